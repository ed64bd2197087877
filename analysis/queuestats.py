"""Figures of a queue's events read piece by piece (analysis.queuemerge.queue_pieces), so that
no figure needs every event in memory: analysis.queue.queue_summary's over a window
(``Window``) and the occupancy and drops at given times (``AtTimes``: what
analysis.tc_samples.compare_with_samples reads of the queue). Each gives what the DataFrame
functions give on the whole table of events (time order, as they come)."""

from __future__ import annotations

import numpy as np

__all__ = ["AtTimes", "Window"]

_DROP = 2


class Window:
    """queue_summary's figures over [start_ns, end_ns): the time-weighted mean and the
    maximum of the occupancy (packets, bytes; the level at the start included), and the
    drops."""

    def __init__(self, start_ns: int, end_ns: int) -> None:
        self.start, self.end = int(start_ns), int(end_ns)
        self.at_start = [0, 0]  # after the last event at or before start
        self.first: int | None = None  # the first event inside
        self.last: tuple[int, int, int] | None = None  # time and levels of the last inside
        self.area = [0, 0]
        self.most: list = [None, None]
        self.drops = 0

    def add(self, ts: np.ndarray, event: np.ndarray, packets: np.ndarray, nbytes: np.ndarray):
        le = int(np.searchsorted(ts, self.start, side="right"))
        if le:
            self.at_start = [int(packets[le - 1]), int(nbytes[le - 1])]
        lo = int(np.searchsorted(ts, self.start, side="left"))
        hi = int(np.searchsorted(ts, self.end, side="left"))
        if hi <= lo:
            return
        t = ts[lo:hi]
        if self.first is None:
            self.first = int(t[0])
        span = np.diff(t)
        for k, level in enumerate((packets[lo:hi], nbytes[lo:hi])):
            level = level.astype(np.int64)
            if self.last is not None:
                self.area[k] += self.last[1 + k] * (int(t[0]) - self.last[0])
            self.area[k] += int((level[:-1] * span).sum())
            top = int(level.max())
            self.most[k] = top if self.most[k] is None else max(self.most[k], top)
        self.last = (int(t[-1]), int(packets[hi - 1]), int(nbytes[hi - 1]))
        self.drops += int((event[lo:hi] == _DROP).sum())

    def result(self) -> dict[str, float]:
        total = self.end - self.start
        first = self.end if self.first is None else self.first
        out: dict[str, float] = {}
        for k, col in enumerate(("packets", "bytes")):
            area = self.at_start[k] * (first - self.start) + self.area[k]
            if self.last is not None:
                area += self.last[1 + k] * (self.end - self.last[0])
            # as numpy divides an int64 sum by an int64 total (both made float64 first)
            mean = float(np.int64(area) / np.int64(total)) if total > 0 else float("nan")
            most = self.at_start[k] if self.most[k] is None else max(self.at_start[k], self.most[k])
            out[f"mean_{col}"] = mean
            out[f"max_{col}"] = float(most)
        out["drops"] = self.drops
        return out


class AtTimes:
    """The occupancy (packets, bytes) after the last event at or before each of ``times``
    (sorted; 0 before any event) and the drops up to then; the first and last event's time."""

    def __init__(self, times: np.ndarray) -> None:
        self.times = np.asarray(times, np.int64)
        n = len(self.times)
        self.packets, self.bytes = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.drops = np.zeros(n, np.int64)
        self.done = 0  # queries answered
        self.level = (0, 0)
        self.dropped = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None

    def add(self, ts: np.ndarray, event: np.ndarray, packets: np.ndarray, nbytes: np.ndarray):
        if not len(ts):
            return
        if self.first_ns is None:
            self.first_ns = int(ts[0])
        self.last_ns = int(ts[-1])
        # Times before this piece's last event: events at that time may go on in the next.
        stop = int(np.searchsorted(self.times, ts[-1], side="left"))
        self._answer(self.done, stop, ts, event, packets, nbytes)
        self.done = stop
        self.level = (int(packets[-1]), int(nbytes[-1]))
        self.dropped += int((event == _DROP).sum())

    def _answer(self, lo, hi, ts, event, packets, nbytes) -> None:
        q = self.times[lo:hi]
        at = np.searchsorted(ts, q, side="right") - 1
        seen = at >= 0
        pick = np.maximum(at, 0)
        self.packets[lo:hi] = np.where(seen, packets[pick], self.level[0])
        self.bytes[lo:hi] = np.where(seen, nbytes[pick], self.level[1])
        drops = ts[event == _DROP]
        self.drops[lo:hi] = self.dropped + np.searchsorted(drops, q, side="right")

    def finish(self) -> None:
        """Answer the times at or after the last event."""
        self.packets[self.done :], self.bytes[self.done :] = self.level
        self.drops[self.done :] = self.dropped
        self.done = len(self.times)
