"""The whole-trial analysis on arrays, without pandas: compiled passes (numba, cached on
disk) for the per-flow TCP counters of tcp_goodput and tcp_retransmissions, the packet
matching of match_packets, the queue events of queue_occupancy and the one-way delay
summary, each giving the DataFrame API's numbers (analysis/metrics.py, analysis/match.py,
analysis/queue.py re-export or call them; tests/analysis/test_fastpath.py checks).

This module imports numpy and numba only: a process that analyses a trial on arrays does not
pay for importing pandas.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "match_times",
    "queue_levels",
    "summarize_owd",
    "tcp_flow_counters",
    "undecided",
]

_ACK, _FIN = 0x10, 0x01
_NEVER = 2**62

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


def undecided(ts_ns: np.ndarray, forwarded: np.ndarray, *, max_delay_ns: int, end_ns: int):
    """True for packets that were not seen downstream but could still have been in transit at
    ``end_ns``: sent after end_ns - max_delay_ns and after the last packet (of the same
    capture, in send order) that was seen downstream; through a FIFO path, a packet sent
    before one that arrived would have arrived too, so it was lost."""
    if not len(ts_ns):
        return np.zeros(0, dtype=bool)
    last_fwd = ts_ns[forwarded].max() if forwarded.any() else np.iinfo(np.int64).min
    return ~forwarded & (ts_ns > end_ns - max_delay_ns) & (ts_ns > last_fwd)


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


def summarize_owd(owd_df) -> dict:
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
