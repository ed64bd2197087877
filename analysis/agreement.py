"""Two implementations of one mechanism against each other, from a batch whose trials ran both
(analysis/implementations.py: H-TCP's kernel module and BPF program; analysis/rio_validation.py:
RIO as GRED and as the BPF program): the rule, each metric's verdict, the table, and the exit
code of the commands that print it. What a trial measures is the caller's: one row per trial
with its `trial`, the `implementation` that ran, a `problem` when it cannot count, and a column
per metric (`Judged` names them).

The rule: a metric agrees when the difference of the two implementations' means is at most
TOLERANCE_SDS pooled standard deviations of the trials (the run-to-run spread within one
implementation). The two-sided Mann–Whitney test of analysis/stats.py is shown beside it. A
trajectory (points of one curve, each a metric) agrees when every point does.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.stats import mann_whitney
from core.layout import TrialDir

__all__ = [
    "TOLERANCE_SDS",
    "Judged",
    "Trajectory",
    "Verdict",
    "begin_row",
    "compare",
    "format_verdicts",
    "judged",
    "main",
    "rows_frame",
]

TOLERANCE_SDS = 2.0  # |difference of means| allowed, in pooled standard deviations
COLUMNS = ["trial", "implementation", "problem"]  # every row's first columns


@dataclass(frozen=True)
class Trajectory:
    """Points of one curve, each a metric `<name>@<where>`, shown as one line (its worst
    point: `label`, `at` formats the point's <where>) with the points below it."""

    label: str
    points: tuple[str, ...]
    at: str  # e.g. "at {} of the epoch"


@dataclass(frozen=True)
class Judged:
    """What a comparison judges: per-trial metric -> its label in the table, and a
    trajectory."""

    metrics: dict[str, str]
    trajectory: Trajectory | None = None

    @property
    def columns(self) -> list[str]:
        return [*self.metrics, *(self.trajectory.points if self.trajectory else ())]


@dataclass(frozen=True)
class Verdict:
    """One metric: per implementation (the two in name order) its trials, mean and sd; the
    difference of the means (second minus first), the tolerance (TOLERANCE_SDS pooled sd),
    the Mann–Whitney p, and whether they agree."""

    metric: str
    n: tuple[int, int]
    mean: tuple[float, float]
    sd: tuple[float, float]
    difference: float
    tolerance: float
    p: float
    agree: bool


def begin_row(
    trial_dir: Path, implementation: Callable[[dict[str, Any]], tuple[str | None, str | None]]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """A trial's row as far as its record goes: trial, implementation and problem
    (`implementation(record)` says what ran, or why that cannot count); the record; and the
    trial's summary, None when the row is final (the trial did not complete, or is not
    analysed)."""
    td = TrialDir(Path(trial_dir))
    record = json.loads(td.record.read_text())
    row: dict[str, Any] = {"trial": td.name, "implementation": None, "problem": None}
    if record.get("status") != "complete":
        return {**row, "problem": f"status {record.get('status')}"}, record, None
    row["implementation"], row["problem"] = implementation(record)
    if not td.summary.exists():
        return {**row, "problem": "not analysed (make report BATCH=... analyses it)"}, record, None
    return row, record, json.loads(td.summary.read_text())


def rows_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The trials' rows as one table, COLUMNS first."""
    table = pd.DataFrame(rows)
    return table.reindex(columns=list(dict.fromkeys([*COLUMNS, *table])))


def _verdict(metric: str, a: np.ndarray, b: np.ndarray) -> Verdict:
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if len(a) < 2 or len(b) < 2:
        nan = math.nan
        return Verdict(metric, (len(a), len(b)), (nan, nan), (nan, nan), nan, nan, nan, False)
    sd_a, sd_b = float(np.std(a, ddof=1)), float(np.std(b, ddof=1))
    pooled = math.sqrt(((len(a) - 1) * sd_a**2 + (len(b) - 1) * sd_b**2) / (len(a) + len(b) - 2))
    difference = float(b.mean() - a.mean())
    tolerance = TOLERANCE_SDS * pooled
    return Verdict(
        metric, (len(a), len(b)), (float(a.mean()), float(b.mean())), (sd_a, sd_b), difference,
        tolerance, mann_whitney(b, a).p, abs(difference) <= tolerance,
    )  # fmt: skip


def compare(rows: pd.DataFrame, what: Judged) -> tuple[tuple[str, str], list[Verdict]]:
    """The two implementations of the usable rows (no problem) and each metric's Verdict,
    then each trajectory point's. ValueError unless exactly two implementations ran."""
    usable = rows[rows.problem.isna()]
    names = sorted(usable.implementation.dropna().unique())
    if len(names) != 2:
        raise ValueError(
            f"the comparison needs trials of exactly two implementations; the usable trials "
            f"ran {', '.join(names) or 'none'}"
        )
    first, second = (usable[usable.implementation == n] for n in names)
    verdicts = [
        _verdict(m, first[m].to_numpy(float), second[m].to_numpy(float))
        for m in what.columns
        if m in usable
    ]
    return (names[0], names[1]), verdicts


def judged(verdicts: list[Verdict]) -> bool:
    """Whether every metric had at least two usable trials of each implementation."""
    return all(v.n[0] >= 2 and v.n[1] >= 2 for v in verdicts)


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def format_verdicts(names: tuple[str, str], verdicts: list[Verdict], what: Judged) -> list[str]:
    """The table, a line per metric: each implementation's mean ± sd (n), the difference,
    the tolerance, Mann–Whitney's p and the verdict; the trajectory as one line (its worst
    point) with its points below; the rule last."""
    head = f"{'metric':28} {names[0]:>22} {names[1]:>22} {'diff':>8} {'allowed':>8} {'p':>6}"
    head += "  verdict"
    out = [head, "-" * len(head)]

    def line(label: str, v: Verdict) -> str:
        sides = [
            f"{_number(m)} ± {_number(s)} ({n})" for m, s, n in zip(v.mean, v.sd, v.n, strict=True)
        ]
        return (
            f"{label:28} {sides[0]:>22} {sides[1]:>22} {_number(v.difference):>8} "
            f"{_number(v.tolerance):>8} {_number(v.p):>6}  {'agree' if v.agree else 'DISAGREE'}"
        )

    curve = what.trajectory
    points = [v for v in verdicts if curve and v.metric in curve.points]
    for v in verdicts:
        if v.metric in what.metrics:
            out.append(line(what.metrics[v.metric], v))
    if curve and points:
        worst = max(points, key=lambda v: abs(v.difference) - v.tolerance)
        agree = all(v.agree for v in points)
        out.append(
            f"{curve.label:28} {'':>22} {'':>22} {_number(worst.difference):>8} "
            f"{_number(worst.tolerance):>8} {'':>6}  {'agree' if agree else 'DISAGREE'} "
            f"({curve.at.format(worst.metric.split('@')[1])}; {sum(v.agree for v in points)} "
            f"of {len(points)} points agree)"
        )
        out += ["  " + line(v.metric, v) for v in points]
    out.append(
        f"rule: a metric agrees when |{names[1]} - {names[0]}| (difference of means) <= "
        f"{TOLERANCE_SDS:g} pooled sd of the trials; the trajectory when every point does"
    )
    return out


def main(
    argv: list[str] | None,
    module: str,
    batch_metrics: Callable[[Path], pd.DataFrame],
    what: Judged,
) -> int:
    """`python -m <module> BATCH`: the table of its batch_metrics; 0 when every metric
    agrees, 1 when one does not, 2 when the batch cannot be judged."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {module} results/<batch>", file=sys.stderr)
        return 2
    rows = batch_metrics(Path(args[0]))
    for r in rows[rows.problem.notna()].itertuples():
        print(f"{r.trial}: left out: {r.problem}")
    try:
        names, verdicts = compare(rows, what)
    except ValueError as exc:
        print(f"{args[0]}: cannot compare: {exc}", file=sys.stderr)
        return 2
    print("\n".join(format_verdicts(names, verdicts, what)))
    if not judged(verdicts):
        print("fewer than two usable trials of an implementation for some metric: not judged")
        return 2
    return 0 if all(v.agree for v in verdicts) else 1
