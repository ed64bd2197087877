"""Per-flow TCP metrics and one-way delay / loss from read_pcap frames (all vectorized).

A flow is (src, dst, sport, dport); its data direction is the one carrying payload.
Sequence and ACK numbers are unwrapped from 32 bits by summing signed 32-bit steps in
time order, so a flow may cross the 2**32 boundary any number of times.
"""

from __future__ import annotations

import weakref

import numpy as np
import pandas as pd
from numba import njit

from analysis.match import _mix, match_packets

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
]

FLOW = ["src", "dst", "sport", "dport"]
_ACK, _FIN = 0x10, 0x01
_NEVER = 2**62
MAX_FRAME_BYTES = 1514  # a full-size Ethernet frame (1500 B MTU), as the shaper counts it


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


# Compiled per-flow counters (numba, cached on disk): the numbers of tcp_goodput and
# tcp_retransmissions in passes over the packet columns, without per-packet tables. Same
# definitions as _tcp_flows: a flow is a direction that carried payload, numbered by its
# first payload packet in file order; packets in time order (stable); sequence and ACK
# numbers unwrapped by summing signed 32-bit steps, the flow's first data-or-FIN packet
# anchoring both.
_EMPTY = np.int64(-1)


@njit(cache=True, nogil=True, inline="always")
def _s32(x):
    return ((x + 2**31) & 0xFFFFFFFF) - 2**31


@njit(cache=True, nogil=True, inline="always")
def _slot(k1, k2, mask):
    h = (k1 * np.uint64(0x9E3779B97F4A7C15)) ^ (k2 * np.uint64(0xBF58476D1CE4E5B9))
    return np.int64((h ^ (h >> np.uint64(29))) & np.uint64(mask))


@njit(cache=True, nogil=True)
def _find(table, keys1, keys2, k1, k2):
    """Slot of (k1, k2) in the open-addressing table, or of the empty slot it would take."""
    mask = len(table) - 1
    s = _slot(k1, k2, mask)
    while table[s] >= 0 and not (keys1[table[s]] == k1 and keys2[table[s]] == k2):
        s = (s + 1) & mask
    return s


@njit(cache=True, nogil=True)
def _directions(src, dst, sport, dport, proto):
    """Direction id of each TCP packet (-1 for others), ids in order of first appearance;
    the number of directions; the id of each direction's reverse (-1 if never seen)."""
    table = np.full(1024, -1, np.int64)  # grows at half full: sized by directions, not packets
    keys1 = np.empty(512, np.uint64)
    keys2 = np.empty(512, np.uint64)
    ids = np.full(len(src), -1, np.int32)
    m = 0
    for i in range(len(src)):
        if proto[i] != 6:
            continue
        k1 = np.uint64(src[i]) << np.uint64(32) | np.uint64(dst[i])
        k2 = np.uint64(sport[i]) << np.uint64(16) | np.uint64(dport[i])
        s = _find(table, keys1, keys2, k1, k2)
        if table[s] >= 0:
            ids[i] = table[s]
            continue
        table[s] = m
        keys1[m], keys2[m] = k1, k2
        ids[i] = m
        m += 1
        if 2 * m >= len(table):
            keys1 = np.concatenate((keys1, np.empty(len(keys1), np.uint64)))
            keys2 = np.concatenate((keys2, np.empty(len(keys2), np.uint64)))
            table = np.full(2 * len(table), -1, np.int64)
            for d in range(m):
                table[_find(table, keys1, keys2, keys1[d], keys2[d])] = d
    rev = np.full(m, -1, np.int64)
    for d in range(m):
        k1 = keys1[d] << np.uint64(32) | keys1[d] >> np.uint64(32)
        k2 = (keys2[d] & np.uint64(0xFFFF)) << np.uint64(16) | keys2[d] >> np.uint64(16)
        rev[d] = table[_find(table, keys1, keys2, k1, k2)]
    return ids, m, rev


@njit(cache=True, nogil=True)
def _counters(
    sorted_, order, ids, m, rev, ts, flags, seq, ack, plen, has_start, start_ns, has_end, end_ns
):
    """Per direction (index d < m): see tcp_flow_counters; rows visited in ``order``."""
    first_data = np.full(m, _EMPTY)  # file row of the first payload packet
    for i in range(len(ids)):
        d = ids[i]
        if d >= 0 and plen[i] > 0 and first_data[d] < 0:
            first_data[d] = i
    # data and FIN packets of flows, in time order
    started = np.zeros(m, np.bool_)
    prev_raw = np.zeros(m, np.int64)
    cur = np.zeros(m, np.int64)
    first_seq = np.zeros(m, np.int64)
    high = np.full(m, -_NEVER, np.int64)
    base = np.full(m, _NEVER, np.int64)
    fin = np.full(m, _NEVER, np.int64)
    first_ts = np.full(m, _NEVER, np.int64)
    packets = np.zeros(m, np.int64)
    retx = np.zeros(m, np.int64)
    retx_bytes = np.zeros(m, np.int64)
    for k in range(len(ids)):
        i = k if sorted_ else order[k]
        d = ids[i]
        if d < 0 or first_data[d] < 0:
            continue
        p = np.int64(plen[i])
        is_fin = (flags[i] & _FIN) != 0
        if p <= 0 and not is_fin:
            continue
        raw = np.int64(seq[i])
        if started[d]:
            u = cur[d] + _s32(raw - prev_raw[d])
        else:
            started[d] = True
            first_seq[d] = raw
            u = raw
        prev_raw[d], cur[d] = raw, u
        end = u + max(p, 0)
        if p > 0:
            packets[d] += 1
            if end <= high[d]:
                retx[d] += 1
                retx_bytes[d] += p
            high[d] = max(high[d], end)
            base[d] = min(base[d], u)
            first_ts[d] = min(first_ts[d], ts[i])
        if is_fin:
            fin[d] = min(fin[d], end)
    # ACKs of flows (sent on the reverse direction), in time order
    lo = np.where(first_data >= 0, first_ts, 0) if not has_start else np.full(m, start_ns)
    a_started = np.zeros(m, np.bool_)
    a_raw = np.zeros(m, np.int64)
    a_cur = np.zeros(m, np.int64)
    run = np.zeros(m, np.int64)  # running max of clipped acked values
    at_lo = np.full(m, _EMPTY)  # running max at the last ACK at or before lo (-1: none)
    at_hi = np.full(m, _EMPTY)
    last_adv = np.full(m, _EMPTY)
    seen_lo = np.zeros(m, np.bool_)
    seen_hi = np.zeros(m, np.bool_)
    for k in range(len(ids)):
        i = k if sorted_ else order[k]
        r = ids[i]
        if r < 0 or (flags[i] & _ACK) == 0:
            continue
        f = rev[r]
        if f < 0 or first_data[f] < 0:
            continue
        raw = np.int64(ack[i])
        if a_started[f]:
            u = a_cur[f] + _s32(raw - a_raw[f])
        else:
            u = first_seq[f] + _s32(raw - first_seq[f])
        a_raw[f], a_cur[f] = raw, u
        acked = min(max(u, base[f]), fin[f])
        if not a_started[f] or acked > run[f]:
            if acked > base[f]:
                last_adv[f] = ts[i]
            run[f] = acked if not a_started[f] else max(run[f], acked)
        a_started[f] = True
        t = ts[i]
        if t <= lo[f]:
            seen_lo[f] = True
            at_lo[f] = run[f]
        if has_end and t <= end_ns:
            seen_hi[f] = True
            at_hi[f] = run[f]
    nbytes = np.zeros(m, np.int64)
    span = np.zeros(m, np.int64)
    for d in range(m):
        if first_data[d] < 0:
            continue
        a_lo = max(at_lo[d] if seen_lo[d] else 0, base[d])
        if has_end:
            hi = end_ns
            a_hi = max(at_hi[d] if seen_hi[d] else 0, base[d])
        elif last_adv[d] >= 0:
            hi = last_adv[d]
            a_hi = max(run[d], base[d])
        else:
            hi = lo[d]
            a_hi = a_lo
        nbytes[d] = max(a_hi - a_lo, 0)
        span[d] = max(hi - lo[d], 0)
    return first_data, packets, retx, retx_bytes, nbytes, span


@njit(cache=True, nogil=True)
def _match(hb, tb, ha, ta, delay, order_b, order_a):
    """ts_out of each before row (-1: none): analysis.match's greedy FIFO matching, with the
    after rows of each key chained in time order through a hash table of the keys."""
    na = len(ha)
    size = 1024
    while size < na + na // 2:
        size *= 2
    mask = np.uint64(size - 1)
    keys = np.empty(size, np.uint64)
    head = np.full(size, -1, np.int32)
    nxt = np.empty(na, np.int32)
    for k in range(na - 1, -1, -1):  # backwards, so that each chain runs forwards in time
        j = order_a[k] if len(order_a) else k
        s = ha[j] & mask
        while head[s] >= 0 and keys[s] != ha[j]:
            s = (s + np.uint64(1)) & mask
        keys[s] = ha[j]
        nxt[j] = head[s]
        head[s] = j
    out = np.full(len(hb), -1, np.int64)
    for k in range(len(hb)):
        i = order_b[k] if len(order_b) else k
        s = hb[i] & mask
        while head[s] != -1 and keys[s] != hb[i]:
            s = (s + np.uint64(1)) & mask
        if head[s] == -1:  # a key never seen after
            continue
        p = head[s]
        while p >= 0 and ta[p] < tb[i]:  # too early for this packet: for every later one too
            p = nxt[p]
        if p >= 0 and ta[p] <= tb[i] + delay:
            out[i] = ta[p]
            p = nxt[p]
        head[s] = p if p >= 0 else -2  # -2: the key's after packets are used up or too early
    return out


def match_times(
    hash_before: np.ndarray,
    ts_before: np.ndarray,
    hash_after: np.ndarray,
    ts_after: np.ndarray,
    *,
    max_delay_ns: int,
) -> np.ndarray:
    """``ts_out_ns`` of ``analysis.match.match_packets`` (same greedy FIFO matching: each
    packet, in time order, takes the earliest unused after packet of its key inside
    [ts, ts + max_delay_ns]) from key hashes (``key_hash`` of read_columns) and timestamps,
    in one compiled pass per side."""

    def order(ts: np.ndarray) -> np.ndarray:
        return (
            np.empty(0, np.int64) if not (ts[1:] < ts[:-1]).any() else np.argsort(ts, kind="stable")
        )

    return _match(
        hash_before,
        ts_before,
        hash_after,
        ts_after,
        int(max_delay_ns),
        order(ts_before),
        order(ts_after),
    )


def tcp_flow_counters(
    cols: dict[str, np.ndarray], *, start_ns: int | None = None, end_ns: int | None = None
) -> dict[str, np.ndarray]:
    """Per data flow, in the order of ``analysis.metrics.tcp_goodput``: src, dst, sport,
    dport, data_packets, retransmitted_packets, retransmitted_bytes (as
    ``tcp_retransmissions``), bytes and span_ns (acked bytes and period of ``tcp_goodput``
    with the same window). ``cols`` holds the read_pcap columns ts_ns, src, dst, sport,
    dport, proto, tcp_flags, seq, ack and payload_len as numpy arrays."""
    ts = np.ascontiguousarray(cols["ts_ns"], dtype=np.int64)
    ids, m, rev = _directions(cols["src"], cols["dst"], cols["sport"], cols["dport"], cols["proto"])
    sorted_ = not (ts[1:] < ts[:-1]).any()
    order = np.empty(0, np.int64) if sorted_ else np.argsort(ts, kind="stable")
    first_data, packets, retx, retx_bytes, nbytes, span = _counters(
        sorted_, order, ids, m, rev, ts, cols["tcp_flags"], cols["seq"], cols["ack"],
        cols["payload_len"], start_ns is not None, 0 if start_ns is None else int(start_ns),
        end_ns is not None, 0 if end_ns is None else int(end_ns),
    )  # fmt: skip
    flows = np.flatnonzero(first_data >= 0)
    flows = flows[np.argsort(first_data[flows], kind="stable")]
    rows = first_data[flows]
    out = {c: cols[c][rows] for c in ("src", "dst", "sport", "dport")}
    out.update(
        data_packets=packets[flows],
        retransmitted_packets=retx[flows],
        retransmitted_bytes=retx_bytes[flows],
        bytes=nbytes[flows],
        span_ns=span[flows],
    )
    return out


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


def undecided(ts_ns: np.ndarray, forwarded: np.ndarray, *, max_delay_ns: int, end_ns: int):
    """True for packets that were not seen downstream but could still have been in transit at
    ``end_ns``: sent after end_ns - max_delay_ns and after the last packet (of the same
    capture, in send order) that was seen downstream; through a FIFO path, a packet sent
    before one that arrived would have arrived too, so it was lost."""
    if not len(ts_ns):
        return np.zeros(0, dtype=bool)
    last_fwd = ts_ns[forwarded].max() if forwarded.any() else np.iinfo(np.int64).min
    return ~forwarded & (ts_ns > end_ns - max_delay_ns) & (ts_ns > last_fwd)


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


def queue_levels(
    ts_ns: np.ndarray,
    ts_out_ns: np.ndarray,
    frame_bytes: np.ndarray,
    *,
    delay_ns: int = 0,
    max_delay_ns: int,
    end_ns: int | None = None,
) -> dict[str, np.ndarray]:
    """The events and occupancy of ``analysis.queue.queue_occupancy`` as arrays (ts_ns,
    event code 0 departure / 1 arrival / 2 drop, frame_bytes, packets, bytes), from the
    packets arriving at the queue (time, ``match_times`` result, frame size): the same
    numbers without building the per-event table with address strings."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    out_ts = np.asarray(ts_out_ns, dtype=np.int64)
    fwd = out_ts >= 0
    if end_ns is None:
        end_ns = int(out_ts[fwd].max()) if fwd.any() else int(ts.max(initial=0))
    keep = np.flatnonzero(~undecided(ts, fwd, max_delay_ns=max_delay_ns, end_ns=end_ns))
    ts, fwd, out_ts = ts[keep], fwd[keep], out_ts[keep]
    size = np.asarray(frame_bytes)[keep].astype(np.int64)
    dep = out_ts[fwd]
    if not ((ts[1:] < ts[:-1]).any() or (dep[1:] < dep[:-1]).any()):
        t, code, size, packets, nbytes = _queue_merge(ts + delay_ns, fwd, size, dep)
        return {"ts_ns": t, "event": code, "frame_bytes": size, "packets": packets, "bytes": nbytes}
    n_fwd = len(dep)
    t = np.r_[ts + delay_ns, dep]
    code = np.r_[np.where(fwd, 1, 2), np.zeros(n_fwd, np.int64)].astype(np.int8)
    sign = np.r_[fwd.astype(np.int64), -np.ones(n_fwd, np.int64)]
    size = np.r_[size, size[fwd]]
    by_code = np.argsort(code, kind="stable")  # at equal times: departures, arrivals, drops
    order = by_code[np.argsort(t[by_code], kind="stable")]
    sign, size = sign[order], size[order]
    return {
        "ts_ns": t[order],
        "event": code[order],
        "frame_bytes": size,
        "packets": np.cumsum(sign),
        "bytes": np.cumsum(sign * size),
    }


@njit(cache=True, nogil=True)
def _queue_merge(arr, fwd, size, dep):
    """queue_levels' events for arrival times and departure times each in order: a three-way
    merge (departures, arrivals, drops; at equal times in that order, then in row order)."""
    n = len(arr) + len(dep)
    t = np.empty(n, np.int64)
    code = np.empty(n, np.int8)
    out_size = np.empty(n, np.int64)
    packets = np.empty(n, np.int64)
    nbytes = np.empty(n, np.int64)
    dep_size = size[fwd]
    big = np.iinfo(np.int64).max
    i_arr, i_drop, i_dep = 0, 0, 0  # next arrival row, next drop row, next departure
    level, level_bytes = 0, 0
    for k in range(n):
        while i_arr < len(arr) and not fwd[i_arr]:
            i_arr += 1
        while i_drop < len(arr) and fwd[i_drop]:
            i_drop += 1
        ta = arr[i_arr] if i_arr < len(arr) else big
        tx = arr[i_drop] if i_drop < len(arr) else big
        td = dep[i_dep] if i_dep < len(dep) else big
        if i_dep < len(dep) and td <= ta and td <= tx:
            t[k], code[k], s = td, 0, dep_size[i_dep]
            level, level_bytes = level - 1, level_bytes - s
            i_dep += 1
        elif i_arr < len(arr) and ta <= tx:
            t[k], code[k], s = ta, 1, size[i_arr]
            level, level_bytes = level + 1, level_bytes + s
            i_arr += 1
        else:
            t[k], code[k], s = tx, 2, size[i_drop]
            i_drop += 1
        out_size[k], packets[k], nbytes[k] = s, level, level_bytes
    return t, code, out_size, packets, nbytes


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


def summarize_owd(owd_df: pd.DataFrame) -> dict:
    """Packet and loss counts plus delay statistics (ms) over delivered packets; the standard
    deviation is the sample one (ddof=1). Statistics are NaN when nothing was delivered.
    ``owd_df`` is one_way_delay's frame or any mapping of its lost and owd_ns arrays."""
    lost = np.asarray(owd_df["lost"], dtype=bool)
    ms = np.asarray(owd_df["owd_ns"])[~lost] / 1e6
    nan = float("nan")
    stats = {
        "min_ms": nan,
        "median_ms": nan,
        "mean_ms": nan,
        "std_ms": nan,
        "max_ms": nan,
        "p99_ms": nan,
    }
    if len(ms):
        stats = {
            "min_ms": float(ms.min()),
            "median_ms": float(np.median(ms)),
            "mean_ms": float(ms.mean()),
            "std_ms": float(ms.std(ddof=1)) if len(ms) > 1 else nan,
            "max_ms": float(ms.max()),
            "p99_ms": float(np.percentile(ms, 99)),
        }
    return {"packets": len(lost), "lost": int(lost.sum()), **stats}
