"""The EFT family (seed 003, ../shared/EXPERIMENTS.md §3) in the HTML report: the response-time
table (the paper's Figs. 9-11) and the FILETRANSF-LONG throughput table (Figs. 4-8), the same
numbers as the terminal report (analysis/families/eft.py), and the distribution of response
times per workload and protocol as a figure; the orderings the paper's text states beside ours,
TCP and UDP compared each at its own send size and window (family.COMPARED)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.batches import trial_dir
from analysis.families import eft as family
from analysis.families.common import TRIMMED_MEAN
from analysis.html_report import paper
from analysis.html_report.page import Page, plt

TITLE = "Application performance of EFT transactions (Lipovac, Batos, Sertic 2009)"
METRICS = {
    "response_median_ms": "median response time (ms)",
    "response_p99_ms": "p99 response time (ms)",
    "capture_response_median_ms": "median response time in the capture (ms)",
    "throughput_median_mbps": "FILETRANSF-LONG throughput (Mbit/s)",
}
DIGITS = {k: 3 for k in METRICS} | {"throughput_median_mbps": 2}


def groups(trials: pd.DataFrame) -> list[str]:
    """What a batch is compared with the previous one by (the comparison needs it; without it
    a second EFT batch's report failed)."""
    wanted = ["workload", "protocol", "rate_mbps", "send_bytes", "file_bytes", "pairs"]
    return [c for c in wanted if c in trials] or ["family"]


def usable(trials: pd.DataFrame) -> pd.DataFrame:
    return trials[(trials.status == "complete") & trials.analysed.astype(bool)]


def response_times(batch_dir: Path, trial: Any) -> np.ndarray:
    """The client's response times (ms) of a trial's successful transactions (``trial``: its
    report row or its name)."""
    f = trial_dir(batch_dir, trial) / "analysis" / "transactions.parquet"
    if not f.exists():
        return np.array([])
    rows = pd.read_parquet(f, columns=["response_ns", "ok"])
    return rows.response_ns[rows.ok == 1].to_numpy() / 1e6


def sections(page: Page, batch_dir: Path, trials: pd.DataFrame) -> None:
    ok = usable(trials)
    page.section("EFT transactions: tables")
    if ok.empty or "workload" not in ok:
        page.warn("No complete, analysed trial in this batch: no table of the family.")
        return
    page.text(
        "Response time: the client's own timing of each transaction (CLOCK_REALTIME around "
        f"its socket calls): of each trial's mean, median and p99, the {TRIMMED_MEAN} (used: "
        "the repetitions averaged, of runs); 'capture median' is the same transactions timed "
        "in the capture nearest the client (first request packet to reply; EFT-SHORT over "
        "TCP: SYN to the server's FIN, set-up and teardown counted). HTB lets an isolated "
        "packet through at once, so a small transaction here has no serialization at the "
        "link's rate."
    )
    resp = family.response_table(ok)
    if not resp.empty:
        page.table(
            resp,
            f"{family.RESPONSE_TITLE}, TCP vs UDP (ms; the paper's Figs. 9-11): "
            f"{TRIMMED_MEAN}; used: the repetitions averaged",
            csv="eft_response.csv",
            digits={c: 3 for c in ("mean_ms", "median_ms", "p99_ms", "capture_median_ms")},
        )
    thr = family.throughput_table(ok)
    if not thr.empty:
        page.table(
            thr,
            f"{family.THROUGHPUT_TITLE} (the paper's Figs. 4-8): {TRIMMED_MEAN}; used: the "
            "repetitions averaged; packets, partial, acks: per transfer in the capture (TCP)",
            csv="eft_throughput.csv",
            digits={"median_mbps": 2, "mean_mbps": 2, "packets": 0, "partial": 0, "acks": 0},
        )
    # the paper's orderings per group of what it compares, each protocol at its own settings
    paper.orderings(page, "eft", ok, family.compared(ok), family.OWN_SETTINGS)
    eft = ok[ok.workload.isin(["eft_short", "eft_long"])]
    if eft.empty:
        return
    page.section("EFT transactions: distribution of response times")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, rows in eft.groupby(["rate_mbps", "protocol", "workload"], dropna=False):
        times = np.concatenate([response_times(batch_dir, r) for _, r in rows.iterrows()])
        if not len(times):
            continue
        times.sort()
        ax.plot(
            times,
            np.arange(1, len(times) + 1) / len(times),
            label=f"{key[0]:g} Mbit/s {key[1]} {key[2]}",
        )
    ax.set_xscale("log")
    ax.set_xlabel("response time (ms, log)")
    ax.set_ylabel("fraction of transactions")
    ax.set_ylim(0, 1)
    if ax.get_legend_handles_labels()[0]:  # no transaction timed: no legend (a warning)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    page.figure(
        fig,
        "eft_response_cdf.png",
        "Response times of every EFT transaction (client's timing, all repetitions pooled), "
        "per rate, protocol and workload.",
    )
