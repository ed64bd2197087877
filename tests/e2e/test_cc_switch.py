"""Trials of one batch that differ only in the hosts' congestion control and the router's link
settings switch them with the hosts' trialbed-select-cc and the router's trialbed-select-shaping
instead of running configure.yml: the hosts then run the new congestion control (read back from
them), the packets take the new delay (from the captures), and configure.yml with that trial's
variables right after changes nothing (the switches left the state the playbook would have).
The runner is driven in-process, so that the by-hand configure comes before the batch's
teardown."""

from __future__ import annotations

import json

import pytest

from analysis.trial import analyse_trial
from core.layout import new_batch_path
from core.rack import Rack
from tests.e2e.conftest import recap
from tests.e2e.test_collateral_damage import DELAY_ACCURACY_MS, EXPERIMENT
from trials.plan import load_plan
from trials.runner import TrialRunner

pytestmark = pytest.mark.rack

CHOICES = ["cubic", "reno"]
DELAYS = ["25ms", "50ms"]  # one way


@pytest.fixture(scope="module")
def batch(test_rack, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("cc_switch")
    experiment = tmp / "cc.yml"
    experiment.write_text(
        EXPERIMENT + f"factors:\n  hosts.all.cc: {json.dumps(CHOICES)}\n"
        f"  network.links[*].delay: {json.dumps(DELAYS)}\n"
    )
    plan = load_plan(experiment, ["duration=3s", "warmup=1s"])
    rack = Rack.load([test_rack.inventory])
    batch_dir = new_batch_path(tmp / "results", experiment)
    batch_dir.mkdir(parents=True)
    runner = TrialRunner(plan, rack, batch_dir, log=print)
    # Two of the plan's four trials, differing in both factors; the choices the first
    # configure renders are the plan's.
    first = plan.trials[0]
    second = next(
        t for t in plan.trials if all(t.overrides[k] != v for k, v in first.overrides.items())
    )
    try:
        records = [runner.run(trial) for trial in (first, second)]
        for r in records:
            r["summary"] = analyse_trial(batch_dir / "trials" / r["trial"])
        overlay = batch_dir / "trials" / records[-1]["trial"] / "ansible" / "trial_vars.yml"
        again = test_rack.playbook(
            "configure.yml", "-i", str(test_rack.inventory), "-i", str(overlay)
        )
    finally:
        runner.config.restore(batch_dir / "ansible" / "teardown")
        rack.close()
    return {"records": records, "again": again, "rack": test_rack}


def test_the_second_trial_switches_and_its_hosts_run_its_congestion_control(batch):
    first, second = batch["records"]
    assert first["status"] == second["status"] == "complete"
    assert first["configure"]["tags"] == "all"  # the batch's first trial: the whole playbook
    cc = second["overrides"]["hosts.all.cc"]
    assert cc != first["overrides"]["hosts.all.cc"]
    # No playbook ran for the second trial: every host switched, the router its links too.
    assert "recap" not in second["configure"], second["configure"]
    assert second["configure"]["cc_switched"] == {h: cc for h in "ABCDR"}
    assert set(second["configure"]["shaping_switched"]) == {"R"}
    for trial in (first, second):
        want = trial["overrides"]["hosts.all.cc"]
        read = {
            h: f["sysctls"]["net.ipv4.tcp_congestion_control"] for h, f in trial["hosts"].items()
        }
        assert read == {h: want for h in "ABCDR"}, (trial["trial"], read)
    print(f"overhead: {first['overhead_s']} s (full configure), {second['overhead_s']} s (switch)")


def test_the_packets_take_the_delay_each_trial_switched_to(batch):
    """The smallest UDP one-way delay through R, from its captures, is each trial's delay: the
    second trial's came from the switch, not from a playbook."""
    for trial in batch["records"]:
        delay_ms = int(trial["overrides"]["network.links[*].delay"].removesuffix("ms"))
        owd_min = trial["summary"]["owd_min_ms"]
        assert delay_ms <= owd_min <= delay_ms + DELAY_ACCURACY_MS, (trial["trial"], owd_min)


def test_configure_right_after_a_switch_changes_nothing(batch):
    done = batch["again"]
    assert done.returncode == 0, done.stdout[-3000:]
    changed = {h: c["changed"] for h, c in recap(done.stdout).items()}
    assert set(changed) >= set("ABCDR")
    tasks, task = [], ""
    for line in done.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line
        elif line.startswith("changed:"):
            tasks.append(f"{task} {line}")
    assert all(v == 0 for v in changed.values()), (changed, tasks)


def test_a_congestion_control_not_made_available_is_refused_by_the_switch(batch):
    rack = Rack.load([batch["rack"].inventory])
    try:
        script = f"{rack.host('A').workdir}/trialbed-select-cc"
        before = rack.run("A", "sysctl -n net.ipv4.tcp_congestion_control").strip()
        out = rack.run("A", f"{script} bbr 2>&1; echo exit=$?", check=False)
        assert "'bbr' was not made available on A" in out and "exit=2" in out, out
        assert rack.run("A", "sysctl -n net.ipv4.tcp_congestion_control").strip() == before
    finally:
        rack.close()
