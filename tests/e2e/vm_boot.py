"""The VM rack of test_vm_rack.py, booted in the background while the tests that need no rack
run (tests/conftest.py orders the suite so and starts it), then handed to that module's
fixture: its rack-up (about 2 minutes under TCG) overlaps them instead of adding to the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.conftest import TestRack, own_topology, remove_stale_test_rack, state_dir

PREFIX = "tv-"
SUBNET = 3
TOOLS = ("qemu-system-x86_64", "qemu-img", "debootstrap")


@dataclass
class VmRackBoot:
    """A rack-up of the VM rack under way (`rack.yml` in the background)."""

    rack: TestRack
    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)
    taken: bool = False

    def take(self) -> subprocess.CompletedProcess:
        """Wait for the rack-up to end; its result, the playbook's whole output as stdout.
        The rack is then the caller's to take down."""
        self.proc.wait()
        self.taken = True
        return subprocess.CompletedProcess(
            self.proc.args, self.proc.returncode, self.log.read_text(), ""
        )

    def abandon(self) -> None:
        """Take the rack down if no test took it over (a session stopped before its module)."""
        if not self.taken:
            self.proc.wait()
            self.rack.rack("absent")


_under_way: list[VmRackBoot] = []


def missing() -> str | None:
    """Why this machine cannot build the VM rack (not root, a tool missing), or None."""
    if os.geteuid() != 0:
        return "the VM rack needs root (tap, bridge, qemu)"
    lacking = [tool for tool in TOOLS if not shutil.which(tool)]
    return f"{', '.join(lacking)} missing: make setup installs it" if lacking else None


def start(tmp_path_factory) -> VmRackBoot:
    """Start the VM rack's rack-up in the background (after taking down a stale one)."""
    base = tmp_path_factory.mktemp("vm-rack") / "inventory"
    rack = TestRack(
        topology=own_topology("dumbbell", PREFIX, SUBNET, base),
        inventory=base / "hosts.yml",
        state_dir=state_dir("vm"),
        prefix=PREFIX,
    )
    remove_stale_test_rack(rack)
    log = base.parent / "rack-up.log"
    proc = rack.start_playbook(
        "rack.yml", *rack.rack_vars("present"), "-e", "virtual_rack_kind=vm", log=log
    )
    boot = VmRackBoot(rack=rack, proc=proc, log=log)
    _under_way.append(boot)
    return boot


def take_over(tmp_path_factory) -> VmRackBoot:
    """The rack-up started early in this session, or a new one."""
    waiting = [boot for boot in _under_way if not boot.taken]
    return waiting[0] if waiting else start(tmp_path_factory)
