"""Trends over nights (analysis/trends.py, its page analysis/html_report/trends.py) on
synthetic nightly series whose answer is known: the night a shift holds from, named with its
commit; a single odd night flagged but no shift; no shift in an unchanged series."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.trends import trends
from core.layout import CATALOG_ENV, CatalogDir

from .test_regressions import nightly_series


@pytest.fixture(autouse=True)
def _catalog_beside_results(monkeypatch):
    monkeypatch.delenv(CATALOG_ENV, raising=False)


def catalog(tmp_path: Path) -> CatalogDir:
    return CatalogDir(tmp_path / "results" / "catalog")


def test_the_night_a_shift_holds_from_is_named_with_its_commit(tmp_path: Path):
    nightly_series(tmp_path, [0, 0, 0, 0, 0, -25, -25, -25])  # from the 6th night (commit c005)
    t = trends("smoke", catalog(tmp_path), key=["goodput_kBps"], nights=3)
    assert t.metrics[0] == "tcp.goodput_kBps"  # the family's bare copy, as the tests name it
    shifted = t.points[t.points.shifted]
    assert shifted[["metric", "batch", "commit"]].values.tolist() == [
        ["tcp.goodput_kBps", "nightly/smoke/2026-12-06", "c005"]
    ]
    assert shifted["shift"].iloc[0] == pytest.approx(-25, abs=3)
    flagged = t.flagged[t.flagged.metric == "tcp.goodput_kBps"]
    assert 5 in set(flagged.night) and not set(flagged.night) & {1, 2, 3, 4}
    series = t.series("-", "tcp.goodput_kBps")
    assert series.commit.tolist() == [f"c{k:03d}" for k in range(8)]
    assert series.runs.tolist() == [6] * 8 and series.flagged.iloc[5]


def test_one_odd_night_is_flagged_but_is_no_shift_that_holds(tmp_path: Path):
    nightly_series(tmp_path, [0, 0, 0, 0, -25, 0, 0, 0])
    t = trends("smoke", catalog(tmp_path), nights=3)
    assert 4 in set(t.flagged[t.flagged.metric == "tcp.goodput_kBps"].night)
    assert not t.points.shifted.any()


def test_an_unchanged_series_shows_no_shift(tmp_path: Path):
    nightly_series(tmp_path, [0] * 6)
    t = trends("smoke", catalog(tmp_path), nights=3)
    assert not t.points.shifted.any() and t.flagged.empty
    assert "tcp.goodput_kBps" in t.metrics  # nothing moved: every metric is followed


def test_the_trends_page_from_the_command_line(tmp_path: Path, capsys):
    from trials.__main__ import main

    nightly_series(tmp_path, [0, 0, 0, 0, -25, -25])
    cat = catalog(tmp_path)
    assert main(["results", "trends", "experiments/smoke.yml", "--catalog", str(cat.path)]) == 0
    page = cat.trends("smoke") / "index.html"
    assert f"trends: {page}" in capsys.readouterr().out
    text = page.read_text()
    assert "Shifts that hold from a night on" in text and "commit c004" in text
    shifts = pd.read_csv(page.parent / "trend_shifts.csv")
    assert shifts.commit.tolist() == ["c004"]
    assert (page.parent / "trend_00.png").stat().st_size > 5000
