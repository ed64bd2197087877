"""The whole-trial analysis on arrays, without pandas: compiled passes (numba, cached on
disk) giving the DataFrame API's numbers (tests/analysis/test_fastpath.py checks; metrics.py
re-exports the array functions).

``scan`` reads a capture once and keeps, per packet, only what a trial's metrics read, with
each packet's direction found while reading (no flow table rebuilt per metric), and, given
the (src, dst) pairs through a bottleneck, the time, key and size of their packets only;
``flow_counters`` gives tcp_goodput's and tcp_retransmissions' numbers from it (or
``tcp_flow_counters`` from read_columns' columns); ``match_times`` / ``match_rows`` pair
packets before and after a router as match_packets does; ``queue_levels`` gives
queue_occupancy's events and occupancy; ``undecided`` and ``summarize_owd`` finish the
one-way delay. A trial's analysis keeps one capture's columns in memory at a time.

This module imports numpy and numba only: a process that analyses a trial on arrays does not
pay for importing pandas.
"""

from __future__ import annotations

import os
import queue
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from analysis.pcapscan import (
    _GLOBAL_HDR,
    _MAX_CAPLEN,
    _REC_HDR,
    _alloc,
    _fit,
    _give_back,
    _headers,
    _ipv4_at,
    _key_hash,
    _payload_head,
    _plain_tcp,
    _record,
    _tcp_headers,
    _u32,
)

_U = np.uint64

__all__ = [
    "Capture",
    "ack_column",
    "crossing_times",
    "flow_counters",
    "key_hashes",
    "match_rows",
    "match_times",
    "queue_levels",
    "scan",
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
def _direction_ids(src, dst, sport, dport, proto, ids, start, table, keys1, keys2, m):
    """_directions' ids of the TCP packets from row ``start`` on, until a new direction would
    fill the table past half: (the row reached, directions so far).

    The table grows in _directions, not here: numba compiles a loop that reassigns its
    arrays into much slower code (README, make bench)."""
    for i in range(start, len(src)):
        if proto[i] != 6:
            continue
        k1 = np.uint64(src[i]) << np.uint64(32) | np.uint64(dst[i])
        k2 = np.uint64(sport[i]) << np.uint64(16) | np.uint64(dport[i])
        s = _find(table, keys1, keys2, k1, k2)
        if table[s] >= 0:
            ids[i] = table[s]
            continue
        if 2 * (m + 1) > len(table):
            return i, m
        table[s] = m
        keys1[m], keys2[m] = k1, k2
        ids[i] = m
        m += 1
    return len(src), m


@njit(cache=True, nogil=True)
def _directions(src, dst, sport, dport, proto):
    """Direction id of each TCP packet (-1 for others), ids in order of first appearance;
    the number of directions; the id of each direction's reverse (-1 if never seen)."""
    table = np.full(1024, -1, np.int64)  # grows at half full: sized by directions, not packets
    keys1 = np.empty(512, np.uint64)
    keys2 = np.empty(512, np.uint64)
    ids = np.full(len(src), -1, np.int32)
    i, m = _direction_ids(src, dst, sport, dport, proto, ids, 0, table, keys1, keys2, 0)
    while i < len(src):
        keys1 = np.concatenate((keys1, np.empty(len(keys1), np.uint64)))
        keys2 = np.concatenate((keys2, np.empty(len(keys2), np.uint64)))
        table = np.full(2 * len(table), -1, np.int64)
        _rehash(table, keys1, keys2, m)
        i, m = _direction_ids(src, dst, sport, dport, proto, ids, i, table, keys1, keys2, m)
    rev = np.full(m, -1, np.int64)
    for d in range(m):
        k1 = keys1[d] << np.uint64(32) | keys1[d] >> np.uint64(32)
        k2 = (keys2[d] & np.uint64(0xFFFF)) << np.uint64(16) | keys2[d] >> np.uint64(16)
        rev[d] = table[_find(table, keys1, keys2, k1, k2)]
    return ids, m, rev


@njit(cache=True, nogil=True)
def _first_data(ids, m, plen):
    """Per direction (index d < m): the file row of its first payload packet, -1 if none."""
    first_data = np.full(m, _EMPTY)
    for i in range(len(ids)):
        d = ids[i]
        if d >= 0 and plen[i] > 0 and first_data[d] < 0:
            first_data[d] = i
    return first_data


@njit(cache=True, nogil=True)
def _counters(
    first_data, order, ids, m, rev, ts, flags, seq, ack, plen, merged, data_rows, data_acks,
    has_start, start_ns, has_end, end_ns, ack_rows,
):  # fmt: skip
    """Per direction (index d < m): see tcp_flow_counters; rows visited in ``order``;
    ``first_data``: _first_data's rows (a scan records them as it reads); ``ack_rows``: room
    for a row per packet (len(ids)). The pass over the data also lists, in time order, the
    rows of the packets that ACK a flow's data (every row is written, the count advances for
    these), and the pass over the ACKs reads only that list: skipping every packet of the
    other kind in a second full pass was a third of the time (mispredicted branches).
    ``merged``: ``seq`` and ``ack`` are one scan's seq_or_ack, and the acks of data and FIN
    packets come from ``data_rows``/``data_acks`` (its data_acks, see Capture) or repeat
    their direction's last ack: rows in file order (``order`` empty) only."""
    assert len(ack_rows) >= len(ids)
    assert not merged or len(order) == 0  # merged: the data packets' acks follow file order
    acks_a_flow = np.zeros(m, np.bool_)  # the direction's packets ACK a flow's data
    for d in range(m):
        acks_a_flow[d] = rev[d] >= 0 and first_data[rev[d]] >= 0
    n_acks = 0
    # data and FIN packets of flows, in time order; and the list of the flows' ACKs
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
        i = _row(order, k)
        d = ids[i]
        if d < 0:
            continue
        ack_rows[n_acks] = i
        n_acks += acks_a_flow[d] & ((flags[i] & _ACK) != 0)
        if first_data[d] < 0:
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
    last = np.zeros(m, np.int64)  # merged: each direction's last ack (its ACKs are all listed)
    listed = 0  # merged: data_rows before row i
    for a in range(n_acks):
        i = ack_rows[a]
        f = rev[ids[i]]
        raw = np.int64(ack[i])
        if merged:
            if plen[i] > 0 or (flags[i] & _FIN) != 0:  # seq_or_ack holds its seq
                while listed < len(data_rows) and data_rows[listed] < i:
                    listed += 1
                listed_here = listed < len(data_rows) and data_rows[listed] == i
                raw = np.int64(data_acks[listed]) if listed_here else last[ids[i]]
            last[ids[i]] = raw
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
    return packets, retx, retx_bytes, nbytes, span


@njit(cache=True, nogil=True)
def _match(hb, tb, ha, ta, delay, order_b, order_a, out, dep):
    """ts_out of each before row (-1: none): analysis.match's greedy FIFO matching, and if
    ``dep`` has room, the matched before rows in the after rows' time order.

    One pass over both sides in time order (before first at equal times): a before packet
    waits from its time until it is matched or its window closes; each after packet takes
    the earliest waiting packet of its key whose window holds it. All windows have the same
    length, so this gives the matching of the before-side greedy rule. A router's queue is
    FIFO, so that packet is nearly always the earliest one waiting: the waiting packets from
    ``head`` (a time rank) on are left where they are, and an after packet compares its key
    with head's only. A packet passed over (another key: dropped, or reordered) waits in a
    small hash table instead, whose packets are all earlier than head's: a key found there
    is the earliest. The table holds the packets passed over until matched or their window
    closes (drops, a few reordered), not the capture: it stays in the CPU's cache. Writes
    ``out`` (one per before row) and ``dep`` (room for one per after row, or none); returns
    how many matched."""
    slots = np.full((1024, 2), -1, np.int64)  # per slot: the key's bits, the time rank
    out[:] = -1
    state = np.zeros(4, np.int64)  # after packet, head, packets in the table, matched
    while not _match_until_full(hb, tb, ha, ta, delay, order_b, order_a, out, dep, slots, state):
        t = ta[_row(order_a, state[0])]  # at most half full: the closed ones go
        slots, state[2] = _waiting_again(slots, tb, order_b, delay, t)
    return state[3]


@njit(cache=True, nogil=True)
def _match_until_full(hb, tb, ha, ta, delay, order_b, order_a, out, dep, slots, state):
    """_match's pass from ``state`` (the after packet's time rank, head, the packets in the
    table, how many matched) on: True once every after packet is seen, False (and ``state``
    where to resume) when a packet passed over would fill the table past half. _match
    rebuilds the table between calls: numba compiles a loop that reassigns its table into
    much slower code (README, make bench)."""
    nb, na = len(hb), len(ha)
    departures = len(dep) > 0
    ka, head, used, matched = state[0], state[1], state[2], state[3]
    while ka < na:
        j = _row(order_a, ka)
        t = ta[j]
        h = np.int64(ha[j])
        best_rank = -1
        if used:  # the packets passed over first: each is earlier than head
            best_rank = _take(slots, h, t, tb, order_b, delay)
            if best_rank >= 0:
                used -= 1
        while best_rank < 0 and head < nb:  # then the waiting packets from head, in order
            i = _row(order_b, head)
            if tb[i] > t:
                break
            head += 1
            if tb[i] + delay < t:
                continue  # its window closed before this after packet: not forwarded
            if np.int64(hb[i]) == h:
                best_rank = head - 1
                break
            if 2 * (used + 1) > len(slots):  # this packet again once the table is rebuilt
                state[0], state[1], state[2], state[3] = ka, head - 1, used, matched
                return False  # _take found no open packet of this key; a rebuild keeps
                # open ones only, so on resuming it finds none again
            _put(slots, np.int64(hb[i]), head - 1)  # passed over: it waits in the table
            used += 1
        if best_rank >= 0:
            i = _row(order_b, best_rank)
            out[i] = t
            if departures:
                dep[matched] = i
            matched += 1
        ka += 1
    state[0], state[1], state[2], state[3] = ka, head, used, matched
    return True


@njit(cache=True, nogil=True, inline="always")
def _take(slots, key, t, tb, order_b, delay):
    """The earliest time rank of ``key`` in _match's table whose window holds t, taken out of
    the table (backward-shift deletion: every probe chain stays whole); -1 if none."""
    m = np.uint64(len(slots) - 1)
    p = np.uint64(key) & m
    best, best_rank = -1, np.iinfo(np.int64).max
    while slots[p, 1] >= 0:
        r = slots[p, 1]
        if slots[p, 0] == key and r < best_rank and tb[_row(order_b, r)] + delay >= t:
            best, best_rank = np.int64(p), r
        p = (p + np.uint64(1)) & m
    if best < 0:
        return -1
    hole = np.uint64(best)
    q = (hole + np.uint64(1)) & m
    while slots[q, 1] >= 0:
        if ((q - (np.uint64(slots[q, 0]) & m)) & m) >= ((q - hole) & m):
            slots[hole, 0], slots[hole, 1] = slots[q, 0], slots[q, 1]
            hole = q
        q = (q + np.uint64(1)) & m
    slots[hole, 1] = -1
    return best_rank


@njit(cache=True, nogil=True, inline="always")
def _put(slots, key, rank):
    """Place (key, rank) in the first free slot from the key's own (linear probing)."""
    m = np.uint64(len(slots) - 1)
    p = np.uint64(key) & m
    while slots[p, 1] >= 0:
        p = (p + np.uint64(1)) & m
    slots[p, 0], slots[p, 1] = key, rank


@njit(cache=True, nogil=True)  # LLVM inlines it; numba's inline="always" made callers slower
def _row(order, k):
    """The row of time rank k: ``order[k]``, or k itself where the rows are in time order
    (``order`` empty)."""
    return order[k] if len(order) else k


@njit(cache=True, nogil=True)
def _waiting_again(slots, tb, order_b, delay, t):
    """_match's table without the packets whose window closed before t, at most a quarter
    full: (slots, entries)."""
    live = 0
    for s in range(len(slots)):
        r = slots[s, 1]
        live += r >= 0 and tb[_row(order_b, r)] + delay >= t
    size = 1024
    while size < 4 * (live + 1):
        size *= 2
    new = np.full((size, 2), -1, np.int64)
    for s in range(len(slots)):
        r = slots[s, 1]
        if r < 0 or tb[_row(order_b, r)] + delay < t:
            continue
        _put(new, slots[s, 0], r)
    return new, live


@njit(cache=True, nogil=True)
def _key_hashes(src, dst, proto, sport, dport, ip_id, seq, head, out):
    for i in range(len(out)):
        addrs = _U(src[i]) << _U(32) | _U(dst[i])
        out[i] = _key_hash(addrs, proto[i], sport[i], dport[i], ip_id[i], seq[i], head[i])


def key_hashes(src, dst, proto, sport, dport, ip_id, seq, payload_head) -> np.ndarray:
    """``analysis.match.key_hash`` of each packet, from its KEY_COLUMNS (arrays, in that
    order), in one compiled pass, as a scan computes it while reading."""
    out = np.empty(len(src), np.uint64)
    _key_hashes(src, dst, proto, sport, dport, ip_id, seq, payload_head, out)
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
    return _match_rows(hash_before, ts_before, hash_after, ts_after, max_delay_ns, False)[0]


def match_rows(
    hash_before: np.ndarray,
    ts_before: np.ndarray,
    hash_after: np.ndarray,
    ts_after: np.ndarray,
    *,
    max_delay_ns: int,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`match_times`, and the matched rows of before in the order the after capture
    saw them (time order): the departures of :func:`queue_levels`, without a sort."""
    return _match_rows(hash_before, ts_before, hash_after, ts_after, max_delay_ns, True)


def _match_rows(hash_before, ts_before, hash_after, ts_after, max_delay_ns, departures):
    out = _alloc(len(hash_before), np.int64)
    dep = _alloc(len(hash_after) if departures else 0, np.int32)
    matched = _match(
        hash_before, ts_before, hash_after, ts_after, int(max_delay_ns), _time_order(ts_before),
        _time_order(ts_after), out, dep,
    )  # fmt: skip
    return out, dep[:matched]


def _time_order(ts: np.ndarray, in_order: bool | None = None) -> np.ndarray:
    """The rows by time (stable argsort), or none when they are in time order already
    (``in_order``, if known; else checked): what _row reads."""
    if in_order is None:
        in_order = not (ts[1:] < ts[:-1]).any()
    return np.empty(0, np.int64) if in_order else np.argsort(ts, kind="stable")


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
    first_data = _first_data(ids, m, cols["payload_len"])
    packets, retx, retx_bytes, nbytes, span = _counters(
        first_data, _time_order(ts), ids, m, rev, ts, cols["tcp_flags"], cols["seq"], cols["ack"],
        cols["payload_len"], False, _NO_ROWS, _NO_ACKS, start_ns is not None,
        0 if start_ns is None else int(start_ns), end_ns is not None,
        0 if end_ns is None else int(end_ns), _row_room(len(ids)),
    )  # fmt: skip
    flows = _in_first_data_order(first_data)
    rows = first_data[flows]
    ends = {c: cols[c][rows] for c in ("src", "dst", "sport", "dport")}
    return _flow_table(ends, flows, packets, retx, retx_bytes, nbytes, span)


_NO_ROWS, _NO_ACKS = np.empty(0, np.int32), np.empty(0, np.uint32)  # _counters' data acks


def _row_room(n: int) -> np.ndarray:
    """Room for n row numbers (pcapscan._alloc: in huge pages from 1 MB on)."""
    return _alloc(n, np.int32 if n < 2**31 else np.int64)


def _in_first_data_order(first_data: np.ndarray) -> np.ndarray:
    """The directions that carried data, in the order of their first data packet."""
    flows = np.flatnonzero(first_data >= 0)
    return flows[np.argsort(first_data[flows], kind="stable")]


def _flow_table(ends, flows, packets, retx, retx_bytes, nbytes, span) -> dict[str, np.ndarray]:
    """One row per data-carrying flow: its four ends, then the _counters of it."""
    return {
        **ends,
        "data_packets": packets[flows],
        "retransmitted_packets": retx[flows],
        "retransmitted_bytes": retx_bytes[flows],
        "bytes": nbytes[flows],
        "span_ns": span[flows],
    }


def undecided(ts_ns: np.ndarray, forwarded: np.ndarray, *, max_delay_ns: int, end_ns: int):
    """True for packets that were not seen downstream but could still have been in transit at
    ``end_ns``: sent after end_ns - max_delay_ns and after the last packet (of the same
    capture, in send order) that was seen downstream; through a FIFO path, a packet sent
    before one that arrived would have arrived too, so it was lost."""
    if not len(ts_ns):
        return np.zeros(0, dtype=bool)
    last_fwd = ts_ns[forwarded].max() if forwarded.any() else np.iinfo(np.int64).min
    return ~forwarded & (ts_ns > end_ns - max_delay_ns) & (ts_ns > last_fwd)


_QUEUE_SPLIT_MIN = 1 << 20  # queue events from which queue_levels merges two halves at once
_QUEUE_PIECE = 1 << 18  # events merged between two give-backs of what the merge passed (consume)


_sharing = 1  # processes analysing side by side on this process's CPUs (see share_cpus)


def share_cpus(processes: int) -> None:
    """This process is one of ``processes`` that analyse side by side on the same CPUs
    (analysis.workers' worker processes): its compiled passes take their share of the CPUs
    by default, not two threads each in every process."""
    global _sharing
    _sharing = max(int(processes), 1)


def _cpus() -> int:
    """Threads a compiled pass may use by default: 2 where the process's share of the CPUs
    it may run on (all of them, unless share_cpus said otherwise) is two or more."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(min(2, (cpus or 1) // _sharing), 1)


def queue_levels(
    ts_ns: np.ndarray,
    ts_out_ns: np.ndarray,
    frame_bytes: np.ndarray,
    *,
    delay_ns: int = 0,
    max_delay_ns: int,
    end_ns: int | None = None,
    departures: np.ndarray | None = None,
    header_bytes: int = 0,
    rows: bool = False,
    threads: int | None = None,
    consume: bool = False,
) -> dict[str, np.ndarray]:
    """The events and occupancy of ``analysis.queue.queue_occupancy`` as arrays (ts_ns,
    event code 0 departure / 1 arrival / 2 drop, frame_bytes, packets, bytes), from the
    packets arriving at the queue (time, ``match_times`` result, frame size): the same
    numbers without building the per-event table with address strings. Arrivals in time
    order (as a capture is written) are merged with the departures in one compiled pass;
    departures not in arrival order (several FIFOs, or none) are taken in the order of
    ``departures`` (the rows by departure time, as :func:`match_rows` gives them), else
    sorted first; a writable int32 ``departures`` is put in that order in place, not copied
    (4 bytes a departure less at the peak), and holds the same rows afterwards, perhaps
    reordered. ``header_bytes`` is added to every frame_bytes value (14 when they are IP
    lengths). Sizes come in the narrowest integers that hold them; the occupancy is first
    written in 16-bit packets and 32-bit bytes (16-bit where the frame sizes bound them so), a
    queue rarely holding more, and counted again from the events (running sums) in the
    narrowest types its measured range needs where it did not fit (4.1 M events: 25 MB less
    at the peak than 32-bit packets and 64-bit bytes; arithmetic on them wants a wider type
    first). ``rows``: also each event's row in the input (``row``: whose packet arrived, left
    or was dropped).
    ``threads``: 2 (the default where the process may run on two CPUs) merges the two halves
    of _QUEUE_SPLIT_MIN events or more at once, the second from the state before its first
    arrival, counted from the arrivals, drops and departures before it (the same events).
    ``consume``: for a caller done with ``ts_ns`` and ``departures``: the pages of their rows
    the merge has passed are given back to the system as it goes (they read as zeros
    afterwards; only arrays of pcapscan._alloc, such as scan's and match_rows', and
    ``departures`` only where it is put in order in place, or whole when the merge does not
    read it): 8 bytes an arrival and 4 a departure less at the end, when the events are all
    held."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    out_ts = np.asarray(ts_out_ns, dtype=np.int64)
    size = np.asarray(frame_bytes)
    add = int(header_bytes)
    low, high = (int(size.min()) + add, int(size.max()) + add) if len(size) else (0, 0)
    if low < -(2**31) or high >= 2**31:
        raise ValueError("frame sizes beyond 32 bits")
    if len(ts) >= 2**31:
        raise ValueError(f"{len(ts)} packets: queue_levels counts occupancy in 32 bits")
    end_ns, last_fwd, n_fwd, n_cut, arr_sorted, dep_sorted = _queue_plan(
        ts, out_ts, -1 if end_ns is None else int(end_ns), end_ns is None, int(max_delay_ns)
    )
    if arr_sorted:  # arrivals in time order: merge them with the departures
        order = np.empty(0, np.int32)  # departures in row order
        if not dep_sorted and departures is not None:
            listed = np.asarray(departures)
            flags = listed.flags
            own = listed.dtype == np.int32 and flags.writeable and flags.c_contiguous
            if not own:
                listed = _alloc(len(listed), np.int32)
                listed[:] = departures
            order = _departure_order(listed, out_ts, n_fwd)
        if not dep_sorted and not len(order):  # not one FIFO: by time, stably
            order = np.argsort(out_ts, kind="stable")[len(out_ts) - n_fwd :]
        given = np.asarray([] if departures is None else departures)
        if consume and not np.shares_memory(order, given):
            _give_back(given, 0, len(given))  # the merge does not read it
        n = len(ts) - n_cut + n_fwd
        total = max(abs(low), abs(high)) * len(size)  # bound of the occupancy in bytes
        sizes = _alloc(n, np.uint16 if low >= 0 and high < 2**16 else np.int32)
        t, code = _alloc(n, np.int64), _alloc(n, np.int8)
        row = _alloc(n if rows else 0, np.int32)
        cut = end_ns - int(max_delay_ns)
        streams = (ts, out_ts, size, add, int(delay_ns), order, n_fwd, cut, last_fwd)
        threads = _cpus() if threads is None else threads
        bound = _signed(-total, total, np.int16)  # what the sizes allow, else 32 bits first
        kinds = (np.int16, bound if np.dtype(bound).itemsize < 4 else np.int32)
        packets, nbytes = _alloc(n, kinds[0]), _alloc(n, kinds[1])
        outputs = (sizes, nbytes, t, code, packets, row)
        seen = _queue_merged(streams, outputs, n, threads, consume)
        need = (_signed(*seen[:2], np.int16), _signed(*seen[2:], np.int16))
        if not all(_wide_enough(k, w) for k, w in zip(kinds, need, strict=True)):
            # written in too few bits: counted again from the events, in the types it needs
            packets = nbytes = outputs = None  # not held beside the wider ones
            packets, nbytes = _alloc(n, need[0]), _alloc(n, need[1])
            _levels(code, sizes, packets, nbytes)
        return {
            "ts_ns": t,
            "event": code,
            "frame_bytes": sizes,
            "packets": packets,
            "bytes": nbytes,
            **({"row": row} if rows else {}),
        }
    fwd = out_ts >= 0
    keep = np.flatnonzero(~undecided(ts, fwd, max_delay_ns=max_delay_ns, end_ns=end_ns))
    ts, fwd, out_ts = ts[keep], fwd[keep], out_ts[keep]
    size = size[keep].astype(np.int32) + add
    dep = out_ts[fwd]
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
        **({"row": np.r_[keep, keep[fwd]][order].astype(np.int32)} if rows else {}),
    }


def _signed(lo: int, hi: int, narrowest) -> type:
    """The narrowest signed integer type from ``narrowest`` up that holds lo to hi."""
    for kind in (np.int16, np.int32, np.int64):
        if np.dtype(kind).itemsize >= np.dtype(narrowest).itemsize:
            info = np.iinfo(kind)
            if info.min <= lo and hi <= info.max:
                return kind
    raise ValueError(f"queue occupancy {lo} to {hi}: beyond 64 bits")


def _wide_enough(kind, needed) -> bool:
    return np.dtype(kind).itemsize >= np.dtype(needed).itemsize


def _queue_merged(streams, outputs, n: int, threads: int, consume: bool) -> tuple:
    """_queue_merge over all n events, as two halves at once where ``threads`` and n allow;
    the least and most packets and bytes queued (the levels written must hold them).
    ``consume``: see queue_levels."""
    ts, out_ts, *_, order, _, cut, last_fwd = streams
    start = _queue_start(ts, out_ts, cut, last_fwd)
    middle = _next_arrival(out_ts, len(ts) // 2)
    ends = (len(ts), len(order))  # rows of ts and of order a merge may give back below
    if threads > 1 and n >= _QUEUE_SPLIT_MIN and middle < len(ts):
        # Two halves at once: the second from the state before the middle arrival.
        half = _queue_state(*streams, middle)
        bound = (min(half[1], half[2]), half[3])  # the first row and departure it reads
        # The first half reads up to the second's first arrival, drop and departure (its
        # next ones when it ends): the second gives back only what lies past them.
        after = (min(max(half[1], half[2]) + 1, len(ts)), min(half[3] + 1, len(order)))
        with ThreadPoolExecutor(1, thread_name_prefix="queue-half") as pool:
            later = pool.submit(
                _merge_range, streams, outputs, half[0], n, half[1:], consume and (after, ends)
            )
            first = _merge_range(
                streams, outputs, 0, half[0], start[1:], consume and ((0, 0), bound)
            )
            second = later.result()
        if consume:  # what both read
            _give_back(ts, bound[0], after[0])
            _give_back(order, bound[1], after[1])
        return _both(first, second)
    return _merge_range(streams, outputs, 0, n, start[1:], consume and ((0, 0), ends))


def _merge_range(streams, outputs, k0: int, k1: int, state, passed) -> tuple:
    """_queue_merge of events k0 to k1 from ``state``: the least and most levels. With
    ``passed`` ((first row, first departure), (end row, end departure): the rows of ts and of
    order that only this range reads), a piece at a time, the rows of ts and order among
    them before the merge's next arrival, drop and departure given back after each piece."""
    if not passed:
        return _queue_merge(*streams, *outputs, k0, k1, *state)[:4]
    ts, order = streams[0], streams[5]
    (row0, dep0), (row_end, dep_end) = passed
    seen = None
    for a in range(k0, max(k1, k0 + 1), _QUEUE_PIECE):
        got = _queue_merge(*streams, *outputs, a, min(a + _QUEUE_PIECE, k1), *state)
        state = got[4:]
        i_arr, i_drop, i_dep = state[:3]
        _give_back(ts, row0, min(i_arr, i_drop, row_end))
        _give_back(order, dep0, min(i_dep, dep_end))
        seen = got[:4] if seen is None else _both(seen, got)
    return seen


def _both(a, b) -> tuple:
    """The least and most packets and bytes of two merges' (lo_p, hi_p, lo_b, hi_b)."""
    return min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3])


@njit(cache=True, nogil=True)
def _levels(code, size, packets, nbytes):
    """The occupancy after each event (packets, bytes) from the events' codes and frame
    sizes: what _queue_merge wrote, again, in the types of ``packets`` and ``nbytes``."""
    level = level_bytes = 0
    for k in range(len(code)):
        if code[k] == 1:
            level, level_bytes = level + 1, level_bytes + size[k]
        elif code[k] == 0:
            level, level_bytes = level - 1, level_bytes - size[k]
        packets[k], nbytes[k] = level, level_bytes


@njit(cache=True, nogil=True)
def _queue_plan(ts, out_ts, end_ns, default_end, max_delay_ns):
    """end_ns (default: the last departure, else the last arrival), the last forwarded
    packet's arrival, how many were forwarded and how many are undecided (see
    :func:`undecided`), whether arrivals are in time order, and departures too (in row
    order)."""
    last_fwd = np.iinfo(np.int64).min
    last_ts = last_dep = np.iinfo(np.int64).min
    n_fwd = 0
    arr_sorted = dep_sorted = True
    for i in range(len(ts)):
        arr_sorted &= ts[i] >= last_ts
        last_ts = ts[i]
        if out_ts[i] >= 0:
            n_fwd += 1
            dep_sorted &= out_ts[i] >= last_dep
            last_dep = out_ts[i]
            last_fwd = max(last_fwd, ts[i])
    if default_end:
        end_ns = np.int64(0)
        for i in range(len(ts)):
            end_ns = max(end_ns, out_ts[i] if n_fwd else ts[i])
    n_cut = 0
    for i in range(len(ts)):
        n_cut += out_ts[i] < 0 and ts[i] > end_ns - max_delay_ns and ts[i] > last_fwd
    return end_ns, last_fwd, n_fwd, n_cut, arr_sorted, dep_sorted


@njit(cache=True, nogil=True)
def _departure_order(out, out_ts, n_fwd):
    """``out`` (every forwarded row once, in the order the capture after the router saw
    them) put in order by (departure time, row), in place, or an empty array when it is not
    that (``out`` then holds the same rows, perhaps partly reordered). Packets that
    left within one timestamp tick (µs in a classic pcap) may be listed out of row order:
    those short runs are put in order by insertion, which stays linear while the list is
    nearly in order; beyond a budget of moves the caller sorts instead."""
    none = out[:0]
    if len(out) != n_fwd:
        return none
    budget = 8 * len(out) + 64  # element moves; a general shuffle exhausts it quickly
    for k in range(len(out)):
        r = out[k]
        if r < 0 or r >= len(out_ts) or out_ts[r] < 0:
            return none
        t = out_ts[r]
        j = k
        while j > 0 and (out_ts[out[j - 1]] > t or (out_ts[out[j - 1]] == t and out[j - 1] > r)):
            out[j] = out[j - 1]
            j -= 1
            budget -= 1
            if budget < 0:
                out[j] = r  # the same rows, for a caller that reads them again
                return none
        out[j] = r
    for k in range(1, len(out)):  # strictly increasing: no row twice
        if out[k] == out[k - 1]:
            return none
    return out


@njit(cache=True, nogil=True)  # as _row: inlined by LLVM, not numba
def _next_arrival(out_ts, i):
    """The first forwarded row from i on (len(out_ts) if none)."""
    while i < len(out_ts) and out_ts[i] < 0:
        i += 1
    return i


@njit(cache=True, nogil=True, inline="always")
def _next_drop(ts, out_ts, i, cut, last_fwd):
    while i < len(out_ts) and (out_ts[i] >= 0 or (ts[i] > cut and ts[i] > last_fwd)):
        i += 1
    return i


@njit(cache=True, nogil=True)
def _queue_start(ts, out_ts, cut, last_fwd):
    """_queue_merge's state before its first event: (0, first arrival, first drop, 0, first
    departure in row order, level 0, 0 bytes)."""
    first = _next_arrival(out_ts, 0)
    return 0, first, _next_drop(ts, out_ts, 0, cut, last_fwd), 0, first, 0, 0


@njit(cache=True, nogil=True)
def _queue_state(ts, out_ts, size, add, delay, order, n_fwd, cut, last_fwd, j):
    """_queue_merge's state before the event of the arrival of forwarded row j: (its event's
    number, j, the next drop, departures before, the next departure in row order, packets
    and bytes queued). Before it: the arrivals of the forwarded rows before j (rows are in
    time order), the drops before its time (at its time, drops come after it), the
    departures up to its time (at its time, they come first)."""
    tj = ts[j]
    arrivals, queued_bytes, drops = 0, 0, 0
    for r in range(j):
        if out_ts[r] >= 0:
            arrivals += 1
            queued_bytes += size[r] + add
        elif ts[r] < tj and not (ts[r] > cut and ts[r] > last_fwd):
            drops += 1
    s = j
    while s > 0 and ts[s - 1] == tj:
        s -= 1
    i_drop = _next_drop(ts, out_ts, s, cut, last_fwd)
    ta = tj + delay
    left, r_dep = 0, 0
    if len(order) > 0:  # departures by time: the first after ta, by bisection
        lo, hi = 0, n_fwd
        while lo < hi:
            mid = (lo + hi) // 2
            if out_ts[order[mid]] <= ta:
                lo = mid + 1
            else:
                hi = mid
        left = lo
        for i in range(left):
            queued_bytes -= size[order[i]] + add
    else:  # departures in row order are in time order
        r = _next_arrival(out_ts, 0)
        while r < len(out_ts) and out_ts[r] <= ta:
            left += 1
            queued_bytes -= size[r] + add
            r = _next_arrival(out_ts, r + 1)
        r_dep = r
    return arrivals + drops + left, j, i_drop, left, r_dep, arrivals - left, queued_bytes


@njit(cache=True, nogil=True)
def _queue_merge(
    ts, out_ts, size, add, delay, order, n_fwd, cut, last_fwd, out_size, nbytes, t, code, packets,
    row, k0, k1, i_arr, i_drop, i_dep, r_dep, level, level_bytes,
):  # fmt: skip
    """queue_levels' events for arrivals in time order: a three-way merge of departures (in
    ``order``, else in row order), arrivals (forwarded rows) and drops (the others, but the
    undecided: after ``cut`` and ``last_fwd``); at equal times in that order, then in row
    order. Each event's time goes to ``t``, its code to ``code``, its frame size (size + add)
    to ``out_size``, the occupancy after it to ``packets`` and ``nbytes`` (the least and
    most of both are returned: the caller checks their types held them), and its packet's
    row to ``row`` if it has room. Events k0 to k1 from the state before event k0 (see
    _queue_start and _queue_state); then the state after them (i_arr, i_drop, i_dep, r_dep,
    level, level_bytes) follows the least and most."""
    big = np.iinfo(np.int64).max
    lo_p = hi_p = np.int64(level)
    lo_b = hi_b = np.int64(level_bytes)
    rows = len(ts)
    by_order = len(order) > 0
    rows_too = len(row) > 0
    for k in range(k0, k1):
        ta = ts[i_arr] + delay if i_arr < rows else big
        tx = ts[i_drop] + delay if i_drop < rows else big
        r = order[i_dep] if by_order and i_dep < n_fwd else r_dep
        td = out_ts[r] if i_dep < n_fwd else big
        if i_dep < n_fwd and td <= ta and td <= tx:
            t[k], code[k], s = td, 0, size[r] + add
            level, level_bytes = level - 1, level_bytes - s
            if rows_too:
                row[k] = r
            i_dep += 1
            if not by_order:
                r_dep = _next_arrival(out_ts, r_dep + 1)
        elif i_arr < rows and ta <= tx:
            t[k], code[k], s = ta, 1, size[i_arr] + add
            level, level_bytes = level + 1, level_bytes + s
            if rows_too:
                row[k] = i_arr
            i_arr = _next_arrival(out_ts, i_arr + 1)
        else:
            t[k], code[k], s = tx, 2, size[i_drop] + add
            if rows_too:
                row[k] = i_drop
            i_drop = _next_drop(ts, out_ts, i_drop + 1, cut, last_fwd)
        out_size[k], packets[k], nbytes[k] = s, level, level_bytes
        lo_p, hi_p = min(lo_p, level), max(hi_p, level)
        lo_b, hi_b = min(lo_b, level_bytes), max(hi_b, level_bytes)
    return lo_p, hi_p, lo_b, hi_b, i_arr, i_drop, i_dep, r_dep, level, level_bytes


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


# One pass per capture: the records are parsed as analysis/pcapscan.py parses them, each
# IPv4 packet gets its direction (a row of a table of (src, dst, sport, dport, proto) that
# the pass builds) and only what a trial's metrics use is kept, in narrow columns.
_BLOCK = 1 << 20  # bytes read at a time: the buffer stays in the CPU's cache
_COLUMNS = ("direction", "ts_ns", "key_hash", "ip_len", "seq_or_ack", "payload_len", "tcp_flags")
_DTYPES = (np.uint8, np.int64, np.uint64, np.uint16, np.uint32, np.uint16, np.uint8)
_CROSSING = ("direction", "ts_ns", "key_hash", "ip_len")  # of a crossing packet
_CROSSING_ONLY = ("key_hash", "ip_len")  # kept for crossing packets only, if they are named
_TABLE0 = 1 << 12  # initial slots of the direction table (it doubles when half full)
_FULL = 3  # _pass stopped before a packet of a new direction: the table must grow first
_ROWS = 4  # _pass stopped before an IPv4 packet: its row would be the second half's first
_WIDE = 5  # _pass stopped before a packet of a new direction: its id would not fit the column
_PAUSED = 6  # a reading stopped between blocks: the other half's stopped with _WIDE
_ID_KINDS = (np.uint8, np.uint16, np.int32)  # direction ids: the narrowest that numbers them
_SPLIT_MIN = 32 << 20  # bytes from which a capture is read as two halves, each in a thread
_CHAIN = 8  # whole record headers in a row that mark where the second half begins
_SAMPLE = 1 << 18  # bytes read at the start and the middle to guess the first half's rows
_MARGIN = 1.05  # the first half's rows: its bytes over the smaller sample's bytes a record, +5 %
_SEC_RANGE = (86_400, 366 * 86_400)  # a record's time around the first one's (seconds)
_MOVE = 1 << 22  # bytes of a column moved at a time when the halves are joined


@dataclass
class Capture:
    """One pass over a capture (:func:`scan`): per IPv4 packet, in file order, its row in
    ``directions`` and the columns a trial's metrics need (read_pcap's names and values, but
    payload_len is 0 where read_pcap's is negative, and seq_or_ack, payload_len and tcp_flags
    are 0 on packets that are not TCP).

    ``seq_or_ack``: a TCP packet's seq if it carries data or FIN, else its ack: the number
    tcp_flow_counters reads of a packet, unless it is a data packet that also ACKs data of
    the other direction (a request-response flow). The acks of data and FIN packets with the
    ACK flag are in ``data_acks`` (``row``, ``ack``) where they differ from the ack before
    them in their direction (and at the first of each direction in each half read), else
    they repeat it; :func:`ack_column` fills them in. A bulk flow's data packets repeat one
    ack: 4 bytes a packet less than an ack column. Where both ends send at once, each data
    packet's ack moves on and is listed: 8 bytes (a row and an ack) instead of 4.

    ``directions``: src, dst, sport, dport, proto, ``first`` (its first packet),
    ``first_data`` (its first TCP packet with payload, -1 if none), ``reverse`` (the opposite
    direction's row, -1 if none) and ``crossing`` (its (src, dst) among the scan's crossing
    pairs) per direction, in order of appearance; ``direction`` in the narrowest of uint8,
    uint16 and int32 that numbers them (a scan reusing a capture's memory: its type, or
    wider), as ``crossing["direction"]``; ``in_order``: timestamps never go back.
    ``crossing``: the rows of the packets crossing a bottleneck when the scan was given its
    (src, dst) pairs (else None), and then key_hash and ip_len are empty."""

    path: str
    direction: np.ndarray
    ts_ns: np.ndarray
    key_hash: np.ndarray
    ip_len: np.ndarray
    seq_or_ack: np.ndarray
    payload_len: np.ndarray
    tcp_flags: np.ndarray
    data_acks: dict[str, np.ndarray]
    directions: dict[str, np.ndarray]
    in_order: bool
    crossing: dict[str, np.ndarray] | None = None
    buffers: list = field(default_factory=list, repr=False)  # the columns' whole allocations


@njit(cache=True, nogil=True, inline="always")
def _among(sorted_keys, key):
    """Whether ``key`` is in the sorted array (a handful of pairs: a binary search)."""
    i = np.searchsorted(sorted_keys, key)
    return i < len(sorted_keys) and sorted_keys[i] == key


@njit(cache=True, nogil=True, boundscheck=False)
def _pass(
    b, limit, size, little, frac_ns, l3_base, et_off, vlan, n, last_ts, in_order,
    table, keys1, keys2, first, first_data, crosses, m, pairs, k, rows, ids, last_ack,
    s_row, s_ack, n_kept, o_dir, o_ts, o_hash, o_len, o_num, o_plen, o_flags, c_dir, c_ts, c_hash,
    c_len,
):  # fmt: skip
    """Parse the records of b[:size] from 0 while pos < limit (as pcapscan._scan) into the
    output columns from row n (o_hash and o_len: if not empty), and the packets of the
    directions from src to dst of one of ``pairs`` (sorted src << 32 | dst) into the
    crossing columns c_* from row k, and the acks of data and FIN packets that differ from the
    last ack of their direction (``last_ack``, -1: none yet) into s_row/s_ack from row n_kept on;
    returns (pos, n, m, k, n_kept, last_ts, in_order, code): code 0
    when ``limit`` was reached, 1 when the record at pos is incomplete, 2 when its caplen is
    above libpcap's maximum, _FULL when its direction is new and the table is half full,
    _WIDE when it is new and ``ids`` directions are numbered already (what o_dir holds),
    _ROWS when row n would be ``rows``."""
    pos = 0
    cap = len(keys1)
    w_hash, w_len = len(o_hash) > 0, len(o_len) > 0
    wc_dir, wc_ts, wc_hash, wc_len = len(c_dir) > 0, len(c_ts) > 0, len(c_hash) > 0, len(c_len) > 0
    last_k1, last_k2, last_d = _U(0), _U(1) << _U(63), np.int64(0)  # no packet's k2
    while pos < limit:
        code, caplen = _record(b, pos, size, little)
        if code:
            return pos, n, m, k, n_kept, last_ts, in_order, code
        rec = pos
        frame = pos + _REC_HDR
        left = frame + caplen
        ip = _ipv4_at(b, frame, left, l3_base, et_off, vlan)
        if ip < 0:
            pos = left
            continue
        if n >= rows:
            return rec, n, m, k, n_kept, last_ts, in_order, _ROWS
        if _plain_tcp(b, ip, left):  # branched here, not in a helper: see _tcp_headers
            ip_hl, ip_len, proto, sport, dport, seq, ack, flags, l4_hl = _tcp_headers(b, ip)
        else:
            ip_hl, ip_len, proto, sport, dport, seq, ack, flags, l4_hl = _headers(b, ip, left)
        src = _u32(b, ip + 12, False)
        dst = _u32(b, ip + 16, False)
        k1 = _U(src) << _U(32) | _U(dst)
        k2 = _U(proto) << _U(32) | _U(sport) << _U(16) | _U(dport)
        if k1 == last_k1 and k2 == last_k2:  # a burst of one direction: no lookup
            d = last_d
        else:
            s = _find(table, keys1, keys2, k1, k2)
            d = table[s]
        if d < 0:
            if m >= ids:
                return rec, n, m, k, n_kept, last_ts, in_order, _WIDE
            if 2 * (m + 1) > len(table) or m >= cap:
                return rec, n, m, k, n_kept, last_ts, in_order, _FULL
            table[s] = m
            keys1[m], keys2[m], first[m], first_data[m] = k1, k2, n, -1
            crosses[m], last_ack[m] = _among(pairs, k1), -1
            d = m
            m += 1
        last_k1, last_k2, last_d = k1, k2, d
        pos = left
        plen = ip_len - ip_hl - l4_hl
        ts = _u32(b, rec, little) * 1_000_000_000 + _u32(b, rec + 4, little) * frac_ns
        if ts < last_ts:
            in_order = False
        last_ts = ts
        o_dir[n] = d
        o_ts[n] = ts
        if w_len:
            o_len[n] = ip_len
        if proto == 6:  # as read_pcap's columns (a later fragment: ports, seq, flags 0), but
            carries = plen > 0 or (flags & _FIN) != 0
            o_num[n], o_flags[n] = seq if carries else ack, flags
            o_plen[n] = max(plen, 0)  # payload lengths below 0 (broken headers) count as 0
            if plen > 0 and first_data[d] < 0:
                first_data[d] = n
            if flags & _ACK:
                if carries and last_ack[d] != ack:
                    s_row[n_kept], s_ack[n_kept] = n, ack
                    n_kept += 1
                last_ack[d] = ack
        else:
            o_num[n], o_plen[n], o_flags[n] = 0, 0, 0
        if w_hash or crosses[d]:
            head = _payload_head(b, ip + ip_hl + l4_hl, left, plen)
            ip_id = np.int64(b[ip + 4]) << 8 | np.int64(b[ip + 5])
            h = _key_hash(k1, proto, sport, dport, ip_id, seq, head)
            if w_hash:
                o_hash[n] = h
            if crosses[d]:
                if wc_dir:
                    c_dir[k] = d
                if wc_ts:
                    c_ts[k] = ts
                if wc_hash:
                    c_hash[k] = h
                if wc_len:
                    c_len[k] = ip_len
                k += 1
        n += 1
    return pos, n, m, k, n_kept, last_ts, in_order, 0


@njit(cache=True, nogil=True)
def _rehash(table, keys1, keys2, m):
    for d in range(m):
        table[_find(table, keys1, keys2, keys1[d], keys2[d])] = d


@njit(cache=True, nogil=True)
def _reverse(table, keys1, keys2, m):
    """Each direction's reverse (ports and addresses swapped, same protocol), -1 if none."""
    rev = np.full(m, -1, np.int64)
    for d in range(m):
        k1 = keys1[d] << np.uint64(32) | keys1[d] >> np.uint64(32)
        p = keys2[d]
        k2 = (
            (p >> np.uint64(32)) << np.uint64(32)
            | (p & np.uint64(0xFFFF)) << np.uint64(16)
            | (p >> np.uint64(16)) & np.uint64(0xFFFF)
        )
        rev[d] = table[_find(table, keys1, keys2, k1, k2)]
    return rev


class _Blocks:
    """The bytes of a file from ``offset`` on (``length`` of them), block after block, read
    by a thread of its own while the caller parses the block before: the read (a copy from
    the page cache, about a quarter of a scan) overlaps the parsing, which releases the GIL.
    Each block comes as (buffer, start, end) with the bytes the caller left unparsed of the
    block before (``carry``: a record cut by the block's end) copied in front of it.
    ``ahead=False``: each block is read when it is asked for, in the caller's thread: when
    two threads parse two halves of a file on two CPUs, a reader thread for each only takes
    turns with them (measured: 54–60 against 61–72 ms a capture of 322 MB)."""

    def __init__(self, path: str, offset: int, length: int, ahead: bool = True) -> None:
        self.path, self.offset, self.left = path, offset, max(length, 0)
        self.head = _MAX_CAPLEN + _REC_HDR  # room for the longest unparsed tail
        self.tail = np.empty(0, np.uint8)  # what the last block left unparsed
        self.free: queue.Queue = queue.Queue()  # ahead: one read while one is parsed
        self.full: queue.Queue = queue.Queue()
        for _ in range(2 if ahead else 1):  # mapped, not malloc's: its heap would keep them
            self.free.put(_alloc(self.head + _BLOCK, np.uint8))
        self.stop = False
        self.reader = None
        if ahead:
            self.reader = threading.Thread(target=self._read, name="pcap-blocks", daemon=True)

    def _fill(self, f, buf: np.ndarray) -> int:
        got = f.readinto(memoryview(buf)[self.head : self.head + min(_BLOCK, self.left)])
        self.left -= got
        return got

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                while not self.stop:
                    buf = self.free.get()
                    if buf is None:
                        return
                    got = self._fill(f, buf)
                    self.full.put((buf, got))
                    if not got:
                        return
        except BaseException as exc:  # the caller raises it instead of waiting for a block
            self.full.put((exc, 0))

    def __enter__(self) -> _Blocks:
        if self.reader is not None:
            self.reader.start()
        else:
            self.file = open(self.path, "rb")  # closed by __exit__
            self.file.seek(self.offset)
        return self

    def __exit__(self, *_exc) -> None:
        if self.reader is None:
            self.file.close()
            return
        self.stop = True
        self.free.put(None)
        self.reader.join()

    def carry(self, unparsed: np.ndarray) -> None:
        """Keep ``unparsed`` (the end of the block just given) for the front of the next one,
        and give that block's buffer back to the reader."""
        self.tail = unparsed.copy()
        self.free.put(self._current)

    def __iter__(self):
        while True:
            if self.reader is None:
                buf = self.free.get_nowait()
                got = self._fill(self.file, buf)
            else:
                buf, got = self.full.get()
            if isinstance(buf, BaseException):
                raise buf
            start = self.head - len(self.tail)
            buf[start : self.head] = self.tail
            self._current = buf
            yield buf, start, self.head + got
            if not got:
                return


@dataclass
class _Reading:
    """One reading of a capture's records (the state _pass carries, so that it resumes): the
    packet and crossing rows written from ``row0`` on up to ``n`` and ``k``, its own table of
    directions (``m`` of them) with the last ack of each (``last_ack``), the acks of data
    packets kept (``s`` of ``s_rows``, ``s_acks``), and where it stopped: ``base`` (a file
    offset), ``code`` (_pass's) and ``tail`` (the bytes it left unparsed: the record it
    stopped at)."""

    row0: int
    n: int
    k: int
    base: int
    table: np.ndarray
    keys1: np.ndarray
    keys2: np.ndarray
    first: np.ndarray
    first_data: np.ndarray
    crosses: np.ndarray
    last_ack: np.ndarray
    s_rows: np.ndarray
    s_acks: np.ndarray
    m: int = 0
    s: int = 0
    last_ts: int = np.iinfo(np.int64).min
    in_order: bool = True
    code: int = 0
    tail: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint8))
    rows: int = 0  # its rows stay below this one (the first half's: the second half's first)
    cancelled: bool = False  # set while the second half is read: its reading is not used

    @classmethod
    def at(cls, row: int, base: int, rows: int) -> _Reading:
        half = _TABLE0 // 2
        per_direction = (np.empty(half, t) for t in (np.uint64, np.uint64, np.int64, np.int64))
        table = np.full(_TABLE0, -1, np.int64)
        crosses, last_ack = np.empty(half, np.bool_), np.empty(half, np.int64)
        # data acks: a row each at most, few in bulk flows (4 KB pages: rarely many written)
        kind = np.int32 if rows < 2**31 else np.int64
        kept = (_alloc(rows - row, t, huge=False) for t in (kind, np.uint32))
        return cls(row, row, row, base, table, *per_direction, crosses, last_ack, *kept, rows=rows)

    def grow(self) -> None:
        """Twice the room for directions (the table half full)."""
        self.table = np.full(2 * len(self.table), -1, np.int64)
        for name in ("keys1", "keys2", "first", "first_data", "crosses", "last_ack"):
            setattr(self, name, np.resize(getattr(self, name), len(self.table) // 2))
        _rehash(self.table, self.keys1, self.keys2, self.m)


def _read(
    name, args, pairs, cols, across, r: _Reading, size: int, stop: int = -1, ahead: bool = True,
    halt: list[bool] | None = None,
) -> None:  # fmt: skip
    """Parse the file's records from byte r.base on into the columns from r's rows on (see
    _pass); with ``stop``: up to the first record that begins at or after that byte;
    ``ahead``: see _Blocks; ``halt``: shared with another reading, set when this one stops
    with _WIDE, and while set this one stops between blocks (code _PAUSED). A reading that
    stops keeps the record header it stopped at as ``tail`` (what an error message reads)."""
    with _Blocks(name, r.base, size - r.base, ahead) as blocks:
        for buf, start, end in blocks:  # buf[start:end]: an unparsed record tail, then a block
            while True:
                room = end - start
                limit = room if stop < 0 else min(room, stop - r.base)
                state = (r.n, r.last_ts, r.in_order, r.table, r.keys1, r.keys2, r.first)
                state = (*state, r.first_data, r.crosses, r.m, pairs, r.k, r.rows)
                state = (*state, _ids(cols[0].dtype), r.last_ack, r.s_rows, r.s_acks, r.s)
                pos, r.n, r.m, r.k, r.s, r.last_ts, r.in_order, r.code = _pass(
                    buf[start:end], limit, room, *args, *state, *cols, *across
                )
                start += pos
                r.base += pos
                if r.code != _FULL:
                    break
                r.grow()
            if r.code == _WIDE and halt is not None:
                halt[0] = True
            elif r.code in (0, 1) and halt is not None and halt[0] and not r.base >= stop >= 0:
                r.code = _PAUSED  # it reads on from r.base (a record's start) when resumed
            if r.code in (2, _ROWS, _WIDE, _PAUSED) or r.base >= stop >= 0 or r.cancelled:
                r.tail = buf[start : min(end, start + _REC_HDR)].copy()  # not the block's rest
                return
            blocks.carry(buf[start:end])
    r.tail = blocks.tail


@njit(cache=True, nogil=True)
def _record_chain(b, little, frac_limit, sec_lo, sec_hi, chain):
    """The first offset in b where ``chain`` whole records follow one another, each header
    plausible (time within [sec_lo, sec_hi] s, fraction below frac_limit, caplen at most
    libpcap's maximum and origlen: not the header's snaplen, which some files break); -1 if
    none."""
    for p in range(len(b)):
        q = p
        for _ in range(chain):
            code, caplen = _record(b, q, len(b), little)  # whole, caplen at most the maximum
            if code:
                break
            sec, frac = _u32(b, q, little), _u32(b, q + 4, little)
            if (
                sec < sec_lo
                or sec > sec_hi
                or frac >= frac_limit
                or caplen > _u32(b, q + 12, little)
            ):
                break
            q += _REC_HDR + caplen
        else:
            return p
    return -1


def _split_point(name: str, fmt, size: int) -> tuple[int, int]:
    """A guess at a record's start near the middle of the file, where _CHAIN plausible
    record headers follow one another (-1 if none), and at the rows before it (the records
    of _SAMPLE bytes at the start and from the guess on: the smaller bytes a record). scan
    checks both guesses."""
    little = fmt.endian == "<"
    with open(name, "rb") as f:
        f.seek(_GLOBAL_HDR)
        start = np.frombuffer(f.read(_SAMPLE), np.uint8)
        middle = _GLOBAL_HDR + (size - _GLOBAL_HDR) // 2
        if len(start) < _REC_HDR:
            return -1, 0
        sec = _u32(start, 0, little)
        frac_limit = 1_000_000_000 // fmt.frac_ns
        lo, hi = sec - _SEC_RANGE[0], sec + _SEC_RANGE[1]
        for length in (_SAMPLE, _CHAIN * (_MAX_CAPLEN + _REC_HDR)):  # the second: long records
            f.seek(middle)
            window = np.frombuffer(f.read(length), np.uint8)
            at = _record_chain(window, little, frac_limit, lo, hi, _CHAIN)
            if at >= 0:
                break
    if at < 0:
        return -1, 0
    record = max(min(_record_bytes(start, 0, little), _record_bytes(window, at, little)), 1)
    return middle + at, int((middle + at - _GLOBAL_HDR) / record * _MARGIN) + 1


@njit(cache=True, nogil=True)
def _record_bytes(b, p, little):
    """The mean size of the whole records of b from p on (header included; 0 if none)."""
    q, n = p, 0
    while True:
        code, caplen = _record(b, q, len(b), little)
        if code:
            break
        q, n = q + _REC_HDR + caplen, n + 1
    return (q - p) / n if n else 0.0


@njit(cache=True, nogil=True)
def _adopt(
    table, keys1, keys2, first, first_data, crosses, m,
    b_keys1, b_keys2, b_first, b_first_data, b_crosses, mb, shift, number, start,
):  # fmt: skip
    """The directions of the second half from ``start`` on into the first half's table (new
    ones appended in their order; the first row of payload kept from the first half where
    it has one), their rows moved down by ``shift``, and each one's number in it
    (``number``); returns (directions, next): next < mb when the table must grow first."""
    for d in range(start, mb):
        k1, k2 = b_keys1[d], b_keys2[d]
        s = _find(table, keys1, keys2, k1, k2)
        a = table[s]
        if a < 0:
            if 2 * (m + 1) > len(table) or m >= len(keys1):
                return m, d
            table[s] = m
            keys1[m], keys2[m], first[m], crosses[m] = k1, k2, b_first[d] - shift, b_crosses[d]
            first_data[m] = b_first_data[d] - shift if b_first_data[d] >= 0 else -1
            a = m
            m += 1
        elif first_data[a] < 0 and b_first_data[d] >= 0:
            first_data[a] = b_first_data[d] - shift
        number[d] = a
    return m, mb


def _ids(kind) -> int:
    """How many direction ids (0 on) a column of ``kind`` holds."""
    return int(np.iinfo(kind).max) + 1


def _join(whole: _Reading, second: _Reading, cols, across) -> None:
    """The second half's reading appended to the first's: its directions renumbered into the
    first's table (the direction columns widened first where the two halves' directions
    together need it), its rows moved down to follow the first half's. The joined reading
    does not read on (its last_ack is the first half's): both halves have ended."""
    number = np.empty(second.m, np.int32)
    done = 0
    shift = second.row0 - whole.n
    b = (second.keys1, second.keys2, second.first, second.first_data, second.crosses)
    while True:
        whole.m, done = _adopt(
            whole.table, whole.keys1, whole.keys2, whole.first, whole.first_data, whole.crosses,
            whole.m, *b, second.m, shift, number, done,
        )  # fmt: skip
        if done == second.m:
            break
        whole.grow()
    if whole.m > _ids(cols[0].dtype):
        _widen(cols, across, (whole, second), whole.m)
    n, k = second.n - second.row0, second.k - second.row0
    if n:
        ts = cols[_COLUMNS.index("ts_ns")]
        whole.in_order = bool(
            whole.in_order and second.in_order and ts[second.row0] >= whole.last_ts
        )
        whole.last_ts = second.last_ts
    for c, column in zip(_COLUMNS, cols, strict=True):
        _move(column, second.row0, whole.n, n, number if c == "direction" else None)
    for c, column in zip(_CROSSING, across, strict=True):
        _move(column, second.row0, whole.k, k, number if c == "direction" else None)
    whole.n, whole.k = whole.n + n, whole.k + k
    kept = slice(whole.s, whole.s + second.s)
    whole.s_rows[kept] = second.s_rows[: second.s] - shift
    whole.s_acks[kept] = second.s_acks[: second.s]
    whole.s += second.s
    whole.code, whole.base, whole.tail = second.code, second.base, second.tail


def _move(column: np.ndarray, src: int, dst: int, n: int, number: np.ndarray | None) -> None:
    """column[dst:dst + n] = column[src:src + n] (src > dst; directions renumbered through
    ``number``), a piece at a time (numpy copies an overlapping piece through a temporary),
    each piece's source pages given back once no row will land on them (the bench trial's
    peak: 313 MB, 317 MB when _fit alone gives back the pages past the rows at the end)."""
    if not len(column):  # a column this scan does not keep
        return
    step = max(_MOVE // column.itemsize, 1)
    for i in range(0, n, step):
        rows = min(step, n - i)
        if number is None:
            column[dst + i : dst + i + rows] = column[src + i : src + i + rows]
        else:  # numpy's number[piece] takes 5 ns a row
            _renumber(column, src + i, dst + i, rows, number)
        _give_back(column, max(src + i, dst + n), src + i + rows)


@njit(cache=True, nogil=True)
def _renumber(column, src, dst, n, number):
    """column[dst:dst + n] = number[column[src:src + n]], forward (dst < src)."""
    for i in range(n):
        column[dst + i] = number[column[src + i]]


def _read_whole(name, args, pairs, cols, across, size, cap, split, expected) -> _Reading:
    """The whole capture read into the columns (see scan), as two halves at once where
    ``split`` (a record's offset) is given. A reading that meets more directions than its
    direction column numbers stops there (_WIDE), and the other half pauses at its next
    block; once no thread writes, the direction columns are widened (_widen) and both read
    on, again at once."""
    whole = _Reading.at(0, _GLOBAL_HDR, cap)
    if split < 0:
        _read_widening(name, args, pairs, cols, across, whole, size)
        return whole
    # The second half's rows go where the first half's should end (guessed from the records'
    # sizes), at most above any row of it (a record takes 16 bytes at least); the first
    # half's reading stops there if it has more rows, and reads on alone.
    above = (split - _GLOBAL_HDR) // _REC_HDR + 1
    second = _Reading.at(min(expected, above), split, cap)
    whole.rows = second.row0
    halt, error = [False], None  # see _read
    todo_whole = todo_second = True
    while todo_whole or todo_second:  # both halves at once; again after a widening
        halt[0] = False
        with ThreadPoolExecutor(1, thread_name_prefix="pcap-half") as pool:
            half = None
            if todo_second:
                half = pool.submit(
                    _read, name, args, pairs, cols, across, second, size, -1, False, halt
                )
            try:  # both halves read their blocks themselves: see _Blocks
                if todo_whole:
                    _read(name, args, pairs, cols, across, whole, size, split, False, halt)
            finally:
                second.cancelled = not _used(whole, split)
                if half is not None:
                    error = half.exception()  # the second half is done before anything else
        if _WIDE in (whole.code, second.code):  # no thread writes now
            _widen(cols, across, (whole, second), max(whole.m, second.m) + 1)
        todo_whole = whole.code in (_WIDE, _PAUSED)
        todo_second = error is None and second.code in (_WIDE, _PAUSED) and _used(whole, split)
    second.cancelled = not _used(whole, split)
    if not second.cancelled:  # the second half began at a record, the rows fit
        if error is not None:
            raise error
        _join(whole, second, cols, across)
    elif whole.code in (0, _ROWS):  # a guess was wrong: the first half reads on alone
        whole.rows = cap
        _read_widening(name, args, pairs, cols, across, whole, size)
    return whole


def _used(whole: _Reading, split: int) -> bool:
    """The second half's reading is still to be joined to the first's (as far as it got): the
    first half ended at the second's start, or stopped to widen and reads on."""
    return whole.code in (_WIDE, _PAUSED) or (whole.code == 0 and whole.base == split)


def _read_widening(name, args, pairs, cols, across, r: _Reading, size: int) -> None:
    """_read to the end of the file, the direction columns widened where it needs."""
    _read(name, args, pairs, cols, across, r, size)
    while r.code == _WIDE:
        _widen(cols, across, (r,), r.m + 1)
        _read(name, args, pairs, cols, across, r, size)


def _widen(cols, across, readings, directions: int) -> None:
    """The direction columns (cols[0], across[0]) replaced by ones of the narrowest type that
    numbers ``directions``, holding the rows the ``readings`` wrote."""
    least = max(directions, _ids(cols[0].dtype) + 1)  # wider than now, always
    kind = next((k for k in _ID_KINDS if _ids(k) >= least), None)
    if kind is None:
        raise ValueError(f"{directions} directions: more than 32-bit ids number")
    for columns, end in ((cols, "n"), (across, "k")):
        old = columns[0]
        new = _alloc(len(old), kind)
        for r in readings:
            new[r.row0 : getattr(r, end)] = old[r.row0 : getattr(r, end)]
        columns[0] = new


def scan(
    path: str | os.PathLike[str],
    *,
    reuse: Capture | None = None,
    crossing: np.ndarray | None = None,
    crossing_columns: tuple[str, ...] = _CROSSING,
    threads: int | None = None,
) -> Capture:
    """One compiled pass over the classic pcap file ``path`` (its size when reading began): see
    :class:`Capture`. Errors and truncation as :func:`analysis.pcap.read_columns`. ``reuse``: a
    capture no longer needed, whose column memory this scan writes over (its pages are resident
    already: no page faults) and keeps (no later scan reuses it again). ``crossing``: (src, dst)
    pairs as src << 32 | dst (the traffic crossing a bottleneck, as a trial's record names it):
    the ``crossing_columns`` of their packets (any of direction, ts_ns, key_hash and ip_len) are
    kept in ``crossing``, and key_hash and ip_len of every packet are not (what matching and the
    queue read, in a third of the memory). ``threads``: 2 (the default where the process may run
    on two CPUs) reads a capture of _SPLIT_MIN bytes or more as two halves at once, the second
    from a record found near the middle; the first half's reading checks that it ends exactly
    there (else it reads on alone), so the result is the same in every way."""
    from analysis import pcap

    unknown = set(crossing_columns) - set(_CROSSING)
    if unknown:
        raise ValueError(f"crossing_columns: {sorted(unknown)} not among {_CROSSING}")
    name = os.fspath(path)
    with open(name, "rb") as f:
        fmt = pcap._read_global_header(f, name)
    ip_offset, et_offset = pcap._LINKTYPES[fmt.linktype]
    size = os.path.getsize(name)
    cap = max((size - _GLOBAL_HDR) // _REC_HDR, 0) + 2  # a packet per 16 B at most; +1: halves
    old = reuse.buffers if reuse is not None else [None] * len(_COLUMNS)
    every = cap if crossing is None else 0  # rows of key_hash and ip_len for every packet
    cols = [
        b if b is not None and len(b) >= rows > 0 else _alloc(rows, t)
        for b, t, rows in zip(
            old, _DTYPES, [every if c in _CROSSING_ONLY else cap for c in _COLUMNS], strict=True
        )
    ]
    if reuse is not None:  # its memory is this scan's now: no later scan may take it too
        reuse.buffers = [None] * len(_COLUMNS)
    pairs = np.unique(np.asarray([] if crossing is None else crossing, np.uint64))
    kept = [crossing is not None and c in crossing_columns for c in _CROSSING]
    across = [  # direction ids: the direction column's type (a reused capture's, or 8 bits)
        _alloc(
            cap if keep else 0, cols[0].dtype if c == "direction" else _DTYPES[_COLUMNS.index(c)]
        )
        for c, keep in zip(_CROSSING, kept, strict=True)
    ]
    args = (fmt.endian == "<", fmt.frac_ns, ip_offset, -1 if et_offset is None else et_offset)
    args = (*args, fmt.linktype == 1)
    threads = _cpus() if threads is None else threads
    split, expected = (
        _split_point(name, fmt, size) if threads > 1 and size >= _SPLIT_MIN else (-1, 0)
    )
    whole = _read_whole(name, args, pairs, cols, across, size, cap, split, expected)
    n, m, k, code, base = whole.n, whole.m, whole.k, whole.code, whole.base
    if code == 2 or code == 1:  # whole.tail: the record the reading stopped at, at byte base
        header = whole.tail[8:12].tobytes()
        caplen = int.from_bytes(header, "little" if args[0] else "big")
        if code == 2:
            raise pcap.PcapError(
                f"{name}: corrupt record header at byte {base} "
                f"(caplen {caplen} > {_MAX_CAPLEN}; file damaged or not written sequentially)"
            )
        warnings.warn(pcap._truncated(name, base, size - base, caplen), stacklevel=2)
    k1, k2 = whole.keys1[:m], whole.keys2[:m]
    directions = {
        "src": (k1 >> _U(32)).astype(np.uint32),
        "dst": (k1 & _U(0xFFFFFFFF)).astype(np.uint32),
        "sport": (k2 >> _U(16) & _U(0xFFFF)).astype(np.uint16),
        "dport": (k2 & _U(0xFFFF)).astype(np.uint16),
        "proto": (k2 >> _U(32)).astype(np.uint8),
        "first": whole.first[:m].copy(),
        "first_data": whole.first_data[:m].copy(),
        "reverse": _reverse(whole.table, whole.keys1, whole.keys2, m),
        "crossing": whole.crosses[:m].copy(),
    }
    rows = {c: _fit(a, k) for c, a, keep in zip(_CROSSING, across, kept, strict=True) if keep}
    data_acks = {"row": _fit(whole.s_rows, whole.s), "ack": _fit(whole.s_acks, whole.s)}
    return Capture(
        name,
        *(_fit(c, n) for c in cols),
        data_acks,
        directions,
        bool(whole.in_order),
        rows if crossing is not None else None,
        cols,
    )


def crossing_times(cap: Capture) -> np.ndarray:
    """The times of ``cap``'s packets crossing the bottleneck (its directions marked
    ``crossing`` by :func:`scan`), in file order, copied out of its ts_ns: what scan keeps as
    its crossing ts_ns column, written once the capture's counters are done instead of while
    it is read (a scan of the capture before the router, whose memory the next scan reuses:
    8 bytes a crossing packet less at the scan's peak, 16 MB at 2 M packets)."""
    _check_not_spent(cap)
    out = _alloc(len(cap.ts_ns), np.int64)
    return _fit(out, _compact(cap.ts_ns, cap.direction, cap.directions["crossing"], out))


def take_crossing_times(cap: Capture) -> np.ndarray:
    """The times of ``cap``'s packets crossing the bottleneck (its directions marked ``crossing``
    by :func:`scan`), in file order: scan's crossing ts_ns column, taken from the capture's own
    ts_ns once the capture is done with, rather than written a second time while it is in use (8
    bytes a crossing packet less at the peak: 16 MB at 2 M packets). The capture gives its ts_ns
    up: the times move to the front of that column in place, its pages past them are given back,
    cap.ts_ns is left empty, and a scan reusing the capture allocates that column anew."""
    _check_not_spent(cap)
    column = cap.buffers[_COLUMNS.index("ts_ns")] if cap.buffers else None
    if column is None:
        raise ValueError(f"{cap.path}: not a scan's capture, or its ts_ns memory is taken")
    ts = cap.ts_ns  # column[:rows]
    kept = _compact(ts, cap.direction, cap.directions["crossing"], ts)
    _give_back(column, kept, len(column))  # to the mapping's end: its last page too
    cap.ts_ns = ts[:0]
    cap.buffers[_COLUMNS.index("ts_ns")] = None
    return ts[:kept]


def _check_not_spent(cap: Capture) -> None:
    if len(cap.ts_ns) != len(cap.direction):
        raise ValueError(f"{cap.path}: its times were taken (take_crossing_times)")
    if cap.buffers and all(b is None for b in cap.buffers):
        raise ValueError(f"{cap.path}: a later scan took its memory (scan's reuse)")


@njit(cache=True, nogil=True)
def _compact(values, direction, crosses, out):
    """The rows of directions marked in ``crosses`` written to the front of ``out``, in order
    (``out`` may be ``values``: row k never moves forward); their count. Every row is
    written where the next kept one goes, and the count advances for the kept ones: a branch
    per row was three times slower (mispredicted: crossing packets and their ACKs alternate)."""
    assert len(out) >= len(values)  # a row past the last kept one is written too
    kept = 0
    for i in range(len(values)):
        out[kept] = values[i]
        kept += crosses[direction[i]]
    return kept


def flow_counters(
    cap: Capture, *, start_ns: int | None = None, end_ns: int | None = None
) -> dict[str, np.ndarray]:
    """:func:`tcp_flow_counters` of a scanned capture (the same numbers, in the same order)."""
    _check_not_spent(cap)
    ts = cap.ts_ns
    first_data = cap.directions["first_data"]
    if cap.in_order:  # the data packets' acks are found as the rows are counted
        acks, merged, rows, kept = cap.seq_or_ack, True, cap.data_acks["row"], cap.data_acks["ack"]
    else:  # counted in time order: the acks are filled in first, in file order
        acks, merged, rows, kept = ack_column(cap), False, _NO_ROWS, _NO_ACKS
    packets, retx, retx_bytes, nbytes, span = _counters(
        first_data, _time_order(ts, cap.in_order), cap.direction, len(cap.directions["src"]),
        cap.directions["reverse"], ts, cap.tcp_flags, cap.seq_or_ack, acks, cap.payload_len,
        merged, rows, kept, start_ns is not None, 0 if start_ns is None else int(start_ns),
        end_ns is not None, 0 if end_ns is None else int(end_ns), _row_room(len(cap.direction)),
    )  # fmt: skip
    flows = _in_first_data_order(first_data)
    ends = {c: cap.directions[c][flows] for c in ("src", "dst", "sport", "dport")}
    return _flow_table(ends, flows, packets, retx, retx_bytes, nbytes, span)


def ack_column(cap: Capture) -> np.ndarray:
    """The ack of each packet of a scan (read_pcap's ack column) where it has the ACK flag or
    carries neither data nor FIN; 0 on a data or FIN packet without the ACK flag (not kept)."""
    _check_not_spent(cap)
    out = _alloc(len(cap.direction), np.uint32)
    rows, acks = cap.data_acks["row"], cap.data_acks["ack"]
    m = len(cap.directions["src"])
    _fill_acks(cap.seq_or_ack, cap.direction, cap.payload_len, cap.tcp_flags, rows, acks, m, out)
    return out


@njit(cache=True, nogil=True)
def _fill_acks(seq_or_ack, ids, plen, flags, rows, acks, m, out):
    """ack_column's values, in file order: a data packet's ack is listed (``rows``, ``acks``)
    or its direction's last one."""
    last = np.zeros(m, np.int64)
    listed = 0
    for i in range(len(ids)):
        d = ids[i]
        acked = (flags[i] & _ACK) != 0
        while listed < len(rows) and rows[listed] < i:  # as _counters: no row left behind
            listed += 1
        if not (plen[i] > 0 or (flags[i] & _FIN) != 0):
            v = np.int64(seq_or_ack[i])
        elif not acked:
            v = np.int64(0)
        elif listed < len(rows) and rows[listed] == i:
            v = np.int64(acks[listed])
        else:
            v = last[d]
        if acked:
            last[d] = v
        out[i] = v
