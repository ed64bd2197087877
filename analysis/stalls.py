"""Stalls of the router's delay line (recorded by it): packets in transit during one did not
see the emulated link, and are judged apart."""

from __future__ import annotations

from typing import Any

import numpy as np


def stall_windows(delayline_stats: dict[str, Any]) -> np.ndarray:
    """Disjoint, sorted [start_ns, end_ns] intervals in which the router's delay line was not
    run (it wakes every millisecond and records every wake-up later than its threshold)."""
    events = delayline_stats.get("stalls", {}).get("events", [])
    if not events:
        return np.empty((0, 2), dtype=np.int64)
    ev = np.array(events, dtype=np.int64)
    windows = np.column_stack([ev[:, 0] - ev[:, 1] * 1000, ev[:, 0]])
    windows = windows[np.argsort(windows[:, 0])]
    # Merge overlapping windows so that their ends are sorted too.
    merged_end = np.maximum.accumulate(windows[:, 1])
    new = np.r_[True, windows[1:, 0] > merged_end[:-1]]
    group = np.cumsum(new) - 1
    starts = windows[new, 0]
    ends = np.zeros(len(starts), dtype=np.int64)
    np.maximum.at(ends, group, windows[:, 1])
    return np.column_stack([starts, ends])


def crossed_a_stall(ts_in: np.ndarray, ts_out: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """True where the router transit [ts_in, ts_out] overlaps a stall window: the packet was in
    the delay line or the queue while the router was not run, so it did not see the emulated
    link (a stalled HTB does not catch up afterwards). Lost packets (ts_out -1) are not flagged."""
    if not len(windows):
        return np.zeros(len(ts_in), dtype=bool)
    i = np.searchsorted(windows[:, 1], ts_in)  # first window ending at or after ts_in
    inside = i < len(windows)
    starts = windows[np.minimum(i, len(windows) - 1), 0]
    return inside & (starts <= ts_out) & (ts_out >= 0)
