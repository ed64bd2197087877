"""Match packets between two captures of the same traffic (upstream and downstream of a router).

A packet is identified by KEY_COLUMNS; IP IDs wrap and UDP payloads repeat, so a key may
occur many times in a capture and a match must also fall inside a time window. Matching is
greedy in ``before`` time order: each packet takes the earliest unused ``after`` packet with
the same key and ``ts_ns`` in [ts, ts + max_delay_ns], as a FIFO router would deliver them.
Keys are compared through a 64-bit hash (analysis.records.key_hash, which the record pass
computes while reading): a false match needs two different keys with equal hashes inside one
time window (odds 2**-64 per pair). The matching is one compiled pass over both sides in time
order (``match_times``); tests check it against plain greedy matchings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from analysis.records import key_hash as packet_key_hash
from analysis.resources import alloc
from analysis.timeorder import row, time_order

if TYPE_CHECKING:  # pandas is imported where a frame is matched
    import pandas as pd

__all__ = [
    "KEY_COLUMNS",
    "key_hash",
    "key_hashes",
    "match_packets",
    "match_rows",
    "match_times",
    "undecided",
]

KEY_COLUMNS = ("src", "dst", "proto", "sport", "dport", "ip_id", "seq", "payload_head")
_U = np.uint64


def key_hash(df: pd.DataFrame) -> np.ndarray:
    """64-bit hash of KEY_COLUMNS of a frame's packets (216 bits of key do not fit in one
    sortable integer): splitmix64 rounds over four words (addresses; protocol, ports and IP
    ID; sequence number; payload head), in one compiled pass."""
    return key_hashes(*(df[c].to_numpy() for c in KEY_COLUMNS))


def match_packets(before: pd.DataFrame, after: pd.DataFrame, *, max_delay_ns: int) -> pd.DataFrame:
    """Find each ``before`` packet in ``after`` (same clock, downstream).

    Returns ``before`` (same index and columns) plus ``ts_out_ns`` (int64, -1 if unmatched) and
    ``forwarded`` (bool)."""
    ts_out = np.full(len(before), -1, dtype=np.int64)
    if len(before) and len(after):
        ts_out = match_times(
            key_hash(before),
            before["ts_ns"].to_numpy(np.int64),
            key_hash(after),
            after["ts_ns"].to_numpy(np.int64),
            max_delay_ns=max_delay_ns,
        )
    return before.assign(ts_out_ns=ts_out, forwarded=ts_out >= 0)


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
        t = ta[row(order_a, state[0])]  # at most half full: the closed ones go
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
        j = row(order_a, ka)
        t = ta[j]
        h = np.int64(ha[j])
        best_rank = -1
        if used:  # the packets passed over first: each is earlier than head
            best_rank = _take(slots, h, t, tb, order_b, delay)
            if best_rank >= 0:
                used -= 1
        while best_rank < 0 and head < nb:  # then the waiting packets from head, in order
            i = row(order_b, head)
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
            i = row(order_b, best_rank)
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
        if slots[p, 0] == key and r < best_rank and tb[row(order_b, r)] + delay >= t:
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


@njit(cache=True, nogil=True)
def _waiting_again(slots, tb, order_b, delay, t):
    """_match's table without the packets whose window closed before t, at most a quarter
    full: (slots, entries)."""
    live = 0
    for s in range(len(slots)):
        r = slots[s, 1]
        live += r >= 0 and tb[row(order_b, r)] + delay >= t
    size = 1024
    while size < 4 * (live + 1):
        size *= 2
    new = np.full((size, 2), -1, np.int64)
    for s in range(len(slots)):
        r = slots[s, 1]
        if r < 0 or tb[row(order_b, r)] + delay < t:
            continue
        _put(new, slots[s, 0], r)
    return new, live


@njit(cache=True, nogil=True)
def _key_hashes(src, dst, proto, sport, dport, ip_id, seq, head, out):
    for i in range(len(out)):
        addrs = _U(src[i]) << _U(32) | _U(dst[i])
        out[i] = packet_key_hash(addrs, proto[i], sport[i], dport[i], ip_id[i], seq[i], head[i])


def key_hashes(src, dst, proto, sport, dport, ip_id, seq, payload_head) -> np.ndarray:
    """:func:`key_hash` of each packet, from its KEY_COLUMNS (arrays, in that order), in one
    compiled pass, as a scan computes it while reading."""
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
    """``ts_out_ns`` of :func:`match_packets` (each packet, in time order, takes the earliest
    unused after packet of its key inside [ts, ts + max_delay_ns]) from key hashes (a scan's
    matched key_hash, or :func:`key_hash`) and timestamps."""
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
    saw them (time order): the departures of analysis.queuemerge.queue_levels, unsorted."""
    return _match_rows(hash_before, ts_before, hash_after, ts_after, max_delay_ns, True)


def _match_rows(hash_before, ts_before, hash_after, ts_after, max_delay_ns, departures):
    out = alloc(len(hash_before), np.int64)
    dep = alloc(len(hash_after) if departures else 0, np.int32)
    matched = _match(
        hash_before, ts_before, hash_after, ts_after, int(max_delay_ns), time_order(ts_before),
        time_order(ts_after), out, dep,
    )  # fmt: skip
    return out, dep[:matched]


def undecided(ts_ns: np.ndarray, forwarded: np.ndarray, *, max_delay_ns: int, end_ns: int):
    """True for packets that were not seen downstream but could still have been in transit at
    ``end_ns``: sent after end_ns - max_delay_ns and after the last packet (of the same
    capture, in send order) that was seen downstream; through a FIFO path, a packet sent
    before one that arrived would have arrived too, so it was lost."""
    if not len(ts_ns):
        return np.zeros(0, dtype=bool)
    last_fwd = ts_ns[forwarded].max() if forwarded.any() else np.iinfo(np.int64).min
    return ~forwarded & (ts_ns > end_ns - max_delay_ns) & (ts_ns > last_fwd)
