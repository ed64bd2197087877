"""The DiffServ family (seed 004, ../shared/EXPERIMENTS.md §4) in the HTML report: the table of
IN % and drop % per marker and RIO threshold (the same numbers as the terminal report,
analysis/families/diffserv.py), and the paper's performance frontiers: mean packet delay vs
goodput, and mean flow completion time vs goodput for 1-, 18- and 190-packet flows, one point
per threshold setting, one curve per marker (and offered load)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.families import diffserv as family
from analysis.families.published import published
from analysis.html_report import paper
from analysis.html_report.frontier import frontier_orderings
from analysis.html_report.page import Page, plt

TITLE = "Adaptive packet marking over DiffServ (Neglia, Bianchi, Sottile)"
METRICS = {
    "in_share": "IN share of the packets at the core",
    "drop_total": "drop share at the core",
    "goodput_bps": "goodput of the web flows (bit/s)",
    "transit_mean_ms": "mean transit through the core (ms)",
}
DIGITS = {"in_share": 3, "drop_total": 4, "goodput_bps": 0, "transit_mean_ms": 1}
LOAD = "load each"
THRESHOLDS = ["IN min (pkt)", "OUT min (pkt)"]
SETTINGS = ["rio_in_min_pkt", "rio_out_min_pkt"]  # one point of a frontier (a trial's keys)


def usable(trials: pd.DataFrame) -> pd.DataFrame:
    return trials[(trials.status == "complete") & trials.analysed.astype(bool)]


def groups(trials: pd.DataFrame) -> list[str]:
    """What a batch is compared with the previous one by: marker, RIO thresholds, load."""
    wanted = ["marker", "rio_in_min_pkt", "rio_out_min_pkt", "factor:traffic[*].load"]
    return [c for c in wanted if c in trials] or ["family"]


def curves(front: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """One curve per marker (and offered load when the batch has several), its points in the
    order of the swept threshold (IN min for NM and APM, OUT min for WPM and MPM; the other
    is fixed): where goodput hardly moves (the web load is not elastic), ordering by it
    would zigzag with the runs' noise."""
    by = ["marker", LOAD] if LOAD in front and front[LOAD].nunique() > 1 else ["marker"]
    order = [c for c in THRESHOLDS if c in front] or ["goodput Mbit/s"]
    out = []
    for key, rows in front.groupby(by, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        label = " ".join(str(k) for k in key if pd.notna(k))
        out.append((label, rows.sort_values(order)))
    return out


def swept(rows: pd.DataFrame) -> str | None:
    """The threshold column a curve sweeps (the one that varies), if any."""
    varying = [c for c in THRESHOLDS if c in rows and rows[c].nunique() > 1]
    return varying[0] if varying else None


def sections(page: Page, batch_dir: Path, trials: pd.DataFrame) -> None:
    ok = usable(trials)
    page.section("DiffServ: IN and drop shares per marker")
    front = family.frontier_table(ok) if not ok.empty else pd.DataFrame()
    if front.empty:
        page.warn("No complete, analysed trial in this batch: no table or figure of the family.")
        return
    shortened = family.labels(ok, "shortened")
    if shortened:
        page.warn(
            f"SHORTENED: {'; '.join(shortened)} (the paper: 500 s per run, the first 50 s "
            "discarded); the numbers below are not the paper's setting."
        )
    rescaled = family.labels(ok, "rescaled")
    if rescaled:
        page.warn(
            f"RESCALED: {'; '.join(rescaled)} (the paper: 6 Mbit/s). The offered loads are "
            "shares of the rate, but the RIO thresholds stay in packets, so each lasts longer "
            "(or shorter) in time than the paper's: compare shapes, not values."
        )
    locked = ok[ok.lockout_s.fillna(0) > 1] if "lockout_s" in ok else ok.iloc[:0]
    if len(locked):
        page.warn(
            f"{len(locked)} trial(s) had their IN queue locked out for more than 1 s (longest "
            f"{locked.lockout_s.max():.1f} s; {', '.join(locked.trial)}): GRED's IN average "
            "stayed at or above its max with the queue empty, so every IN packet was dropped. "
            "Linux GRED does not restart its idle clock after dropping into an empty queue: "
            "its average decays per arriving packet, not with idle time as in ns-2's RED "
            "(the paper's). Read these trials' IN/drop shares with that in mind."
        )
    approx = family.labels(ok, "rio_approximation")
    if approx:
        page.warn(
            f"NOT RIO: a FreeBSD router's rio is {'; '.join(approx)} (trial.json's rio and "
            "delay records say how it differs); its IN % and drop % are those two queues' "
            "counters (queue IN as VQ 0, OUT as VQ 1), not GRED's."
        )
    if "rio_bpf" in ok and ok["rio_bpf"].eq(True).any():
        page.warn(
            f"{int(ok['rio_bpf'].eq(True).sum())} trial(s) ran RIO as the tc BPF program "
            "hostside/bpf_tc/rio (a kernel without GRED): its IN % and drop % are that "
            "program's counters per level, under GRED's names; its README says where it departs "
            "from GRED (w_q as asked, RED's idle decay, the averages of an ideal FIFO)."
        )
    page.text(
        "IN % and drop %: GRED's per-virtual-queue counters at the core (VQ 0 IN, VQ 1 OUT; "
        "VQ 2 HIGH where the queue has a third level, MPM's probes), "
        "over the whole trial. Goodput: the web flows' payload delivered in the steady window "
        "(after the warm-up), from the captures. Transit: capture before the core to capture "
        "after it (queue, link delay, the edge marker's time), mean over the packets forwarded "
        "in the middle window. FCT: SYN to last data packet, mean weighted by each "
        "generator's number of flows of that size."
    )
    page.table(
        front,
        "Per marker and RIO threshold (means over the runs): the paper's table of IN % and "
        "drop % (total, IN, OUT), with goodput, delay and FCT",
        csv="diffserv_frontier.csv",
        digits={"IN min (pkt)": 0, "OUT min (pkt)": 0, "runs": 0, "goodput Mbit/s": 3},
    )
    lines = curves(front)
    page.section("DiffServ: performance frontiers")
    one_curve_per_marker(
        page, lines, ("goodput Mbit/s", "goodput (Mbit/s)"),
        ("transit ms", "mean packet delay through the core (ms)"),
        "diffserv_delay_frontier.png",
        "Mean packet delay vs goodput: one point per RIO threshold setting, one curve per "
        "marker (the paper's delay frontier).",
    )  # fmt: skip
    one_curve_per_marker(
        page, lines, ("utilization %", "utilization of the bottleneck (%)"),
        ("normalized delay", "mean packet delay / least packet delay"),
        "diffserv_normalized_delay.png",
        "Normalized per-packet delay vs utilization: the mean transit through the core over "
        "the least one of the trial (an empty queue: at its start at least), one point per RIO "
        "threshold setting.",
    )  # fmt: skip
    fig, axes = plt.subplots(1, len(family.FCT_CLASSES), figsize=(12, 4))
    for ax, packets in zip(axes, family.FCT_CLASSES, strict=True):
        column = f"FCT {packets} pkt ms"
        for label, rows in lines:
            ax.plot(rows["goodput Mbit/s"], rows[column], marker="o", label=label)
        ax.set_title(f"{packets}-packet flows")
        ax.set_xlabel("goodput (Mbit/s)")
        ax.set_ylabel("mean FCT (ms)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    page.figure(
        fig,
        "diffserv_fct_frontier.png",
        "Mean flow completion time vs goodput for 1-, 18- and 190-packet flows: one point per "
        "RIO threshold setting, one curve per marker (the paper's FCT frontiers).",
    )
    beside_paper(page, lines)
    load = [c for c in ("offered_load", "factor:traffic[*].load") if c in ok][:1]
    frontier_orderings(page, "diffserv", ok, load, SETTINGS)
    paper.orderings(page, "diffserv", ok, load, tuple(SETTINGS))


def beside_paper(page: Page, lines: list[tuple[str, pd.DataFrame]]) -> None:
    """The paper's Table II (analysis/families/diffserv_paper.yml) beside ours: each of our
    curves' values at its lowest and at its highest threshold, as the paper gives its ranges;
    display only."""
    pub = published("diffserv")
    table = pub.tables.get("table2") if pub else None
    if table is None:
        return
    theirs = table.rows.set_index("marker")
    rows = []
    for label, points in lines:
        marker = points["marker"].iloc[0]
        row: dict[str, object] = {"ours": label, "settings": len(points)}
        for column in table.values:
            ends = points[column] if column in points else pd.Series(dtype=float)
            row[column] = "–" if ends.isna().all() else f"{ends.iloc[0]:.1f}–{ends.iloc[-1]:.1f}"
            got = theirs[column].get(marker) if marker in theirs.index else None
            row[f"{paper.PAPER} {column}"] = "–" if got is None else str(got)
        rows.append(row)
    page.table(
        pd.DataFrame(rows),
        f"{table.title}, from the paper ({pub.citation}), beside ours: each of our curves from "
        f"its lowest threshold to its highest (means over the runs); the columns labelled "
        f"'{paper.PAPER}' are its published ranges (display only)",
        csv=f"table2_vs_{paper.PAPER}.csv",
    )


def one_curve_per_marker(
    page: Page,
    lines: list[tuple[str, pd.DataFrame]],
    x: tuple[str, str],
    y: tuple[str, str],
    name: str,
    caption: str,
) -> None:
    """One figure: column x[0] against y[0] (axis labels x[1], y[1]), one curve per marker."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, rows in lines:  # in threshold order, each point labelled with its threshold
        (line,) = ax.plot(rows[x[0]], rows[y[0]], marker="o", label=label)
        column = swept(rows)
        for _, r in rows.iterrows() if column else ():
            ax.annotate(
                f"{r[column]:g}", (r[x[0]], r[y[0]]), textcoords="offset points",
                xytext=(4, 4), fontsize=7, color=line.get_color(),
            )  # fmt: skip
    ax.set_xlabel(x[1])
    ax.set_ylabel(y[1])
    ax.legend(fontsize=8)
    fig.tight_layout()
    page.figure(fig, name, caption)
