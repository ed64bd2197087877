"""A virtual rack of the tests' own (own namespaces, bridges, addresses and state), so that
the tests never disturb a rack the user has up; it is removed at the end of the session."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
PREFIX = "tt-"


@dataclass
class TestRack:
    topology: Path
    inventory: Path
    state_dir: Path

    def playbook(self, playbook: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                str(PROJECT / ".venv/bin/ansible-playbook"),
                str(PROJECT / "playbooks" / playbook),
                *args,
            ],
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
            env={
                **os.environ,
                "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"),
                "ANSIBLE_NOCOLOR": "1",
            },
        )

    def rack(self, state: str) -> subprocess.CompletedProcess:
        return self.playbook(
            "rack.yml",
            "-e",
            f"virtual_rack_topology_file={self.topology}",
            "-e",
            f"virtual_rack_state_dir={self.state_dir}",
            "-e",
            f"virtual_rack_namespace_prefix={PREFIX}",
            "-e",
            f"virtual_rack_state={state}",
        )


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines as {host: {ok, changed, unreachable, failed}}."""
    pattern = re.compile(
        r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M
    )
    return {
        m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
        for m in pattern.finditer(output)
    }


def rack_leftovers() -> list[str]:
    """Namespaces, links and processes of the test rack still present."""
    left = [
        n["name"]
        for n in json.loads(
            subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout
            or "[]"
        )
        if n["name"].startswith(PREFIX)
    ]
    links = json.loads(
        subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
    )
    left += [link["ifname"] for link in links if link["ifname"].startswith(PREFIX.rstrip("-"))]
    return left


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain `text` (e.g. the rack's state dir)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


@pytest.fixture(scope="session")
def test_rack(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the virtual rack needs root (network namespaces)")
    base = tmp_path_factory.mktemp("rack")
    topology = yaml.safe_load((PROJECT / "inventory/virtual/topology.yml").read_text())
    # Own bridges and management subnet (198.19.1.0/24) beside any rack of the user's.
    topology["management"]["bridge"] = f"{PREFIX}mgmt"
    topology["management"]["controller"] = "198.19.1.1/24"
    for segment in topology["segments"].values():
        segment["bridge"] = PREFIX + segment["bridge"].split("-", 1)[1]
    for host in topology["hosts"].values():
        host["mgmt"] = host["mgmt"].replace("198.19.0.", "198.19.1.")
    (base / "inventory").mkdir()
    shutil.copytree(PROJECT / "inventory/virtual/group_vars", base / "inventory" / "group_vars")
    topo_file = base / "inventory" / "topology.yml"
    topo_file.write_text(yaml.safe_dump(topology))
    # sshd refuses keys below a world-writable directory such as /tmp: keep state in the project.
    state_dir = PROJECT / ".state" / f"test-rack-{os.getpid()}"
    rack = TestRack(
        topology=topo_file, inventory=base / "inventory" / "hosts.yml", state_dir=state_dir
    )
    # As on a fresh machine, the initial namespace does not allow CUBIC: configure must add it
    # for the rack's namespaces, and rack-down must put the list back.
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
    original = allowed.read_text()
    allowed.write_text("reno")
    try:
        up = rack.rack("present")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
        rack.first_up = up
        yield rack
        down = rack.rack("absent")
        assert down.returncode == 0, down.stdout[-3000:]
        assert rack_leftovers() == []
        assert processes_mentioning(str(state_dir)) == []
        assert allowed.read_text().split() == ["reno"]
    finally:
        allowed.write_text(original)
