"""Preflight on a lab rack of two Linux routers (the seed-001 chain), facts stood in for. The
route check: every host on the path between a flow's ends, the routers included, must route to
the far end through the rack's links. No role sets routes; a first router without a route to
the far segment via the second would send the trial's traffic nowhere. And the table of checks
itself: a row added to it is read for every trial and judged on the hosts that answered."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from core.rack import Rack
from trials import preflight
from trials.plan import load_plan
from trials.preflight.context import Check
from trials.runner import TrialRunner
from trials.spec import SpecError

PROJECT = Path(__file__).resolve().parents[2]
EXPERIMENT = PROJECT / "experiments/rack_capacity.yml"  # bulk S1 -> D1 over R1 - R2

CHAIN = """\
all:
  vars: {ansible_user: root, trialbed_rack_kind: physical}
  children:
    testbed_hosts:
      hosts:
        S1: {ansible_host: 198.19.10.11, trialbed_interfaces: {eth1: {address: 198.18.1.10/24}}}
        D1: {ansible_host: 198.19.10.21, trialbed_interfaces: {eth1: {address: 198.18.17.10/24}}}
    linux_routers:
      hosts:
        R1:
          ansible_host: 198.19.10.2
          trialbed_interfaces: {core: {address: 198.18.100.1/24}, a1: {address: 198.18.1.1/24}}
        R2:
          ansible_host: 198.19.10.3
          trialbed_interfaces: {core: {address: 198.18.100.2/24}, b1: {address: 198.18.17.1/24}}
"""

# Each host's routing table as `ip route get` reads it: (network, gateway or None, device).
TABLES = {
    "S1": [("198.18.1.0/24", None, "eth1"), ("198.18.0.0/16", "198.18.1.1", "eth1")],
    "D1": [("198.18.17.0/24", None, "eth1"), ("198.18.0.0/16", "198.18.17.1", "eth1")],
    "R1": [
        ("198.18.1.0/24", None, "a1"),
        ("198.18.100.0/24", None, "core"),
        ("198.18.16.0/20", "198.18.100.2", "core"),
    ],
    "R2": [
        ("198.18.17.0/24", None, "b1"),
        ("198.18.100.0/24", None, "core"),
        ("198.18.0.0/20", "198.18.100.1", "core"),
    ],
}


def kernel_route(table, address: str) -> dict | None:
    """The longest prefix of `table` that holds `address`, as host_facts reports it."""
    found = [r for r in table if ipaddress.ip_address(address) in ipaddress.ip_network(r[0])]
    if not found:
        return None
    _, gateway, dev = max(found, key=lambda r: ipaddress.ip_network(r[0]).prefixlen)
    return {"dev": dev, "gateway": gateway}


def chain_preflight(tmp_path, monkeypatch, tables, sets=(), only=None, unreachable=()):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(CHAIN)
    rack = Rack.load([inventory])
    asked: dict[str, list[str]] = {}

    def fake_facts(rack, names, route_to=None, **_):
        asked.update(route_to or {})
        return {
            n: {
                "kernel": "6.1.0-28-amd64",
                "cc_loaded": ["reno", "cubic"],
                "cc_modules": [],
                "cc_params": {},
                "tools": {t: "x" for t in ("tc", "tcpdump", "iperf3", "python3")},
                "free_disk_bytes": 10**11,
                "qdiscs": [],
                "tracepoints": ["tcp:tcp_probe"],
                "mtu": {itf: 1500 for itf in rack.host(n).interfaces},
                "speed": {},
                "route_to": {a: kernel_route(tables[n], a) for a in (route_to or {}).get(n, [])},
            }
            for n in names
        }

    monkeypatch.setattr(preflight.run, "host_facts", fake_facts)

    def reachability(rack, names):
        gone = [n for n in names if n in unreachable]
        return [n for n in names if n not in gone], [f"host {n} does not answer" for n in gone]

    monkeypatch.setattr(preflight.run, "reachability", reachability)
    plan = load_plan(EXPERIMENT, ["factors={}", *sets])
    trials = plan.select(only)
    preflight.preflight(trials, rack, str(EXPERIMENT), plan_trials=plan.trials)
    return asked


def test_every_host_on_the_path_is_asked_and_a_well_routed_chain_passes(tmp_path, monkeypatch):
    asked = chain_preflight(tmp_path, monkeypatch, TABLES)
    # Both ends and both routers, each for both directions' far ends.
    assert asked == {
        "S1": ["198.18.17.10"],
        "D1": ["198.18.1.10"],
        "R1": ["198.18.1.10", "198.18.17.10"],
        "R2": ["198.18.1.10", "198.18.17.10"],
    }


def test_a_first_router_without_a_route_via_the_second_is_named_with_the_route_it_needs(
    tmp_path, monkeypatch
):
    tables = {**TABLES, "R1": TABLES["R1"][:2]}  # R1 lost its route to the receivers' segments
    with pytest.raises(SpecError) as exc:
        chain_preflight(tmp_path, monkeypatch, tables)
    said = str(exc.value).split("\nWhat the hosts have:")[0].splitlines()
    assert said == [
        "host R1 has no route to 198.18.17.10 (D1, traffic[0]): the host's own network "
        "configuration needs a route to 198.18.17.10 via R2 (198.18.100.2) on core"
    ]


def test_a_second_router_that_sends_replies_straight_on_is_refused(tmp_path, monkeypatch):
    # R2's way back to the senders points at an address on its own core segment that is not R1.
    back = [("198.18.17.0/24", None, "b1"), ("198.18.0.0/16", "198.18.100.9", "core")]
    with pytest.raises(SpecError) as exc:
        chain_preflight(tmp_path, monkeypatch, {**TABLES, "R2": back})
    said = str(exc.value).split("\nWhat the hosts have:")[0].splitlines()
    assert said == [
        "host R2's route to 198.18.1.10 (S1, traffic[0]) goes via 198.18.100.9 on core, not "
        "via R1 (198.18.100.1): the traffic would miss the rack's path; the host's own network "
        "configuration needs a route to 198.18.1.10 via R1 (198.18.100.1) on core"
    ]


def test_module_parameters_of_a_flows_own_congestion_control_are_refused(tmp_path, monkeypatch):
    """rack_capacity's flows select cubic themselves (traffic[bulk].cc); no trial
    selects it for a host (hosts.*.cc). Module parameters are set for the congestion controls
    the plan selects for a host only, so cubic's would silently not apply: refused, once,
    naming the key."""
    sets = ['hosts.senders.cc_params={"cubic": {"beta": 717}}']
    with pytest.raises(SpecError) as exc:
        chain_preflight(tmp_path, monkeypatch, TABLES, sets)
    said = str(exc.value).split("\nWhat the hosts have:")[0].splitlines()
    assert said == [
        f"{EXPERIMENT}: key 'hosts.senders.cc_params.cubic': cubic runs only as traffic[0]'s "
        "own congestion control (traffic[0].cc) and no trial selects it for host S1 "
        "(hosts.*.cc); module parameters are set only for a host's congestion control, so "
        "these would not apply. Select it for the host (hosts.S1.cc: cubic) or remove them"
    ]
    # Selected for the sender, they are set (and checked against the module's parameters).
    chain_preflight(tmp_path, monkeypatch, TABLES, [*sets, "hosts.senders.cc=cubic"])
    # Given to every host, they matter where cubic sends: D1 not selecting it is no problem.
    everywhere = ['hosts.all.cc_params={"cubic": {"beta": 717}}', "hosts.senders.cc=cubic"]
    chain_preflight(tmp_path, monkeypatch, TABLES, everywhere)


def test_a_flows_cc_that_the_plan_switches_the_host_to_has_its_parameters_set(
    tmp_path, monkeypatch
):
    """The sender's own cc is a factor (reno, cubic) and the flow always runs cubic: the runner
    configures cubic's parameters as a switch choice (testbed_host_cc_choice_params), in force
    in the reno trial too. Not refused, for the whole plan or for the reno trial alone."""
    sets = [
        'hosts.senders.cc_params={"cubic": {"beta": 717}}',
        "factors.hosts.senders.cc=[reno,cubic]",
    ]
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(CHAIN)
    rack = Rack.load([inventory])
    plan = load_plan(EXPERIMENT, ["factors={}", *sets])
    runner = TrialRunner(plan, rack, tmp_path)
    assert runner.config.choices.cc["S1"] == {"cubic": {"beta": 717}, "reno": {}}
    chain_preflight(tmp_path, monkeypatch, TABLES, sets)
    chain_preflight(tmp_path, monkeypatch, TABLES, sets, only=["*reno*"])


def test_a_row_added_to_the_table_is_read_per_trial_and_judged_on_the_hosts_that_answered(
    tmp_path, monkeypatch
):
    """Adding a check is adding a row: its need reads every selected trial, every host it
    wants something of is asked, and its judge sees those that answered; one that does not
    (R2) is named once and dropped from every row's wants."""
    read, judged = [], {}

    def need_every_node(ctx, view, wants):
        read.append(view.trial.name)
        for node in view.net.nodes:
            wants.setdefault(view.net.host_of(node), set()).add(view.trial.name)
        return []

    def judge_every_node(ctx, wants):
        judged.update(wants)
        return [f"host {h}: judged with kernel {ctx.facts[h]['kernel']}" for h in sorted(wants)]

    row = Check("every node", need=need_every_node, judge=judge_every_node)
    monkeypatch.setattr(preflight.run, "CHECKS", [*preflight.CHECKS, row])
    sets = ["factors.hosts.senders.cc=[reno,cubic]"]
    with pytest.raises(SpecError) as exc:
        chain_preflight(tmp_path, monkeypatch, TABLES, sets, unreachable={"R2"})
    said = str(exc.value).split("\nWhat the hosts have:")[0].splitlines()
    trials = {t.name for t in load_plan(EXPERIMENT, ["factors={}", *sets]).trials}
    assert len(read) == len(trials) == 2 and set(read) == trials
    assert judged == {host: trials for host in ("D1", "R1", "S1")}
    assert said == [
        "host R2 does not answer",
        *(f"host {host}: judged with kernel 6.1.0-28-amd64" for host in sorted(judged)),
    ]
