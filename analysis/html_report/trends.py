"""The experiment's nights as a page section (analysis/trends.py): per key metric and cell,
each night's runs, median and range with the night's commit under its date, the nights the
test flagged in red, and the night from which a shift holds marked with its commit; and the
whole as a page of its own (`trialbed results trends`, make trends)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.html_report.page import Page, plt
from analysis.trends import Trends, trends

__all__ = ["MAX_FIGURES", "sections", "write_trends"]

MAX_FIGURES = 16  # per page: the shifted and flagged series first


def _order(t: Trends) -> list[tuple[str, str]]:
    """(cell, metric) pairs to draw: those that shifted, then flagged, then the rest."""
    shifted = t.points[t.points.shifted] if len(t.points) else t.points
    first = list(zip(shifted.get("cell", []), shifted.get("metric", []), strict=True))
    first += list(zip(t.flagged.get("cell", []), t.flagged.get("metric", []), strict=True))
    every = [(c, m) for m in t.metrics for c in sorted(t.rows.cell.unique())]
    return [p for p in dict.fromkeys([*first, *every]) if p[1] in t.metrics]


def _figure(page: Page, t: Trends, cell: str, metric: str, k: int) -> None:
    per = t.series(cell, metric)
    runs = t.rows[t.rows.cell == cell][["night", metric]].dropna()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.scatter(runs.night, runs[metric], s=10, color="0.6", label="runs", zorder=2)
    ax.plot(per.night, per["median"], marker="o", color="C0", label="median", zorder=3)
    ax.fill_between(per.night, per.low, per.high, color="C0", alpha=0.12, label="range")
    hit = per[per.flagged]
    if len(hit):
        ax.scatter(hit.night, hit["median"], s=80, color="C3", label="flagged", zorder=4)
    point = t.points[(t.points.cell == cell) & (t.points.metric == metric)] if len(t.points) else ()
    said = ""
    if len(point) and bool(point.shifted.iloc[0]):
        p = point.iloc[0]
        ax.axvline(p.from_night - 0.5, color="C3", linestyle="--", zorder=1)
        said = f"; shifted from {p.batch} (commit {str(p.commit)[:10]})"
    ax.set_xticks(per.night)
    ax.set_xticklabels(
        [f"{str(d)[5:10]}\n{c[:7]}" for d, c in zip(per.date, per.commit, strict=True)],
        fontsize=7,
    )
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} — {cell if cell != '-' else 'every trial (no factors)'}")
    ax.legend(loc="best", fontsize=7)
    page.figure(
        fig,
        f"trend_{k:02d}.png",
        f"{metric}, cell {cell}: each night's runs (grey), median and range; red: nights the "
        f"test flagged against the nights before them{said}. Under each date: its commit.",
    )


def sections(page: Page, t: Trends, title: str = "Trends over nights") -> None:
    page.section(title)
    if t.rows.empty:
        page.note(f"The results catalog has no complete, analysed trial of {t.experiment}.")
        return
    nights = t.rows.night.nunique()
    page.text(
        f"{t.experiment}: {nights} night(s) from the results catalog, "
        f"{t.rows.batch.iloc[0]} to {t.rows.batch.iloc[-1]}; {len(t.metrics)} metric(s) "
        "followed (the family's key metrics and every metric flagged or shifted)."
    )
    shifted = t.points[t.points.shifted] if len(t.points) else t.points
    if len(shifted):
        page.warn(
            "Shifts that hold from a night on (bisect from its commit): "
            + "; ".join(
                f"{r.metric} ({r.cell}) from {r.batch}, commit {r.commit}"
                for r in shifted.itertuples()
            )
        )
        page.table(
            shifted.drop(columns=["shifted"]),
            "The first night after which a shift holds, per cell and metric",
            csv="trend_shifts.csv",
            digits={"shift": 4, "p": 4, "q": 4},
        )
    else:
        page.text("No shift holds from any night on.")
    if len(t.flagged):
        page.table(
            t.flagged,
            "Nights flagged against the nights before them",
            csv="trend_flags.csv",
            digits={"q": 4},
        )
    pairs = _order(t)
    for k, (cell, metric) in enumerate(pairs[:MAX_FIGURES]):
        _figure(page, t, cell, metric, k)
    if len(pairs) > MAX_FIGURES:
        page.note(
            f"{len(pairs) - MAX_FIGURES} more series not drawn; trend_series.csv has them all."
        )
    if pairs:
        every = pd.concat([t.series(c, m).assign(cell=c, metric=m) for c, m in pairs])
        every.to_csv(page.out_dir / "trend_series.csv", index=False)
        page.files.append("trend_series.csv")


def write_trends(experiment: str, out_dir: Path, catalog=None, key=None, **kw) -> Path:
    """The experiment's trends as a page of their own in ``out_dir``; its path."""
    t = trends(experiment, catalog, key=key, **kw)
    page = Page(f"Trends: {experiment}", out_dir)
    sections(page, t, "Trends")
    nights = t.rows.night.nunique() if len(t.rows) else 0
    return page.write(f"{len(t.rows)} runs over {nights} nights of the results catalog")
