"""Stalls of a router: packets in transit during one did not see the emulated link, and are
judged apart. Two sources: the user-space delay line records its own late wake-ups; where the
delay is a kernel qdisc (netem), the stalls are read from the packets, as the times the
bottleneck served packets later than its rate allows (`lost_service_ns`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from analysis.lazy import pd

# A shaper later than this is a stall: the same 2 ms as the delay line's threshold.
STALL_NS = 2_000_000


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


def lost_service_ns(
    queue: pd.DataFrame, ts_in_ns: np.ndarray, ts_out_ns: np.ndarray, delay_ns: int, rate_bps: float
) -> np.ndarray:
    """Per packet forwarded through a FIFO bottleneck: how much later it left than a faithful
    shaper at `rate_bps` would have sent it, from the bottleneck's queue events
    (analysis.queue.queue_occupancy) and the packet's times before the router (`ts_in_ns`,
    plus the link's `delay_ns` ahead of the shaper) and after it (`ts_out_ns`; -1 if dropped:
    0 for those).

    A faithful shaper finishes the frame it was sending when the packet entered the queue,
    then sends every frame that left between then and the packet's own departure, each in its
    serialization time: the packet is due at that sum. What it left later is service the
    shaper lost while the packet waited (a stalled machine; HTB does not catch up beyond its
    burst); a shaper running early (its burst) gives a small negative value."""
    departed = (queue["event"] == "departure").to_numpy()  # on the codes: no strings
    t = queue["ts_ns"].to_numpy(np.int64)[departed]
    frame = queue["frame_bytes"].to_numpy(np.int64)[departed]
    return lost_service_of(t, frame, ts_in_ns, ts_out_ns, delay_ns, rate_bps)


def lost_service_of(
    t: np.ndarray,
    frame: np.ndarray,
    ts_in_ns: np.ndarray,
    ts_out_ns: np.ndarray,
    delay_ns: int,
    rate_bps: float,
) -> np.ndarray:
    """:func:`lost_service_ns` from the queue's departures alone: their times ``t`` and frame
    sizes ``frame``, in the queue's event order (by time; at equal times by row)."""
    t, frame = np.asarray(t, np.int64), np.asarray(frame, np.int64)
    ns_per_byte = 8e9 / rate_bps
    sent_before = np.r_[0, np.cumsum(frame)]  # bytes that left before departure i
    out = np.zeros(len(ts_in_ns), dtype=np.int64)
    fwd = np.flatnonzero(np.asarray(ts_out_ns) >= 0)
    if not len(fwd) or not len(t):
        return out
    enter = np.asarray(ts_in_ns, dtype=np.int64)[fwd] + delay_ns
    leave = np.asarray(ts_out_ns, dtype=np.int64)[fwd]
    last = np.searchsorted(t, enter, side="right") - 1  # the frame being sent when it entered
    own = np.searchsorted(t, leave, side="left")  # its own departure
    busy_until = np.where(
        last >= 0, t[np.maximum(last, 0)] + frame[np.maximum(last, 0)] * ns_per_byte, enter
    )
    ahead = sent_before[own] - sent_before[last + 1]  # left after it entered, before it
    due = np.maximum(enter, busy_until) + ahead * ns_per_byte
    out[fwd] = (leave - due).astype(np.int64)
    return out
