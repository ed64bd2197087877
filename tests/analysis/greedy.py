"""The greedy FIFO matching of analysis.match written a second way, as the oracle the compiled
matcher (analysis.match.match_times, which match_packets uses) is checked against on whole
captures: both sides sorted by (key, time), then a vectorized fixed point per key."""

from __future__ import annotations

import numpy as np


def _exclusive_group_cumsum(x: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Sum of x over the earlier rows of the same group (groups are contiguous runs)."""
    cs = np.cumsum(x) - x
    first = np.maximum.accumulate(np.where(start, np.arange(len(x)), 0))
    return cs - cs[first]


def _fixed_point(
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


def greedy_match(
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
    c = _fixed_point(f, e, group, tb[b_rows], ta_s, max_delay_ns)
    hit = c >= 0
    ts_out[b_rows[hit]] = ta_s[c[hit]]
    return ts_out
