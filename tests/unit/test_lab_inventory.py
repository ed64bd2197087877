"""inventory/lab.example: the documented physical rack (four Debian hosts, a FreeBSD dummynet
router) loads, and the seed-000 experiment resolves on it unchanged: the runner hands the
FreeBSD router the same linux_router_links a Linux router gets, and configure.yml gives them
to freebsd_router. Nothing is contacted (ansible-inventory and --list-tasks only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from core.rack import Rack
from tests.unit.test_freebsd_host import list_hosts
from trials import host_commands
from trials.generators import GENERATOR_TYPES
from trials.generators.base import TrialContext
from trials.host_vars import cc_switchable, host_vars
from trials.network import host_settings, resolve_network
from trials.plan import load_plan
from trials.runner import TrialRunner

PROJECT = Path(__file__).resolve().parents[2]
LAB = PROJECT / "inventory/lab.example/hosts.yml"
EXPERIMENT = PROJECT / "experiments/collateral_damage.yml"


def test_lab_rack_loads_with_management_apart_from_experiment_interfaces():
    rack = Rack.load([LAB])
    assert {n for n, h in rack.hosts.items() if "testbed_hosts" in h.groups} == {"A", "B", "C", "D"}
    router = rack.host("R")
    assert "freebsd_routers" in router.groups
    assert set(router.interfaces) == {"em1", "em2"}
    for host in rack.hosts.values():
        # The management address (ansible_host) is on no experiment interface.
        assert all(host.address not in str(i.network) for i in host.interfaces.values())
        assert not any(str(i.ip) == host.address for i in host.interfaces.values())
        assert "trialbed_clock_domain" not in host.vars  # each host its own clock


def test_seed000_on_the_lab_rack_gives_the_freebsd_router_its_links():
    rack = Rack.load([LAB])
    plan = load_plan(EXPERIMENT)
    trial = plan.trials[0]
    net = resolve_network(trial.experiment, rack, str(EXPERIMENT))
    assert net.routers == {"R"}
    variables = host_vars(trial, net, host_settings(trial.experiment, net, str(EXPERIMENT)))
    links = sorted(variables["R"]["linux_router_links"], key=lambda link: link["iface"])
    assert variables["R"]["linux_router_forwarding"] is True
    assert [(x["iface"], x["rate"], x["buffer"], x["qdisc"]) for x in links] == [
        ("em1", "1mbit", "60000B", "droptail"),  # back towards A and B
        ("em2", "1mbit", "60000B", "droptail"),  # towards C and D
    ]
    assert {x["delay_ms"] for x in links} <= {25.0, 50.0}
    # Both capture points are R's interfaces: one machine, one clock, OWD valid.
    assert {c.clock for c in net.captures} == {"R"}


def test_configure_runs_freebsd_router_on_the_lab_router_only():
    plays = list_hosts("configure.yml")
    assert plays["Shaped links of FreeBSD routers"] == ["R"]
    assert "R" not in plays["Shaped links"] and "R" not in plays["End hosts and routers"]


def test_lab_example_overlay_gives_r_its_links():
    overlay = PROJECT / "playbooks/examples/lab_bottleneck.yml"
    rack = Rack.load([LAB, overlay])
    links = rack.host("R").vars["linux_router_links"]
    assert {x["iface"] for x in links} == set(rack.host("R").interfaces)


def input_checks(overlay: Path) -> subprocess.CompletedProcess:
    """configure.yml's input-check play for R, run on this machine (connection local: the
    checks are controller-side; nothing is sent to the lab address)."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"),
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
    }
    return subprocess.run(
        [str(PROJECT / ".venv/bin/ansible-playbook"), str(PROJECT / "playbooks/configure.yml"),
         "-i", str(LAB), "-i", str(overlay), "--limit", "R", "--tags", "input_checks",
         "-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=PROJECT, env=env, capture_output=True, text=True, check=False, timeout=180,
    )  # fmt: skip


def test_configure_checks_the_freebsd_routers_links(tmp_path):
    good = input_checks(PROJECT / "playbooks/examples/lab_bottleneck.yml")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "freebsd_router : Check the links" in good.stdout
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "all:\n  hosts:\n    R:\n      linux_router_links:\n"
        "        - {iface: em2, rate: 1mbit, buffer: 60000B, delay_ms: 25, qdisc: cake}\n"
        "        - {iface: em9, rate: 1mbit, buffer: 60000B}\n"
    )
    refused = input_checks(bad)
    assert refused.returncode != 0
    assert "on R (a FreeBSD dummynet router): qdisc 'cake'" in refused.stdout
    assert "iface 'em9' is not an experiment interface of this host (it has: em1, em2)" in (
        refused.stdout
    )


def lab_trial(tmp_path: Path, *overlays: Path, experiment: Path = EXPERIMENT):
    """The runner, the resolved network and the generators of the first trial of `experiment`
    (seed 000's) on the lab rack (nothing is contacted: no connection is opened before a
    trial runs)."""
    rack = Rack.load([LAB, *overlays])
    plan = load_plan(experiment)
    exp = plan.trials[0].experiment
    net = resolve_network(exp, rack, str(experiment))
    ctx = TrialContext(rack=None, network=net, daemons=None, duration_ns=exp.duration)  # type: ignore[arg-type]
    generators = [
        GENERATOR_TYPES[spec.type](spec, name, i, ctx)
        for i, (spec, name) in enumerate(zip(exp.traffic, exp.generator_names(), strict=True))
    ]
    return TrialRunner(plan, rack, tmp_path), net, generators


def test_the_freebsd_router_samples_its_pipes_and_snapshots_them(tmp_path):
    """R is a dummynet router: its queue is sampled with `ipfw pipe show` (not tc), by the pipe
    numbers freebsd_router gives the links (base 10000 + 1 + the link's place in the list
    host_vars hands it), and its before/after snapshots are of the same pipes."""
    runner, net, generators = lab_trial(tmp_path)
    variables = host_vars(
        runner.plan.trials[0], net, host_settings(runner.plan.trials[0].experiment, net, "x")
    )
    order = [link["iface"] for link in variables["R"]["linux_router_links"]]
    assert net.dummynet_pipes("R") == {iface: 10001 + i for i, iface in enumerate(order)}
    recorders = {(h, name): cmd for h, name, cmd, _ in host_commands.recorders(net, generators)}
    assert set(recorders) == {("R", "ipfw_sampler"), ("A", "tcp_probe")}
    # Both flows cross em2 (towards C and D): only its pipe is sampled.
    assert f"em2={net.dummynet_pipes('R')['em2']}" in recorders["R", "ipfw_sampler"].split()[-1]
    assert host_commands.recorder_names(net, generators) == list(recorders)
    daemons = SimpleNamespace(remote={h: f"/var/lib/trialbed/trials/b/t/{h}" for h in "ABCDR"})
    snapshot = host_commands.snapshot_commands(net, daemons, "before")["R"]  # type: ignore[arg-type]
    pipes = " ".join(f"{i}={n}" for i, n in net.dummynet_pipes("R").items())
    assert snapshot.startswith(f"{{ echo '## pipes {pipes}'; ipfw pipe show; }} > ")
    assert "ipfw_before.txt" in snapshot and "tc " not in snapshot


def test_a_freebsd_sender_records_its_cwnd_with_siftr(tmp_path):
    overlay = tmp_path / "freebsd_a.yml"
    overlay.write_text("all:\n  children:\n    freebsd_hosts:\n      hosts:\n        A: {}\n")
    _, net, generators = lab_trial(tmp_path, overlay)
    recorders = {
        (h, name): (cmd, ready) for h, name, cmd, ready in host_commands.recorders(net, generators)
    }
    assert set(recorders) == {("R", "ipfw_sampler"), ("A", "siftr")}
    command, ready = recorders["A", "siftr"]
    assert ready == "recording siftr" and command.split()[-2:] == ["--out", "siftr.log"]


def test_seed000_switches_between_its_three_congestion_controls(tmp_path):
    """H-TCP's module parameters (the paper's settings) go with the choices the batch's first
    configure makes, so that reno -> htcp -> cubic are switches, not configure runs."""
    runner, net, _ = lab_trial(tmp_path)
    htcp = {"use_bandwidth_switch": 0, "use_rtt_scaling": 1}
    assert runner.config.choices.cc["A"] == {"cubic": {}, "htcp": htcp, "reno": {}}
    by_cc = {}
    for trial in runner.plan.trials:
        settings = host_settings(trial.experiment, net, str(EXPERIMENT))
        variables = host_vars(trial, net, settings, runner.config.choices.cc)["A"]
        if trial.overrides["traffic[tcp].flows"] == 1 and trial.repetition == 1:
            by_cc.setdefault(trial.overrides["hosts.all.cc"], variables)
    assert by_cc["htcp"]["testbed_host_cc_params"] == htcp
    assert by_cc["htcp"]["testbed_host_cc_choice_params"] == {"htcp": htcp}
    for before, after in (("reno", "htcp"), ("htcp", "cubic"), ("cubic", "reno")):
        assert cc_switchable(by_cc[before], by_cc[after])


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", *args], cwd=PROJECT, capture_output=True, text=True, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_inventory_is_the_one_variable_that_picks_the_rack(tmp_path):
    """INVENTORY= reaches every target that runs on a rack (a batch too: as its one rack), and a
    wrong path is refused naming it, before ansible-playbook could run on no host at all."""
    batch = make("-n", "batch", f"EXPERIMENT={EXPERIMENT}", f"INVENTORY={LAB}")
    assert f"--rack {LAB}" in batch.stdout, batch.stdout
    nightly = make("-n", "nightly-run", f"EXPERIMENT={EXPERIMENT}", f"INVENTORY={LAB}")
    assert f"--rack {LAB}" in nightly.stdout, nightly.stdout
    missing = tmp_path / "lab" / "hosts.yml"
    example = PROJECT / "playbooks/examples/dumbbell_bottleneck.yml"
    for target in (("configure", f"VARS={example}"), ("teardown",)):
        done = make(*target, f"INVENTORY={missing}")
        assert done.returncode == 2
        assert f"inventory {missing}: no such file; check INVENTORY=" in done.stderr, done.stderr
    for target in ("trial", "preflight", "status"):
        done = make(target, f"INVENTORY={missing}")
        assert done.returncode == 2
        assert f"{missing}: inventory not found" in done.stderr, done.stderr
    done = make("configure", f"VARS={example} {tmp_path / 'nope.yml'}", f"INVENTORY={LAB}")
    assert done.returncode == 2 and f"VARS {tmp_path / 'nope.yml'}: no such file" in done.stderr


def test_settings_of_a_group_and_its_group_vars_reach_the_runner(tmp_path):
    """A lab puts its SSH user, key and work directory on a group (or in group_vars/) as
    Ansible allows: the runner reads them as Ansible does (it read all.vars and the host's own
    only, and went on as root with no key)."""
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "testbed_hosts.yml").write_text("trialbed_dir: /srv/tb\n")
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    testbed_hosts:\n"
        "      vars: {ansible_user: lab, ansible_ssh_private_key_file: /keys/lab}\n"
        "      hosts:\n        A: {ansible_host: 198.19.10.11}\n"
    )
    host = Rack.load([tmp_path / "hosts.yml"]).host("A")
    assert (host.user, host.workdir) == ("lab", "/srv/tb")
    assert host.vars["ansible_ssh_private_key_file"] == "/keys/lab"


def test_a_host_of_a_child_group_takes_its_parent_groups_settings(tmp_path):
    """A FreeBSD end host declared in freebsd_hosts under testbed_hosts is a member of
    testbed_hosts for an experiment's hosts.testbed_hosts settings, as it is for Ansible; the
    child group's settings win over the parent's (it was a member of freebsd_hosts only, and
    took neither)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    testbed_hosts:\n      hosts:\n"
        "        A: {trialbed_interfaces: {e0: {address: 198.18.1.11/24}}}\n"
        "      children:\n        freebsd_hosts:\n          hosts:\n"
        "            E: {trialbed_interfaces: {em1: {address: 198.18.1.15/24}}}\n"
    )
    rack = Rack.load([inventory])
    assert rack.host("E").groups == ("testbed_hosts", "freebsd_hosts")
    assert rack.host("A").groups == ("testbed_hosts",)
    experiment = tmp_path / "exp.yml"
    experiment.write_text(
        "experiment: nested\nduration: 10s\n"
        "hosts:\n  testbed_hosts: {cc: reno, initcwnd: 4}\n  freebsd_hosts: {cc: cubic}\n"
        "traffic:\n  - {type: bulk_tcp, from: A, to: E}\n"
    )
    trial = load_plan(experiment).trials[0]
    net = resolve_network(trial.experiment, rack, str(experiment))
    settings = host_settings(trial.experiment, net, str(experiment))
    assert (settings["A"].cc, settings["A"].initcwnd) == ("reno", 4)
    assert (settings["E"].cc, settings["E"].initcwnd) == ("cubic", 4)
