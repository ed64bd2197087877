"""The collateral-damage family (seed 000, ../shared/EXPERIMENTS.md §1) in the HTML report:
Table 1 and Table 2 (the same numbers as the terminal report, analysis/families), Fig. 2 (one
trial: cwnd, UDP one-way delay and queue occupancy over about three congestion epochs),
Fig. 3 (OWD CDF per CC, a panel per flow count), Fig. 4 (queue-full events per minute),
Fig. 5 (retransmitted packets) and the paper's trial-length rule; the paper's published
values beside ours (analysis/html_report/paper.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.batches import trial_dir
from analysis.families import collateral_damage as family
from analysis.families.common import trimmed
from analysis.html_report import paper
from analysis.html_report.page import Page, plt
from analysis.tcp_probe import congestion_events
from core.layout import RECORD
from core.link_rules import FULL_FRAME_BYTES
from core.trial_record import load_record
from core.units import parse_bytes, parse_duration_ns

TITLE = "Collateral damage: TCP variants vs. VoIP latency (Stewart, Armitage, Huebner 2009)"
FAMILY = "collateral_damage"  # its published values: analysis/families/collateral_damage_paper.yml
GROUP = family.GROUP  # cc, rtt_ms, flows
TRIMMING = (
    "Mean and σ are over the complete repetitions of each CC × RTT × flows group; with five "
    "or more, the highest and the lowest are dropped first (the paper: 5 runs, the middle 3 "
    "averaged); with fewer, every run is used. σ is the sample standard deviation (n − 1) "
    "and needs at least two runs."
)
# Per-trial metrics: the trial table's columns and what the batch comparison looks at.
METRICS = {
    "goodput_kBps": "aggregate goodput (KB/s)",
    "owd_median_ms": "UDP OWD median (ms)",
    "owd_mean_ms": "UDP OWD mean (ms)",
    "owd_p99_ms": "UDP OWD p99 (ms)",
    "queue_full_events_per_min": "queue-full events per minute",
    "retransmitted_packets": "retransmitted packets",
    "udp_lost": "UDP packets lost",
}
MIN_LENGTH_S, MIN_EPOCHS = family.MIN_SECONDS, family.MIN_EPOCHS  # the paper's length rule
EPOCH_GAP_NS = 10**9  # queue-full events closer than this belong to one congestion epoch
CWND_COLUMNS = ["ts_ns", "src", "sport", "dst", "dport", "snd_cwnd", "ssthresh", "generator"]
CC_COLOURS = {"reno": "tab:blue", "newreno": "tab:blue", "cubic": "tab:red", "htcp": "tab:green"}


def groups(trials: pd.DataFrame) -> list[str]:
    return GROUP


def usable(trials: pd.DataFrame) -> pd.DataFrame:
    """Complete, analysed trials with a goodput: the only ones the tables and figures use."""
    ok = trials[(trials.status == "complete") & trials.analysed.astype(bool)]
    if "goodput_kBps" not in ok:
        return ok.iloc[:0]
    return ok[ok.goodput_kBps.notna()]


def _colour(cc: str) -> str | None:
    return CC_COLOURS.get(str(cc).lower())


def _group_label(rtt: float, flows: int) -> str:
    return f"RTT {rtt:g} ms, {int(flows)} flow{'s' if flows != 1 else ''}"


def sections(page: Page, batch_dir: Path, trials: pd.DataFrame) -> None:
    ok = usable(trials)
    page.section("Collateral damage: tables")
    if ok.empty:
        page.warn(
            "No complete, analysed trial in this batch: no table or figure of the family. "
            "See the trial list below for what happened to each trial."
        )
        return
    page.text(TRIMMING)
    table_1(page, ok)
    table_2(page, batch_dir, ok)
    page.section("Collateral damage: figures")
    figure_2(page, batch_dir, ok)
    figure_3(page, batch_dir, ok)
    per_group_figure(
        page,
        ok,
        "queue_full_events_per_min",
        "queue-full events per minute",
        "fig4_queue_full_events.png",
        "Fig. 4: queue-full events per minute at the bottleneck, over a 60 s window in the "
        "middle of each trial (a queue-full event: the queue reaching capacity and dropping "
        "until it accepts a packet again)." + aqm_note(ok),
        window_note=True,
    )
    per_group_figure(
        page,
        ok,
        "retransmitted_packets",
        "retransmitted packets per trial",
        "fig5_retransmitted_packets.png",
        "Fig. 5: retransmitted TCP packets per trial, summed over the flows (from the "
        "sender-side capture).",
    )
    paper.orderings(page, FAMILY, ok, GROUP)
    page.section("Collateral damage: trial length")
    length_rule(page, batch_dir, trials)


def table_1(page: Page, ok: pd.DataFrame) -> None:
    t1 = family.goodput_table(ok)
    page.table(
        t1,
        "Table 1: aggregate TCP goodput (KB/s, 1 KB = 1000 B, steady state, from the captures): "
        "mean and σ over the trimmed repetitions",
        csv="table1_goodput.csv",
        digits={"mean_kBps": 1, "std_kBps": 2, "rtt_ms": 0},
    )
    paper.beside(page, FAMILY, "table1", t1, {"mean_kBps": 1, "std_kBps": 2, "rtt_ms": 0})
    if (t1.runs < 2).any():
        page.note(
            "Some groups have a single complete repetition: their σ is not defined (–), and "
            "their mean is one run."
        )
    elif (t1.runs < 5).any():
        page.note("Fewer than five repetitions in some groups: nothing was trimmed there.")


def table_2(page: Page, batch_dir: Path, ok: pd.DataFrame) -> None:
    has_owd = _has(batch_dir, ok, "owd")
    missing = ok[~has_owd | ok.udp_generator.isna()]
    if len(missing):
        page.note(
            "No UDP one-way delay table (analysis/owd.parquet) for "
            + ", ".join(missing.trial)
            + ": left out of Table 2 and Fig. 3."
        )
    with_owd = ok[has_owd & ok.udp_generator.notna()]
    if with_owd.empty:
        page.warn("No trial has UDP one-way delays: no Table 2.")
        return
    t2 = family.owd_table(batch_dir, with_owd)
    t2.insert(0, "trials", with_owd.groupby(GROUP).size())
    page.table(
        t2,
        "Table 2: UDP one-way delay through the router (ms, from the captures on both sides): "
        "over every delivered packet of the group's complete trials; packets dropped at the "
        "queue are counted as lost and left out",
        csv="table2_owd.csv",
        digits={"median_ms": 1, "mean_ms": 1, "std_ms": 1, "rtt_ms": 0},
    )
    paper.beside(
        page, FAMILY, "table2", t2, {"median_ms": 1, "mean_ms": 1, "std_ms": 1, "rtt_ms": 0}
    )
    owd_bounds(page, with_owd)


def owd_bounds(page: Page, ok: pd.DataFrame) -> None:
    """The paper's sanity bounds: the smallest OWD is about RTT/2 (plus serialization); the
    largest is at most RTT/2 + (buffer + one full frame) · 8 / rate (owd_bound_ms)."""
    needed = {"owd_min_ms", "owd_max_ms", "owd_bound_ms"}
    if not needed <= set(ok.columns) or ok[list(needed)].isna().all().any():
        return
    rows = []
    for (cc, rtt, flows), g in ok.groupby(GROUP):
        low, high, bound = g.owd_min_ms.min(), g.owd_max_ms.max(), g.owd_bound_ms.max()
        rows.append(
            {
                "cc": cc,
                "rtt_ms": rtt,
                "flows": flows,
                "min_ms": low,
                "rtt_half_ms": rtt / 2,
                "max_ms": high,
                "bound_ms": bound,
                "within": bool(low >= rtt / 2 and high <= bound),
            }
        )
    table = pd.DataFrame(rows)
    if not table.within.all():
        page.warn("Some one-way delays are outside the physical bounds (flagged rows).")
    page.table(
        table,
        "One-way delay bounds: smallest OWD against RTT/2, largest against RTT/2 + "
        f"(buffer + {FULL_FRAME_BYTES} B) · 8 / rate",
        csv="owd_bounds.csv",
        digits={"min_ms": 2, "max_ms": 1, "bound_ms": 1, "rtt_half_ms": 1, "rtt_ms": 0},
        row_class=lambda r: None if r.within else "flag",
    )


def _has(batch_dir: Path, trials: pd.DataFrame, kind: str) -> pd.Series:
    """Per trial: has it analysis/<kind>.parquet?"""
    files = [trial_dir(batch_dir, r) / "analysis" / f"{kind}.parquet" for _, r in trials.iterrows()]
    return pd.Series([f.exists() for f in files], index=trials.index, dtype=bool)


def _read(where: Path, kind: str, columns: list[str] | None = None) -> pd.DataFrame | None:
    f = where / "analysis" / f"{kind}.parquet"
    return pd.read_parquet(f, columns=columns) if f.exists() else None


def _fig2_trials(batch_dir: Path, ok: pd.DataFrame) -> pd.DataFrame:
    """One trial per CC: the fewest flows, the shortest RTT, the first repetition; a trial
    with cwnd recorded first."""
    has = _has(batch_dir, ok, "cwnd")
    ranked = ok.assign(_no_cwnd=~has).sort_values(["_no_cwnd", "flows", "rtt_ms", "repetition"])
    return ranked.groupby("cc", sort=True).head(1).sort_values("cc")


def aqm_note(trials: pd.DataFrame) -> str:
    """What Fig. 4 counts where the bottleneck's queue is an AQM: its runs of drops, which come
    before the queue is full."""
    if "queue_qdisc" not in trials:
        return ""
    aqms = sorted({q for q in trials.queue_qdisc.dropna() if q != "droptail"})
    if not aqms:
        return ""
    return (
        f" Where the bottleneck runs {', '.join(aqms)}, the count is that queue's runs of drops: "
        "an AQM drops early, before its buffer is full."
    )


def epoch_starts(
    cwnd: pd.DataFrame | None, queue: pd.DataFrame | None, *, flows: int = 1
) -> tuple[np.ndarray, str]:
    """Start times of congestion epochs: with one flow, its ssthresh reductions (tcp_probe);
    with several (or without cwnd), the bottleneck's queue-full events (runs of drops)
    merged when closer than EPOCH_GAP_NS: the aggregate's epochs."""
    have_cwnd = cwnd is not None and len(cwnd) > 0
    have_queue = queue is not None and len(queue) > 0
    if have_cwnd and (flows == 1 or not have_queue):
        first = cwnd[cwnd.sport == cwnd.sport.min()].sort_values("ts_ns", kind="stable")
        events = congestion_events(first.reset_index(drop=True))
        return events.ts_ns.to_numpy(np.int64), "ssthresh reductions of flow 1 (tcp_probe)"
    if have_queue:
        seen = queue[queue.event != "departure"]
        drop = (seen.event == "drop").to_numpy()
        start = drop.copy()
        start[1:] &= ~drop[:-1]
        ts = seen.ts_ns.to_numpy(np.int64)[start]
        keep = np.r_[True, np.diff(ts) > EPOCH_GAP_NS] if len(ts) else np.array([], bool)
        return ts[keep], "queue-full events at the bottleneck, a second apart or more"
    return np.array([], np.int64), "none"


def fig2_window(epochs: np.ndarray, start_ns: int, end_ns: int) -> tuple[int, int, int]:
    """About three congestion epochs around the middle of [start_ns, end_ns) (the trial after
    its warm-up): (from, to, epochs shown). Without four epoch starts there, the whole span."""
    e = epochs[(epochs >= start_ns) & (epochs < end_ns)]
    if len(e) < 4:
        return start_ns, end_ns, max(len(e) - 1, 0)
    mid = (start_ns + end_ns) // 2
    i = int(np.clip(np.searchsorted(e, mid) - 1, 0, len(e) - 4))
    pad = (e[i + 3] - e[i]) // 10
    return max(start_ns, int(e[i] - pad)), min(end_ns, int(e[i + 3] + pad)), 3


def figure_2(page: Page, batch_dir: Path, ok: pd.DataFrame) -> None:
    for _, r in _fig2_trials(batch_dir, ok).iterrows():
        where = trial_dir(batch_dir, r)
        record = load_record(where / RECORD)
        tcp_name, tcp = next(
            (n, g) for n, g in record["traffic"].items() if g["type"] == "bulk_tcp"
        )
        bottleneck = tcp["path"].get("bottleneck") or {}
        cwnd = _read(where, "cwnd", CWND_COLUMNS)
        queue = _read(where, "queue", ["ts_ns", "event", "bytes", "link"])
        owd = _read(where, "owd", ["ts_ns", "owd_ns", "lost", "generator"])
        if cwnd is not None:
            cwnd = cwnd[cwnd.generator == tcp_name]
        if queue is not None:
            queue = queue[queue.link == bottleneck.get("link")]
        if owd is not None:
            owd = owd[owd.generator == r.udp_generator]
        t0 = int(record["times"]["t0_ns"])
        params = record["parameters"]
        warmup = parse_duration_ns(params.get("warmup") or "0s")
        duration = parse_duration_ns(params["duration"])
        epochs, source = epoch_starts(cwnd, queue, flows=int(r.flows))
        lo, hi, shown = fig2_window(epochs, t0 + warmup, t0 + duration)
        missing = [
            name
            for name, frame in (("cwnd", cwnd), ("queue occupancy", queue), ("UDP OWD", owd))
            if frame is None or frame.empty
        ]
        if len(missing) == 3:
            page.note(f"Fig. 2 ({r.cc}): trial {r.trial} has no cwnd, queue or OWD table.")
            continue
        fig, axes = plt.subplots(3, 1, figsize=(10, 7.5), sharex=True)
        _fig2_cwnd(axes[0], cwnd, t0, lo, hi)
        _fig2_owd(axes[1], owd, t0, lo, hi)
        _fig2_queue(axes[2], queue, t0, lo, hi, bottleneck.get("buffer"))
        for e in epochs[(epochs >= lo) & (epochs < hi)]:
            for ax in axes:
                ax.axvline((e - t0) / 1e9, color="grey", lw=0.8, ls=":", zorder=0)
        axes[-1].set_xlabel("time since T0 (s)")
        axes[-1].set_xlim((lo - t0) / 1e9, (hi - t0) / 1e9)
        fig.suptitle(f"{r.cc}, {_group_label(r.rtt_ms, r.flows)}: trial {r.trial}")
        fig.tight_layout()
        span = f"{(lo - t0) / 1e9:.1f}–{(hi - t0) / 1e9:.1f} s after T0"
        what = (
            f"{shown} congestion epochs ({source}; dotted lines mark their starts)"
            if shown
            else f"the trial after its warm-up (fewer than four epoch starts found: {source})"
        )
        page.figure(
            fig,
            f"fig2_{_safe(r.cc)}_{_safe(r.trial)}.png",
            f"Fig. 2 ({r.cc}): (a) cwnd of each TCP flow, (b) one-way delay of the UDP "
            f"packets, (c) bottleneck queue occupancy; {span}: {what}.",
        )
        if missing:
            page.note(
                f"Fig. 2 ({r.cc}, trial {r.trial}): no {' and no '.join(missing)} recorded "
                "for this trial; "
                + (
                    "cwnd needs the tcp:tcp_probe recording on the sender (A/tcp_probe.txt)."
                    if "cwnd" in missing
                    else "that panel is empty."
                )
            )


def _safe(text: Any) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in str(text))


def legend(ax: Any, **kwargs: Any) -> None:
    """A legend if anything is labelled (an empty one is a matplotlib warning)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="grey")
    ax.set_yticks([])


def _fig2_cwnd(ax: Any, cwnd: pd.DataFrame | None, t0: int, lo: int, hi: int) -> None:
    ax.set_ylabel("cwnd (segments)")
    ax.set_title("(a) congestion window", loc="left")
    if cwnd is None or cwnd.empty:
        _empty(ax, "no cwnd recorded (tcp_probe)")
        return
    inside = cwnd[(cwnd.ts_ns >= lo) & (cwnd.ts_ns < hi)]
    for i, (sport, flow) in enumerate(inside.groupby("sport", sort=True), 1):
        ax.step(
            (flow.ts_ns - t0) / 1e9, flow.snd_cwnd, where="post", lw=1, label=f"flow {i} ({sport})"
        )
    if inside.sport.nunique() > 1:
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)
    ax.set_ylim(bottom=0)


def _fig2_owd(ax: Any, owd: pd.DataFrame | None, t0: int, lo: int, hi: int) -> None:
    ax.set_ylabel("one-way delay (ms)")
    ax.set_title("(b) UDP one-way delay through the router", loc="left")
    if owd is None or owd.empty:
        _empty(ax, "no UDP one-way delays")
        return
    inside = owd[(owd.ts_ns >= lo) & (owd.ts_ns < hi)]
    got = inside[~inside.lost]
    ax.plot((got.ts_ns - t0) / 1e9, got.owd_ns / 1e6, ".", ms=2.5, color="tab:purple")
    lost = inside[inside.lost]
    if len(lost):
        top = float(got.owd_ns.max() / 1e6) if len(got) else 1.0
        ax.plot(
            (lost.ts_ns - t0) / 1e9,
            np.full(len(lost), top * 1.05),
            "x",
            color="tab:red",
            ms=5,
            label=f"lost at the queue ({len(lost)})",
        )
        ax.legend(loc="lower right")
    ax.set_ylim(bottom=0)


def _fig2_queue(
    ax: Any, queue: pd.DataFrame | None, t0: int, lo: int, hi: int, buffer: str | None
) -> None:
    ax.set_ylabel("queue (KB)")
    ax.set_title("(c) bottleneck queue occupancy (from the captures)", loc="left")
    if queue is None or queue.empty:
        _empty(ax, "no queue occupancy (analysis/queue.parquet)")
        return
    inside = queue[(queue.ts_ns >= lo) & (queue.ts_ns < hi)]
    ax.step((inside.ts_ns - t0) / 1e9, inside.bytes / 1000, where="post", lw=1, color="tab:green")
    if buffer:
        cap = parse_bytes(buffer) / 1000
        ax.axhline(cap, color="black", lw=0.8, ls="--", label=f"buffer {cap:g} KB")
    drops = inside[inside.event == "drop"]
    if len(drops):
        ax.plot(
            (drops.ts_ns - t0) / 1e9,
            drops.bytes / 1000,
            "|",
            color="tab:red",
            ms=8,
            label=f"drops ({len(drops)})",
        )
    legend(ax, loc="lower right")
    ax.set_ylim(bottom=0)


def figure_3(page: Page, batch_dir: Path, ok: pd.DataFrame) -> None:
    ok = ok[ok.udp_generator.notna()]
    delays: dict[tuple, np.ndarray] = {}
    for key, rows in ok.groupby(GROUP):
        parts = []
        for _, r in rows.iterrows():
            owd = _read(trial_dir(batch_dir, r), "owd", ["owd_ns", "lost", "generator"])
            if owd is not None:
                keep = (owd.generator == r.udp_generator) & ~owd.lost
                parts.append(owd.owd_ns[keep].to_numpy() / 1e6)
        if parts:
            delays[key] = np.sort(np.concatenate(parts))
    if not delays:
        page.note("Fig. 3: no UDP one-way delays in this batch.")
        return
    rtts = sorted({k[1] for k in delays})
    flows = sorted({k[2] for k in delays})
    fig, axes = plt.subplots(
        len(rtts),
        len(flows),
        figsize=(4.2 * len(flows) + 0.8, 3.4 * len(rtts) + 0.6),
        squeeze=False,
        sharey=True,
    )
    for i, rtt in enumerate(rtts):
        for j, n in enumerate(flows):
            ax = axes[i][j]
            ax.set_title(_group_label(rtt, n))
            for (cc, rr, nn), ms in sorted(delays.items()):
                if rr != rtt or nn != n or not len(ms):
                    continue
                # At most ~2000 points: the CDF's shape, not every packet.
                pick = np.unique(np.linspace(0, len(ms) - 1, min(len(ms), 2000)).astype(int))
                ax.step(
                    ms[pick],
                    (pick + 1) / len(ms),
                    where="post",
                    label=f"{cc} ({len(ms)} pkts)",
                    color=_colour(cc),
                )
            if ax.has_data():
                legend(ax, loc="upper left")
            else:
                _empty(ax, "no trial")
            ax.set_xlabel("one-way delay (ms)")
            ax.set_ylim(0, 1.02)
            if j == 0:
                ax.set_ylabel("fraction of UDP packets")
    fig.tight_layout()
    page.figure(
        fig,
        "fig3_owd_cdf.png",
        "Fig. 3: CDF of the UDP one-way delay per CC, one panel per flow count (a row per "
        "RTT); every delivered packet of the group's complete trials.",
    )


def per_group_figure(
    page: Page,
    ok: pd.DataFrame,
    metric: str,
    ylabel: str,
    name: str,
    caption: str,
    *,
    window_note: bool = False,
) -> None:
    """Bars: trimmed mean per CC and flow count (a panel per RTT), σ as error bars; every
    run as a dot (hollow: trimmed away)."""
    if metric not in ok or ok[metric].isna().all():
        page.note(f"{caption.split(':')[0]}: no trial has {ylabel} (metric {metric}).")
        return
    data = ok[ok[metric].notna()]
    rtts = sorted(data.rtt_ms.unique())
    ccs = sorted(data.cc.unique())
    flows = sorted(data.flows.unique())
    width = 0.8 / len(ccs)
    fig, axes = plt.subplots(
        1,
        len(rtts),
        figsize=(max(5.0, 1.4 * len(flows) * len(ccs)) * len(rtts) * 0.75 + 1, 4),
        squeeze=False,
        sharey=True,
    )
    for ax, rtt in zip(axes[0], rtts, strict=True):
        for k, cc in enumerate(ccs):
            for j, n in enumerate(flows):
                runs = data[(data.rtt_ms == rtt) & (data.cc == cc) & (data.flows == n)][metric]
                if runs.empty:
                    continue
                kept = trimmed(runs.astype(float))
                x = j + (k - (len(ccs) - 1) / 2) * width
                sd = kept.std(ddof=1) if len(kept) > 1 else 0.0
                ax.bar(
                    x,
                    kept.mean(),
                    width * 0.9,
                    yerr=sd,
                    capsize=3,
                    color=_colour(cc),
                    alpha=0.75,
                    label=cc if j == 0 else None,
                )
                dropped = runs.drop(kept.index)
                ax.plot(np.full(len(kept), x), kept, "o", ms=3.5, color="black")
                ax.plot(np.full(len(dropped), x), dropped, "o", ms=3.5, mfc="none", color="black")
        ax.set_xticks(range(len(flows)), [str(int(n)) for n in flows])
        ax.set_xlabel("TCP flows")
        ax.set_title(f"RTT {rtt:g} ms")
        ax.set_xlim(-0.6, len(flows) - 0.4)
        legend(ax, loc="upper left")
    axes[0][0].set_ylabel(ylabel)
    fig.tight_layout()
    page.figure(
        fig,
        name,
        caption + " Bars: trimmed mean; error bars: σ; dots: every run (hollow: trimmed away).",
    )
    if window_note and "queue_window_s" in data and (data.queue_window_s < 60).any():
        short = data[data.queue_window_s < 60]
        page.note(
            f"{len(short)} trial(s) are shorter than 60 s: their window is the whole trial "
            f"({', '.join(f'{v:g}' for v in sorted(short.queue_window_s.unique()))} s), "
            "scaled to a minute."
        )


def _epochs(value: Any) -> list[int] | None:
    if isinstance(value, str):
        return json.loads(value)
    if isinstance(value, list):
        return value
    return None


def length_rule(page: Page, batch_dir: Path, trials: pd.DataFrame) -> None:
    """The paper's rule: at least 3 minutes or 20 congestion epochs, whichever is longer."""
    rows = []
    for _, r in trials.iterrows():
        value = r.get("param:duration")
        duration = (
            parse_duration_ns(value) / 1e9
            if isinstance(value, str)
            else (value / 1e9 if isinstance(value, int | float) and not pd.isna(value) else None)
        )
        epochs = _epochs(r.get("tcp.congestion_epochs"))
        fewest = min(epochs) if epochs else None
        problems = []
        if duration is not None and duration < MIN_LENGTH_S:
            problems.append("too short")
        if fewest is not None and fewest < MIN_EPOCHS:
            problems.append("too few epochs")
        if fewest is None:
            problems.append("epochs unknown")
        verdict = ", ".join(problems) or "ok"
        rows.append(
            {
                "trial": r.trial,
                "status": r.status,
                "duration_s": duration,
                "epochs_per_flow": ", ".join(map(str, epochs)) if epochs else "no cwnd",
                "verdict": verdict,
            }
        )
    table = pd.DataFrame(rows)
    bad = table.verdict.str.contains("too")
    page.text(
        f"The paper's rule: each trial runs at least {MIN_LENGTH_S // 60} minutes or "
        f"{MIN_EPOCHS} congestion epochs, whichever is longer. Epochs are counted per flow from "
        "the cwnd recording (ssthresh reductions); without it they are unknown."
    )
    if bad.any():
        page.warn(f"{int(bad.sum())} of {len(table)} trial(s) do not meet the rule (flagged).")
    if table.verdict.str.contains("unknown").any():
        page.note("Trials without a cwnd recording: their number of epochs cannot be checked.")
    page.table(
        table,
        "Trial length against the paper's rule",
        csv="trial_length.csv",
        digits={"duration_s": 0},
        row_class=lambda row: "bad" if row.verdict != "ok" else None,
    )
