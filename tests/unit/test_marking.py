"""Static DSCP marking in experiment files (network.marking): what is accepted, what the
role dscp_marker is given on each host, and the messages for what is not (file, key, what is
allowed), all before any host is touched."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.dscp import DSCP_NAMES, parse_dscp
from core.rack import Host, Rack, RackError
from tests.unit.spec_files import error_of, write
from trials.network import resolve_network
from trials.plan import load_plan
from trials.runner import host_vars

PROJECT = Path(__file__).resolve().parents[2]
GOOD = """\
experiment: collateral_damage
network:
  links:
    - {name: downstream, from: R, to: C, rate: 1mbit, buffer: 60000B}
  marking:
    - {name: tcp_af11, at: A, flow: tcp, dscp: af11}
    - {name: voip_cs5, at: R, flow: voip, dscp: cs5}
    - {name: b_rest, at: R, src: B, dst: 198.18.2.0/24, proto: udp, dport: 1000-2000, dscp: 3}
traffic:
  - {type: bulk_tcp, name: tcp, from: A, to: C, port: 5301}
  - {type: cbr_udp, name: voip, from: B, to: D, dscp: ef}
duration: 10s
factors:
  network.marking[voip_cs5].dscp: [cs5, af41]
"""


def dumbbell(router_group: str = "linux_routers") -> Rack:
    """The virtual rack's dumbbell as an inventory would describe it (no host is reached)."""
    topology = yaml.safe_load((PROJECT / "inventory/virtual/topologies/dumbbell.yml").read_text())
    hosts = {
        name: Host(
            name=name,
            address=h["mgmt"],
            user="root",
            groups=tuple(router_group if g == "linux_routers" else g for g in h["groups"]),
            workdir="/nonexistent",
            interfaces={k: ipaddress.IPv4Interface(v) for k, v in h["interfaces"].items()},
            vars={},
        )
        for name, h in topology["hosts"].items()
    }
    return Rack([Path("dumbbell.yml")], hosts, {})


def resolve(tmp_path: Path, text: str):
    path = write(tmp_path, text)
    return resolve_network(load_plan(path).base, dumbbell(), str(path))


def rack_error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(RackError) as exc:
        resolve(tmp_path, text)
    message = " ".join(str(exc.value).split())
    assert str(tmp_path / "exp.yml") in message
    return message


def test_rules_become_each_hosts_role_variables(tmp_path):
    plan = load_plan(write(tmp_path, GOOD))
    assert sorted(t.name for t in plan.trials) == ["dscp-af41_r1", "dscp-cs5_r1"]
    af41 = next(t for t in plan.trials if t.name == "dscp-af41_r1")
    net = resolve(tmp_path, GOOD)
    topology = yaml.safe_load((PROJECT / "inventory/virtual/topologies/dumbbell.yml").read_text())
    address = {n: h["interfaces"] for n, h in topology["hosts"].items()}
    a, b = address["A"]["left"].split("/")[0], address["B"]["left"].split("/")[0]
    c, d = address["C"]["right"].split("/")[0], address["D"]["right"].split("/")[0]
    assert net.marking == {
        # a TCP flow: sender to receiver, to its server's port
        "A": [{"name": "tcp_af11", "src": a, "dst": c, "proto": "tcp", "dport": 5301, "dscp": 10}],
        "R": [
            # the cbr_udp stream's port is 40000 + its index
            {"name": "voip_cs5", "src": b, "dst": d, "proto": "udp", "dport": 40001, "dscp": 40},
            {"name": "b_rest", "src": b, "dst": "198.18.2.0/24", "proto": "udp"}
            | {"dport": "1000-2000", "dscp": 3},
        ],
    }
    variables = host_vars(
        af41, resolve_network(af41.experiment, dumbbell(), "f"), {n: _settings() for n in net.nodes}
    )
    assert variables["R"]["dscp_marker_rules"][0]["dscp"] == DSCP_NAMES["af41"]
    assert variables["C"]["dscp_marker_rules"] == []  # a host without rules keeps none
    assert net.record()["marking"] == net.marking  # in trial.json


def _settings():
    from trials.spec import HostSettings

    return HostSettings()


def test_dscp_names_and_numbers():
    assert [parse_dscp(v) for v in ("ef", "AF11", "af43", "cs1", "be", 0, 63)] == [
        46, 10, 38, 8, 0, 0, 63,
    ]  # fmt: skip
    for bad in ("af14", 64, -1, True, "gold"):
        with pytest.raises(ValueError, match=r"is not a DSCP; give 0\.\.63 or one of: cs0"):
            parse_dscp(bad)


def test_bad_rules_name_file_key_and_allowed(tmp_path):
    rule = "{name: tcp_af11, at: A, flow: tcp, dscp: af11}"
    cases = {
        "{at: A, flow: tcp, dscp: af14}": (
            "key 'network.marking[0].dscp': 'af14' is not a DSCP; give 0..63 or one of:",
            "af11, af12, af13",
        ),
        "{at: A, flow: tcp, dscp: 64}": ("key 'network.marking[0].dscp': 64 is not a DSCP",),
        "{at: A, flow: tcp, port: 80, dscp: ef}": (
            "unknown key 'network.marking[0].port'; allowed here: name, at, flow, src, dst, "
            "proto, sport, dport, dscp",
        ),
        "{at: A, flow: tcpx, dscp: ef}": (
            "network.marking[0].flow: no traffic named 'tcpx'; the traffic is: tcp, voip",
        ),
        "{at: A, flow: tcp, src: A, dscp: ef}": (
            "key 'network.marking[0]': flow 'tcp' already gives the addresses, protocol and "
            "port; give either flow or src",
        ),
        "{at: A, dport: 80, dscp: ef}": (
            "key 'network.marking[0]': sport and dport need proto: tcp or proto: udp",
        ),
        "{at: A, proto: tcp, dport: 70000, dscp: ef}": (
            "key 'network.marking[0].dport': 70000: ports run from 1 to 65535",
        ),
        "{at: A, proto: tcp, sport: 90-80, dscp: ef}": (
            "key 'network.marking[0].sport': '90-80': ports run from 1 to 65535, low before high",
        ),
        "{at: A, proto: sctp, dscp: ef}": ("key 'network.marking[0].proto'", "'tcp', 'udp'"),
        "{at: A, src: 198.18.300.1, dscp: ef}": (
            "key 'network.marking[0].src': '198.18.300.1' is neither an IPv4 address or prefix",
        ),
        "{flow: tcp, dscp: ef}": ("key 'network.marking[0].at' is required",),
        "{at: A, flow: tcp}": ("key 'network.marking[0].dscp' is required",),
        "{name: voip_cs5, at: A, flow: tcp, dscp: ef}": (
            "marking rule names must be unique; repeated: voip_cs5",
        ),
    }
    for bad, expected in cases.items():
        message = error_of(tmp_path, GOOD.replace(rule, bad))
        for text in expected:
            assert text in message, (bad, message)
    nodes = "network:\n  nodes: {A: A, B: B, C: C, D: D, R: R}\n"
    message = error_of(
        tmp_path, GOOD.replace("network:\n", nodes).replace(rule, "{at: A, dst: E, dscp: ef}")
    )
    assert "network.marking[0]: node 'E' is not in network.nodes (A, B, C, D, R)" in message


def test_rules_the_rack_cannot_apply_are_refused_naming_the_key(tmp_path):
    rule = "{name: tcp_af11, at: A, flow: tcp, dscp: af11}"
    message = rack_error_of(tmp_path, GOOD.replace(rule, "{at: B, flow: tcp, dscp: af11}"))
    assert (
        "key 'network.marking[0].at': B is not on the path of flow tcp (A -> R -> C); "
        "mark it at A or R" in message
    )
    # tcpreplay's packets leave the sender through a packet socket, past nftables.
    message = rack_error_of(tmp_path, GOOD.replace(rule, "{at: B, flow: voip, dscp: af11}"))
    assert "key 'network.marking[0].at': flow voip is replayed by tcpreplay" in message
    assert "mark it on a router of its path (R)" in message
    message = rack_error_of(tmp_path, GOOD.replace(rule, "{at: A, src: R, dscp: af11}"))
    assert "key 'network.marking[0].src': 'R' is not an end host of the rack" in message
    message = rack_error_of(tmp_path, GOOD.replace(rule, "{at: Q, dscp: af11}"))
    assert "node Q: host 'Q' is not in the inventory" in message
    path = write(tmp_path, GOOD)
    with pytest.raises(RackError, match="R is a FreeBSD router, which has no nftables"):
        resolve_network(load_plan(path).base, dumbbell("freebsd_routers"), str(path))


def test_check_refuses_a_bad_rule_before_touching_any_host(tmp_path):
    path = write(tmp_path, GOOD.replace("dscp: af11}", "dscp: gold}"))
    done = subprocess.run(
        [sys.executable, "-m", "trials", "check", str(path)],
        cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert f"{path}: key 'network.marking[0].dscp': 'gold' is not a DSCP" in message


def test_the_shipped_example_resolves_on_the_dumbbell():
    path = PROJECT / "experiments" / "dscp_marking.yml"
    plan = load_plan(path)
    net = resolve_network(plan.base, dumbbell(), str(path))
    assert sorted(net.marking) == ["A", "R"] and len(plan.trials) == 2
