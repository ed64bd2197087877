"""The controller's disk under a batch (trials/preflight/disk.py): preflight refuses only a
disk that cannot take the largest trial's captures; a batch worker checks each next trial
before it runs it; the batch says up front when its whole worst case exceeds the free disk.
The shipped high-speed WAN file resolved on the chain2 topology's hosts (no SSH)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_marker_load import EXPERIMENTS, context, rack
from trials.batch_worker import results_disk_full
from trials.preflight import disk
from trials.preflight.checks import full_results_disk
from trials.preflight.disk import batch_capture_line, trial_capture_bytes

HSWAN = EXPERIMENTS / "startup_paper_hswan.yml"


@pytest.fixture
def hswan():
    on = rack()
    ctx = context(HSWAN, on)
    one = trial_capture_bytes(ctx.views[0].net, ctx.views[0].exp.duration + ctx.views[0].exp.drain)
    return on, ctx, one


def with_free(monkeypatch, free: float) -> None:
    monkeypatch.setattr(disk, "free_bytes", lambda results: int(free))


def test_a_trial_writes_what_its_capture_points_add_up_to(hswan):
    _on, ctx, one = hswan
    view = ctx.views[0]
    points = [
        disk.capture_bytes(view.net, c, view.exp.duration + view.exp.drain)
        for c in view.net.captures
    ]
    assert len(points) == 9 and all(p > 0 for p in points)
    assert one == pytest.approx(sum(points))


def test_preflight_refuses_only_a_disk_smaller_than_the_largest_trial(hswan, monkeypatch, tmp_path):
    _on, ctx, one = hswan
    ctx.results = tmp_path / "results" / "batch"
    with_free(monkeypatch, 2 * one)  # two trials' worth, for a plan of 60
    assert full_results_disk(ctx, {}) == []
    with_free(monkeypatch, one / 2)
    (problem,) = full_results_disk(ctx, {})
    assert problem.startswith(f"results {ctx.results}: only {one / 2e6:.0f} MB free on its disk")
    assert f"brings back up to {one / 1e6:.0f} MB of captures" in problem
    assert any(f"trial {v.trial.name} brings" in problem for v in ctx.views)
    assert "free space there or give --results a larger disk" in problem


def test_a_worker_stops_before_a_trial_that_no_longer_fits(hswan, monkeypatch, tmp_path):
    on, ctx, one = hswan
    trial = ctx.views[3].trial
    with_free(monkeypatch, one + 1)
    assert results_disk_full(tmp_path, on, trial) is None
    with_free(monkeypatch, one - 1)
    said = results_disk_full(tmp_path, on, trial)
    assert said is not None and f"trial {trial.name} brings back up to" in said


def test_the_batch_says_when_its_worst_case_exceeds_the_free_disk(hswan, monkeypatch, tmp_path):
    on, ctx, one = hswan
    trials = [v.trial for v in ctx.views]
    with_free(monkeypatch, 100 * one)
    line = batch_capture_line(trials, on, str(HSWAN), tmp_path)
    assert line.startswith(f"captures: up to {60 * one / 1e6:.0f} MB for 60 trial(s), ")
    assert "stops before a trial" not in line
    with_free(monkeypatch, 10 * one)
    line = batch_capture_line(trials, on, str(HSWAN), tmp_path)
    assert "a worker stops before a trial that no longer fits" in line
    assert Path(tmp_path).name in line
