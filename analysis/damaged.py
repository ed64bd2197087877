"""A trial's file that is not what its writer writes (cut short, another file, bytes that are
not text): the error names the file, so that a report says which one to look at."""

from __future__ import annotations

from pathlib import Path


class DamagedFile(ValueError):
    """A trial's file the analysis cannot read as its writer writes it; names the file."""


def not_text(path: str | Path, exc: UnicodeDecodeError) -> DamagedFile:
    return DamagedFile(f"{path}: not UTF-8 text (byte {exc.start}): damaged, or another file")


def text_of(path: str | Path) -> str:
    """The text of a file the runner wrote (a snapshot, a log)."""
    try:
        return Path(path).read_text()
    except UnicodeDecodeError as exc:
        raise not_text(path, exc) from None
