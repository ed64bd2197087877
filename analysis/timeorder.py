"""Rows in time order for the compiled passes: a stable order of the rows by timestamp, or none
when they are in that order already (a capture is written so), read through ``row``."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["row", "time_order"]


@njit(cache=True, nogil=True)  # LLVM inlines it; numba's inline="always" made callers slower
def row(order, k):
    """The row of time rank k: ``order[k]``, or k itself where the rows are in time order
    (``order`` empty)."""
    return order[k] if len(order) else k


def time_order(ts: np.ndarray, in_order: bool | None = None) -> np.ndarray:
    """The rows by time (stable argsort), or none when they are in time order already
    (``in_order``, if known; else checked)."""
    if in_order is None:
        in_order = not (ts[1:] < ts[:-1]).any()
    return np.empty(0, np.int64) if in_order else np.argsort(ts, kind="stable")
