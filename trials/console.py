"""The command line's console for messages and errors: stderr; not a terminal (a log, a
pipe): lines are not wrapped, tables keep 200 columns."""

from __future__ import annotations

import sys

from rich.console import Console

console = Console(
    stderr=True,
    width=None if sys.stderr.isatty() else 200,
    soft_wrap=not sys.stderr.isatty(),
)
