"""The virtual_rack role's `virtual_rack_allowed_cc` module: racks that come and go on one
machine share its allowed-congestion-control list; the last one down gives the original back,
and no rack removes what another one still needs. Run as Ansible runs it, on a stand-in file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
MODULE = PROJECT / "roles/virtual_rack/library/virtual_rack_allowed_cc.py"


@pytest.fixture
def machine(tmp_path: Path):
    sysctl = tmp_path / "tcp_allowed_congestion_control"
    sysctl.write_text("reno\n")
    owner_dir = tmp_path / "run"

    def call(state: str, rack: str, *allow: str, check: bool = False, **extra) -> dict:
        args = {
            "state": state,
            "rack": rack,
            "allow": list(allow),
            "owner_dir": str(owner_dir),
            "sysctl_path": str(sysctl),
            "_ansible_check_mode": check,
            **extra,
        }
        done = subprocess.run(
            [sys.executable, str(MODULE)],
            input=json.dumps({"ANSIBLE_MODULE_ARGS": args}),
            capture_output=True,
            text=True,
            check=False,
        )
        return json.loads(done.stdout)

    call.allowed = lambda: sysctl.read_text().split()
    call.record = owner_dir / "allowed_cc.json"
    return call


def test_one_rack_adds_and_gives_back(machine) -> None:
    assert machine("present", "/rack/a", "cubic", "reno")["changed"]
    assert machine.allowed() == ["reno", "cubic"]
    assert not machine("present", "/rack/a", "cubic")["changed"]  # idempotent
    down = machine("absent", "/rack/a")
    assert down["changed"] and down["allowed"] == ["reno"]
    assert machine.allowed() == ["reno"] and not machine.record.exists()
    assert not machine("absent", "/rack/a")["changed"]


def test_a_rack_going_down_keeps_what_another_needs(machine) -> None:
    machine("present", "/rack/a", "cubic")
    machine("present", "/rack/b", "cubic", "bbr")
    assert machine.allowed() == ["reno", "cubic", "bbr"]
    # a goes first: b still needs both (the old per-rack copy put back "reno" here and b's
    # namespaces got EPERM selecting cubic)
    assert machine("absent", "/rack/a")["allowed"] == ["reno", "cubic", "bbr"]
    assert machine.allowed() == ["reno", "cubic", "bbr"]
    assert machine("absent", "/rack/b")["allowed"] == ["reno"]
    assert not machine.record.exists()


def test_what_only_the_departing_rack_needed_goes(machine) -> None:
    machine("present", "/rack/a", "cubic")
    machine("present", "/rack/b", "bbr")
    assert machine("absent", "/rack/b")["allowed"] == ["reno", "cubic"]
    assert json.loads(machine.record.read_text())["racks"] == {"/rack/a": ["cubic"]}


def test_a_rack_that_needed_nothing_new_is_still_counted_once_a_record_exists(machine) -> None:
    machine("present", "/rack/a", "cubic")
    assert machine("present", "/rack/b", "cubic")["changed"]  # recorded, list unchanged
    assert machine.allowed() == ["reno", "cubic"]
    machine("absent", "/rack/a")
    assert machine.allowed() == ["reno", "cubic"]  # b still selects cubic


def test_check_mode_changes_nothing(machine) -> None:
    result = machine("present", "/rack/a", "cubic", check=True)
    assert result["changed"] and result["diff"]["after"] == "reno cubic\n"
    assert machine.allowed() == ["reno"] and not machine.record.exists()


def test_a_rack_from_before_the_record_gives_its_own_copy_back(machine, tmp_path: Path) -> None:
    legacy = tmp_path / "allowed_cc.orig"
    legacy.write_text("reno bbr\n")
    down = machine("absent", "/rack/old", legacy_original=str(legacy))
    assert down["changed"] and machine.allowed() == ["reno", "bbr"]
