"""Two implementations of one congestion control against each other (the kernel's module and
hostside/bpf_cc's: `make validate-htcp`), from any batch whose trials ran both: per trial its
goodput, the UDP stream's median one-way delay, the bulk flow's mean congestion-epoch length
and the shape of its cwnd over an epoch; per implementation their mean and run-to-run spread;
per metric the verdict.

The rule: a metric agrees when the difference of the two implementations' means is at most
TOLERANCE_SDS pooled standard deviations of the trials (the run-to-run spread within one
implementation). The two-sided Mann–Whitney test of analysis/stats.py is shown beside it.

The cwnd's shape: each congestion epoch (loss to loss: analysis/tcp_probe.py epoch_starts)
from the end of its reduction (recovery) to the next loss on a time axis of its own, 0 to 1,
and the cwnd over the cwnd just before that loss. H-TCP grows by alpha(D) per RTT, D the time
since
the epoch began: NewReno's one segment for the first second, then faster and faster, so the
curve is convex where NewReno's is a straight line. Its mean over a trial's epochs at the
points of GRID is the trial's trajectory (judged point by point by the same rule), and
LATE_GROWTH the share of the epoch's growth made in its second half (a straight line: 0.5;
H-TCP's convex curve: more).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.stats import mann_whitney
from analysis.tcp_probe import epoch_starts
from core.layout import BatchDir, TrialDir

__all__ = [
    "GRID",
    "METRICS",
    "TOLERANCE_SDS",
    "Verdict",
    "batch_metrics",
    "compare",
    "epoch_shapes",
    "format_verdicts",
    "main",
    "trial_metrics",
]

TOLERANCE_SDS = 2.0  # |difference of means| allowed, in pooled standard deviations
GRID = np.round(np.arange(1, 20) * 0.05, 2)  # points of an epoch where its cwnd is compared
MIDDLE = int(np.flatnonzero(GRID == 0.5)[0])
# Per-trial metric -> its label in the table (the trajectory's points follow them).
METRICS = {
    "goodput_kBps": "goodput (KB/s, captures)",
    "owd_median_ms": "UDP median OWD (ms)",
    "epoch_s": "congestion epoch (s, cwnd)",
    "late_growth": "cwnd growth in 2nd half",
}
TRAJECTORY = [f"cwnd@{u:g}" for u in GRID]


def epoch_shapes(cwnd: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The lengths (s, loss to loss) of the complete congestion epochs of one flow's cwnd
    samples (columns ts_ns and epoch_starts'), and the cwnd of each from the end of its
    reduction to the next loss, over the cwnd just before that loss, at the points of GRID of
    that span (the last sample at or before each): an array of (epochs, len(GRID))."""
    flow = cwnd.sort_values("ts_ns", kind="stable")
    ts = flow.ts_ns.to_numpy(np.int64)
    window = flow.snd_cwnd.to_numpy(np.float64)
    starts, ended = epoch_starts(flow)
    if len(starts) < 2:
        return np.empty(0), np.empty((0, len(GRID)))
    lengths = np.diff(ts[starts]) / 1e9
    grows = (ended[:-1] >= 0) & (ended[:-1] < starts[1:])  # recovered before the next loss
    begin, end = ts[ended[:-1][grows]], ts[starts[1:][grows]]
    at = begin[:, None] + np.rint((end - begin)[:, None] * GRID[None, :]).astype(np.int64)
    rows = np.searchsorted(ts, at, side="right") - 1  # the last sample at or before
    return lengths, window[rows] / window[starts[1:][grows] - 1][:, None]


def _implementation(record: dict[str, Any]) -> tuple[str | None, str | None]:
    """What ran on the trial's hosts (one name when they all agree) and why not, if not."""
    ran = {
        (d.get("cc"), d.get("implementation"), d.get("asked"))
        for per_host in (record.get("cc_implementation") or {}).values()
        for d in per_host.values()
    }
    if not ran:
        return None, "its record names no congestion control's implementation"
    asked_other = [f"{cc}: asked {a}, ran {i}" for cc, i, a in ran if a not in (None, "auto", i)]
    if asked_other:
        return None, "; ".join(sorted(asked_other))
    kinds = {i for _, i, _ in ran}
    if len(kinds) > 1:
        return None, f"its hosts ran different implementations ({', '.join(sorted(kinds))})"
    ccs = sorted({str(c) for c, _, _ in ran})
    return f"{'+'.join(ccs)}/{kinds.pop()}", None


def trial_metrics(trial_dir: Path) -> dict[str, Any]:
    """One analysed trial's row: trial, implementation (cc/implementation as its record says
    it ran), the METRICS and the TRAJECTORY points; `problem` says why a trial cannot count."""
    td = TrialDir(Path(trial_dir))
    record = json.loads(td.record.read_text())
    row: dict[str, Any] = {"trial": td.name, "implementation": None, "problem": None}
    if record.get("status") != "complete":
        return {**row, "problem": f"status {record.get('status')}"}
    row["implementation"], row["problem"] = _implementation(record)
    if not td.summary.exists():
        return {**row, "problem": "not analysed (make report BATCH=... analyses it)"}
    summary = json.loads(td.summary.read_text())
    row["goodput_kBps"] = summary.get("goodput_kBps", math.nan)
    row["owd_median_ms"] = summary.get("owd_median_ms", math.nan)
    if not td.table("cwnd").exists():
        return {**row, "problem": row["problem"] or "no cwnd table (no tcp_probe recording)"}
    cwnd = pd.read_parquet(td.table("cwnd"))
    key = ["src", "sport", "dst", "dport"]
    flows = cwnd.groupby(key, observed=True)
    flow = flows.get_group(flows.size().idxmax())  # the bulk flow, not iperf3's control socket
    lengths, shapes = epoch_shapes(flow)
    row["epochs"] = len(lengths)
    row["epoch_s"] = float(lengths.mean()) if len(lengths) else math.nan
    mean = shapes.mean(axis=0) if len(shapes) else np.full(len(GRID), math.nan)
    row.update(zip(TRAJECTORY, mean.tolist(), strict=True))
    grown = mean[-1] - mean[0]
    row["late_growth"] = float((mean[-1] - mean[MIDDLE]) / grown) if grown > 0 else math.nan
    if not len(lengths) and row["problem"] is None:
        row["problem"] = "fewer than two congestion events"
    return row


def batch_metrics(batch_dir: Path) -> pd.DataFrame:
    """trial_metrics of every trial of a batch, one row each."""
    rows = [trial_metrics(t.path) for t in BatchDir(Path(batch_dir)).trial_dirs()]
    return pd.DataFrame(rows).reindex(
        columns=list(dict.fromkeys(["trial", "implementation", "problem", *pd.DataFrame(rows)]))
    )


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


def compare(rows: pd.DataFrame) -> tuple[tuple[str, str], list[Verdict]]:
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
        for m in [*METRICS, *TRAJECTORY]
        if m in usable
    ]
    return (names[0], names[1]), verdicts


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def format_verdicts(names: tuple[str, str], verdicts: list[Verdict]) -> list[str]:
    """The table, a line per metric: each implementation's mean ± sd (n), the difference,
    the tolerance, Mann–Whitney's p and the verdict; the trajectory as one line (its worst
    point) with its points below."""
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

    points = [v for v in verdicts if v.metric in TRAJECTORY]
    for v in verdicts:
        if v.metric in METRICS:
            out.append(line(METRICS[v.metric], v))
    if points:
        worst = max(points, key=lambda v: abs(v.difference) - v.tolerance)
        agree = all(v.agree for v in points)
        out.append(
            f"{'cwnd trajectory (worst pt)':28} {'':>22} {'':>22} {_number(worst.difference):>8} "
            f"{_number(worst.tolerance):>8} {'':>6}  {'agree' if agree else 'DISAGREE'} "
            f"(at {worst.metric.split('@')[1]} of the epoch; {sum(v.agree for v in points)} of "
            f"{len(points)} points agree)"
        )
        out += ["  " + line(v.metric, v) for v in points]
    out.append(
        f"rule: a metric agrees when |{names[1]} - {names[0]}| (difference of means) <= "
        f"{TOLERANCE_SDS:g} pooled sd of the trials; the trajectory when every point does"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m analysis.implementations BATCH: the table; 0 when every metric agrees, 1 when
    one does not, 2 when the batch cannot be judged."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m analysis.implementations results/<batch>", file=sys.stderr)
        return 2
    rows = batch_metrics(Path(args[0]))
    for r in rows[rows.problem.notna()].itertuples():
        print(f"{r.trial}: left out: {r.problem}")
    try:
        names, verdicts = compare(rows)
    except ValueError as exc:
        print(f"{args[0]}: cannot compare: {exc}", file=sys.stderr)
        return 2
    print("\n".join(format_verdicts(names, verdicts)))
    judged = [v for v in verdicts if not math.isnan(v.tolerance)]
    if len(judged) < len(verdicts):
        print("fewer than two usable trials of an implementation for some metric: not judged")
        return 2
    return 0 if all(v.agree for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
