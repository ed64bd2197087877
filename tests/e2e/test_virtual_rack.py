"""The virtual rack itself: idempotent, reachable over SSH with known host keys, offloads off."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.conftest import PREFIX, recap
from trials.rack import Rack

pytestmark = pytest.mark.rack


def test_second_rack_up_changes_nothing(test_rack):
    assert recap(test_rack.first_up.stdout)["localhost"]["changed"] > 0
    again = test_rack.rack("present")
    assert again.returncode == 0, again.stdout[-2000:]
    assert recap(again.stdout)["localhost"]["changed"] == 0


def test_hosts_answer_over_ssh_with_their_own_hostname(test_rack):
    rack = Rack.load([test_rack.inventory])
    try:
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


def test_sshd_listens_only_on_the_management_address(test_rack):
    out = subprocess.run(
        ["ip", "netns", "exec", f"{PREFIX}A", "ss", "-Hltn"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listeners = {line.split()[3] for line in out.splitlines()}
    assert listeners == {"198.19.1.11:22"}
