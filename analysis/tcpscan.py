"""Per-flow TCP counters in compiled passes over packet columns: the numbers of
``analysis.metrics.tcp_goodput`` and ``tcp_retransmissions``, exactly, without building the
per-packet data and ACK tables.

Definitions are those of analysis/metrics.py: a flow is a direction (src, dst, sport, dport)
that carried payload, numbered by its first payload packet in file order; packets are taken
in time order (stable); sequence and ACK numbers are unwrapped by summing signed 32-bit
steps, the flow's first data-or-FIN packet anchoring both.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["tcp_flow_counters"]

_ACK, _FIN = 0x10, 0x01
_NEVER = 2**62
_EMPTY = np.int64(-1)


@njit(cache=True, nogil=True, inline="always")
def _s32(x):
    return ((x + 2**31) & 0xFFFFFFFF) - 2**31


@njit(cache=True, nogil=True, inline="always")
def _slot(k1, k2, mask):
    h = (k1 * np.uint64(0x9E3779B97F4A7C15)) ^ (k2 * np.uint64(0xBF58476D1CE4E5B9))
    return np.int64((h ^ (h >> np.uint64(29))) & np.uint64(mask))


@njit(cache=True, nogil=True)
def _directions(src, dst, sport, dport, proto):
    """Direction id of each TCP packet (-1 for others), ids in order of first appearance;
    the 4-tuple of each id; the id of each direction's reverse (-1 if never seen)."""
    n = len(src)
    size = 1024
    while size < 2 * n + 2:
        size *= 2
    mask = size - 1
    table = np.full(size, -1, np.int64)
    keys1 = np.empty(n + 1, np.uint64)
    keys2 = np.empty(n + 1, np.uint64)
    ids = np.full(n, -1, np.int64)
    m = 0
    for i in range(n):
        if proto[i] != 6:
            continue
        k1 = np.uint64(src[i]) << np.uint64(32) | np.uint64(dst[i])
        k2 = np.uint64(sport[i]) << np.uint64(16) | np.uint64(dport[i])
        s = _slot(k1, k2, mask)
        while True:
            j = table[s]
            if j < 0:
                table[s] = m
                keys1[m], keys2[m] = k1, k2
                ids[i] = m
                m += 1
                break
            if keys1[j] == k1 and keys2[j] == k2:
                ids[i] = j
                break
            s = (s + 1) & mask
    rev = np.full(m, -1, np.int64)
    for d in range(m):
        k1 = keys1[d] << np.uint64(32) | keys1[d] >> np.uint64(32)
        k2 = (keys2[d] & np.uint64(0xFFFF)) << np.uint64(16) | keys2[d] >> np.uint64(16)
        s = _slot(k1, k2, mask)
        while table[s] >= 0:
            j = table[s]
            if keys1[j] == k1 and keys2[j] == k2:
                rev[d] = j
                break
            s = (s + 1) & mask
    return ids, m, rev


@njit(cache=True, nogil=True)
def _counters(order, ids, m, rev, ts, flags, seq, ack, plen, has_start, start_ns, has_end, end_ns):
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
    for k in range(len(order)):
        i = order[k]
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
    for k in range(len(order)):
        i = order[k]
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
    if len(ts) < 2 or (ts[1:] >= ts[:-1]).all():
        order = np.arange(len(ts))
    else:
        order = np.argsort(ts, kind="stable")
    first_data, packets, retx, retx_bytes, nbytes, span = _counters(
        order, ids, m, rev, ts, cols["tcp_flags"], cols["seq"], cols["ack"],
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
