"""Match packets between two captures of the same traffic (upstream and downstream of a router).

A packet is identified by KEY_COLUMNS; IP IDs wrap and UDP payloads repeat, so a key may
occur many times in a capture and a match must also fall inside a time window. Matching is
greedy in ``before`` time order: each packet takes the earliest unused ``after`` packet with
the same key and ``ts_ns`` in [ts, ts + max_delay_ns], as a FIFO router would deliver them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["KEY_COLUMNS", "match_packets"]

KEY_COLUMNS = ("src", "dst", "proto", "sport", "dport", "ip_id", "seq", "payload_head")

_U64 = np.uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (uint64 arithmetic wraps, which is what we want)."""
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def key_hash(df: pd.DataFrame) -> np.ndarray:
    """64-bit hash of KEY_COLUMNS (216 bits of key do not fit in one sortable integer)."""
    c = {k: df[k].to_numpy().astype(np.uint64) for k in KEY_COLUMNS}
    words = (
        (c["src"] << _U64(32)) | c["dst"],
        (c["proto"] << _U64(56))
        | (c["sport"] << _U64(40))
        | (c["dport"] << _U64(24))
        | (c["ip_id"] << _U64(8)),
        c["seq"],
        c["payload_head"],
    )
    h = np.full(len(df), 0x9E3779B97F4A7C15, dtype=np.uint64)
    for w in words:
        h = _mix(h ^ w)
    return h


def _exclusive_group_cumsum(x: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Sum of x over the earlier rows of the same group (groups are contiguous runs)."""
    cs = np.cumsum(x) - x
    first = np.maximum.accumulate(np.where(start, np.arange(len(x)), 0))
    return cs - cs[first]


def _greedy(
    f: np.ndarray, e: np.ndarray, group: np.ndarray, tb: np.ndarray, ta: np.ndarray, delay: int
) -> np.ndarray:
    """Index into ``ta`` matched by each before row, or -1.

    Rows are sorted by (key, ts); f is the first after-index of the same key with ts >= tb,
    e the end of that key's after-run. Sequentially: c_i = max(f_i, c_{i-1} + matched_{i-1}).
    Writing M_i for the matches before row i, c_i - M_i is a running max of f_j - M_j, so for a
    guessed ``matched`` vector one pass of cumsum + cummax gives c; iterate to the (unique)
    fixed point, re-running only key groups whose outcome changed.
    """
    n = len(f)
    c = np.full(n, -1, dtype=np.int64)
    matched = np.ones(n, dtype=bool)
    rows = np.arange(n)
    big = len(ta) + n + 1  # keeps the running max from leaking across groups
    while len(rows):
        g, fr = group[rows], f[rows]
        start = np.r_[True, g[1:] != g[:-1]]
        m_before = _exclusive_group_cumsum(matched[rows].astype(np.int64), start)
        offset = np.cumsum(start) * big
        cr = m_before + np.maximum.accumulate(fr - m_before + offset) - offset
        ok = cr < e[rows]
        ok[ok] = ta[cr[ok]] <= tb[rows[ok]] + delay
        changed = ok != matched[rows]
        matched[rows] = ok
        c[rows] = np.where(ok, cr, -1)
        rows = rows[np.isin(g, g[changed])] if changed.any() else rows[:0]
    return c


def match_packets(before: pd.DataFrame, after: pd.DataFrame, *, max_delay_ns: int) -> pd.DataFrame:
    """Find each ``before`` packet in ``after`` (same clock, downstream).

    Returns ``before`` (same index and columns) plus ``ts_out_ns`` (int64, -1 if unmatched) and
    ``forwarded`` (bool). Keys are compared through a 64-bit hash: a false match needs two
    different keys with equal hashes inside one time window (odds 2**-64 per pair).

    Most keys occur once in each capture (the IP ID and sequence number differ from packet to
    packet): those are joined through a hash table; only keys that repeat (IP ID wrap, equal
    UDP payloads) go through the sort-based greedy matching.
    """
    return before.assign(**_match_columns(before, after, max_delay_ns))


def _match_columns(before: pd.DataFrame, after: pd.DataFrame, max_delay_ns: int) -> dict:
    nb, na = len(before), len(after)
    ts_out = np.full(nb, -1, dtype=np.int64)
    if nb and na:
        hb, ha = key_hash(before), key_hash(after)
        tb = before["ts_ns"].to_numpy(np.int64)
        ta = after["ts_ns"].to_numpy(np.int64)
        cb, keys = pd.factorize(np.r_[hb, ha])
        counts_b = np.bincount(cb[:nb], minlength=len(keys))
        counts_a = np.bincount(cb[nb:], minlength=len(keys))
        single = (counts_b <= 1) & (counts_a <= 1)
        # Unique on both sides: the one candidate, if it is inside the window.
        one_b = np.flatnonzero(single[cb[:nb]])
        pos_a = np.full(len(keys), -1, dtype=np.int64)
        a_single = np.flatnonzero(single[cb[nb:]])
        pos_a[cb[nb:][a_single]] = a_single
        cand = pos_a[cb[:nb][one_b]]
        has = cand >= 0
        delay = ta[cand[has]] - tb[one_b[has]]
        ok = (delay >= 0) & (delay <= max_delay_ns)
        ts_out[one_b[has][ok]] = ta[cand[has]][ok]
        # Repeated keys: greedy matching in time order, on those rows only.
        rb = np.flatnonzero(~single[cb[:nb]])
        ra = np.flatnonzero(~single[cb[nb:]])
        if len(rb) and len(ra):
            ts_out[rb] = _greedy_match(hb[rb], ha[ra], tb[rb], ta[ra], int(max_delay_ns))
    return {"ts_out_ns": ts_out, "forwarded": ts_out >= 0}


def _greedy_match(
    hb: np.ndarray, ha: np.ndarray, tb: np.ndarray, ta: np.ndarray, max_delay_ns: int
) -> np.ndarray:
    """ts_ns of the after packet each before packet is matched to (-1: none)."""
    nb = len(hb)
    ts_out = np.full(nb, -1, dtype=np.int64)
    # One sort of both captures by (key, time); at equal times the before row comes
    # first so a zero delay still matches.
    order = np.lexsort((np.r_[tb * 2, ta * 2 + 1], np.r_[hb, ha]))
    is_a = order >= nb
    a_rows = order[is_a] - nb  # after rows in (key, time) order
    b_rows = order[~is_a]
    f = (np.cumsum(is_a) - is_a)[~is_a]  # after rows sorted before each before row
    hb_s, ha_s = hb[b_rows], ha[a_rows]
    e = np.searchsorted(ha_s, hb_s, side="right")
    group = np.cumsum(np.r_[True, hb_s[1:] != hb_s[:-1]])
    ta_s = ta[a_rows]
    c = _greedy(f, e, group, tb[b_rows], ta_s, max_delay_ns)
    hit = c >= 0
    ts_out[b_rows[hit]] = ta_s[c[hit]]
    return ts_out
