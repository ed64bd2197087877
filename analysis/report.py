"""A batch's trials as one table indexed by their parameters, and the paper's Tables 1 and 2.

Table 1: aggregate goodput (KB/s, 1 KB = 1000 B) per CC x RTT x flows, mean and sigma over
repetitions; with five or more, the highest and lowest are dropped as in the paper.
Table 2: UDP one-way delay (ms) per CC x RTT x flows: median, mean and sigma over every
delivered packet of the group's trials.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from analysis.trial import analyse_trial

GROUP = ["cc", "rtt_ms", "flows"]


def analyse_batch(batch_dir: Path) -> pd.DataFrame:
    """Analyse every trial that has captures; write summary.parquet; return one row per trial."""
    rows = []
    for trial_json in sorted((batch_dir / "trials").glob("*/trial.json")):
        record = json.loads(trial_json.read_text())
        try:
            rows.append(analyse_trial(trial_json.parent))
        except (OSError, ValueError, KeyError) as exc:
            rows.append(
                {
                    "trial": record["trial"],
                    "status": record["status"],
                    "error": f"analysis: {type(exc).__name__}: {exc}",
                    **{k: record["parameters"][k] for k in (*GROUP, "repetition")},
                }
            )
    table = pd.DataFrame(rows)
    if len(table):
        table.attrs["batch"] = str(batch_dir)
        flat = table.drop(
            columns=[
                c
                for c in ("flow_goodput_kBps", "delayline_lateness_us", "capture_drops")
                if c in table
            ]
        )
        flat.to_parquet(batch_dir / "summary.parquet", index=False)
    return table


def _trimmed(values: pd.Series) -> pd.Series:
    values = values.sort_values()
    return values.iloc[1:-1] if len(values) >= 5 else values


def _fmt(value: float, digits: int = 1) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.{digits}f}"
    )


def goodput_table(table: pd.DataFrame) -> pd.DataFrame:
    ok = table[table.status == "complete"]
    grouped = ok.groupby(GROUP)["goodput_kBps"]
    return pd.DataFrame(
        {
            "runs": grouped.size(),
            "mean_kBps": grouped.apply(lambda s: _trimmed(s).mean()),
            "std_kBps": grouped.apply(lambda s: _trimmed(s).std(ddof=1)),
        }
    )


def owd_table(batch_dir: Path, table: pd.DataFrame) -> pd.DataFrame:
    ok = table[table.status == "complete"]
    rows = []
    for group, trials in ok.groupby(GROUP):
        owd = pd.concat(
            [
                pd.read_parquet(
                    batch_dir / "trials" / t / "analysis" / "udp_owd.parquet",
                    columns=["owd_ns", "lost"],
                )
                for t in trials.trial
            ]
        )
        ms = owd.owd_ns[~owd.lost] / 1e6
        rows.append((*group, ms.median(), ms.mean(), ms.std(ddof=1), int(owd.lost.sum())))
    return pd.DataFrame(rows, columns=[*GROUP, "median_ms", "mean_ms", "std_ms", "lost"]).set_index(
        GROUP
    )


def print_batch(table: pd.DataFrame, console: Console | None = None) -> None:
    console = console or Console()
    if table.empty:
        console.print("no trials")
        return
    batch_dir = Path(table.attrs["batch"])
    t1 = Table(title="Table 1: aggregate TCP goodput (KB/s, steady state, from captures)")
    for col in ("CC", "RTT ms", "flows", "runs", "mean", "σ"):
        t1.add_column(col, justify="right")
    for (cc, rtt, flows), row in goodput_table(table).iterrows():
        t1.add_row(
            cc, f"{rtt:g}", str(flows), str(int(row.runs)), _fmt(row.mean_kBps), _fmt(row.std_kBps)
        )
    console.print(t1)
    t2 = Table(title="Table 2: UDP one-way delay through the router (ms, from captures)")
    for col in ("CC", "RTT ms", "flows", "median", "mean", "σ", "lost"):
        t2.add_column(col, justify="right")
    for (cc, rtt, flows), row in owd_table(batch_dir, table).iterrows():
        t2.add_row(
            cc,
            f"{rtt:g}",
            str(flows),
            _fmt(row.median_ms),
            _fmt(row.mean_ms),
            _fmt(row.std_ms),
            str(int(row.lost)),
        )
    console.print(t2)
    for _, r in table.iterrows():
        console.print(trial_table(r))


def trial_table(r: pd.Series) -> Table:
    """One trial's figures, one per line (fits an 80-column terminal)."""
    t = Table(title=f"Trial {r.trial}: {r.status}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    if isinstance(r.get("error"), str):
        t.add_row("error", r.error)
        return t
    per_flow = ", ".join(_fmt(v) for v in r.flow_goodput_kBps)
    t.add_row(
        "TCP goodput",
        f"{_fmt(r.goodput_kBps)} KB/s steady ({per_flow} per flow); "
        f"{_fmt(r.goodput_kBps_lifetime)} KB/s over each flow's lifetime",
    )
    t.add_row("retransmitted", f"{r.retransmitted_packets} packets")
    t.add_row(
        "UDP one-way delay",
        f"min {_fmt(r.owd_min_ms)} / median {_fmt(r.owd_median_ms)} / "
        f"mean {_fmt(r.owd_mean_ms)} / p99 {_fmt(r.owd_p99_ms)} / "
        f"max {_fmt(r.owd_max_ms)} ms",
    )
    if r.router_stalls:
        t.add_row(
            "router stalls",
            f"{r.router_stalls} (> 2 ms, {_fmt(r.router_stalled_ms, 0)} ms in all); "
            f"{r.udp_delay_path_stalled} UDP packets were in transit during one; max OWD "
            f"without them {_fmt(r.owd_max_ms_unstalled)} ms",
        )
    t.add_row("UDP lost at the queue", f"{r.udp_lost} of {r.udp_packets}")
    t.add_row(
        "queue drops",
        f"{r.queue_drops_capture} from captures, {r.queue_drops_tc} by the bfifo counter",
    )
    t.add_row(
        "queue-full events",
        f"{r.queue_full_events} in {r.queue_window_s:g} s "
        f"({_fmt(r.queue_full_events_per_min)} per minute)",
    )
    delay = f"{r.delay_backend}; smallest OWD − RTT/2 = {_fmt(r.owd_min_excess_ms, 2)} ms"
    lateness = [v for v in (r.delayline_lateness_us or {}).values() if v]
    if lateness:
        mean, p99 = max(v["mean"] for v in lateness), max(v["p99"] for v in lateness)
        worst = max(v["max"] for v in lateness)
        delay += f"; delay line late by {mean:.0f} µs mean, {p99:.0f} µs p99, {worst:.0f} µs max"
    t.add_row("delay path", delay)
    return t
