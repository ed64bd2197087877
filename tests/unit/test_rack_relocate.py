"""The virtual_rack role's `virtual_rack_relocate` filter: a rack beside another checkout's gets
bridges and a management subnet of its own (make RACK_PREFIX=tw- RACK_SUBNET=4)."""

import importlib.util
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "relocate", PROJECT / "roles/virtual_rack/filter_plugins/relocate.py"
)
relocate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(relocate)
DUMBBELL = yaml.safe_load((PROJECT / "inventory/virtual/topologies/dumbbell.yml").read_text())


def test_relocate_moves_bridges_and_management_addresses():
    moved = relocate.virtual_rack_relocate(DUMBBELL, "tw-", "4")
    assert moved["management"]["bridge"] == "tw-mgmt"
    assert moved["management"]["controller"] == "198.19.4.1/24"
    assert {s["bridge"] for s in moved["segments"].values()} == {"tw-left", "tw-right"}
    assert moved["hosts"]["R"]["mgmt"] == "198.19.4.2"
    assert moved["hosts"]["A"]["mgmt"] == "198.19.4.11"
    # Experiment addresses stay; the original is untouched.
    assert moved["hosts"]["A"]["interfaces"] == DUMBBELL["hosts"]["A"]["interfaces"]
    assert DUMBBELL["management"]["bridge"] == "tb-mgmt"


def test_relocate_without_subnet_is_the_topology():
    assert relocate.virtual_rack_relocate(DUMBBELL, "tw-", "") is DUMBBELL


@pytest.mark.parametrize("bad", ["x", "256", "-1"])
def test_relocate_refuses_a_bad_subnet(bad):
    with pytest.raises(relocate.AnsibleFilterError, match="third octet"):
        relocate.virtual_rack_relocate(DUMBBELL, "tw-", bad)
