"""The paper's statements about its performance frontiers beside ours: one curve per level of
``by`` (a marker), one point per setting (the mean of its runs), compared at equal values of
the statement's `against` (goodput) over the range the curves share, or its lower or upper half
(the paper's "low" and "high utilization"), by linear interpolation between our points. Display
only, as the other orderings (analysis/html_report/paper.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.families.published import Ordering, published
from analysis.html_report.page import Page
from analysis.html_report.paper import PAPER

__all__ = ["compare", "curve", "frontier_orderings"]

HOLDS = f"ours as the {PAPER}"


def curve(runs: pd.DataFrame, settings: list[str], against: str, metric: str) -> pd.DataFrame:
    """A level's frontier: per setting, the mean of its runs' `against` and `metric`, in
    order of `against`."""
    own = [s for s in settings if s in runs and runs[s].notna().any()]
    points = runs.groupby(own, dropna=False)[[against, metric]].mean() if own else None
    if points is None:
        points = runs[[against, metric]].mean().to_frame().T
    return points.dropna().sort_values(against).reset_index(drop=True)


def _span(curves: dict[Any, pd.DataFrame], against: str, region: str | None) -> tuple | None:
    """The range of `against` every curve covers (its lower or upper half for a region)."""
    lo = max(c[against].min() for c in curves.values())
    hi = min(c[against].max() for c in curves.values())
    if not lo < hi:
        return None
    mid = (lo + hi) / 2
    return {"low": (lo, mid), "high": (mid, hi)}.get(region or "", (lo, hi))


def compare(curves: dict[Any, pd.DataFrame], o: Ordering) -> dict[str, Any]:
    """At each of our points inside the shared range (and its ends), whether every level in
    `more` is above every one in `than`; each level's mean over those points."""
    assert o.against is not None
    span = _span(curves, o.against, o.region)
    if span is None:
        return {"span": None, "held": 0, "points": 0, "means": {}}
    lo, hi = span
    xs = sorted({lo, hi} | {x for c in curves.values() for x in c[o.against] if lo <= x <= hi})
    at = {
        level: np.interp(xs, c[o.against].to_numpy(), c[o.metric].to_numpy())
        for level, c in curves.items()
    }
    high = np.min([at[m] for m in o.more], axis=0)
    low = np.max([at[t] for t in o.than], axis=0)
    return {
        "span": span,
        "held": int((high > low).sum()),
        "points": len(xs),
        "means": {level: float(np.mean(v)) for level, v in at.items()},
    }


def _shown(value: float, column: str) -> str:
    return f"{value / 1e6:.2f}" if column.endswith("_bps") else f"{value:.3g}"


def _unit(column: str) -> str:
    return " (Mbit/s)" if column.endswith("_bps") else ""


def frontier_orderings(
    page: Page, family: str, ok: pd.DataFrame, groups: list[str], settings: list[str]
) -> None:
    """Per frontier statement of the paper and group of ours (``groups``: e.g. the offered
    load), the paper's ordering and ours at equal `against` (``settings``: the columns one
    point of a curve is made of, e.g. the RIO thresholds)."""
    pub = published(family)
    wanted = [o for o in (pub.orderings if pub else []) if o.against]
    rows = []
    for o in wanted:
        if not {o.metric, o.against, o.by} <= set(ok):
            continue
        data = ok[ok[o.metric].notna() & ok[o.against].notna()]
        by = [c for c in groups if c in data]
        for key, g in data.groupby(by, sort=True, dropna=False) if by else [((), data)]:
            levels = {
                level: curve(runs, settings, o.against, o.metric)
                for level, runs in g.groupby(o.by, sort=True)
                if level in o.more + o.than
            }
            if not all(level in levels for level in o.more + o.than):
                continue  # a level the statement names did not run in this group
            found = compare(levels, o)
            span = found["span"]
            order = sorted(found["means"].items(), key=lambda kv: -kv[1])
            held, points = found["held"], found["points"]
            rows.append(
                {
                    "figure": o.figure,
                    **dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)),
                    f"{PAPER}: more": ", ".join(map(str, o.more)),
                    f"{PAPER}: than": ", ".join(map(str, o.than)),
                    f"{o.against} compared{_unit(o.against)}": (
                        f"{_shown(span[0], o.against)}–{_shown(span[1], o.against)}"
                        if span
                        else "no range in common"
                    ),
                    "ours (mean over it)": " > ".join(
                        f"{level} {_shown(v, o.metric)}" for level, v in order
                    ),
                    "points in the paper's order": f"{held} of {points}" if span else "–",
                    HOLDS: None if not span or 0 < held < points else held == points,
                }
            )
    if not rows:
        return
    page.heading(f"The paper's frontier statements ({pub.citation if pub else ''})")
    page.items([f"{o.figure}: “{o.says}”" for o in wanted])
    page.table(
        pd.DataFrame(rows),
        f"The paper's statements about its frontiers (labelled '{PAPER}': its text, display "
        "only) beside ours: each marker's curve (one point per RIO threshold setting, the "
        "mean of its runs) read at equal goodput, by linear interpolation between our points, "
        "over the goodput the curves share (its lower half for 'low utilization', upper half "
        f"for 'high'). '{HOLDS}': at every point compared (– where only at some)",
        csv=f"frontier_orderings_vs_{PAPER}.csv",
        row_class=lambda r: "flag" if r[HOLDS] is False else None,
    )
