"""Teardown restores what was applied, read from the hosts' own records: after a runner that
was SIGKILLed mid-trial (so it restored nothing), `teardown.yml` with no variables leaves every
host as it was before the trial, stops what still ran there, keeps the trial's files; a
second teardown changes nothing. A sysctl one configure set and the next does not is given
back by that next configure."""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml

from core.rack import Rack
from tests.e2e.conftest import host_states, recap, start_trials, wait_for_daemon
from tests.e2e.test_interrupt import namespace_commands

pytestmark = pytest.mark.rack

EXPERIMENT = """\
experiment: collateral_damage
network:
  links:
    - {name: downstream, from: R, to: C, rate: 1mbit, buffer: 60000B, delay: 20ms}
    - {name: upstream, from: R, to: A, rate: 1mbit, buffer: 60000B, delay: 20ms}
traffic:
  - {type: bulk_tcp, name: tcp, from: A, to: C, flows: 1}
  - {type: cbr_udp, name: voip, from: B, to: D}
capture:
  points:
    - {name: bottleneck_in, link: upstream, at: R}
hosts:
  all: {cc: reno}
  A: {initcwnd: 3, rto_min: 1s}
  C: {rcvbuf: 1000000B, tcp_no_metrics_save: 0}
duration: 60s
warmup: 5s
"""


def changed(done) -> dict[str, int]:
    counts = {host: c["changed"] for host, c in recap(done.stdout).items()}
    assert counts, done.stdout[-3000:]
    return counts


def test_teardown_after_a_sigkilled_runner_leaves_the_rack_as_before(test_rack, tmp_path):
    inventory = ("-i", str(test_rack.inventory))
    rack = Rack.load([test_rack.inventory])
    try:
        assert test_rack.playbook("teardown.yml", *inventory).returncode == 0
        before = host_states(rack)

        exp_file = tmp_path / "killed.yml"
        exp_file.write_text(EXPERIMENT)
        proc = start_trials(str(exp_file), inventory=test_rack.inventory, results=tmp_path / "r")
        wait_for_daemon(proc, test_rack, "A", "tcp_client")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        during = host_states(rack)
        assert "htb" in during["R"] and "NFQUEUE" in during["R"]
        assert "reno" in during["A"] and "initcwnd 3" in during["A"]
        assert "1000000" in during["C"]
        # The sender's helper waits for T0 (up to the runner's lead) before it execs iperf3;
        # nothing the killed runner would have done is needed for it to start.
        deadline = time.monotonic() + 15
        while "iperf3" not in namespace_commands("A") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "iperf3" in namespace_commands("A") and "tcpdump" in namespace_commands("R")

        first = test_rack.playbook("teardown.yml", *inventory)  # none of the trial's variables
        assert first.returncode == 0, first.stdout[-3000:]
        assert all(changed(first)[h] > 0 for h in "ACR"), changed(first)
        assert host_states(rack) == before
        for host in "ABCDR":
            assert namespace_commands(host) <= {"sshd"}, host
        # What the trial captured stays on the host, flushed (tcpdump ended on SIGINT).
        (capture,) = (test_rack.state_dir / "hosts/R/work/trials").glob("*/*/bottleneck_in.pcap")
        assert capture.stat().st_size > 10_000

        second = test_rack.playbook("teardown.yml", *inventory)
        assert second.returncode == 0, second.stdout[-3000:]
        assert set(changed(second).values()) == {0}, changed(second)
        assert host_states(rack) == before
    finally:
        rack.close()


def test_a_sysctl_set_by_one_configure_is_given_back_by_the_next(test_rack, tmp_path):
    # C alone (and the controller's play): the other hosts take no part, and each playbook run
    # on five hosts costs tens of seconds.
    inventory = ("-i", str(test_rack.inventory), "--limit", "localhost,C")
    rack = Rack.load([test_rack.inventory])
    try:
        assert test_rack.playbook("teardown.yml", *inventory).returncode == 0
        own = rack.run("C", "sysctl -n net.ipv4.tcp_rmem").split()
        tuned = tmp_path / "tuned.yml"
        sysctls = {"net.ipv4.tcp_no_metrics_save": 1, "net.ipv4.tcp_rmem": "4096 131072 777777"}
        tuned.write_text(
            yaml.safe_dump({"all": {"hosts": {"C": {"testbed_host_sysctls": sysctls}}}})
        )
        done = test_rack.playbook("configure.yml", *inventory, "-i", str(tuned))
        assert done.returncode == 0, done.stdout[-3000:]
        assert rack.run("C", "sysctl -n net.ipv4.tcp_rmem").split()[2] == "777777"

        plain = test_rack.playbook("configure.yml", *inventory)  # the next trial: no tcp_rmem
        assert plain.returncode == 0, plain.stdout[-3000:]
        assert changed(plain)["C"] > 0
        assert rack.run("C", "sysctl -n net.ipv4.tcp_rmem").split() == own
        assert test_rack.playbook("teardown.yml", *inventory).returncode == 0
        record = test_rack.state_dir / "hosts/C/work/baseline.json"
        assert not record.exists(), json.loads(record.read_text())
    finally:
        rack.close()


def test_a_link_shaped_by_one_configure_and_not_by_the_next_is_unshaped(test_rack, tmp_path):
    """An end host's access link (A's egress) shaped by one configure; the next configure
    shapes nothing on A: A's qdisc is the kernel's again before any teardown, and a third
    configure changes nothing."""
    inventory = ("-i", str(test_rack.inventory), "--limit", "localhost,A")
    rack = Rack.load([test_rack.inventory])

    def root() -> str:
        return rack.run("A", "tc qdisc show dev left root").split()[1]

    try:
        assert test_rack.playbook("teardown.yml", *inventory).returncode == 0
        own = root()
        shaped = tmp_path / "access_link.yml"
        link = {"iface": "left", "rate": "2mbit", "buffer": "30000B"}
        shaped.write_text(yaml.safe_dump({"all": {"hosts": {"A": {"linux_router_links": [link]}}}}))
        done = test_rack.playbook("configure.yml", *inventory, "-i", str(shaped))
        assert done.returncode == 0, done.stdout[-3000:]
        assert root() == "htb"

        runs = [test_rack.playbook("configure.yml", *inventory) for _ in range(2)]
        for run in runs:
            assert run.returncode == 0, run.stdout[-3000:]
        print(f"A's root: {own} before, htb shaped, {root()} after the next configure")
        assert changed(runs[0])["A"] > 0 and root() == own
        assert changed(runs[1])["A"] == 0
        assert test_rack.playbook("teardown.yml", *inventory).returncode == 0
        assert root() == own
    finally:
        rack.close()


def test_check_mode_on_a_host_that_has_not_built_the_tools_yet(test_rack):
    """`make configure CHECK=1`, the README's first by-hand step, on a host configure has not
    yet built trialbed-transact on: the build and its link show as changes, nothing fails and
    nothing is built; the real run then builds it."""
    inventory = ("-i", str(test_rack.inventory), "--limit", "localhost,A")
    bin_dir = test_rack.state_dir / "hosts/A/work/bin"
    for path in bin_dir.glob("trialbed-transact*"):
        path.unlink()
    check = test_rack.playbook("configure.yml", *inventory, "--check", "--diff")
    assert check.returncode == 0, check.stdout[-3000:]
    assert changed(check)["A"] > 0
    assert not list(bin_dir.glob("trialbed-transact*"))
    applied = test_rack.playbook("configure.yml", *inventory)
    assert applied.returncode == 0, applied.stdout[-3000:]
    assert (bin_dir / "trialbed-transact").resolve().is_file()
    assert test_rack.playbook("teardown.yml", *inventory).returncode == 0


def test_ipv6_on_an_experiment_interface_is_turned_off_and_given_back(test_rack):
    """A lab host speaks IPv6 on its experiment interface (the rack's hosts do not: turned on
    here by hand). configure turns it off there (its own IPv6 frames would enter the
    bottleneck's queue unseen by the IPv4 captures), a second configure changes nothing, and
    teardown gives it back."""
    inventory = ("-i", str(test_rack.inventory), "--limit", "localhost,C")
    rack = Rack.load([test_rack.inventory])
    (iface,) = rack.host("C").interfaces
    key = f"net.ipv6.conf.{iface}.disable_ipv6"

    def ipv6() -> tuple[str, str]:
        return (
            rack.run("C", f"sysctl -n {key}").strip(),
            rack.run("C", f"ip -6 -o addr show dev {iface}").strip(),
        )

    try:
        assert test_rack.playbook("teardown.yml", *inventory).returncode == 0
        rack.run("C", f"sysctl -qw {key}=0")
        own = ipv6()
        assert own[0] == "0" and "fe80::" in own[1], own  # a link-local address: IPv6 on
        runs = [test_rack.playbook("configure.yml", *inventory) for _ in range(2)]
        for run in runs:
            assert run.returncode == 0, run.stdout[-3000:]
        off = ipv6()
        print(f"C's {iface}: {own} before, {off} after configure")
        assert off == ("1", "")
        assert changed(runs[0])["C"] > 0 and changed(runs[1])["C"] == 0
        assert test_rack.playbook("teardown.yml", *inventory).returncode == 0
        assert ipv6()[0] == "0"
    finally:
        rack.run("C", f"sysctl -qw {key}=1", check=False)
        rack.close()
