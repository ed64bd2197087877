"""The virtual rack itself: idempotent, reachable over SSH with known host keys, offloads off;
topologies chosen by name, switched on one prefix, and a rack owned by one checkout."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.rack import Rack
from tests.e2e.conftest import (
    CHAIN_PAIRS,
    OWNER_DIR,
    PREFIX,
    PROJECT,
    TestRack,
    namespaces,
    processes_mentioning,
    rack_leftovers,
    recap,
    remove_stale_test_rack,
    state_dir,
)

pytestmark = pytest.mark.rack


def test_second_rack_up_changes_nothing(test_rack):
    assert recap(test_rack.first_up.stdout)["localhost"]["changed"] > 0
    again = test_rack.rack("present")
    assert again.returncode == 0, again.stdout[-2000:]
    assert recap(again.stdout)["localhost"]["changed"] == 0


def test_hosts_answer_over_ssh_with_their_own_hostname(test_rack):
    rack = Rack.load([test_rack.inventory])
    try:
        assert rack.vars["trialbed_topology"] == "dumbbell"
        names = rack.run_parallel({h: "hostname" for h in rack.hosts})
        assert {h: out.strip() for h, out in names.items()} == {h: h for h in "ABCDR"}
        for host in rack.hosts.values():
            for itf in host.interfaces:
                features = rack.run(host.name, f"ethtool -k {itf}")
                for feature in (
                    "tcp-segmentation-offload",
                    "generic-segmentation-offload",
                    "generic-receive-offload",
                ):
                    assert f"{feature}: off" in features, (host.name, itf, feature)
    finally:
        rack.close()


def test_commands_run_in_sshds_plain_environment(test_rack):
    """bash reads ~/.bashrc for a command sshd starts unless SHLVL says it is not the first
    shell: the controller's own .bashrc (its PATH, its slow init) must not reach rack hosts."""
    rack = Rack.load([test_rack.inventory])
    try:
        shlvl, path = rack.run("A", 'echo "$SHLVL"; echo "$PATH"').split()
        # sshd's SHLVL=1 (unset, this would be 0): the login shell, bash, counts it up and
        # down again as it execs /bin/sh, which runs the command (core/remote_shell.py)
        assert shlvl == "1"
        assert path == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    finally:
        rack.close()


def test_sshd_listens_only_on_the_management_address(test_rack):
    out = subprocess.run(
        ["ip", "netns", "exec", f"{PREFIX}A", "ss", "-Hltn"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listeners = {line.split()[3] for line in out.splitlines()}
    assert listeners == {"198.19.1.11:22"}


def test_hosts_speak_no_ipv6(test_rack):
    """IPv6 is off in every namespace: no link-local address, so none of IPv6's own frames
    (router solicitations, MLD) enters a shaped queue where the `ip` captures miss it."""
    for host in "ABCDR":
        out = subprocess.run(
            ["ip", "-n", f"{PREFIX}{host}", "-6", "-o", "addr", "show"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert out == "", (host, out)


def test_rack_up_records_its_owner(test_rack):
    owner = json.loads(test_rack.owner_file.read_text())
    assert owner["project_dir"] == str(PROJECT)
    assert owner["state_dir"] == str(test_rack.state_dir)
    assert owner["topology"] == "dumbbell"
    assert owner["since"].endswith("Z")
    assert sorted(owner["namespaces"]) == [f"{PREFIX}{h}" for h in "ABCDR"]
    stored = json.loads((test_rack.state_dir / "rack.json").read_text())
    assert stored["spec"] == yaml.safe_load(test_rack.topology.read_text())


# -- chain2: the seed-001 two-router chain (its first four pairs, see trim_chain) ------------

CHAIN_HOSTS = {"R1", "R2"} | {f"{side}{i}" for side in "SD" for i in range(1, CHAIN_PAIRS + 1)}

# An ICMP echo from Python (the hosts have no ping): prints the reply's TTL.
ICMP_ECHO = """
import socket, struct, sys
dst = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.settimeout(2)
body = struct.pack("!BBHHH", 8, 0, 0, 0x7462, 1) + b"trialbed"
total = sum(struct.unpack("!8H", body))
total = (total >> 16) + (total & 0xFFFF)
total = ~(total + (total >> 16)) & 0xFFFF
s.sendto(body[:2] + struct.pack("!H", total) + body[4:], (dst, 0))
while True:
    data, (src, _) = s.recvfrom(1500)
    ihl = (data[0] & 15) * 4
    if src == dst and data[ihl] == 0 and data[ihl + 4 : ihl + 6] == b"tb":
        print(data[8])
        break
"""


def test_chain_hosts_answer_over_ssh_with_their_hostnames(chain_rack):
    rack = Rack.load([chain_rack.inventory])
    try:
        assert rack.vars["trialbed_topology"] == "chain2"
        assert set(rack.hosts) == CHAIN_HOSTS
        assert {h.name for h in rack.hosts.values() if "linux_routers" in h.groups} == {"R1", "R2"}
        names = rack.run_parallel({h: "hostname" for h in rack.hosts})
        assert {h: out.strip() for h, out in names.items()} == {h: h for h in CHAIN_HOSTS}
    finally:
        rack.close()


def test_second_chain_rack_up_changes_nothing(chain_rack):
    again = chain_rack.rack("present")
    assert again.returncode == 0, again.stdout[-2000:]
    assert recap(again.stdout)["localhost"]["changed"] == 0


def test_experiment_neighbours_are_permanent(test_rack):
    # No ARP on the experiment links: a router's probe would queue (and drop) with the traffic.
    rack = Rack.load([test_rack.inventory])
    try:
        links = {h: json.loads(rack.run(h, "ip -j addr show")) for h in rack.hosts}
        mac_of = {
            a["local"]: link["address"]
            for h in links
            for link in links[h]
            if link["ifname"] != "mgmt"
            for a in link.get("addr_info", [])
            if a["family"] == "inet" and a["local"].startswith("198.18.")
        }
        neighbours = {
            h: {
                n["dst"]: (n["lladdr"], n["state"])
                for n in json.loads(rack.run(h, "ip -j neigh show"))
                if n["dev"] != "mgmt"
            }
            for h in rack.hosts
        }
    finally:
        rack.close()
    assert neighbours["R"] == {
        ip: (mac, ["PERMANENT"]) for ip, mac in mac_of.items() if not ip.endswith(".1")
    }
    assert neighbours["A"] == {
        ip: (mac_of[ip], ["PERMANENT"]) for ip in ("198.18.1.1", "198.18.1.12")
    }


def route(rack: Rack, host: str, to: str) -> dict:
    return json.loads(rack.run(host, f"ip -j route get {to}"))[0]


def test_s1_reaches_d1_through_r1_and_r2(chain_rack):
    rack = Rack.load([chain_rack.inventory])
    d1 = "198.18.17.10"
    try:
        assert (route(rack, "S1", d1)["gateway"], route(rack, "S1", d1)["dev"]) == (
            "198.18.1.1",
            "a1",
        )
        assert (route(rack, "R1", d1)["gateway"], route(rack, "R1", d1)["dev"]) == (
            "198.18.100.2",
            "core",
        )
        assert route(rack, "R2", d1)["dev"] == "b1" and "gateway" not in route(rack, "R2", d1)
        assert route(rack, "D1", "198.18.1.10")["gateway"] == "198.18.17.1"
        # Forwarding is the router role's business; turn it on for this probe only.
        routers = ("R1", "R2")
        before = rack.run_parallel({r: "sysctl -n net.ipv4.ip_forward" for r in routers})
        rack.run_parallel({r: "sysctl -qw net.ipv4.ip_forward=1" for r in routers})
        try:
            ttl = rack.run("S1", f"python3 -c {shlex.quote(ICMP_ECHO)} {d1}", timeout=10)
        finally:
            rack.run_parallel(
                {r: f"sysctl -qw net.ipv4.ip_forward={before[r].strip()}" for r in routers}
            )
        assert int(ttl) == 64 - 2  # the reply crossed two routers
    finally:
        rack.close()


def test_preflight_checks_the_first_routers_route_via_the_second(chain_rack):
    """rack_capacity.yml (S1 -> D1 over R1 - R2) passes preflight on the chain; with R1's route
    to the receivers' segments gone (a lab router nobody gave it), preflight names R1 and the
    route it needs, and changes nothing."""
    exp = str(PROJECT / "experiments/rack_capacity.yml")

    def preflight() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "trials", "preflight", exp, "--set", "factors={}",
             "-i", str(chain_rack.inventory)],
            cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
            timeout=300,
        )  # fmt: skip

    clean = preflight()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    rack = Rack.load([chain_rack.inventory])
    try:
        via = route(rack, "R1", "198.18.17.10")
        assert via["gateway"] == "198.18.100.2"
        try:
            rack.run("R1", "ip route del 198.18.16.0/20")
            refused = preflight()
            routes_after = rack.run("R1", "ip -4 route show")
        finally:
            rack.run("R1", "ip route replace 198.18.16.0/20 via 198.18.100.2 dev core")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        said = refused.stdout + refused.stderr
        problems = [line.strip() for line in said.splitlines() if line.startswith("  host ")]
        assert problems == [
            "host R1 has no route to 198.18.17.10 (D1, traffic[0]): the host's own network "
            "configuration needs a route to 198.18.17.10 via R2 (198.18.100.2) on core"
        ], said
        assert "198.18.16.0/20" not in routes_after  # preflight changed nothing
        assert route(rack, "R1", "198.18.17.10")["gateway"] == "198.18.100.2"
    finally:
        rack.close()


# -- switching topologies, and the owner lock (tiny topologies, prefix tw-) ------------------

SWITCH_PREFIX = "tw-"


def tiny_topology(directory: Path, name: str, segment: str, hosts: dict[str, int]) -> Path:
    """One segment (198.18.250.0/24) with the given hosts; management 198.19.3.0/24."""
    topology = {
        "management": {
            "bridge": f"{SWITCH_PREFIX}mgmt",
            "controller": "198.19.3.1/24",
            "prefix": 24,
        },
        "segments": {segment: {"bridge": f"{SWITCH_PREFIX}{segment}"}},
        "hosts": {
            host: {
                "groups": ["testbed_hosts"],
                "mgmt": f"198.19.3.{n}",
                "interfaces": {segment: f"198.18.250.{n}/24"},
                "routes": [],
            }
            for host, n in hosts.items()
        },
    }
    path = directory / f"{name}.yml"
    path.write_text(yaml.safe_dump(topology, sort_keys=False))
    return path


@pytest.fixture
def tiny(tmp_path):
    """Two tiny topologies, 'solo' (X on segment lan) and 'duo' (Y, Z on segment net), on
    prefix tw-; whatever is left of them is taken down afterwards."""
    if os.geteuid() != 0:
        pytest.skip("the virtual rack needs root (network namespaces)")
    solo = TestRack(
        topology=tiny_topology(tmp_path, "solo", "lan", {"X": 11}),
        inventory=tmp_path / "hosts.yml",
        state_dir=state_dir("tiny"),
        prefix=SWITCH_PREFIX,
    )
    duo = TestRack(
        topology=tiny_topology(tmp_path, "duo", "net", {"Y": 12, "Z": 13}),
        inventory=solo.inventory,
        state_dir=solo.state_dir,
        prefix=SWITCH_PREFIX,
    )
    remove_stale_test_rack(solo)
    yield solo, duo
    down = rack_down(solo)
    assert down.returncode == 0, down.stdout[-3000:]
    assert rack_leftovers(SWITCH_PREFIX) == []


def rack_down(rack: TestRack) -> subprocess.CompletedProcess:
    """rack-down as `make rack-down` runs it: no topology, only the prefix to find the rack."""
    return rack.playbook(
        "rack.yml",
        "-e",
        f"virtual_rack_namespace_prefix={rack.prefix}",
        "-e",
        "virtual_rack_state=absent",
    )


def test_switching_topologies_on_one_prefix_takes_the_old_rack_down(tiny):
    solo, duo = tiny
    up = solo.rack("present")
    assert up.returncode == 0, up.stdout[-3000:]
    assert namespaces(SWITCH_PREFIX) == ["tw-X"]

    switch = duo.rack("present")
    assert switch.returncode == 0, switch.stdout[-3000:]
    assert "taking down the running solo rack to bring up duo" in switch.stdout
    assert namespaces(SWITCH_PREFIX) == ["tw-Y", "tw-Z"]
    assert not Path("/sys/class/net/tw-lan").exists()
    assert json.loads(duo.owner_file.read_text())["topology"] == "duo"
    assert yaml.safe_load(duo.inventory.read_text())["all"]["vars"]["trialbed_topology"] == "duo"

    down = rack_down(duo)
    assert down.returncode == 0, down.stdout[-3000:]
    assert rack_leftovers(SWITCH_PREFIX) == []
    assert not duo.state_dir.exists() and not duo.inventory.exists()


def test_a_rack_owned_by_another_checkout_is_refused_and_a_stale_owner_taken_over(tiny):
    solo, _ = tiny
    other = "/srv/another-checkout"
    # A stale owner file (its namespaces are gone) is taken over with a warning.
    OWNER_DIR.mkdir(parents=True, exist_ok=True)
    stale = {"project_dir": other, "state_dir": f"{other}/.state/rack", "topology": "chain2",
             "since": "2026-01-01T00:00:00Z", "namespaces": ["tw-S1"]}  # fmt: skip
    solo.owner_file.write_text(json.dumps(stale))
    up = solo.rack("present")
    assert up.returncode == 0, up.stdout[-3000:]
    assert "stale owner file" in up.stderr + up.stdout
    mine = json.loads(solo.owner_file.read_text())
    assert mine["project_dir"] == str(PROJECT)

    # The same rack, now recorded as another checkout's while its namespaces exist.
    solo.owner_file.write_text(json.dumps({**mine, "project_dir": other}))
    try:
        for attempt in (solo.rack("present"), rack_down(solo)):
            assert attempt.returncode != 0
            message = " ".join(attempt.stdout.split())
            assert (
                f"owned by another checkout {other} (topology solo, up since {mine['since']}"
                in message
            )
            assert f"cd {other} && make rack-down" in message
            assert "virtual_rack_namespace_prefix" in message
        assert namespaces(SWITCH_PREFIX) == ["tw-X"]
    finally:
        solo.owner_file.write_text(json.dumps(mine))


def test_a_live_rack_whose_checkout_is_gone_is_taken_down_with_a_warning(tiny):
    """A checkout deleted (or cleaned) with its rack up leaves namespaces and sshds that only
    its state directory could manage: another checkout's rack-down takes them down, saying
    so, instead of sending the user to a checkout that no longer exists."""
    solo, _ = tiny
    up = solo.rack("present")
    assert up.returncode == 0, up.stdout[-3000:]
    mine = json.loads(solo.owner_file.read_text())
    gone = "/srv/deleted-checkout"
    orphan = {**mine, "project_dir": gone, "state_dir": f"{gone}/.state/rack"}
    solo.owner_file.write_text(json.dumps(orphan))
    down = rack_down(solo)
    assert down.returncode == 0, down.stdout[-3000:]
    said = " ".join((down.stderr + down.stdout).split())
    assert (
        f"Taking over the virtual rack with namespace prefix '{SWITCH_PREFIX}' of checkout {gone}"
        in said
    ), said[-3000:]
    assert "its state directory is gone" in said
    assert namespaces(SWITCH_PREFIX) == []
    assert processes_mentioning(str(solo.state_dir)) == []  # its sshds ended with them
    assert not solo.owner_file.exists()


def test_a_vm_rack_whose_checkout_is_gone_has_its_qemu_ended(tiny, tmp_path):
    """The same for a VM rack: its qemu pid file went with the state directory, so the qemu
    is found by the pid file its command line names, and ended. (A stand-in process with
    qemu's name and arguments plays the VM: what is checked is finding and ending it.)"""
    solo, _ = tiny
    gone = tmp_path / "deleted-checkout"
    rack_state = gone / ".state/rack"
    pidfile = rack_state / "vm/qemu.pid"
    pidfile.parent.mkdir(parents=True)
    qemu = subprocess.Popen(
        ["qemu-system-x86_64", "-c", "import time; time.sleep(600)", "-pidfile", str(pidfile)],
        executable=sys.executable,
        start_new_session=True,
    )
    try:
        pidfile.write_text(f"{qemu.pid}\n")
        solo.owner_file.parent.mkdir(parents=True, exist_ok=True)
        solo.owner_file.write_text(
            json.dumps(
                {
                    "project_dir": str(gone), "state_dir": str(rack_state), "topology": "vm",
                    "prefix": SWITCH_PREFIX, "inventory": str(gone / "inventory/virtual/hosts.yml"),
                    "since": "2026-11-27T21:00:00Z", "namespaces": [], "bridges": [],
                    "management": [], "kind": "vm", "vm_pidfile": str(pidfile),
                }
            )
        )  # fmt: skip
        # While its checkout exists, the VM rack is that checkout's: refused.
        refused = rack_down(solo)
        assert refused.returncode != 0
        assert f"owned by another checkout {gone}" in " ".join(refused.stdout.split())
        assert qemu.poll() is None

        shutil.rmtree(gone)
        down = rack_down(solo)
        assert down.returncode == 0, down.stdout[-3000:]
        said = " ".join((down.stderr + down.stdout).split())
        assert f"Taking over the virtual rack with namespace prefix '{SWITCH_PREFIX}'" in said
        assert "its state directory is gone" in said
        assert qemu.wait(timeout=30) == -signal.SIGTERM  # ended by rack-down, by its pid
        assert not solo.owner_file.exists()
    finally:
        if qemu.poll() is None:
            qemu.kill()
            qemu.wait()
