"""Tonight against a baseline, judged by a test: for each cell of the matrix (the trials whose
factors agree) and each metric the catalog holds for the experiment, tonight's repetitions
against the baseline's (the last N nights of the same experiment, or one named batch) by a
two-sided Mann–Whitney U test (analysis/stats.py), the p-values adjusted for how many were
made (Benjamini–Hochberg by default, or Holm), and the change given as the Hodges–Lehmann
shift with its interval. Metrics come from the catalog (analysis/query.py), whatever the
family; only complete, analysed trials count.

A metric the trials all share the value of (in a cell: tonight's and the baseline's together)
is not tested, nor a second name for the same values (a family's copy of a generator's metric):
both choices are blind to which trial is tonight's, so the test stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analysis.dataset import KEYS, PROVENANCE
from analysis.lazy import pd
from analysis.query import connect
from analysis.stats import adjust, mann_whitney
from core.layout import CatalogDir, batch_key, catalog_dir

__all__ = [
    "ALPHA",
    "NIGHTS",
    "Verdict",
    "baseline_batches",
    "compare",
    "distinct_metrics",
    "judge",
    "metric_columns",
    "same_values",
]

ALPHA = 0.05  # the false discovery rate (bh) or family-wise error rate (holm) allowed
NIGHTS = 7  # baseline: this many nights before tonight
MIN_RUNS = 2  # on each side, for a cell and metric to be tested
# Columns of the trials view that are no metric.
NOT_METRICS = {*KEYS, *PROVENANCE, "experiment", "date", "analysed", "t0_ns", "repetition"}


def metric_columns(trials: pd.DataFrame) -> list[str]:
    """The numeric columns of catalog rows that are metrics (no key, factor or provenance)."""
    return [
        c
        for c in trials.columns
        if c not in NOT_METRICS
        and not c.startswith(("factor:", "param:"))
        and pd.api.types.is_numeric_dtype(trials[c])
        and not pd.api.types.is_bool_dtype(trials[c])
    ]


def same_values(frame: pd.DataFrame, metrics: list[str]) -> dict[str, list[str]]:
    """Each metric kept -> the other names of its values: of columns equal in every row (the
    same values, NaN where it is NaN) the one with a generator's or queue's name (a dot or
    bracket) is kept, then the first by name."""
    kept: dict[bytes, str] = {}
    others: dict[str, list[str]] = {}
    for m in sorted(metrics, key=lambda c: (not ("." in c or "[" in c), c)):
        key = frame[m].to_numpy(dtype=float, na_value=np.nan).tobytes()
        first = kept.setdefault(key, m)
        others.setdefault(first, []).extend([m] if first != m else [])
    return dict(sorted(others.items()))


def distinct_metrics(frame: pd.DataFrame, metrics: list[str]) -> list[str]:
    """The metrics left once a column equal to another is dropped (same_values)."""
    return list(same_values(frame, metrics))


def compare(
    tonight: pd.DataFrame,
    baseline: pd.DataFrame,
    *,
    alpha: float = ALPHA,
    correction: str = "bh",
    metrics: list[str] | None = None,
) -> pd.DataFrame:
    """One row per cell and metric of tonight's trials: runs and medians of both sides, the
    shift (tonight − baseline, Hodges–Lehmann) and its (1 − alpha) interval, the relative
    shift, Cliff's delta, p, the adjusted p (``q``) and ``changed`` (q <= alpha); rows that
    were not tested say why in ``untested`` (their p is NaN and they do not count in the
    adjustment); ``same_values``: the other metrics with these values in every run (tested
    once, under this name)."""
    both = pd.concat([tonight, baseline], ignore_index=True)
    candidates = metrics if metrics is not None else metric_columns(both)
    candidates = [m for m in candidates if m in both and both[m].notna().any()]
    aliases = same_values(both, candidates)
    rows = []
    for cell, here in tonight.groupby("cell", sort=True):
        there = baseline[baseline.cell == cell]
        for m, also in aliases.items():
            x = here[m].to_numpy(dtype=float, na_value=np.nan)
            y = there[m].to_numpy(dtype=float, na_value=np.nan) if len(there) else np.array([])
            x, y = x[~np.isnan(x)], y[~np.isnan(y)]
            row = {"cell": cell, "metric": m, "runs": len(x), "runs_baseline": len(y)}
            row["same_values"] = ", ".join(also) or None
            row["median"] = float(np.median(x)) if len(x) else np.nan
            row["median_baseline"] = float(np.median(y)) if len(y) else np.nan
            if len(x) < MIN_RUNS or len(y) < MIN_RUNS:
                row["untested"] = f"fewer than {MIN_RUNS} runs on a side"
            elif np.ptp(np.concatenate([x, y])) == 0:
                row["untested"] = "one value in every run"
            else:
                s = mann_whitney(x, y, level=1 - alpha)
                base = row["median_baseline"]
                row.update(
                    shift=s.shift,
                    shift_low=s.low,
                    shift_high=s.high,
                    relative=s.shift / abs(base) if base else np.nan,
                    delta=s.delta,
                    p=s.p,
                    p_min=s.p_min,
                )
            rows.append(row)
    cols = ["cell", "metric", "runs", "runs_baseline", "median", "median_baseline", "shift",
            "shift_low", "shift_high", "relative", "delta", "p", "p_min", "q", "changed",
            "untested", "same_values"]  # fmt: skip
    table = pd.DataFrame(rows).reindex(columns=cols)
    table["q"] = adjust(table.p.to_numpy(dtype=float, na_value=np.nan), correction)
    table["changed"] = table.q <= alpha
    return table


def _batches(con, experiment: str) -> pd.DataFrame:
    return con.execute(
        "SELECT batch, min(date) AS date FROM trials WHERE experiment = ? "
        "GROUP BY batch ORDER BY date, batch",
        [experiment],
    ).df()


def baseline_batches(
    con, experiment: str, tonight: str, nights: int = NIGHTS, named: str | None = None
) -> list[str]:
    """The baseline's batches in the catalog: ``named`` alone, else the ``nights`` batches of
    the experiment before tonight's (by date, then name)."""
    listed = _batches(con, experiment)
    if named is not None:
        return [named] if named in set(listed.batch) else []
    order = list(listed.batch)
    before = order[: order.index(tonight)] if tonight in order else order
    return before[-nights:] if nights > 0 else []


@dataclass
class Verdict:
    """What the test said of one batch: the table of compare(), and what it compared."""

    batch: str
    experiment: str | None
    baseline: list[str]
    alpha: float
    correction: str
    table: pd.DataFrame = field(default_factory=lambda: pd.DataFrame())
    problem: str | None = None  # why nothing was compared

    @property
    def changed(self) -> pd.DataFrame:
        if not len(self.table):
            return self.table
        return self.table[self.table.changed.fillna(False).astype(bool)]

    @property
    def found(self) -> bool:
        return bool(len(self.changed))

    @property
    def tested(self) -> int:
        return int(self.table.p.notna().sum()) if len(self.table) else 0

    def lines(self) -> list[str]:
        """The verdict as text: report.txt's section, the nightly log's lines."""
        name = {"bh": "Benjamini-Hochberg", "holm": "Holm"}[self.correction]
        head = f"Regressions: {self.batch} against the baseline"
        if self.problem:
            return [head, f"  not judged: {self.problem}"]
        out = [
            head + f" {', '.join(self.baseline)}",
            f"  two-sided Mann-Whitney U per cell and metric; {self.tested} tests, {name} "
            f"adjusted, changed where q <= {self.alpha:g}; shift = tonight - baseline "
            f"(Hodges-Lehmann, {1 - self.alpha:.0%} interval)",
        ]
        if not self.found:
            out.append("  verdict: no change found")
            never = self.table[self.table.p_min > self.alpha]
            if len(never):
                out.append(
                    f"  ({len(never)} of the tests could not reach p <= {self.alpha:g} with "
                    "so few runs: more repetitions or nights give them the power)"
                )
            return out
        out.append(f"  verdict: CHANGED: {len(self.changed)} metric(s)")
        for r in self.changed.itertuples():
            interval = (
                f"[{r.shift_low:.4g}, {r.shift_high:.4g}]"
                if not np.isnan(r.shift_low)
                else "[no interval: too few runs]"
            )
            out.append(
                f"  {r.metric} ({r.cell}): {r.median_baseline:.4g} -> {r.median:.4g}, shift "
                f"{r.shift:+.4g} {interval} ({r.relative:+.1%}), delta {r.delta:+.2f}, "
                f"p={r.p:.2g}, q={r.q:.2g}"
                + (f" (the same values: {r.same_values})" if isinstance(r.same_values, str) else "")
            )
        return out


def judge(
    batch_dir: Path,
    *,
    nights: int = NIGHTS,
    baseline: str | Path | None = None,
    alpha: float = ALPHA,
    correction: str = "bh",
    catalog: CatalogDir | None = None,
) -> Verdict:
    """Tonight's batch (in the catalog already: analysis.dataset.add_batch) against its
    baseline: the last ``nights`` batches of its experiment, or the batch ``baseline`` (its
    directory, or its name in the catalog)."""
    catalog = catalog or catalog_dir(batch_dir)
    name, _ = batch_key(batch_dir)
    named = None
    if baseline is not None:
        named = batch_key(Path(baseline))[0] if Path(baseline).is_dir() else str(baseline)
    verdict = Verdict(name, None, [], alpha, correction)
    con = connect(catalog)
    try:
        rows = con.execute("SELECT * FROM trials WHERE batch = ?", [name]).df()
        if rows.empty:
            verdict.problem = f"{name} is not in the catalog {catalog.path}"
            return verdict
        verdict.experiment = str(rows.experiment.iloc[0])
        verdict.baseline = baseline_batches(con, verdict.experiment, name, nights, named)
        if not verdict.baseline:
            verdict.problem = (
                f"no baseline: the catalog has no batch {named}"
                if named
                else f"no earlier batch of {verdict.experiment} in the catalog"
            )
            return verdict
        marks = ", ".join("?" for _ in verdict.baseline)
        before = con.execute(
            f"SELECT * FROM trials WHERE batch IN ({marks}) AND experiment = ?",
            [*verdict.baseline, verdict.experiment],
        ).df()
    finally:
        con.close()

    def usable(t: pd.DataFrame) -> pd.DataFrame:
        return t[(t.status == "complete") & t.analysed.fillna(False).astype(bool)]

    verdict.table = compare(usable(rows), usable(before), alpha=alpha, correction=correction)
    return verdict
