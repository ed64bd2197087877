"""pandas for the modules a trial's analysis imports, imported where it is first used: reading
and matching the captures needs numpy and numba only, so a fresh process reads them without
pandas' 70 MB resident (and its import's 0.35 s comes later, once they are read). Use
``from analysis.lazy import pd`` as ``import pandas as pd``."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["pd"]


class _Deferred:
    """A module imported on the first access to one of its attributes."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


pd: Any = _Deferred("pandas")
