"""Seed 003 (Lipovac, Batos, Sertic 2009): response time per transaction of EFT-SHORT and
EFT-LONG over TCP and UDP (the paper's Figs. 9-11: mean, and here median and p99 too, from the
client and from the capture), and the throughput of FILETRANSF-LONG per protocol, rate, send
size and file size (Figs. 4-8), with what the capture says about partial frames and ACKs; each
figure a trimmed mean over the repetitions (analysis/families/common.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from analysis.families.common import TRIMMED_MEAN, first_of, fmt, trimmed_mean, used
from analysis.lazy import pd

CARRIED = (
    "workload",
    "protocol",
    "transactions",
    "failed",
    "retransmissions",
    "response_mean_ms",
    "response_median_ms",
    "response_p99_ms",
    "capture_response_median_ms",
    "client_excess_median_us",
    "throughput_median_mbps",
    "throughput_mean_mbps",
    "data_packets_per_transfer",
    "partial_segments_per_transfer",
    "server_acks_per_transfer",
)


# A reproduction record's summary.csv (analysis/reproduction.py): no keys of the family's own
# (the experiment's factors), then what the tables group by and show, as the summary holds it.
RECORD_KEYS: tuple[str, ...] = ()
RECORD_METRICS = {
    k: k for k in ("rate_mbps", "send_bytes", "request_bytes", "tcp_window", "pairs", *CARRIED)
}


def trial_summary(record: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    _, s, gen = first_of(summary, record, "transaction")
    bottleneck = gen["path"].get("bottleneck") or {}
    return {
        "rate_mbps": bottleneck.get("rate_bps", float("nan")) / 1e6,
        "send_bytes": gen["send_bytes"],
        "request_bytes": gen["request_bytes"],
        "tcp_window": gen.get("sockbuf"),
        "pairs": gen["pairs"],
        **{k: s.get(k) for k in CARRIED},
    }


def host_factors(table: pd.DataFrame) -> list[str]:
    """Factors the generator's and the link's columns do not show (hosts.*: e.g. TCP
    timestamps): each becomes a key of the tables, named without its `factor:` prefix."""
    return [c for c in table if c.startswith("factor:hosts.")]


# What the paper compares at (section 3.1): the workload, the protocol, the link's rate, the
# file or request size and the pairs (and the hosts' settings an experiment varies). The send
# size and the TCP window are each protocol's own (TCP sends 32 767 bytes, UDP 8 863, at
# 100 Mbit/s 32 543): TCP meets UDP at its own, so they are no group of the comparisons.
COMPARED = ("workload", "protocol", "rate_mbps", "request_bytes", "pairs")
OWN_SETTINGS = ("send_bytes", "tcp_window")


def compared(table: pd.DataFrame) -> list[str]:
    """The columns the paper's comparisons group trials by (COMPARED and host_factors)."""
    return [*COMPARED, *host_factors(table)]


def _complete(table: pd.DataFrame) -> pd.DataFrame:
    ok = table[table.status == "complete"]
    return ok[ok.workload.notna()] if "workload" in ok else ok.iloc[:0]


def response_table(table: pd.DataFrame) -> pd.DataFrame:
    """EFT-SHORT and EFT-LONG per rate, protocol and pairs: trimmed means over the runs of
    each trial's mean, median and p99 response time (client), and the capture's median;
    used: the runs averaged (of those with a mean response time)."""
    ok = _complete(table)
    ok = ok[ok.workload.isin(["eft_short", "eft_long"])]
    keys = ["rate_mbps", "protocol", "pairs", *host_factors(ok), "workload"]
    return (
        ok.groupby(keys, dropna=False)
        .agg(
            runs=("trial", "size"),
            used=("response_mean_ms", used),
            transactions=("transactions", "sum"),
            mean_ms=("response_mean_ms", trimmed_mean),
            median_ms=("response_median_ms", trimmed_mean),
            p99_ms=("response_p99_ms", trimmed_mean),
            capture_median_ms=("capture_response_median_ms", trimmed_mean),
        )
        .reset_index()
        .rename(columns=lambda c: c.removeprefix("factor:"))
    )


def throughput_table(table: pd.DataFrame) -> pd.DataFrame:
    """FILETRANSF-LONG per rate, protocol, send size, file size, TCP window and pairs:
    trimmed means over the runs of each trial's median and mean throughput and its capture's
    counts per transfer; used: the runs averaged (of those with a median throughput)."""
    ok = _complete(table)
    ok = ok[ok.workload == "filetransf_long"]
    keys = ["rate_mbps", "protocol", "send_bytes", "request_bytes", "tcp_window", "pairs"]
    keys += host_factors(ok)
    return (
        ok.groupby(keys, dropna=False)
        .agg(
            runs=("trial", "size"),
            used=("throughput_median_mbps", used),
            transfers=("transactions", "sum"),
            median_mbps=("throughput_median_mbps", trimmed_mean),
            mean_mbps=("throughput_mean_mbps", trimmed_mean),
            packets=("data_packets_per_transfer", trimmed_mean),
            partial=("partial_segments_per_transfer", trimmed_mean),
            acks=("server_acks_per_transfer", trimmed_mean),
        )
        .reset_index()
        .rename(columns=lambda c: c.removeprefix("factor:"))
    )


RESPONSE_TITLE = "Response time per transaction, EFT-SHORT vs EFT-LONG"
THROUGHPUT_TITLE = "FILETRANSF-LONG throughput (Mbit/s of payload per transfer)"


def print_tables(batch_dir: Path, table: pd.DataFrame, console: Console) -> None:
    resp = response_table(table)
    if not resp.empty:
        t = Table(title=f"{RESPONSE_TITLE} (ms): {TRIMMED_MEAN} (used)")
        extra = [c.removeprefix("factor:") for c in host_factors(_complete(table))]
        cols = ("Mbit/s", "protocol", "pairs", *extra, "workload", "runs", "used", "transactions")
        for col in cols:
            t.add_column(col, justify="right")
        for col in ("mean", "median", "p99", "capture median"):
            t.add_column(col, justify="right")
        for _, r in resp.iterrows():
            t.add_row(
                fmt(r.rate_mbps, 0),
                r.protocol,
                str(r.pairs),
                *(str(r[c]) for c in extra),
                r.workload,
                str(r.runs),
                str(r.used),
                str(r.transactions),
                *(fmt(r[c], 3) for c in ("mean_ms", "median_ms", "p99_ms", "capture_median_ms")),
            )
        console.print(t)
        console.print(
            "HTB lets an isolated packet through at once: a small transaction's response time "
            "here has no serialization at the link's rate (a 10 Mbit/s Ethernet takes 133 us "
            "for the 166-byte frame of a 100-byte TCP request); it shows once transactions "
            "queue behind each other"
        )
    thr = throughput_table(table)
    if not thr.empty:
        t = Table(title=f"{THROUGHPUT_TITLE}: {TRIMMED_MEAN} (used)")
        extra = [c.removeprefix("factor:") for c in host_factors(_complete(table))]
        for col in ("Mbit/s", "protocol", "send B", "file B", "TCP window B", "pairs", *extra):
            t.add_column(col, justify="right")
        for col in (
            "runs",
            "used",
            "transfers",
            "median",
            "mean",
            "packets",
            "partial",
            "server ACKs",
        ):
            t.add_column(col, justify="right")
        for _, r in thr.iterrows():
            window = r.tcp_window
            t.add_row(
                fmt(r.rate_mbps, 0),
                r.protocol,
                str(r.send_bytes),
                str(r.request_bytes),
                "-" if pd.isna(window) else str(int(window)),
                str(r.pairs),
                *(str(r[c]) for c in extra),
                str(r.runs),
                str(r.used),
                str(r.transfers),
                fmt(r.median_mbps, 2),
                fmt(r.mean_mbps, 2),
                fmt(r.packets, 0),
                fmt(r.partial, 0),
                fmt(r.acks, 0),
            )
        console.print(t)
        console.print(
            "packets, partial, server ACKs: per transfer, from the capture nearest the client "
            "(TCP only): data packets, those shorter than the largest, pure ACKs back"
        )


def trial_rows(r: pd.Series) -> list[tuple[str, str]]:
    rows = [
        ("workload", f"{r.workload} over {r.protocol}, {fmt(r.rate_mbps, 0)} Mbit/s"),
        (
            "response time",
            f"mean {fmt(r.response_mean_ms, 3)} ms, median {fmt(r.response_median_ms, 3)} ms, "
            f"p99 {fmt(r.response_p99_ms, 3)} ms over {r.transactions} transactions "
            f"({r.failed} failed); capture median {fmt(r.capture_response_median_ms, 3)} ms",
        ),
    ]
    if pd.notna(r.get("throughput_median_mbps")):
        rows.append(("throughput", f"median {fmt(r.throughput_median_mbps, 2)} Mbit/s"))
    return rows
