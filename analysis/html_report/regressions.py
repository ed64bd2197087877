"""The report's verdict on tonight against its baseline (analysis/regressions.py): what was
compared with what and how, the metrics that changed with their shift and its interval, and
every test made (as CSV too)."""

from __future__ import annotations

import pandas as pd

from analysis.html_report.page import Page
from analysis.regressions import Verdict

__all__ = ["sections"]

DIGITS = {"median": 4, "median_baseline": 4, "shift": 4, "shift_low": 4, "shift_high": 4}
DIGITS |= {"relative": 3, "delta": 2, "p": 4, "p_min": 4, "q": 4}


def sections(page: Page, verdict: Verdict) -> None:
    page.section("Regressions (tested against the baseline)")
    lines = verdict.lines()
    if verdict.problem:
        page.note(f"Not judged: {verdict.problem}.")
        return
    page.text(f"Baseline: {', '.join(verdict.baseline)}.")
    page.text(lines[1].strip() + ".")
    if verdict.found:
        page.warn(f"Changed: {len(verdict.changed)} metric(s), listed first below.")
    else:
        page.text("Verdict: no change found.")
        if len(lines) > 3:
            page.note(lines[3].strip().strip("()") + ".")
    table = verdict.table.sort_values(
        ["changed", "q", "cell", "metric"], ascending=[False, True, True, True], na_position="last"
    )
    page.table(
        table,
        "Every cell and metric: medians, shift (tonight − baseline) with its interval, "
        "Cliff's delta, p and adjusted q (flagged rows: changed)",
        csv="regressions.csv",
        digits=DIGITS,
        row_class=lambda r: "flag" if _true(r.changed) else None,
    )


def _true(value: object) -> bool:
    return value is not None and not pd.isna(value) and bool(value)
