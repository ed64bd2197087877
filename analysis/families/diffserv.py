"""Seed 004 (Neglia, Bianchi, Sottile): adaptive markers over a RIO core.

Per trial: the marker at the edge; IN % (of the packets that reached the RIO queue, the share
its IN virtual queue received) and drop % (total, IN, OUT, and HIGH where the queue has that
third level: MPM's probes), from GRED's own per-VQ counters;
the goodput that crossed the bottleneck (web payload in the steady window, from the capture
after it) as a share of the link's rate; the mean transit of a packet across the router (its
queue, plus the core link's delay and the edge marker's time: constant per setting), from the
captures on both sides; and the mean flow completion time of 1-, 18- and 190-packet flows.

Over a batch: one row per marker and IN threshold (the frontier's points: delay and FCT
against goodput, one curve per marker), and the IN % / drop % table per marker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from analysis.families.common import fmt
from analysis.lazy import pd
from core.units import parse_duration_ns, parse_offset_ns

FCT_CLASSES = (1, 18, 190)


def _rio(record: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    rio = record.get("rio") or {}
    return next(iter(sorted(rio.items())), None)


def _marker(record: dict[str, Any]) -> str:
    markers = record.get("markers") or {}
    return ",".join(sorted({m.get("marker", "?") for m in markers.values()})) or "none"


PAPER_LENGTH = (500 * 10**9, 50 * 10**9)  # duration, warmup (discarded), ns
PAPER_RATE_BPS = 6_000_000  # the bottleneck

# A reproduction record's summary.csv (analysis/reproduction.py): each trial's setting, from
# its record (a failed trial's too), then the report's figures of the complete ones.
RECORD_KEYS = ("marker", "rio_in_min_pkt", "rio_out_min_pkt", "offered_load", "seed")
RECORD_METRICS = {
    k: k
    for k in (
        "rio_high_min_pkt",
        "in_share",
        "high_share",
        "drop_total",
        "drop_in",
        "drop_out",
        "drop_high",
        "goodput_bps",
        "utilization",
        "transit_mean_ms",
        "delay_normalized",
        *(f"fct_{p}pkt_{s}" for p in FCT_CLASSES for s in ("mean_ms", "flows")),
        "lockout_s",
        "turnaround_excess_p99_ms",
        "rio_bpf",
        "shortened",
        "rescaled",
    )
}


def record_keys(record: dict[str, Any]) -> dict[str, Any]:
    """The marker, the RIO queue's IN and OUT min thresholds (packets), the web load offered
    in all (a share of the link's rate: the paper's 64 % or 90 %) and the flows' seed."""
    found = _rio(record)
    queues = found[1]["virtual_queues"] if found else []
    web = [g for g in record["traffic"].values() if g["type"] == "web_poisson"]
    seeds = sorted({g.get("seed") for g in web}, key=str)
    loads = [g.get("load") for g in web]
    return {
        "marker": _marker(record),
        "rio_in_min_pkt": queues[0].get("min_packets") if queues else None,
        "rio_out_min_pkt": queues[1].get("min_packets") if len(queues) > 1 else None,
        "offered_load": round(sum(loads), 6) if web and None not in loads else None,
        "seed": seeds[0] if len(seeds) == 1 else None,
    }


def trial_summary(record: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    params = record["parameters"]
    length = (parse_duration_ns(params["duration"]), parse_offset_ns(params.get("warmup") or 0))
    out: dict[str, Any] = {
        **record_keys(record),
        "shortened": None
        if length == PAPER_LENGTH
        else f"{params['duration']}, {params.get('warmup')} discarded",
    }
    found = _rio(record)
    if found:
        where, rio = found
        counters = rio.get("counters") or {}
        c_in, c_out, c_high = (counters.get(vq, {}) for vq in ("0", "1", "2"))
        n_in, n_out, n_high = (c.get("packets", 0) for c in (c_in, c_out, c_high))
        d_in, d_out, d_high = (c.get("drops", 0) for c in (c_in, c_out, c_high))
        total = n_in + n_out + n_high
        out.update(
            rio_at=where,
            in_packets=n_in,
            out_packets=n_out,
            in_share=n_in / total if total else None,
            drop_total=(d_in + d_out + d_high) / total if total else None,
            drop_in=d_in / n_in if n_in else None,
            drop_out=d_out / n_out if n_out else None,
            # Seconds its IN queue was locked out (analysis.gred_lockout): None without samples.
            lockout_s=((summary.get("rio_lockout") or {}).get(where) or {}).get("locked_s"),
        )
        if len(rio["virtual_queues"]) > 2:  # the high level (MPM's probes)
            out.update(
                rio_high_min_pkt=rio["virtual_queues"][2].get("min_packets"),
                high_packets=n_high,
                high_share=n_high / total if total else None,
                drop_high=d_high / n_high if n_high else None,
            )
        if rio.get("approximation"):  # a FreeBSD router: two dummynet queues, not RIO
            out["rio_approximation"] = rio["approximation"]
        elif rio.get("implementation") == "bpf":  # a kernel without GRED: hostside/bpf_tc/rio
            out["rio_bpf"] = True
    web = {
        n: s
        for n, s in summary["generators"].items()
        if record["traffic"][n]["type"] == "web_poisson"
    }
    payload = sum(s.get("steady_payload_bytes", 0) for s in web.values())
    window = max((s.get("steady_window_s") or 0 for s in web.values()), default=0)
    bottleneck = next(
        (
            (g["path"].get("bottleneck") or {})
            for g in record["traffic"].values()
            if g["type"] == "web_poisson"
        ),
        {},
    )
    rate = bottleneck.get("rate_bps")
    # Another bottleneck rate keeps the thresholds in packets: each is that much longer or
    # shorter in time than the paper's.
    out["rescaled"] = (
        None if rate in (None, PAPER_RATE_BPS) else f"bottleneck {rate / 1e6:g} Mbit/s"
    )
    out["goodput_bps"] = payload * 8 / window if window else None
    out["utilization"] = out["goodput_bps"] / rate if rate and out["goodput_bps"] else None
    queue = (summary.get("queues") or {}).get(bottleneck.get("link"), {})
    out["transit_mean_ms"] = queue.get("transit_mean_ms_in_window")
    # Normalized per-packet delay: the mean transit over the least one of the trial (an empty
    # queue); analyses made before it was kept have only the window's least.
    least = queue.get("transit_min_ms") or queue.get("transit_min_ms_in_window")
    out["delay_normalized"] = out["transit_mean_ms"] / least if least else None
    # The rack's own delay behind the bottleneck (analysis.traffic.web_poisson): the worst
    # receiver's excess over its least SYN to SYN-ACK turnaround.
    turns = [s for s in web.values() if s.get("receiver_turnaround_handshakes")]
    if turns:
        out["turnaround_min_ms"] = min(s["receiver_turnaround_ms_min"] for s in turns)
        for stat in ("median", "p99", "max"):
            key = f"receiver_turnaround_excess_ms_{stat}"
            out[f"turnaround_excess_{stat}_ms"] = max(s[key] for s in turns)
    for packets in FCT_CLASSES:
        n = sum(s.get(f"fct_{packets}pkt_flows") or 0 for s in web.values())
        weighted = sum(
            (s.get(f"fct_{packets}pkt_mean_ms") or 0) * (s.get(f"fct_{packets}pkt_flows") or 0)
            for s in web.values()
        )
        out[f"fct_{packets}pkt_flows"] = n
        out[f"fct_{packets}pkt_mean_ms"] = weighted / n if n else None
    return out


def frontier_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per marker and IN threshold (complete trials, means over their runs): the frontier's
    points and the IN / drop shares."""
    ok = table[table.status == "complete"]
    if ok.empty or "marker" not in ok:
        return pd.DataFrame()
    by = ["marker", "rio_in_min_pkt", "rio_out_min_pkt"]
    load = "factor:traffic[*].load"
    if load in ok:
        by.append(load)
    rows = []
    for key, r in ok.groupby(by, dropna=False):
        rows.append(
            {
                "marker": key[0],
                "IN min (pkt)": key[1],
                "OUT min (pkt)": key[2],
                **({"load each": key[3]} if len(key) > 3 else {}),
                "runs": len(r),
                "IN %": 100 * r.in_share.mean(),
                "drop %": 100 * r.drop_total.mean(),
                "drop IN %": 100 * r.drop_in.mean(),
                "drop OUT %": 100 * r.drop_out.mean(),
                **(
                    {"HIGH %": 100 * r.high_share.mean(), "drop HIGH %": 100 * r.drop_high.mean()}
                    if "high_share" in r and r.high_share.notna().any()
                    else {}
                ),
                "goodput Mbit/s": r.goodput_bps.mean() / 1e6,
                "utilization %": 100 * r.utilization.mean(),
                "transit ms": r.transit_mean_ms.mean(),
                "normalized delay": r.delay_normalized.mean(),
                "IN locked out s": r.lockout_s.mean() if "lockout_s" in r else None,
                **{f"FCT {p} pkt ms": r[f"fct_{p}pkt_mean_ms"].mean() for p in FCT_CLASSES},
            }
        )
    return pd.DataFrame(rows).sort_values(["marker", "IN min (pkt)", "OUT min (pkt)"])


def labels(table: pd.DataFrame, column: str) -> list[str]:
    """The distinct text values of a column of trial summaries (shortened, rescaled, ...)."""
    return sorted({x for x in table.get(column, []) if isinstance(x, str)})


def print_tables(batch_dir: Path, table: pd.DataFrame, console: Console) -> None:
    front = frontier_table(table)
    if front.empty:
        return
    shortened = labels(table, "shortened")
    note = (
        f" — SHORTENED: {'; '.join(shortened)} (the paper: 500 s, 50 s discarded)"
        if shortened
        else ""
    )
    rescaled = labels(table, "rescaled")
    if rescaled:
        note += f" — RESCALED: {'; '.join(rescaled)} (the paper: 6 Mbit/s)"
    approx = labels(table, "rio_approximation")
    bpf = "rio_bpf" in table and table["rio_bpf"].eq(True).any()
    gred = "GRED's and the BPF RIO's counters" if bpf else "GRED's counters"
    if bpf and table["rio_bpf"].eq(True).all():
        gred = "the BPF RIO's counters"
    counted = f"NOT RIO but {'; '.join(approx)}: their counters" if approx else gred
    t = Table(
        title=f"Seed 004: per marker and RIO threshold — IN % and drops ({counted}), "
        "goodput and transit (captures), mean FCT" + note
    )
    for col in front.columns:
        t.add_column(col, justify="right")
    counts = {"IN min (pkt)", "OUT min (pkt)", "runs"}
    for _, row in front.iterrows():
        t.add_row(
            *[
                v if isinstance(v, str) else f"{v:.0f}" if col in counts else fmt(v)
                for col, v in row.items()
            ]
        )
    console.print(t)


def trial_rows(r: pd.Series) -> list[tuple[str, str]]:
    rows = [("marker", str(r.get("marker")))]
    if pd.notna(r.get("in_share")):
        approx = r.get("rio_approximation")
        three = pd.notna(r.get("high_share"))
        high = int(r.high_packets) if three else 0
        high_share = f", HIGH {100 * r.high_share:.1f} %" if three else ""
        high_drops = f", HIGH {fmt(100 * (r.drop_high or 0), 2)} %" if three else ""
        rows.append(
            (
                "RIO approximation (dummynet queues)"
                if isinstance(approx, str)
                else "RIO (BPF counters)"
                if r.get("rio_bpf") is True
                else "RIO (GRED counters)",
                f"IN {100 * r.in_share:.1f} % of {int(r.in_packets + r.out_packets + high)} "
                f"packets{high_share}; drops {100 * r.drop_total:.2f} % (IN "
                f"{fmt(100 * (r.drop_in or 0), 2)} %, OUT {fmt(100 * (r.drop_out or 0), 2)} %"
                f"{high_drops})" + (f"; not RIO: {approx}" if isinstance(approx, str) else ""),
            )
        )
    if r.get("lockout_s"):
        rows.append(("RIO lockout", f"IN average above max, queue empty, for {r.lockout_s:.1f} s"))
    if pd.notna(r.get("utilization")):
        rows.append(
            (
                "goodput",
                f"{r.goodput_bps / 1e6:.2f} Mbit/s ({100 * r.utilization:.1f} % of the link); "
                f"transit {fmt(r.get('transit_mean_ms'))} ms",
            )
        )
    if pd.notna(r.get("turnaround_excess_p99_ms")):
        rows.append(
            (
                "receiver turnaround",
                f"SYN to SYN-ACK behind the bottleneck: least {fmt(r.turnaround_min_ms)} ms; "
                f"above it median {fmt(r.turnaround_excess_median_ms)}, p99 "
                f"{fmt(r.turnaround_excess_p99_ms)}, max {fmt(r.turnaround_excess_max_ms)} ms "
                "(delay outside the modelled queues)",
            )
        )
    fct = "; ".join(
        f"{p} pkt {fmt(r.get(f'fct_{p}pkt_mean_ms'))} ms ({int(r.get(f'fct_{p}pkt_flows') or 0)})"
        for p in FCT_CLASSES
    )
    if any(r.get(f"fct_{p}pkt_flows") for p in FCT_CLASSES):
        rows.append(("mean FCT (flows)", fct))
    return rows
