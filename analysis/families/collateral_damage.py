"""Seed 000 (Stewart, Armitage, Huebner 2009): Table 1 (aggregate goodput per CC x RTT x
flows, mean and sigma over repetitions, trimmed) and Table 2 (UDP one-way delay per group over
every delivered packet of its trials)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from analysis.batches import trial_dir
from analysis.families.common import TRIMMED_MEAN, first_of, fmt, trimmed, trimmed_mean, used
from analysis.lazy import pd
from core.units import parse_duration_ns

GROUP = ["cc", "rtt_ms", "flows"]


# A reproduction record's summary.csv (analysis/reproduction.py): the trial's keys, from its
# record alone (record_keys: known before the analysis, also of a failed trial), and its
# column for each summary metric (the summary's key).
RECORD_KEYS = GROUP
RECORD_METRICS = {
    "goodput_kBps": "goodput_kBps",
    "owd_median_ms": "owd_median_ms",
    "owd_max_ms": "owd_max_ms",
    "queue_full_per_min": "queue_full_events_per_min",
    "retransmissions": "retransmitted_packets",
}


def _bulk(record: dict[str, Any]) -> dict[str, Any]:
    return next(g for g in record["traffic"].values() if g["type"] == "bulk_tcp")


def record_keys(record: dict[str, Any]) -> dict[str, Any]:
    """cc, rtt_ms and flows of the TCP traffic, from the trial record (its congestion control:
    the generator's own, else its sender's; the RTT of its path as the runner resolved it)."""
    tcp_gen = _bulk(record)
    sender = tcp_gen["from"]
    cc = tcp_gen["spec"].get("cc") or record["host_settings"].get(sender, {}).get("cc") or "default"
    return {
        "cc": cc,
        "rtt_ms": tcp_gen["path"]["rtt_ns"] / 1e6,
        "flows": tcp_gen["spec"]["flows"],
    }


def trial_summary(record: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    _, tcp, tcp_gen = first_of(summary, record, "bulk_tcp")
    udp_name, udp, udp_gen = first_of(summary, record, "cbr_udp")
    queue = summary["queues"].get((tcp_gen["path"].get("bottleneck") or {}).get("link"), {})
    b_host = (udp_gen["path"].get("bottleneck") or {}).get("host")
    return {
        **record_keys(record),
        "udp_generator": udp_name,
        **{k: v for k, v in tcp.items() if k.startswith(("goodput", "flow_goodput", "retrans"))},
        **{k: v for k, v in udp.items() if k.startswith(("udp_", "owd_", "router_"))},
        "delayline_lateness_us": udp.get("delayline_lateness_us"),
        **{k: v for k, v in queue.items() if k.startswith("queue_")},
        "delay_backend": (record.get("delay", {}).get(b_host) or {}).get("backend"),
        **length_rule(record, tcp),
    }


# The paper's trial length: at least 3 minutes or 20 congestion epochs, whichever is longer.
MIN_EPOCHS, MIN_SECONDS = 20, 180


def length_rule(record: dict[str, Any], tcp: dict[str, Any]) -> dict[str, Any]:
    """Whether the trial is as long as the paper asks, from the cwnd data (the flow with the
    fewest congestion epochs counts); None when there is no cwnd data."""
    epochs = tcp.get("congestion_epochs")
    seconds = record["parameters"]["duration"]
    seconds = parse_duration_ns(seconds) / 1e9 if isinstance(seconds, str) else seconds / 1e9
    fewest = min(epochs) if epochs else None
    return {
        "congestion_epochs_min": fewest,
        "long_enough": None if fewest is None else fewest >= MIN_EPOCHS and seconds >= MIN_SECONDS,
    }


def goodput_table(table: pd.DataFrame) -> pd.DataFrame:
    ok = table[table.status == "complete"]
    grouped = ok.groupby(GROUP)["goodput_kBps"]
    return pd.DataFrame(
        {
            "runs": grouped.size(),
            "used": grouped.apply(used),
            "mean_kBps": grouped.apply(trimmed_mean),
            "std_kBps": grouped.apply(lambda s: trimmed(s).std(ddof=1)),
        }
    )


def owd_table(batch_dir: Path, table: pd.DataFrame) -> pd.DataFrame:
    ok = table[table.status == "complete"]
    rows = []
    for group, trials in ok.groupby(GROUP):
        parts = []
        for _, r in trials.iterrows():
            owd = pd.read_parquet(
                trial_dir(batch_dir, r) / "analysis" / "owd.parquet",
                columns=["owd_ns", "lost", "generator"],
            )
            parts.append(owd[owd.generator == r.udp_generator])
        owd = pd.concat(parts)
        ms = owd.owd_ns[~owd.lost] / 1e6
        rows.append((*group, ms.median(), ms.mean(), ms.std(ddof=1), int(owd.lost.sum())))
    return pd.DataFrame(rows, columns=[*GROUP, "median_ms", "mean_ms", "std_ms", "lost"]).set_index(
        GROUP
    )


def print_tables(batch_dir: Path, table: pd.DataFrame, console: Console) -> None:
    t1 = Table(
        title="Table 1: aggregate TCP goodput (KB/s, steady state, from captures): "
        f"{TRIMMED_MEAN} (used) and σ of the same"
    )
    for col in ("CC", "RTT ms", "flows", "runs", "used", "mean", "σ"):
        t1.add_column(col, justify="right")
    for (cc, rtt, flows), row in goodput_table(table).iterrows():
        t1.add_row(
            cc, f"{rtt:g}", str(flows), str(int(row.runs)), str(int(row.used)),
            fmt(row.mean_kBps), fmt(row.std_kBps),
        )  # fmt: skip
    console.print(t1)
    t2 = Table(title="Table 2: UDP one-way delay through the router (ms, from captures)")
    for col in ("CC", "RTT ms", "flows", "median", "mean", "σ", "lost"):
        t2.add_column(col, justify="right")
    for (cc, rtt, flows), row in owd_table(batch_dir, table).iterrows():
        t2.add_row(
            cc,
            f"{rtt:g}",
            str(flows),
            fmt(row.median_ms),
            fmt(row.mean_ms),
            fmt(row.std_ms),
            str(int(row.lost)),
        )
    console.print(t2)


def known(value: Any) -> bool:
    """A summary value that is there (a trial without it reads None or NaN in the table)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def trial_rows(r: pd.Series) -> list[tuple[str, str]]:
    per_flow = ", ".join(fmt(v) for v in r.flow_goodput_kBps)
    rows = [
        (
            "TCP goodput",
            f"{fmt(r.goodput_kBps)} KB/s steady ({per_flow} per flow); "
            f"{fmt(r.goodput_kBps_lifetime)} KB/s over each flow's lifetime",
        ),
        ("retransmitted", f"{r.retransmitted_packets} packets"),
        (
            "UDP one-way delay",
            f"min {fmt(r.owd_min_ms)} / median {fmt(r.owd_median_ms)} / "
            f"mean {fmt(r.owd_mean_ms)} / p99 {fmt(r.owd_p99_ms)} / max {fmt(r.owd_max_ms)} ms",
        ),
    ]
    source = str(r.get("router_stalls_from"))
    stalled = known(r.get("router_stalls")) and r.router_stalls > 0
    late = " or left over 2 ms later than the rate allows" if "and lost service" in source else ""
    if stalled:
        rows.append(
            (
                "router stalls",
                f"{r.router_stalls} (> 2 ms, {fmt(r.router_stalled_ms, 0)} ms in all, recorded "
                f"by the delay line); {r.udp_delay_path_stalled} UDP packets were in transit "
                f"during one{late}; max OWD without them {fmt(r.owd_max_ms_unstalled)} ms",
            )
        )
    if known(r.get("udp_lost_service_median_ms")):
        # where late packets were judged apart and no stalls' row says so already
        judged = (
            f"; max OWD of the others {fmt(r.owd_max_ms_unstalled)} ms"
            if source.endswith("lost service") and not stalled
            else ""
        )
        rows.append(
            (
                "service lost",
                f"median {fmt(r.udp_lost_service_median_ms, 2)} / p99 "
                f"{fmt(r.udp_lost_service_p99_ms, 2)} / max {fmt(r.udp_lost_service_max_ms, 2)}"
                f" ms per UDP packet (sent later than the link's rate allows, from packets); "
                f"{int(r.udp_served_late)} over 2 ms{judged}",
            )
        )
    rows += [
        ("UDP lost at the queue", f"{r.udp_lost} of {r.udp_packets}"),
        (
            "queue drops",
            f"{r.queue_drops_capture} from captures, {r.queue_drops_tc} by the queue's own counter",
        ),
        (
            r.queue_drop_runs_are
            if isinstance(r.get("queue_drop_runs_are"), str)
            else "queue-full events",
            f"{r.queue_full_events} in {r.queue_window_s:.3g} s "
            f"({fmt(r.queue_full_events_per_min)} per minute)",
        ),
    ]
    delay = f"{r.delay_backend}; smallest OWD − RTT/2 = {fmt(r.owd_min_excess_ms, 2)} ms"
    lateness = [v for v in (r.delayline_lateness_us or {}).values() if v]
    if lateness:
        mean, p99 = max(v["mean"] for v in lateness), max(v["p99"] for v in lateness)
        worst = max(v["max"] for v in lateness)
        delay += f"; delay line late by {mean:.0f} µs mean, {p99:.0f} µs p99, {worst:.0f} µs max"
    rows.append(("delay path", delay))
    if r.get("congestion_epochs_min") is not None and not pd.isna(r.congestion_epochs_min):
        verdict = "meets" if r.long_enough else "SHORTER than"
        rows.append(
            (
                "length",
                f"{int(r.congestion_epochs_min)} congestion epochs (fewest of its flows, from "
                f"cwnd); {verdict} the paper's rule (>= {MIN_EPOCHS} epochs and >= "
                f"{MIN_SECONDS // 60} min)",
            )
        )
    return rows
