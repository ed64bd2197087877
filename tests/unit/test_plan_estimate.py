"""The batch plan's time estimate: racks sharing one plan divide its wall time by rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from trials.commands import plan_table
from trials.plan import load_plan

PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("racks", "rounds"), [(1, 90), (2, 45), (3, 30), (4, 23)])
def test_the_estimate_counts_rounds_of_trials_on_the_racks(racks, rounds):
    plan = load_plan(PROJECT / "experiments/collateral_damage.yml")
    trials = plan.select(())
    assert len(trials) == 90
    overhead = 12
    per_trial = trials[0].experiment.duration / 1e9 + overhead
    caption = plan_table(plan, trials, overhead=overhead, racks=racks).caption
    where = "one rack" if racks == 1 else f"{racks} racks"
    assert caption.startswith(f"estimated {rounds * per_trial / 60:.0f} min on {where} for 90 ")
