"""RIO's two implementations on Linux against each other (GRED in RIO mode and the tc BPF program
of hostside/bpf_tc/rio: `make validate-rio`), from any batch whose trials ran both: per trial
the drop share of IN and of OUT packets at the RIO queue, counted by DSCP in the captures
before and after it (analysis/dscp.py's counts: one referee whichever ran, not each
implementation's own counters), IN's share of the packets offered, the queue's length over the
steady window (its time-weighted mean and quantiles, of the queue the captures reconstruct:
analysis/bottleneck.py), and the trial's point on seed 004's frontier (goodput and mean transit,
analysis/families/diffserv.py); per implementation their mean and run-to-run spread; per metric
the verdict, by analysis/agreement.py's rule and table (H-TCP's validation shares them).

A packet before the queue and none after it was dropped there: the captures before and after
must see every packet, and the queue must have drained before they stopped (the experiment's
drain); a trial where either fails (a capture's kernel drops, packets the queue analysis
could not tell from drops at the end) is left out, named.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from analysis import agreement
from analysis.agreement import Judged, Trajectory, begin_row, rows_frame
from analysis.queue import queue_quantiles, queue_summary
from core.dscp import DSCP_NAMES
from core.layout import BatchDir, TrialDir
from core.units import parse_duration_ns, parse_offset_ns

__all__ = [
    "JUDGED",
    "METRICS",
    "QUANTILES",
    "batch_metrics",
    "drop_counts",
    "main",
    "trial_metrics",
]

LEVELS = ("in", "out", "high")  # RIO's drop precedences, as core/rio.py names them
# Per-trial metric -> its label in the table (the queue's quantiles follow them).
METRICS = {
    "in_share_pct": "IN % of packets offered",
    "in_drop_pct": "IN dropped % (captures)",
    "out_drop_pct": "OUT dropped % (captures)",
    "high_drop_pct": "HIGH dropped % (captures)",
    "queue_mean_pkt": "queue mean (pkt, captures)",
    "goodput_mbps": "goodput (Mbit/s, frontier)",
    "transit_ms": "transit (ms, frontier)",
}
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)  # of the time over the steady window
TRAJECTORY = [f"queue@p{round(q * 100)}" for q in QUANTILES]
JUDGED = Judged(
    METRICS,
    Trajectory("queue quantiles (worst pt)", tuple(TRAJECTORY), "at its {} (time-weighted)"),
)


def _implementation(record: dict[str, Any]) -> tuple[str | None, str | None]:
    """What ran at the trial's RIO queue (gred, bpf) and why it cannot count, if not."""
    rio = record.get("rio") or {}
    if len(rio) != 1:
        return None, f"{len(rio)} RIO queues; the comparison takes a trial with one"
    where, entry = next(iter(rio.items()))
    ran, asked = entry.get("implementation"), entry.get("asked")
    if ran is None:
        return None, f"{where}: {entry.get('approximation') or 'no implementation recorded'}"
    if entry.get("error"):
        return None, f"{where}: {entry['error']}"
    if asked not in (None, "auto", ran):
        return None, f"{where}: asked {asked}, ran {ran}"
    return ran, None


def _code(name: str) -> int:
    """A DSCP as analysis/dscp.py names it (af11, be; a number where it has no name)."""
    return DSCP_NAMES[name] if name in DSCP_NAMES else int(name)


def drop_counts(record: dict[str, Any], summary: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Per RIO level present: the packets of the generators through the trial's RIO queue
    seen before it and after it, by their DSCP (the record's in_dscp, high_dscp; every other
    code is OUT). ValueError when a generator's counts at the queue's captures are missing."""
    ((where, rio),) = record["rio"].items()
    host, iface = where.split(":", 1)
    queue = (summary.get("queues") or {}).get(rio["link"])
    if not queue:
        raise ValueError(f"no queue of link {rio['link']} in the summary (a capture each side?)")
    level = {c: "in" for c in rio["in_dscp"]} | {c: "high" for c in rio.get("high_dscp", [])}
    counts = {name: [0, 0] for name in LEVELS[: 3 if rio.get("high_dscp") else 2]}
    for name, gen in record["traffic"].items():
        b = gen["path"].get("bottleneck") or {}
        if (b.get("host"), b.get("iface")) != (host, iface):
            continue
        seen = summary["generators"][name].get("dscp") or {}
        for side, points in enumerate((queue["captures_before"], queue["captures_after"])):
            point = next((p for p in seen if p in points), None)
            if point is None:
                raise ValueError(f"{name}: no DSCP counts at {' or '.join(points)}")
            for dscp, packets in seen[point].items():
                counts[level.get(_code(dscp), "out")][side] += packets
    return {k: (before, after) for k, (before, after) in counts.items()}


def _queue_columns(td: TrialDir, record: dict[str, Any], link: str) -> dict[str, float]:
    """The queue's time-weighted mean and QUANTILES (packets) over the steady window (warmup
    to the duration's end), from the queue the captures reconstruct."""
    columns = ["ts_ns", "event", "packets", "bytes", "link"]
    queue = pd.read_parquet(td.table("queue"), columns=columns)
    queue = queue[queue.link == link]
    params = record["parameters"]
    start = record["times"]["t0_ns"] + parse_offset_ns(params.get("warmup") or 0)
    end = record["times"]["t0_ns"] + parse_duration_ns(params["duration"])
    levels = queue_quantiles(queue, list(QUANTILES), start_ns=start, end_ns=end)
    mean = queue_summary(queue, start_ns=start, end_ns=end)["mean_packets"]
    return {"queue_mean_pkt": mean, **dict(zip(TRAJECTORY, levels, strict=True))}


def trial_metrics(trial_dir: Path) -> dict[str, Any]:
    """One analysed trial's row: trial, implementation (gred or bpf, as its record says it
    ran), the METRICS and the queue's quantiles; `problem` says why a trial cannot count."""
    row, record, summary = begin_row(trial_dir, _implementation)
    if summary is None or "rio" not in record or len(record["rio"]) != 1:
        return row
    td = TrialDir(Path(trial_dir))
    ((_, rio),) = record["rio"].items()
    try:
        counts = drop_counts(record, summary)
    except ValueError as exc:
        return {**row, "problem": row["problem"] or str(exc)}
    queue = summary["queues"][rio["link"]]
    lost = {
        p: n
        for p, n in (summary.get("capture_drops") or {}).items()
        if n and p in {*queue["captures_before"], *queue["captures_after"]}
    }
    if lost and row["problem"] is None:
        said = ", ".join(f"{p} {n}" for p, n in sorted(lost.items()))
        row["problem"] = f"captures lost packets in the kernel ({said}): drops would be miscounted"
    if (waiting := queue.get("queue_undecided_at_end") or 0) and row["problem"] is None:
        row["problem"] = (
            f"{waiting} packets may have been in the queue still when the captures stopped, "
            "which the counts by DSCP take for drops: give the trial a longer drain"
        )
    offered = sum(before for before, _ in counts.values())
    row["in_share_pct"] = 100 * counts["in"][0] / offered if offered else math.nan
    for name, (before, after) in counts.items():
        row[f"{name}_drop_pct"] = 100 * (before - after) / before if before else math.nan
    # seed 004's frontier point (the diffserv family's summary; none: not judged)
    goodput, transit = summary.get("goodput_bps"), summary.get("transit_mean_ms")
    row["goodput_mbps"] = math.nan if goodput is None else goodput / 1e6
    row["transit_ms"] = math.nan if transit is None else transit
    if not td.table("queue").exists():
        return {**row, "problem": row["problem"] or "no queue table (captures on both sides?)"}
    return {**row, **_queue_columns(td, record, rio["link"])}


def batch_metrics(batch_dir: Path) -> pd.DataFrame:
    """trial_metrics of every trial of a batch, one row each."""
    return rows_frame([trial_metrics(t.path) for t in BatchDir(Path(batch_dir)).trial_dirs()])


def main(argv: list[str] | None = None) -> int:
    """python -m analysis.rio_validation BATCH: the table; 0 when every metric agrees, 1 when
    one does not, 2 when the batch cannot be judged."""
    return agreement.main(argv, "analysis.rio_validation", batch_metrics, JUDGED)


if __name__ == "__main__":
    sys.exit(main())
