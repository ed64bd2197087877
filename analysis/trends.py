"""An experiment's nights as series: per cell and metric, each night's runs (median and range)
with the night's commit; the nights the test flagged (each night against the nights before it,
as the nightly run judged it: analysis.regressions); and the first night after which a shift
holds, named with its commit (bisect from there).

The shift's night: every split of the series into nights before and nights from night k is
tested (Mann–Whitney U, the runs before against the runs from k); the split with the smallest
p-value is the candidate, its p multiplied by the number of splits tried (Bonferroni), then
adjusted over all the series (Benjamini–Hochberg). It holds when that is <= alpha and every
night from k has its median on the shifted side of the nights before (a single odd night is
no shift that holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.query import connect
from analysis.regressions import (
    ALPHA,
    MIN_RUNS,
    NIGHTS,
    compare,
    distinct_metrics,
    metric_columns,
)
from analysis.stats import adjust, mann_whitney
from core.layout import CatalogDir

__all__ = ["Trends", "change_points", "flagged_nights", "nights_of", "trends"]

# A series' splits are many (one per night): exact p-values up to this many runs, the normal
# approximation beyond (a split's p is multiplied by the splits tried anyway).
SPLIT_EXACT_LIMIT = 40


def nights_of(
    experiment: str, catalog: CatalogDir | None = None, until: str | None = None, last: int = 60
) -> pd.DataFrame:
    """The complete, analysed trials of the experiment's last ``last`` batches (up to the
    batch ``until``, included), with ``night``: the batch's place in date order (0 first)."""
    con = connect(catalog)
    try:
        rows = con.execute(
            "SELECT * FROM trials WHERE experiment = ? AND status = 'complete' AND analysed",
            [experiment],
        ).df()
    finally:
        con.close()
    if rows.empty:
        return rows
    order = rows.groupby("batch").date.min().reset_index().sort_values(["date", "batch"])
    names = list(order.batch)
    if until is not None and until in names:
        names = names[: names.index(until) + 1]
    names = names[-last:]
    rows = rows[rows.batch.isin(names)].copy()
    rows["night"] = rows.batch.map({b: i for i, b in enumerate(names)})
    return rows.sort_values(["night", "trial"]).reset_index(drop=True)


def flagged_nights(
    rows: pd.DataFrame, metrics: list[str], nights: int = NIGHTS, alpha: float = ALPHA
) -> pd.DataFrame:
    """Each night tested against the ``nights`` before it: (night, batch, cell, metric, q) of
    every change found."""
    found = []
    for night in sorted(rows.night.unique()):
        before = rows[(rows.night < night) & (rows.night >= night - nights)]
        if before.empty:
            continue
        table = compare(rows[rows.night == night], before, alpha=alpha, metrics=metrics)
        batch = rows[rows.night == night].batch.iloc[0]
        for r in table[table.changed].itertuples():
            found.append({"night": night, "batch": batch, "cell": r.cell, "metric": r.metric,
                          "q": r.q})  # fmt: skip
    return pd.DataFrame(found, columns=["night", "batch", "cell", "metric", "q"])


def _split(values: pd.DataFrame, metric: str) -> dict | None:
    """The best split of one series (its runs with their night), or None (too short)."""
    nights = sorted(values.night.unique())
    best = None
    for k in nights[1:]:
        x = values[values.night >= k][metric].to_numpy(float)
        y = values[values.night < k][metric].to_numpy(float)
        if len(x) < MIN_RUNS or len(y) < MIN_RUNS or np.ptp(np.concatenate([x, y])) == 0:
            continue
        s = mann_whitney(x, y, exact_limit=SPLIT_EXACT_LIMIT)
        if best is None or s.p < best["p_split"]:
            best = {"from_night": k, "p_split": s.p, "shift": s.shift, "before": np.median(y)}
    if best is None:
        return None
    best["splits"] = len(nights) - 1
    best["p"] = min(best["p_split"] * best["splits"], 1.0)
    medians = values.groupby("night")[metric].median()
    after = medians[medians.index >= best["from_night"]]
    side = np.sign(best["shift"])
    best["holds"] = bool(side != 0 and (np.sign(after - best["before"]) == side).all())
    return best


def change_points(rows: pd.DataFrame, metrics: list[str], alpha: float = ALPHA) -> pd.DataFrame:
    """Per cell and metric, the night from which a shift holds (see the module docstring):
    cell, metric, from_night, batch, date, commit, shift, p (Bonferroni over the splits), q
    (adjusted over the series), holds."""
    out = []
    for cell, here in rows.groupby("cell", sort=True):
        for m in metrics:
            values = here[["night", m]].dropna()
            found = _split(values, m) if values.night.nunique() > 1 else None
            if found is None:
                continue
            night = here[here.night == found["from_night"]]
            commits = sorted(set(night.commit.dropna()))
            out.append(
                {
                    "cell": cell,
                    "metric": m,
                    "from_night": found["from_night"],
                    "batch": night.batch.iloc[0],
                    "date": str(night.date.iloc[0])[:10],
                    "commit": ", ".join(commits) or None,
                    "shift": found["shift"],
                    "p": found["p"],
                    "holds_every_night": found["holds"],
                }
            )
    cols = ["cell", "metric", "from_night", "batch", "date", "commit", "shift", "p",
            "holds_every_night", "q", "shifted"]  # fmt: skip
    table = pd.DataFrame(out).reindex(columns=cols)
    table["q"] = adjust(table.p.to_numpy(float, na_value=np.nan))
    table["shifted"] = (table.q <= alpha) & table.holds_every_night.fillna(False).astype(bool)
    return table


@dataclass
class Trends:
    """An experiment's series: its rows (one per run), the metrics followed, the nights
    flagged and the change points."""

    experiment: str
    rows: pd.DataFrame
    metrics: list[str]
    flagged: pd.DataFrame
    points: pd.DataFrame

    def series(self, cell: str, metric: str) -> pd.DataFrame:
        """Per night: batch, date, commit(s), runs, median, min, max, flagged."""
        here = self.rows[self.rows.cell == cell]
        per = here.groupby("night").agg(
            batch=("batch", "first"),
            date=("date", "first"),
            commit=("commit", lambda c: ", ".join(sorted({str(x)[:10] for x in c.dropna()}))),
            runs=(metric, "count"),
            median=(metric, "median"),
            low=(metric, "min"),
            high=(metric, "max"),
        )
        hit = self.flagged[(self.flagged.cell == cell) & (self.flagged.metric == metric)]
        per["flagged"] = per.index.isin(hit.night)
        return per.reset_index()


def trends(
    experiment: str,
    catalog: CatalogDir | None = None,
    *,
    until: str | None = None,
    key: list[str] | None = None,
    nights: int = NIGHTS,
    alpha: float = ALPHA,
    last: int = 60,
) -> Trends:
    """The experiment's series from the catalog: the metrics in ``key`` (those present),
    and every other metric a night was flagged on or that shifted; without ``key`` and
    nothing flagged, every metric."""
    rows = nights_of(experiment, catalog, until, last)
    if rows.empty:
        empty = pd.DataFrame()
        return Trends(experiment, rows, [], empty, empty)
    found = [m for m in metric_columns(rows) if m != "night" and rows[m].notna().any()]
    every = distinct_metrics(rows, found)
    flagged = flagged_nights(rows, every, nights, alpha)
    points = change_points(rows, every, alpha)
    moved = set(flagged.metric) | set(points[points.shifted].metric)
    wanted = [_named(rows, m, every) for m in key or [] if m in rows and rows[m].notna().any()]
    metrics = list(dict.fromkeys([*wanted, *sorted(moved)]))
    return Trends(experiment, rows, metrics or every, flagged, points)


def _named(rows: pd.DataFrame, metric: str, names: list[str]) -> str:
    """The name the tests gave ``metric`` (a family's bare copy of a generator's metric is
    tested under the generator's name): the one of ``names`` with the same values."""
    if metric in names:
        return metric
    values = rows[metric].to_numpy(dtype=float, na_value=np.nan)
    for n in names:
        if np.array_equal(rows[n].to_numpy(dtype=float, na_value=np.nan), values, equal_nan=True):
            return n
    return metric
