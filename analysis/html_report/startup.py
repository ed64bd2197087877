"""The startup family (seed 001, ../shared/EXPERIMENTS.md §2) in the HTML report: the
effective-throughput table (the paper's Fig. 3 table) and the late-joiner table, the same
numbers as the terminal report (analysis/families/startup.py), and the transferred share of
the bottleneck against elapsed time as a figure; the paper's Fig. 3 table beside ours where the
batch ran its network, and the orderings its text states of Figs. 7-10 beside ours."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.families import startup as family
from analysis.families.common import TRIMMED_MEAN
from analysis.families.published import published
from analysis.html_report import paper
from analysis.html_report.page import Page, plt
from analysis.html_report.paper import PAPER

TITLE = "TCP startup dynamics (Aron, Druschel 1998)"
TABLE = (family.TRANSFERRED, family.SINCE_SYN)  # the table's measure and origin
METRICS = {
    **{
        family.share_key(*TABLE, c): "fraction of capacity transferred (past the bottleneck in "
        f"sequence) by the first data SYN + {c}"
        for c in family.CUTOFFS
    },
    "late_share_of_fair": "late joiner: share of its fair share in the first 5 s after its "
    "data SYN",
    "late_window_utilization": "every sender, the 5 s after the late joiner's data SYN: "
    "fraction of capacity transferred",
    "timeouts": "retransmission timeouts",
    "fast_retransmits": "fast retransmits",
}

DIGITS = {
    **{family.share_key(*TABLE, c): 2 for c in family.CUTOFFS},
    "late_share_of_fair": 2,
    "late_window_utilization": 2,
}


def groups(trials: pd.DataFrame) -> list[str]:
    factors = [c for c in trials.columns if c.startswith("factor:")]
    return factors or ["family"]


def usable(trials: pd.DataFrame) -> pd.DataFrame:
    return trials[(trials.status == "complete") & trials.analysed.astype(bool)]


def sections(page: Page, batch_dir: Path, trials: pd.DataFrame) -> None:
    ok = usable(trials)
    page.section("Startup: tables")
    if ok.empty:
        page.warn("No complete, analysed trial in this batch: no table of the family.")
        return
    scaled = family.scaled_note(ok)
    if scaled:
        page.warn(f"SCALED from the paper's setup: {scaled}")
    page.text(
        f"Each figure is the {TRIMMED_MEAN}, over the complete repetitions of each group (the "
        "factors the experiment varies) that have it; '<t> used': the repetitions averaged. "
        "KB: 1000 bytes of TCP payload over all flows that passed the "
        "capture after the bottleneck in sequence (new bytes, contiguous from each flow's "
        "first: the paper's useful data, as it reached the receivers; not yet acknowledged) "
        "since the trial's first data SYN (the start of the transfers; iperf3 opens its control "
        "connection three round trips before it, from T0); %: of what the bottleneck could "
        "carry in that time."
    )
    for note in (family.legacy_note(ok), family.skipped_note(ok)):
        if note:
            page.warn(note)
    through = family.throughput_table(ok)
    page.table(
        through,
        "Effective throughput vs elapsed time since the first data SYN (the paper's Fig. 3 "
        f"table): {family.STATISTIC}",
        csv="startup_throughput.csv",
        digits={f"{c}{family.KB}": 0 for c in family.CUTOFFS}
        | {f"{c}{family.SHARE}": 0 for c in family.CUTOFFS}
        | {family.FIRST_SYN_COLUMN: 3},
    )
    if len(ok) == ok.groupby(groups(ok), dropna=False).ngroups:
        page.note("One repetition per group: the table shows single runs, not means.")
    beside_paper(page, ok)
    # Figs. 7-10: each statement per group of the other factors (display only)
    paper.orderings(page, "startup", ok, groups(ok))
    late = family.late_joiner_table(ok)
    if late.empty:
        page.text("No late joiner in this batch (every sender starts at T0).")
    else:
        page.table(
            late,
            f"{family.LATE_TITLE}: {family.STATISTIC}",
            csv="startup_late_joiner.csv",
            digits=family.LATE_DIGITS,
        )
    page.section("Startup: figure")
    keys = family.group_columns(through)
    seconds = [float(c[:-1]) for c in family.CUTOFFS]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for _, row in through.iterrows():
        y = [row[f"{c}{family.SHARE}"] for c in family.CUTOFFS]
        label = ", ".join(f"{k}={row[k]}" for k in keys)
        ax.plot(seconds, y, "o-", label=label)
    ax.set_xlabel("elapsed time since the first data SYN (s)")
    ax.set_ylabel("data transferred (% of bottleneck capacity)")
    ax.set_xscale("log")
    ax.set_xticks(seconds, [f"{s:g}" for s in seconds])
    ax.set_ylim(0, 105)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    page.figure(
        fig,
        "startup_utilization.png",
        "Effective throughput: data transferred by the first data SYN + t over all flows, as a "
        "share of the bottleneck's capacity (trimmed means per group, as the table); missing "
        "points: trials shorter than t.",
    )


def beside_paper(page: Page, ok: pd.DataFrame) -> None:
    """The paper's Fig. 3 table (analysis/families/startup_paper.yml) beside our effective
    throughput, per group, of the trials on the paper's network; display only."""
    pub = published("startup")
    table = pub.tables.get("fig3") if pub else None
    if table is None:
        return
    mine = table.applies_to(ok)
    if mine.empty:
        where = ", ".join(f"{k.removeprefix('param:')} {v}" for k, v in table.applies.items())
        page.note(
            f"The paper's {table.title.split(':')[0]} is of its high-speed WAN ({where}); no "
            "trial of this batch ran there, so it is not shown beside ours."
        )
        return
    through = family.throughput_table(mine)
    keys = family.group_columns(through)
    rows = []
    for _, p in table.rows.iterrows():
        row = {
            "elapsed": p.cutoff,
            f"{PAPER} effective throughput %": p.utilization_pct,
            f"{PAPER} data per sender": p.data_per_sender,
        }
        for _, g in through.iterrows():
            label = ", ".join(f"{k}={g[k]}" for k in keys) or "all"
            row[f"ours % ({label})"] = g.get(f"{p.cutoff}{family.SHARE}")
            row[f"ours used ({label})"] = g.get(f"{p.cutoff}{family.USED}")
        rows.append(row)
    page.table(
        pd.DataFrame(rows),
        f"{table.title}, from the paper ({pub.citation}), beside ours: the columns labelled "
        f"'{PAPER}' are its published values (display only); ours: % of the bottleneck's "
        "capacity delivered by the first data SYN + the elapsed time per group, the "
        f"{TRIMMED_MEAN} (used: the repetitions averaged)",
        csv=f"fig3_vs_{PAPER}.csv",
        digits={c: 2 if c.startswith(PAPER) else 0 for c in rows[0]},
    )
