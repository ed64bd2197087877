"""The VM rack of test_vm_rack.py, booted in the background while the tests that need no rack
run (tests/conftest.py orders the suite so and starts it), then handed to that module's
fixture: its rack-up (about 2 minutes under TCG) overlaps them instead of adding to the suite.
The module's first batch (test_vm_rack.first_batch) follows the rack-up at once, in the
background too: the rack is otherwise idle until those tests end (2-3 minutes here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.conftest import PROJECT, TestRack, own_topology, remove_stale_test_rack, state_dir

PREFIX = "tv-"
SUBNET = 3
TOOLS = ("qemu-system-x86_64", "qemu-img", "debootstrap")


# A command to run on the rack once it is up: its arguments, given the rack.
Follower = Callable[[TestRack], list[str]]


@dataclass
class VmRackBoot:
    """A rack-up of the VM rack under way (`rack.yml` in the background), and the command that
    follows it when it succeeds."""

    rack: TestRack
    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)
    taken: bool = False
    followed: subprocess.CompletedProcess | None = None  # the follower's run, once it ended
    followed_s: float = 0.0
    batch_dir: Path | None = None  # where the module's first batch ran, when it followed
    _thread: threading.Thread | None = None

    def follow_with(self, follower: Follower) -> None:
        """Run `follower`'s command (output captured) as soon as the rack-up succeeds."""

        def run() -> None:
            if self.proc.wait() != 0:
                return
            begun = time.monotonic()
            self.followed = subprocess.run(
                follower(self.rack), cwd=PROJECT, capture_output=True, text=True,
                check=False, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            self.followed_s = time.monotonic() - begun

        self._thread = threading.Thread(target=run, name="vm-rack-follower", daemon=True)
        self._thread.start()

    def take(self) -> subprocess.CompletedProcess:
        """Wait for the rack-up, and for its follower, to end; the rack-up's result, the
        playbook's whole output as stdout. The rack is then the caller's to take down."""
        self.proc.wait()
        if self._thread is not None:
            self._thread.join()
        self.taken = True
        return subprocess.CompletedProcess(
            self.proc.args, self.proc.returncode, self.log.read_text(), ""
        )

    def abandon(self) -> None:
        """Take the rack down if no test took it over (a session stopped before its module)."""
        if not self.taken:
            self.proc.wait()
            if self._thread is not None:
                self._thread.join()
            self.rack.rack("absent")


_under_way: list[VmRackBoot] = []


def missing() -> str | None:
    """Why this machine cannot build the VM rack (not root, a tool missing), or None."""
    if os.geteuid() != 0:
        return "the VM rack needs root (tap, bridge, qemu)"
    lacking = [tool for tool in TOOLS if not shutil.which(tool)]
    return f"{', '.join(lacking)} missing: make setup installs it" if lacking else None


def start(tmp_path_factory, first_batch: bool = False) -> VmRackBoot:
    """Start the VM rack's rack-up in the background (after taking down a stale one), and
    with `first_batch` test_vm_rack's first batch after it."""
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
    if first_batch:
        from tests.e2e.test_vm_rack import first_batch_command  # the module's own batch

        boot.batch_dir = tmp_path_factory.mktemp("vm-trials")
        boot.follow_with(lambda rack: first_batch_command(rack, boot.batch_dir))
    _under_way.append(boot)
    return boot


def take_over(tmp_path_factory) -> VmRackBoot:
    """The rack-up started early in this session, or a new one (without a follower)."""
    waiting = [boot for boot in _under_way if not boot.taken]
    return waiting[0] if waiting else start(tmp_path_factory)


def taken() -> VmRackBoot | None:
    """The rack-up a test took over in this session."""
    return next((boot for boot in _under_way if boot.taken), None)
