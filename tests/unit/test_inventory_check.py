"""A lab inventory's variables that reach a host (experiment interfaces and their addresses,
ansible_host, trialbed_dir, a FreeBSD router's management rule) are checked when the runner
loads the inventory, before any host is asked anything: each problem names the inventory
file, the host, the variable and what is allowed, all of them at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.names import ADDRESS_RULE, INTERFACE_RULE
from core.rack import Rack, RackError

PROJECT = Path(__file__).resolve().parents[2]
LAB = yaml.safe_load((PROJECT / "inventory/lab.example/hosts.yml").read_text())


def lab(tmp_path: Path, host: str, **changes) -> Path:
    """inventory/lab.example with `host`'s variables changed (None: removed)."""
    data = yaml.safe_load(yaml.safe_dump(LAB))
    group = "freebsd_routers" if host == "R" else "testbed_hosts"
    entry = data["all"]["children"][group]["hosts"][host]
    for key, value in changes.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    path = tmp_path / "lab" / "hosts.yml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


CASES = {
    "interface name": (
        "A", {"trialbed_interfaces": {"enp2s0;reboot": {"address": "198.18.1.11/24"}}},
        f"trialbed_interfaces: 'enp2s0;reboot' is not an interface name; allowed: {INTERFACE_RULE}",
    ),
    "address without prefix": (
        "A", {"trialbed_interfaces": {"enp2s0": {"address": "198.18.1.11"}}},
        "trialbed_interfaces.enp2s0.address is '198.18.1.11'; allowed: an IPv4 address with its "
        "prefix length, e.g. 198.18.1.11/24",
    ),
    "no address": (
        "A", {"trialbed_interfaces": {"enp2s0": {}}},
        "trialbed_interfaces.enp2s0.address is None; allowed: an IPv4 address",
    ),
    "interfaces as a list": (
        "A", {"trialbed_interfaces": ["enp2s0"]},
        "trialbed_interfaces is ['enp2s0']; allowed: a mapping of experiment interfaces",
    ),
    "ansible_host": (
        "B", {"ansible_host": "$(reboot)"}, f"ansible_host is '$(reboot)'; allowed: {ADDRESS_RULE}"
    ),
    "trialbed_dir": (
        "C", {"trialbed_dir": "var/lib/trialbed"},
        "trialbed_dir is 'var/lib/trialbed'; allowed: an absolute path (starting with /)",
    ),
    "router with no management": (
        "R", {"ansible_host": None, "freebsd_router_management_iface": None},
        "neither ansible_host nor freebsd_router_management_iface is set: ipfw's management "
        "rule would name 'R', a host name ipfw must resolve on the router; allowed: "
        "ansible_host (or freebsd_router_management_address) as an IP address, or "
        "freebsd_router_management_iface naming the management interface",
    ),
    "router managed by a name": (
        "R", {"ansible_host": "r.lab", "freebsd_router_management_iface": None},
        "the management address 'r.lab' (freebsd_router_management_address, else ansible_host) "
        "is not an IP address",
    ),
    "router managed on an experiment interface": (
        "R", {"freebsd_router_management_iface": "em2"},
        "freebsd_router_management_iface is em2, an experiment interface (trialbed_interfaces): "
        "its traffic would pass the pipes unshaped; allowed: the management interface, none of "
        "em1, em2",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_bad_variable_is_named_with_its_file_host_and_what_is_allowed(tmp_path, case):
    host, changes, said = CASES[case]
    path = lab(tmp_path, host, **changes)
    with pytest.raises(RackError) as exc:
        Rack.load([path])
    assert f"{path}: host {host}: {said}" in str(exc.value), str(exc.value)


def test_every_problem_is_said_at_once(tmp_path):
    path = lab(tmp_path, "R", ansible_host=None, freebsd_router_management_iface=None,
               trialbed_interfaces={"em1": {"address": "x"}})  # fmt: skip
    with pytest.raises(RackError) as exc:
        Rack.load([path])
    lines = str(exc.value).splitlines()
    assert len(lines) == 2 and all(line.startswith(f"{path}: host R: ") for line in lines)


def test_the_router_with_either_an_address_or_an_interface_loads(tmp_path):
    by_address = lab(tmp_path, "R", freebsd_router_management_iface=None)
    assert Rack.load([by_address]).host("R").address == "198.19.10.2"
    by_interface = lab(tmp_path, "R", ansible_host="r.lab")  # em0: the name is only for SSH
    assert Rack.load([by_interface]).host("R").address == "r.lab"
