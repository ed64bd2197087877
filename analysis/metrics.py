"""Per-flow TCP metrics and one-way delay / loss from read_pcap frames (all vectorized).

A flow is (src, dst, sport, dport); its data direction is the one carrying payload.
Sequence and ACK numbers are unwrapped from 32 bits by summing signed 32-bit steps in
time order, so a flow may cross the 2**32 boundary any number of times.
"""

from __future__ import annotations

import weakref

import numpy as np
import pandas as pd

from analysis.fastpath import (
    match_times,
    queue_levels,
    summarize_owd,
    tcp_flow_counters,
    undecided,
)
from analysis.match import match_packets
from core.link_rules import FULL_FRAME_BYTES as MAX_FRAME_BYTES

__all__ = [
    "match_times",
    "one_way_delay",
    "owd_upper_bound_ns",
    "queue_full_events",
    "queue_levels",
    "summarize_owd",
    "tcp_flow_counters",
    "tcp_goodput",
    "tcp_retransmissions",
    "undecided",
]

FLOW = ["src", "dst", "sport", "dport"]
_ACK, _FIN = 0x10, 0x01
_NEVER = 2**62


def _group_agg(values, ids, n: int, how: str, fill: int) -> np.ndarray:
    """int64 per-group min/max for groups 0..n-1 (``fill`` where a group has no rows);
    stays in integers (no float64 round trip)."""
    out = np.full(n, fill, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    if len(values):
        ids = np.asarray(ids)
        seen = np.zeros(n, dtype=bool)
        seen[ids] = True
        ufunc = np.minimum if how == "min" else np.maximum
        acc = np.full(n, np.iinfo(np.int64).max if how == "min" else np.iinfo(np.int64).min)
        ufunc.at(acc, ids, values)
        out[seen] = acc[seen]
    return out


def _starts(group: np.ndarray) -> np.ndarray:
    """True where a run of equal values begins (rows sorted by group)."""
    start = np.ones(len(group), dtype=bool)
    start[1:] = group[1:] != group[:-1]
    return start


def _group_cummax(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Running maximum within each group (rows sorted by group; int64 values whose spread
    within a group is below 2**41): one global accumulate over values lifted per group."""
    values = np.asarray(values, dtype=np.int64)
    if not len(values):
        return values.copy()
    start = _starts(group)
    low = np.minimum.reduceat(values, np.flatnonzero(start))
    lift = np.cumsum(start) * (np.int64(1) << 42) - np.repeat(
        low, np.diff(np.r_[np.flatnonzero(start), len(values)])
    )
    return np.maximum.accumulate(values + lift) - lift


def _signed32(x: np.ndarray) -> np.ndarray:
    """int64 -> the signed 32-bit value with the same low 32 bits (bit ops, not %)."""
    return ((x + 2**31) & 0xFFFFFFFF) - 2**31


def _unwrap(raw: np.ndarray, group: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Unwrap 32-bit values sorted by (group, time); the first of each group is placed
    nearest to ``base`` (one value per row) rather than at its raw value."""
    raw = raw.astype(np.int64)
    start = _starts(group)
    step = _signed32(np.diff(raw, prepend=raw[:1]))
    step[start] = (base + _signed32(raw - base))[start]
    cs = np.cumsum(step)
    first = np.maximum.accumulate(np.where(start, np.arange(len(raw)), 0))
    return cs - cs[first] + step[first]


_U64 = np.uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (uint64 arithmetic wraps, which is what we want): the array twin of
    pcapscan's compiled _mix, for hashes of whole columns at once."""
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def _flow_hash(src, dst, sport, dport) -> np.ndarray:
    """64-bit hash of a direction's 4-tuple: a key pandas can index without a MultiIndex.
    Callers check the 4-tuples behind equal keys (a collision is possible, if unlikely)."""
    ports = np.asarray(sport).astype(_U64) << _U64(16) | np.asarray(dport).astype(_U64)
    addrs = np.asarray(src).astype(_U64) << _U64(32) | np.asarray(dst).astype(_U64)
    return _mix(addrs ^ (ports * _U64(0x9E3779B97F4A7C15)))


class _HashCollision(Exception):
    pass


def _flow_ids(packets: pd.DataFrame, data: pd.DataFrame, reverse: bool) -> np.ndarray:
    """Row in ``data`` (the data-flow table) of each packet's flow, or of the flow its
    packets acknowledge when ``reverse``; -1 if none."""
    cols = ["dst", "src", "dport", "sport"] if reverse else FLOW
    keys = _flow_hash(*(packets[c].to_numpy() for c in cols))
    table = pd.Index(_flow_hash(*(data[c].to_numpy() for c in FLOW)))
    fid = table.get_indexer(keys) if table.is_unique else None
    hit = fid >= 0 if fid is not None else None
    if fid is None or not all(
        np.array_equal(packets[c].to_numpy()[hit], data[d].to_numpy()[fid[hit]])
        for c, d in zip(cols, FLOW, strict=True)
    ):  # two 4-tuples share a hash: compare them whole
        tuples = pd.MultiIndex.from_frame(packets[cols].set_axis(FLOW, axis=1))
        return pd.MultiIndex.from_frame(data[FLOW]).get_indexer(tuples)
    return fid


def _time_order(fid: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Stable order by (flow, ts): one stable sort by flow when the rows are already in time
    order (captures are written so), else a lexsort."""
    if len(ts) < 2 or (np.diff(ts) >= 0).all():
        small = fid.astype(np.int16) if len(fid) and fid.max() < 2**15 else fid
        return np.argsort(small, kind="stable")  # radix sort for int16
    return np.lexsort((ts, fid))


_CACHE: dict[int, tuple[weakref.ref, tuple]] = {}


def _tcp_flows(packets: pd.DataFrame):
    """Data flows, their data packets (unwrapped seq) and their ACKs (unwrapped ack).

    Returns (flows, data, acks) where data/acks carry a ``flow`` row number into flows,
    sorted by (flow, ts_ns), indexed by the packets' labels; flows has the first data
    timestamp, base sequence number and FIN. Built once per packets frame (frames are not
    modified after reading): every metric of the same frame reuses it.
    """
    hit = _CACHE.get(id(packets))
    if hit is not None and hit[0]() is packets:
        return hit[1]
    try:
        out = _build_tcp_flows(packets, _flow_hash)
    except _HashCollision:  # two 4-tuples share a hash: key by their rank instead
        out = _build_tcp_flows(packets, _exact_key(packets))
    for key in [k for k, (ref, _) in _CACHE.items() if ref() is None]:
        del _CACHE[key]
    _CACHE[id(packets)] = (weakref.ref(packets), out)
    return out


def _exact_key(packets: pd.DataFrame):
    """A key function numbering the distinct 4-tuples (exact, slower than the hash)."""
    tcp = packets[packets["proto"] == 6]
    both = pd.concat(
        [tcp[FLOW], tcp[["dst", "src", "dport", "sport"]].set_axis(FLOW, axis=1)]
    ).drop_duplicates()
    table = pd.MultiIndex.from_frame(both)

    def key(src, dst, sport, dport) -> np.ndarray:
        frame = pd.DataFrame({"src": src, "dst": dst, "sport": sport, "dport": dport})
        return table.get_indexer(pd.MultiIndex.from_frame(frame)).astype(np.uint64)

    return key


def _build_tcp_flows(packets: pd.DataFrame, key_of):
    col = {c: packets[c].to_numpy() for c in ("proto", "tcp_flags", "payload_len", "ts_ns")}
    tcp = np.flatnonzero(col["proto"] == 6)
    flags = col["tcp_flags"][tcp]
    plen = col["payload_len"][tcp].astype(np.int64)
    ts = col["ts_ns"][tcp]
    ends = {c: packets[c].to_numpy()[tcp] for c in FLOW}
    wide = {c: v.astype(np.uint64) for c, v in ends.items()}  # cast once for both keys
    fwd = key_of(wide["src"], wide["dst"], wide["sport"], wide["dport"])
    has_data = np.flatnonzero(plen > 0)
    codes, keys = pd.factorize(fwd[has_data])  # flows in order of first data
    first_row = np.empty(len(keys), dtype=np.int64)
    first_row[codes[::-1]] = has_data[::-1]
    flows = pd.DataFrame({c: ends[c][first_row] for c in FLOW})
    index = pd.Index(keys)
    labels = packets.index.to_numpy()[tcp]

    sel = np.flatnonzero((plen > 0) | ((flags & _FIN) > 0))
    fid = index.get_indexer(fwd[sel])
    sel, fid = sel[fid >= 0], fid[fid >= 0]
    order = _time_order(fid, ts[sel])
    sel, fid = sel[order], fid[order]
    seq = packets["seq"].to_numpy()[tcp][sel].astype(np.int64)
    first_seq = seq[np.searchsorted(fid, fid)]  # the flow's first packet anchors unwrapping
    seq_u = _unwrap(seq, fid, first_seq)
    data = pd.DataFrame(
        {
            "ts_ns": ts[sel],
            "seq": seq,
            "payload_len": plen[sel],
            "tcp_flags": flags[sel],
            "flow": fid,
            "seq_u": seq_u,
            "end_u": seq_u + np.maximum(plen[sel], 0),
        },
        index=labels[sel],
        copy=False,  # no consolidation into one 2-D block (a copy of every column)
    )

    rev = key_of(wide["dst"], wide["src"], wide["dport"], wide["sport"])
    del wide
    asel = np.flatnonzero((flags & _ACK) > 0)
    afid = index.get_indexer(rev[asel])
    asel, afid = asel[afid >= 0], afid[afid >= 0]
    order = _time_order(afid, ts[asel])
    asel, afid = asel[order], afid[order]
    n = len(flows)
    flow_first = np.zeros(n, dtype=np.int64)
    if len(fid):
        starts = np.flatnonzero(_starts(fid))
        flow_first[fid[starts]] = first_seq[starts]
    ack_raw = packets["ack"].to_numpy()[tcp][asel]
    acks = pd.DataFrame(
        {
            "ts_ns": ts[asel],
            "ack": ack_raw,
            "payload_len": plen[asel],
            "tcp_flags": flags[asel],
            "flow": afid,
            "ack_u": _unwrap(ack_raw, afid, flow_first[afid]),
        },
        index=labels[asel],
        copy=False,
    )
    # The key found each packet's flow; check that the 4-tuples agree.
    back = dict(zip(FLOW, ("dst", "src", "dport", "sport"), strict=True))
    for c in FLOW:
        if not np.array_equal(ends[c][sel], flows[c].to_numpy()[fid]) or not np.array_equal(
            ends[back[c]][asel], flows[c].to_numpy()[afid]
        ):
            raise _HashCollision

    payload = plen[sel] > 0
    flows["first_ts"] = _group_agg(ts[sel][payload], fid[payload], n, "min", 0)
    flows["base"] = _group_agg(seq_u[payload], fid[payload], n, "min", 0)  # byte after SYN
    fins = (flags[sel] & _FIN) > 0
    # The FIN's own sequence number; flows without a FIN get a cap nothing reaches.
    flows["fin"] = _group_agg(data["end_u"].to_numpy()[fins], fid[fins], n, "min", _NEVER)
    return flows, data, acks


def _acked_progress(
    flows: pd.DataFrame, acks: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per ACK of ``_tcp_flows`` (sorted by flow, time): flow row, ts_ns, and the highest
    unwrapped sequence number acknowledged in order so far in its flow, clipped to
    [base, fin] (SYN and FIN each take one sequence number: count only ACKs of data bytes)."""
    afid = acks["flow"].to_numpy()
    base = flows["base"].to_numpy()
    acked = np.clip(acks["ack_u"].to_numpy(), base[afid], flows["fin"].to_numpy()[afid])
    acked = _group_cummax(acked, afid)
    return afid, acks["ts_ns"].to_numpy(), acked


def _acked_at(
    afid: np.ndarray, ts: np.ndarray, acked: np.ndarray, base: np.ndarray, t: np.ndarray
) -> np.ndarray:
    """Per flow f: the unwrapped sequence number acknowledged in order by time t[f] (ACKs at
    or before it count), or base[f] if none; inputs as returned by ``_acked_progress``."""
    seen = ts <= t[afid]  # acked is a running max, so the max is the last ACK's value
    return np.maximum(_group_agg(acked[seen], afid[seen], len(base), "max", 0), base)


def _retransmitted(fid: np.ndarray, end: np.ndarray) -> np.ndarray:
    """True for data packets (sorted by flow, time) whose end (seq + payload, unwrapped) does
    not pass the highest end sent earlier in their flow."""
    start = _starts(fid)
    high = _group_cummax(end, fid)
    prev_high = np.where(start, -_NEVER, np.roll(high, 1))  # nothing sent earlier in the flow
    return end <= prev_high


def tcp_goodput(
    packets: pd.DataFrame, *, start_ns: int | None = None, end_ns: int | None = None
) -> pd.DataFrame:
    """In-order bytes acknowledged by each data flow's receiver, and the rate.

    With a window: bytes acked between the last ACK at or before ``start_ns`` and the last ACK
    at or before ``end_ns``, over the window length. Without: from the flow's first data packet
    to its last ACK that advanced. A missing bound defaults to that per-flow value.
    goodput_bps is NaN when the period is empty.
    """
    c = tcp_flow_counters(_columns(packets), start_ns=start_ns, end_ns=end_ns)
    out = pd.DataFrame({k: c[k] for k in FLOW})
    if out.empty:
        return out.assign(bytes=np.int64(0), seconds=0.0, goodput_bps=0.0).astype(
            {"bytes": "int64", "seconds": "float64", "goodput_bps": "float64"}
        )
    nbytes = c["bytes"]
    seconds = c["span_ns"] / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(seconds > 0, nbytes * 8 / seconds, np.nan)
    return out.assign(bytes=nbytes, seconds=seconds, goodput_bps=rate)


def tcp_retransmissions(packets: pd.DataFrame) -> pd.DataFrame:
    """Per data flow: data packets, and those whose end (seq + payload) does not pass the
    highest end sent earlier in the flow (in time order)."""
    c = tcp_flow_counters(_columns(packets))
    return pd.DataFrame({k: c[k] for k in (*FLOW, *RETRANSMISSION_COLUMNS)})


_TCP_COLUMNS = ("ts_ns", *FLOW, "proto", "tcp_flags", "seq", "ack", "payload_len")
RETRANSMISSION_COLUMNS = ("data_packets", "retransmitted_packets", "retransmitted_bytes")


def _columns(packets: pd.DataFrame) -> dict[str, np.ndarray]:
    return {k: packets[k].to_numpy() for k in _TCP_COLUMNS}


def owd_upper_bound_ns(*, one_way_delay_ns: int, buffer_bytes: int, rate_bps: int) -> int:
    """The longest one-way delay a packet can see through a drop-tail bottleneck: the path's
    propagation delay (RTT/2), plus waiting behind a full queue and the full-size frame the
    shaper is sending when it arrives, (buffer + 1514 B) x 8 / rate (its own serialization
    is inside that: the queue it joins holds at most buffer bytes including itself)."""
    return one_way_delay_ns + -(-(buffer_bytes + MAX_FRAME_BYTES) * 8 * 10**9 // rate_bps)


def one_way_delay(
    before: pd.DataFrame,
    after: pd.DataFrame,
    *,
    max_delay_ns: int,
    proto: int = 17,
    end_ns: int | None = None,
) -> pd.DataFrame:
    """match_packets columns plus ``owd_ns`` (-1 when lost) and ``lost`` for packets of
    ``proto`` in ``before``. Only packets that could not yet have arrived by end_ns (defaults
    to the last timestamp in ``after``, or in ``before`` if ``after`` is empty) are left out:
    those not seen downstream, sent within max_delay_ns of the end and after the last packet
    that was delivered (see :func:`undecided`)."""
    b = before[before["proto"] == proto]
    a = after[after["proto"] == proto]
    m = match_packets(b, a, max_delay_ns=max_delay_ns)
    if end_ns is None:
        src = after if len(after) else before
        end_ns = int(src["ts_ns"].max()) if len(src) else 0
    fwd = m["forwarded"].to_numpy()
    cut = undecided(m["ts_ns"].to_numpy(), fwd, max_delay_ns=max_delay_ns, end_ns=end_ns)
    m = m[~cut].copy()
    fwd = fwd[~cut]
    m["owd_ns"] = np.where(fwd, m["ts_out_ns"].to_numpy() - m["ts_ns"].to_numpy(), -1)
    m["lost"] = ~fwd
    return m


def queue_full_events(matched: pd.DataFrame, *, start_ns: int, end_ns: int) -> dict:
    """Runs of consecutive drops (in arrival order) among packets entering a bottleneck.

    ``events`` counts runs whose first drop lies in [start_ns, end_ns); ``drops`` is the
    number of dropped packets in those runs (including any part running past end_ns).
    """
    order = np.argsort(matched["ts_ns"].to_numpy(), kind="stable")
    ts = matched["ts_ns"].to_numpy()[order]
    dropped = ~matched["forwarded"].to_numpy(bool)[order]
    run_start = dropped.copy()
    run_start[1:] &= ~dropped[:-1]
    run_id = np.cumsum(run_start)
    counted = run_start & (ts >= start_ns) & (ts < end_ns)
    events = int(counted.sum())
    drops = int(np.isin(run_id[dropped], run_id[counted]).sum())
    minutes = (end_ns - start_ns) / 60e9
    return {
        "events": events,
        "drops": drops,
        "minutes": minutes,
        "events_per_minute": events / minutes if minutes > 0 else float("nan"),
    }
