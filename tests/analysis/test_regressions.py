"""Regressions judged by a test (analysis/stats.py, analysis/regressions.py) on synthetic
series whose answer is known: the exact p-values against an enumeration of every split, a
planted shift found (and nothing else), and unchanged series flagged at the nominal rate."""

from __future__ import annotations

import itertools
import math
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.dataset import backfill
from analysis.regressions import compare, judge
from analysis.stats import _midranks, adjust, mann_whitney, rank_sum_null
from core.layout import CATALOG_ENV

from . import resultsgen

ALPHA = 0.05


@pytest.fixture(autouse=True)
def _catalog_beside_results(monkeypatch):
    monkeypatch.delenv(CATALOG_ENV, raising=False)


def binomial_bound(p: float, n: int, sigmas: float = 3.5) -> float:
    """How far a rate measured over n independent draws strays from p, at most (sigmas)."""
    return sigmas * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("seed", range(6))
def test_the_exact_p_value_is_the_share_of_splits_at_least_as_far(seed: int):
    """Every split of the pooled values into groups of the two sizes enumerated: the p-value
    is the share whose rank sum lies at least as far from its mean (ties included)."""
    rng = np.random.default_rng(seed)
    nx, ny = int(rng.integers(2, 6)), int(rng.integers(2, 8))
    x = rng.integers(0, 5, nx).astype(float)  # few values: many ties
    y = rng.integers(1, 6, ny).astype(float)
    got = mann_whitney(x, y)
    ranks = _midranks(np.concatenate([x, y]))
    centre = nx * (nx + ny + 1) / 2
    far = abs(ranks[:nx].sum() - centre)
    every = itertools.combinations(range(nx + ny), nx)
    splits = [abs(ranks[list(c)].sum() - centre) for c in every]
    assert got.p == pytest.approx(np.mean([d >= far - 1e-9 for d in splits]))
    assert got.p_min == pytest.approx(np.mean([d >= max(splits) - 1e-9 for d in splits]))
    pairs = np.subtract.outer(x, y).ravel()
    assert got.shift == np.median(pairs)
    assert got.delta == pytest.approx(np.mean(pairs > 0) - np.mean(pairs < 0))


def test_the_shift_interval_covers_the_true_shift_as_often_as_it_says():
    rng = np.random.default_rng(7)
    runs, covered = 1000, 0
    for _ in range(runs):
        s = mann_whitney(rng.normal(2.0, 1, 6), rng.normal(0, 1, 12), level=0.9)
        covered += s.low <= 2.0 <= s.high
    assert abs(covered / runs - 0.9) <= binomial_bound(0.9, runs) + 0.01  # exact: >= 0.9 - ...


def test_adjustments_as_written_by_hand():
    p = [0.01, 0.04, 0.03, 0.005, np.nan]
    np.testing.assert_allclose(adjust(p, "bh")[:4], [0.02, 0.04, 0.04, 0.02])
    np.testing.assert_allclose(adjust(p, "holm")[:4], [0.03, 0.06, 0.06, 0.02])
    assert np.isnan(adjust(p)[4])
    with pytest.raises(ValueError, match="one of bh, holm"):
        adjust(p, "bonferonni")


def null_size(nx: int, ny: int, alpha: float) -> float:
    """The exact rejection rate of the test at alpha on continuous data: the probability of
    the rank sums whose two-sided p-value is <= alpha."""
    sums, probs = rank_sum_null(tuple(range(2, 2 * (nx + ny) + 1, 2)), nx)
    far = np.abs(sums - nx * (nx + ny + 1))
    p = np.array([probs[far >= f - 1e-9].sum() for f in far])
    return float(probs[p <= alpha].sum())


def test_unchanged_series_are_flagged_at_the_nominal_rate():
    """Tonight's 5 runs against a baseline of 3 nights x 5, all from one distribution: over
    4000 draws, the test rejects at alpha as often as its exact size says (within a binomial
    bound), and that size is close to alpha (below it: the rank sum is discrete)."""
    nx, ny, draws = 5, 15, 4000
    size = null_size(nx, ny, ALPHA)
    assert 0.8 * ALPHA <= size <= ALPHA
    rng = np.random.default_rng(49)
    rejected = sum(
        mann_whitney(rng.lognormal(size=nx), rng.lognormal(size=ny)).p <= ALPHA
        for _ in range(draws)
    )
    rate = rejected / draws
    assert abs(rate - size) <= binomial_bound(size, draws), (rate, size)


def nights_frame(rng, cells, runs, metrics, shift=None, batch="b") -> pd.DataFrame:
    """Catalog rows: ``runs`` per cell, each metric N(10, 1) (plus ``shift`` = {(cell, metric):
    amount}); one more metric copies the first under a family's bare name."""
    rows = []
    for cell in cells:
        for _ in range(runs):
            row = {"batch": batch, "cell": cell, "status": "complete", "analysed": True}
            for m in metrics:
                row[m] = rng.normal(10, 1) + (shift or {}).get((cell, m), 0.0)
            row["goodput_kBps"] = row[metrics[0]]  # the same values twice: tested once
            row["tcp.flows_seen"] = 2.0  # one value in every run: not tested
            rows.append(row)
    return pd.DataFrame(rows)


def test_unchanged_series_make_few_nights_flagged_after_the_correction():
    """With 2 cells x 8 metrics a night, the nights flagged at all (any test) stay below the
    false discovery rate allowed (under no change at all, BH holds the family-wise rate)."""
    cells, metrics = ["cc=reno", "cc=cubic"], [f"tcp.m{k}" for k in range(8)]
    draws, flagged = 200, 0
    for seed in range(draws):
        rng = np.random.default_rng(seed)
        table = compare(nights_frame(rng, cells, 5, metrics), nights_frame(rng, cells, 15, metrics))
        assert table.p.notna().sum() == 16  # the copy and the constant are not tested
        flagged += bool(table.changed.any())
    assert flagged / draws <= ALPHA + binomial_bound(ALPHA, draws)


def test_a_planted_shift_is_found_and_nothing_else():
    rng = np.random.default_rng(3)
    cells, metrics = ["cc=reno", "cc=cubic"], [f"tcp.m{k}" for k in range(8)]
    planted = {("cc=cubic", "tcp.m3"): 4.0}
    table = compare(
        nights_frame(rng, cells, 5, metrics, planted), nights_frame(rng, cells, 35, metrics)
    )
    changed = table[table.changed]
    assert list(zip(changed.cell, changed.metric, strict=True)) == [("cc=cubic", "tcp.m3")]
    (row,) = changed.itertuples()
    assert row.shift_low <= 4.0 <= row.shift_high and row.delta == 1.0
    assert "goodput_kBps" not in set(table.metric) and "tcp.m0" in set(table.metric)
    assert set(table[table.metric == "tcp.m0"].same_values) == {"goodput_kBps"}
    constant = table[table.metric == "tcp.flows_seen"]
    assert constant.untested.eq("one value in every run").all() and constant.p.isna().all()


def goodput(shift: float, night: int = 0):
    """Each run's metrics: goodput about 100 KB/s plus ``shift``, counts about 6; drawn from
    a generator seeded by the cell, repetition and night."""

    def metrics(overrides: dict, rep: int) -> dict[str, float]:
        rng = np.random.default_rng(zlib.crc32(f"{overrides} {rep} {night}".encode()))
        return {
            "goodput_kBps": 100 + rng.normal(0, 2) + shift,
            "retransmitted_packets": float(rng.poisson(6)),
            "queue_drops_capture": float(rng.poisson(6)),
        }

    return metrics


def test_judged_from_the_catalog_tonight_against_the_last_nights_or_a_named_batch(tmp_path):
    results = tmp_path / "results" / "nightly" / "smoke"
    cells = [{"traffic[0].cc": "reno"}]
    days = ["2026-12-01", "2026-12-02", "2026-12-03", "2026-12-04"]
    made = [resultsgen.batch(results / d, cells, 6, goodput(0.0)) for d in days]
    tonight = resultsgen.batch(results / "2026-12-05", cells, 6, goodput(-30.0))
    backfill(tmp_path / "results")
    verdict = judge(tonight, nights=3)
    assert verdict.baseline == [f"nightly/smoke/{d}" for d in days[1:]]
    assert verdict.found and list(verdict.changed.metric) == ["tcp.goodput_kBps"]
    text = "\n".join(verdict.lines())
    assert "verdict: CHANGED: 1 metric(s)" in text and "tcp.goodput_kBps" in text
    quiet = judge(made[3], nights=3)
    assert not quiet.found and quiet.tested == 3 and "no change found" in "\n".join(quiet.lines())
    named = judge(tonight, baseline=made[0])
    assert named.baseline == ["nightly/smoke/2026-12-01"] and named.found
    first = judge(made[0])
    assert first.problem == "no earlier batch of smoke in the catalog" and not first.found
    assert "not judged" in first.lines()[1]


def nightly_series(tmp_path: Path, shifts: list[float], family: str = "bulk_only") -> list[Path]:
    """Nights of the smoke experiment (one cell, 6 runs) under results/nightly/smoke/, each
    night's goodput moved by its shift; catalogued."""
    results = tmp_path / "results" / "nightly" / "smoke"
    made = [
        resultsgen.batch(
            results / f"2026-12-{k + 1:02d}",
            [{}],
            6,
            goodput(s, k),
            family=family,
            commit=f"c{k:03d}",
        )
        for k, s in enumerate(shifts)
    ]
    backfill(tmp_path / "results")
    return made


def test_the_command_line_verdict_and_its_exit_status(tmp_path: Path, capsys, monkeypatch):
    from trials.__main__ import main
    from trials.nightly import CHANGE_FOUND

    monkeypatch.setenv("COLUMNS", "200")
    made = nightly_series(tmp_path, [0, 0, 0, -30])
    assert main(["results", "regressions", str(made[-1])]) == CHANGE_FOUND == 3
    out = capsys.readouterr().out
    assert "verdict: CHANGED: 1 metric(s)" in out and "tcp.goodput_kBps" in out
    assert main(["results", "regressions", str(made[2])]) == 0
    assert "verdict: no change found" in capsys.readouterr().out
    assert main(["results", "regressions", str(made[-1]), "--baseline", str(made[0])]) == 3


def test_the_html_report_has_the_verdict(tmp_path: Path):
    from analysis.html_report import write_report

    made = nightly_series(tmp_path, [0, 0, 0, -30])
    page = write_report(made[-1], previous=None).read_text()
    assert "Regressions (tested against the baseline)" in page
    assert "Changed: 1 metric(s), listed first below." in page
    table = pd.read_csv(made[-1] / "report" / "regressions.csv")
    assert table[table.changed].metric.tolist() == ["tcp.goodput_kBps"]
    quiet = write_report(made[2], previous=None).read_text()
    assert "Verdict: no change found." in quiet
    first = write_report(made[0], previous=None).read_text()
    assert "Not judged: no earlier batch of smoke in the catalog." in first
