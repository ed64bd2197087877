"""`make preflight` (python -m trials preflight) on the test rack: the clean rack passes; then
one run meets, each made real on the rack, a host whose sshd refuses the key it is given, a
host that does not answer, a host whose clock reads 50 ms ahead of its clock domain's, an
interface the inventory names but the router lacks, a receiver without iperf3 (hidden by a bind
mount in that host's own mount namespace), a router whose disk for the trials is full (a small
one mounted there and filled), captures bigger than the free disk of a sender and of the
controller's results directory, an inventory address a host's interface lacks, and a sender
whose route to its receiver leaves by its management interface; every
problem is one line naming the host and what to check, and no host is changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from core.rack import Rack
from tests.e2e.conftest import PROJECT, host_states

pytestmark = pytest.mark.rack

EXPERIMENT = """\
experiment: preflight_probe
description: the collateral-damage dumbbell with captures on three hosts of one clock domain
network:
  links:
    - {name: downstream, from: R, to: C, rate: 1mbit, buffer: 60000B, delay: 25ms}
    - {name: upstream, from: R, to: A, rate: 1mbit, buffer: 60000B, delay: 25ms}
traffic:
  - {type: bulk_tcp, name: tcp, from: A, to: C, flows: 1}
  - {type: cbr_udp, name: voip, from: B, to: D, packet_bytes: 186, interval: 20ms}
capture:
  points:
    - {name: bottleneck_in, link: upstream, at: R}
    - {name: sender, node: A, interface: left}
    - {name: receiver, node: C, interface: right}
hosts:
  all: {cc: reno}
duration: 20s
"""


def preflight(inventories: list, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "trials", "preflight", *args]
    for inventory in inventories:
        command += ["-i", str(inventory)]
    return subprocess.run(
        command, cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )


def test_a_clean_rack_passes(test_rack, tmp_path):
    exp = tmp_path / "probe.yml"
    exp.write_text(EXPERIMENT)
    done = preflight([test_rack.inventory], str(exp))
    print(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 trial(s) can run" in done.stderr
    for host in "ABCDR":
        assert f"\n  {host} (kernel " in done.stderr  # what each host offers


def test_each_problem_is_one_line_with_what_to_check(test_rack, tmp_path):
    exp = tmp_path / "probe.yml"
    exp.write_text(EXPERIMENT)
    rack = Rack.load([test_rack.inventory])
    d_address = rack.host("D").address
    router_interfaces = dict(rack.host("R").vars["trialbed_interfaces"])
    router_interfaces["ghost0"] = {"address": "198.18.99.1/24"}
    ((c_iface, c_itf),) = rack.host("C").interfaces.items()
    c_moved = c_itf.network.network_address + 99  # C's address as a mistyped inventory says
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    overlay = tmp_path / "broken.yml"
    nobody = d_address.rsplit(".", 1)[0] + ".250"  # on the management bridge, no host there
    overlay.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        # A's clock read 50 ms ahead (the read command is the inventory's)
                        "A": {"trialbed_clock_read": "echo $(( $(date +%s%N) + 50000000 ))"},
                        "R": {"trialbed_interfaces": router_interfaces},
                        "C": {
                            "trialbed_interfaces": {
                                c_iface: {"address": f"{c_moved}/{c_itf.network.prefixlen}"}
                            }
                        },
                        "B": {"ansible_ssh_private_key_file": str(stranger)},
                        "D": {"ansible_host": nobody},
                    }
                }
            }
        )
    )
    before = host_states(rack)
    # C's sshd runs in a mount namespace of its own (ip netns exec makes one, a slave of the
    # controller's): /dev/null bound over iperf3 there is a C without iperf3, and only C.
    c_sshd = (test_rack.state_dir / "hosts" / "C" / "sshd.pid").read_text().strip()
    in_c = ["nsenter", "--target", c_sshd, "--mount", "--"]
    iperf3 = shutil.which("iperf3")
    assert iperf3
    subprocess.run([*in_c, "mount", "--bind", "/dev/null", iperf3], check=True)
    # R's disk for the trials' files, full: a small one mounted there in R's mount namespace
    # and filled from a shell on R.
    r_trials = f"{rack.host('R').workdir}/trials"
    rack.run("R", f"mkdir -p {r_trials} && mount -t tmpfs -o size=4m tmpfs {r_trials}")
    # A's traffic to C sent out of its management interface (a host route there, the
    # mistake of a lab host whose default route is the management network's)
    a_management = next(
        link["ifname"]
        for link in json.loads(rack.run("A", "ip -4 -j addr show"))
        if any(a.get("local") == rack.host("A").address for a in link.get("addr_info", []))
    )
    a_experiment = next(iter(rack.host("A").interfaces))
    detour = f"{c_moved}/32 dev {a_management}"
    rack.run("A", f"ip route add {detour}")
    results = tmp_path / "results"
    try:
        rack.run("R", f"dd if=/dev/zero of={r_trials}/filler bs=64k", check=False)
        assert os.access(iperf3, os.X_OK)  # the controller's own is untouched
        done = preflight(
            [test_rack.inventory, overlay],
            str(exp),
            # the longest trial there is, through links as fast as a rack has: captures of
            # about 100 TB, more than any disk here
            "--set",
            "duration=86400s",
            "--set",
            "network.links[*].rate=5gbit",
            "--results",
            str(results),
        )
    finally:
        subprocess.run([*in_c, "umount", iperf3], check=True)
        rack.run("R", f"umount {r_trials}", check=False)
        rack.run("A", f"ip route del {detour}", check=False)
    print(done.stdout + done.stderr)
    assert done.returncode == 1
    lines = [" ".join(line.split()) for line in done.stderr.split("\n  ")]
    found = {
        "key": [ln for ln in lines if ln.startswith("host B") and "was refused" in ln],
        "unreachable": [ln for ln in lines if ln.startswith("host D") and "unreachable" in ln],
        "clock": [ln for ln in lines if "clock domain 'controller'" in ln and "A's clock" in ln],
        "interface": [ln for ln in lines if ln.startswith("host R has no interface 'ghost0'")],
        "disk": [ln for ln in lines if ln.startswith(f"host R: only 0 MB free in {r_trials} ")],
        "sized": [ln for ln in lines if ln.startswith("host A: only") and "MB free in" in ln],
        "results": [ln for ln in lines if ln.startswith(f"results {results}: only")],
        "tool": [ln for ln in lines if ln.startswith("host C lacks iperf3 (needed by traffic[0]")],
        "address": [ln for ln in lines if ln.startswith(f"host C: interface {c_iface} lacks")],
        "route": [ln for ln in lines if ln.startswith(f"host A's route to {c_moved} (C, ")],
    }
    assert all(found.values()), found
    assert str(stranger) in found["key"][0] and "authorized_keys" in found["key"][0]
    assert nobody in found["unreachable"][0]
    # the measured offset, not the configured one: 50 ms within the SSH round trip
    offset = float(found["clock"][0].split("A's clock is ")[1].split(" ms")[0])
    within = float(found["clock"][0].split("\u00b1")[1].split(" ms")[0])
    assert abs(offset - 50) <= within + 1, found["clock"]
    assert "bottleneck_in" in found["disk"][0]
    # A's disk is not full, only too small for a day's capture at 5 Gbit/s; so is the controller's
    assert int(found["sized"][0].split("only ")[1].split(" MB")[0]) > 100
    assert "sender" in found["sized"][0]
    assert "brings back up to" in found["results"][0]
    assert not results.exists()  # reads only
    assert "install it (the virtual rack: make setup; a lab rack: the" in found["tool"][0]
    assert not any("lacks" in ln and not ln.startswith("host C") for ln in lines)
    assert f"the address {c_moved}/{c_itf.network.prefixlen} " in found["address"][0]
    assert f"it has {c_itf}: set the address on the host" in found["address"][0]
    assert (
        f"leaves through {a_management}, not its experiment interface {a_experiment}"
        in (found["route"][0])
    )
    r_left = next(  # the route A needs: through R's address on A's segment
        i.ip
        for i in rack.host("R").interfaces.values()
        if i.network == next(iter(rack.host("A").interfaces.values())).network
    )
    assert found["route"][0].endswith(f"via R ({r_left}) on {a_experiment}")
    assert len([ln for ln in lines if "route to" in ln]) == 1  # the other routes are right
    assert not any("C's clock" in ln or "R's clock" in ln for ln in lines)
    assert host_states(rack) == before
    rack.close()
