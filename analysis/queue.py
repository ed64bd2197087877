"""Occupancy of a bottleneck queue over time, from the captures on both sides of the router.

Every packet of the traffic crossing the bottleneck is seen arriving (capture before the
router) and, unless the queue dropped it, departing (capture after it); ``match_packets``
pairs them. The router delays a packet by the link's fixed delay *before* its shaper (netem
as the root qdisc with HTB under it, or the NFQUEUE delay line ahead of the qdisc), so a
packet enters the drop-tail queue at ``ts + delay_ns`` and leaves it when the egress capture
sees it (the capture taps packets as the shaper hands them to the driver). Between those two
instants it is in the queue: the occupancy after each event is a running sum, exact for a
FIFO as far as the delay is constant. A dropped packet changes nothing; it is kept as an
event so the occupancy it met is on record.

Bytes are counted as the qdisc counts them: the Ethernet frame without FCS (IP length + 14).
"""

from __future__ import annotations

import numpy as np

from analysis.lazy import pd
from analysis.match import KEY_COLUMNS
from analysis.pcap import ip_strings
from analysis.queuemerge import queue_levels
from core.link_rules import ETHERNET_HEADER

__all__ = [
    "ETHERNET_HEADER",
    "EVENT_NAMES",
    "occupancy_at",
    "queue_occupancy",
    "queue_quantiles",
    "queue_summary",
]

EVENT_NAMES = ("departure", "arrival", "drop")  # their codes; order at equal timestamps


def __getattr__(name: str):
    if name == "EVENTS":  # made on first use: importing this module needs no pandas
        return pd.CategoricalDtype(list(EVENT_NAMES))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def queue_occupancy(
    matched: pd.DataFrame, *, delay_ns: int = 0, max_delay_ns: int, end_ns: int | None = None
) -> pd.DataFrame:
    """Queue events in time order from ``match_packets(before, after)`` output.

    Columns: ts_ns (int64), event (arrival / departure / drop), frame_bytes, src, dst (strings),
    proto, sport, dport, and the occupancy right after the event: packets, bytes.
    Unmatched packets that could still have been in transit at ``end_ns`` (default: the last
    departure) are left out, as in ``one_way_delay``. At equal timestamps departures come
    before arrivals (a packet leaving frees room for one arriving). A packet was forwarded
    when its ts_out_ns is 0 or more (match_packets' ``forwarded``). The events come from
    analysis.queuemerge.queue_levels' compiled merge (tests/analysis/queue_oracle.py computes
    them a second way, with numpy sorts).
    """
    events = queue_levels(
        matched["ts_ns"].to_numpy(np.int64),
        matched["ts_out_ns"].to_numpy(np.int64),
        matched["ip_len"].to_numpy(),
        delay_ns=delay_ns,
        max_delay_ns=max_delay_ns,
        end_ns=end_ns,
        header_bytes=ETHERNET_HEADER,
        rows=True,
    )
    src = events["row"]  # row in ``matched``
    return pd.DataFrame(
        {
            "ts_ns": events["ts_ns"],
            "event": pd.Categorical.from_codes(events["event"], categories=list(EVENT_NAMES)),
            "frame_bytes": events["frame_bytes"].astype(np.int32),
            "src": ip_strings(matched["src"].to_numpy()[src]),
            "dst": ip_strings(matched["dst"].to_numpy()[src]),
            "proto": matched["proto"].to_numpy()[src],
            "sport": matched["sport"].to_numpy()[src],
            "dport": matched["dport"].to_numpy()[src],
            "packets": events["packets"].astype(np.int64),
            "bytes": events["bytes"].astype(np.int64),
        },
        copy=False,
    )


QUEUE_COLUMNS = ["ts_ns", "ip_len", *KEY_COLUMNS]  # what matching and the queue read


def crossing(frame: pd.DataFrame, pairs: set[tuple[int, int]]) -> pd.DataFrame:
    """The packets of ``frame`` going from src to dst for one of the (src, dst) ``pairs``
    (integer addresses): the traffic that crosses a bottleneck in its direction; only the
    columns the queue reconstruction reads (a copy of every column would double memory)."""
    key = frame["src"].to_numpy().astype(np.uint64) << np.uint64(32)
    key |= frame["dst"].to_numpy().astype(np.uint64)
    wanted = np.array([(s << 32) | d for s, d in pairs], dtype=np.uint64)
    rows = np.flatnonzero(np.isin(key, wanted))
    return pd.DataFrame({c: frame[c].to_numpy()[rows] for c in QUEUE_COLUMNS}, copy=False)


def occupancy_at(queue: pd.DataFrame, ts_ns: np.ndarray) -> pd.DataFrame:
    """Occupancy (packets, bytes) at each time: after every event at or before it."""
    ts_ns = np.asarray(ts_ns, dtype=np.int64)
    idx = np.searchsorted(queue["ts_ns"].to_numpy(), ts_ns, side="right") - 1
    seen = idx >= 0
    pick = np.maximum(idx, 0)
    return pd.DataFrame(
        {
            "ts_ns": ts_ns,
            "packets": np.where(seen, queue["packets"].to_numpy()[pick], 0),
            "bytes": np.where(seen, queue["bytes"].to_numpy()[pick], 0),
        }
    )


def _held(queue: pd.DataFrame, start_ns: int, end_ns: int, col: str) -> tuple[np.ndarray, ...]:
    """Each level of ``col`` the queue held over [start_ns, end_ns) (the one at the start
    first) and for how long (ns)."""
    ts = queue["ts_ns"].to_numpy()
    inside = (ts >= start_ns) & (ts < end_ns)
    at_start = occupancy_at(queue, np.array([start_ns]))
    span = np.diff(np.r_[start_ns, ts[inside], end_ns])
    return np.r_[at_start[col].to_numpy(), queue[col].to_numpy()[inside]], span


def queue_summary(queue: pd.DataFrame, *, start_ns: int, end_ns: int) -> dict[str, float]:
    """Time-weighted mean and the maximum occupancy over [start_ns, end_ns), and drops."""
    out: dict[str, float] = {}
    for col in ("packets", "bytes"):
        level, span = _held(queue, start_ns, end_ns, col)
        total = span.sum()
        out[f"mean_{col}"] = float((level * span).sum() / total) if total > 0 else float("nan")
        out[f"max_{col}"] = float(level.max()) if len(level) else float("nan")
    ts = queue["ts_ns"].to_numpy()
    inside = (ts >= start_ns) & (ts < end_ns)
    out["drops"] = int((queue["event"] == "drop").to_numpy()[inside].sum())
    return out


def queue_quantiles(
    queue: pd.DataFrame, quantiles: list[float], *, start_ns: int, end_ns: int
) -> list[float]:
    """The occupancy in packets at each of ``quantiles`` (0..1) of the time over
    [start_ns, end_ns): the least level the queue held at or below for that share of it."""
    level, span = _held(queue, start_ns, end_ns, "packets")
    if span.sum() <= 0:
        return [float("nan")] * len(quantiles)
    order = np.argsort(level, kind="stable")
    held = np.cumsum(span[order]) / span.sum()
    at = np.searchsorted(held, np.asarray(quantiles, np.float64) - 1e-12, side="left")
    return level[order][np.minimum(at, len(level) - 1)].astype(float).tolist()
