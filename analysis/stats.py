"""Two-sample tests for a few repetitions, in numpy: the Mann–Whitney U (Wilcoxon rank-sum)
test with its exact permutation distribution (ties included: the midranks' own distribution),
the Hodges–Lehmann shift with its distribution-free (Moses) interval, Cliff's delta, and the
Holm and Benjamini–Hochberg adjustments of many p-values.

Exact up to ``EXACT_LIMIT`` pooled values; beyond, the normal approximation with the tie
correction (by then it is close).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = [
    "CORRECTIONS",
    "EXACT_LIMIT",
    "Shift",
    "adjust",
    "mann_whitney",
    "rank_sum_null",
]

EXACT_LIMIT = 120  # pooled values: the exact distribution's table stays below ~10^7 cells
CORRECTIONS = ("bh", "holm")


def _midranks(pooled: np.ndarray) -> np.ndarray:
    """Ranks 1..N of the pooled values, ties given their mean rank."""
    order = np.argsort(pooled, kind="mergesort")
    ranks = np.empty(len(pooled))
    ranks[order] = np.arange(1, len(pooled) + 1)
    _, inverse, counts = np.unique(pooled, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


@lru_cache(maxsize=4096)
def rank_sum_null(doubled_ranks: tuple[int, ...], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The permutation distribution of the sum of ``n`` of the pooled ranks (each given
    doubled, so that midranks are whole): (sums doubled, their probabilities). Counts subsets
    by size and sum, one value at a time (a 0/1 knapsack over the ranks)."""
    top = sum(sorted(doubled_ranks)[-n:]) if n else 0
    ways = np.zeros((n + 1, top + 1))
    ways[0, 0] = 1.0
    for v in doubled_ranks:
        if v <= top:
            ways[1:, v:] = ways[1:, v:] + ways[:-1, : top + 1 - v]
    counts = ways[n]
    sums = np.nonzero(counts)[0]
    return sums, counts[sums] / counts.sum()


@dataclass(frozen=True)
class Shift:
    """x against y: Mann–Whitney's two-sided p-value (``exact``: from the permutation
    distribution), the smallest p-value these sample sizes (and ties) can give, the
    Hodges–Lehmann shift (median of x_i − y_j) with its interval at ``level`` (NaN bounds:
    too few values for that level), and Cliff's delta (P(x > y) − P(x < y))."""

    n_x: int
    n_y: int
    p: float
    p_min: float
    exact: bool
    shift: float
    low: float
    high: float
    delta: float


def _normal_p(z: float) -> float:
    from math import erfc, sqrt

    return float(erfc(abs(z) / sqrt(2)))


def mann_whitney(x, y, level: float = 0.95, exact_limit: int = EXACT_LIMIT) -> Shift:
    """Two-sided Mann–Whitney U test of x against y (NaNs dropped), with the shift's
    estimate and interval; exact up to ``exact_limit`` values pooled; ValueError for fewer
    than one value in either."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    x, y = x[~np.isnan(x)], y[~np.isnan(y)]
    nx, ny = len(x), len(y)
    if nx < 1 or ny < 1:
        raise ValueError(f"Mann-Whitney needs values on both sides (got {nx} and {ny})")
    pooled = np.concatenate([x, y])
    doubled = np.rint(2 * _midranks(pooled)).astype(np.int64)
    observed = int(doubled[:nx].sum())
    centre = nx * (nx + ny + 1)  # the mean of the doubled rank sum
    diffs = np.sort(np.subtract.outer(x, y).ravel())
    greater = np.count_nonzero(diffs > 0)
    less = np.count_nonzero(diffs < 0)
    delta = (greater - less) / diffs.size
    exact = nx + ny <= exact_limit
    if exact:
        sums, probs = rank_sum_null(tuple(sorted(doubled.tolist())), nx)
        far = np.abs(sums - centre)
        p = float(probs[far >= abs(observed - centre) - 1e-9].sum())
        p_min = float(probs[far >= far.max() - 1e-9].sum())
    else:
        _, counts = np.unique(pooled, return_counts=True)
        n = nx + ny
        var = nx * ny / 12 * ((n + 1) - (counts**3 - counts).sum() / (n * (n - 1)))
        z = (observed / 2 - centre / 2) / np.sqrt(var) if var > 0 else 0.0
        p = _normal_p(z) if var > 0 else 1.0
        p_min = 0.0
    low, high = _moses(diffs, nx, ny, 1 - level, exact_limit)
    return Shift(nx, ny, min(p, 1.0), min(p_min, 1.0), exact, float(np.median(diffs)), low, high,
                 float(delta))  # fmt: skip


def _moses(
    diffs: np.ndarray, nx: int, ny: int, alpha: float, exact_limit: int
) -> tuple[float, float]:
    """The distribution-free interval of the shift: the k-th smallest and largest pairwise
    difference, k from U's null distribution without ties (exact up to EXACT_LIMIT, else
    normal): P(U < k) <= alpha / 2."""
    m = nx * ny
    if nx + ny <= exact_limit:
        sums, probs = rank_sum_null(tuple(range(2, 2 * (nx + ny) + 1, 2)), nx)
        u = (sums - nx * (nx + 1)) // 2  # U from the (doubled) rank sum
        cdf = np.cumsum(probs)
        k = int(np.count_nonzero(cdf <= alpha / 2))  # P(U <= k - 1) <= alpha / 2
        k = int(u[k - 1]) + 1 if k else 0
    else:
        from statistics import NormalDist

        z = NormalDist().inv_cdf(1 - alpha / 2)
        k = int(np.floor(m / 2 - z * np.sqrt(m * (nx + ny + 1) / 12)))
    if k < 1:
        return float("nan"), float("nan")
    return float(diffs[k - 1]), float(diffs[m - k])


def adjust(p, method: str = "bh") -> np.ndarray:
    """p-values adjusted for their number: Benjamini–Hochberg (``bh``: reject where the
    adjusted value <= the false discovery rate wanted) or Holm (``holm``: <= the family-wise
    error rate wanted); NaNs stay NaN and do not count."""
    if method not in CORRECTIONS:
        raise ValueError(f"correction {method!r}: one of {', '.join(CORRECTIONS)}")
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    q = p[ok]
    m = len(q)
    if m == 0:
        return out
    order = np.argsort(q, kind="mergesort")
    ranked = q[order]
    if method == "holm":
        adj = np.maximum.accumulate((m - np.arange(m)) * ranked)
    else:
        adj = np.minimum.accumulate((m / np.arange(1, m + 1) * ranked)[::-1])[::-1]
    back = np.empty(m)
    back[order] = np.minimum(adj, 1.0)
    out[ok] = back
    return out
