"""Two implementations of one congestion control against each other (the kernel's module and
hostside/bpf_cc's: `make validate-htcp`), from any batch whose trials ran both: per trial its
goodput, the UDP stream's median one-way delay, the bulk flow's mean congestion-epoch length
and the shape of its cwnd over an epoch; per implementation their mean and run-to-run spread;
per metric the verdict.

The rule, the verdicts and the table are analysis/agreement.py's (RIO's validation shares them):
a metric agrees when the difference of the two implementations' means is at most TOLERANCE_SDS
pooled standard deviations of the trials.

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

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import agreement
from analysis.agreement import TOLERANCE_SDS, Judged, Trajectory, Verdict, begin_row, rows_frame
from analysis.tcp_probe import epoch_starts
from core.layout import BatchDir, TrialDir

__all__ = [
    "GRID",
    "JUDGED",
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
JUDGED = Judged(
    METRICS, Trajectory("cwnd trajectory (worst pt)", tuple(TRAJECTORY), "at {} of the epoch")
)


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
    row, _, summary = begin_row(trial_dir, _implementation)
    if summary is None:
        return row
    td = TrialDir(Path(trial_dir))
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
    return rows_frame([trial_metrics(t.path) for t in BatchDir(Path(batch_dir)).trial_dirs()])


def compare(rows: pd.DataFrame) -> tuple[tuple[str, str], list[Verdict]]:
    """The two implementations of the usable rows (no problem) and each metric's Verdict,
    then each trajectory point's (agreement.compare). ValueError unless exactly two
    implementations ran."""
    return agreement.compare(rows, JUDGED)


def format_verdicts(names: tuple[str, str], verdicts: list[Verdict]) -> list[str]:
    """The table (agreement.format_verdicts): a line per metric, the cwnd trajectory as one
    line (its worst point) with its points below."""
    return agreement.format_verdicts(names, verdicts, JUDGED)


def main(argv: list[str] | None = None) -> int:
    """python -m analysis.implementations BATCH: the table; 0 when every metric agrees, 1 when
    one does not, 2 when the batch cannot be judged."""
    return agreement.main(argv, "analysis.implementations", batch_metrics, JUDGED)


if __name__ == "__main__":
    sys.exit(main())
