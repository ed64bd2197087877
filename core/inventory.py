"""The inventory's variables that reach a rack host as they are (its experiment interfaces, the
address Ansible and the runner reach it at, its trialbed_dir, a FreeBSD router's management
rule), checked before any host is touched. Each problem names the variable, its value and
what is allowed; the runner (core.rack.Rack.load) adds the host and the inventory files, and
role freebsd_router asks the same rule of its management settings (filter
trialbed_management_problems)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any

from core.names import (
    ADDRESS_RULE,
    INTERFACE_RULE,
    is_address_or_dns_name,
    is_interface_name,
    is_ip_address,
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
FREEBSD_ROUTERS = "freebsd_routers"


def _templated(value: Any) -> bool:
    """Ansible renders it when a play runs: checked then (by the roles), not here."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def host_problems(name: str, variables: Mapping[str, Any], groups: Iterable[str]) -> list[str]:
    """What is wrong with one host's inventory variables (`variables`: merged as Ansible
    merges them, `groups`: every group it is in)."""
    problems = []
    interfaces = variables.get("trialbed_interfaces")
    if interfaces is not None and not isinstance(interfaces, Mapping):
        problems.append(
            f"trialbed_interfaces is {interfaces!r}; allowed: a mapping of experiment "
            "interfaces, e.g. {enp2s0: {address: 198.18.1.11/24}}"
        )
        interfaces = {}
    for iface, body in (interfaces or {}).items():
        if not is_interface_name(iface):
            problems.append(f"trialbed_interfaces: {iface!r} is not an interface name; allowed: "
                            f"{INTERFACE_RULE}")  # fmt: skip
        address = body.get("address") if isinstance(body, Mapping) else None
        if not _is_interface_address(address):
            problems.append(
                f"trialbed_interfaces.{iface}.address is {address!r}; allowed: an IPv4 address "
                "with its prefix length, e.g. 198.18.1.11/24"
            )
    for key in ("ansible_host", "ansible_ssh_host"):
        value = variables.get(key)
        if value is not None and not _templated(value) and not is_address_or_dns_name(value):
            problems.append(f"{key} is {value!r}; allowed: {ADDRESS_RULE}")
    workdir = variables.get("trialbed_dir")
    if workdir is not None and not _templated(workdir) and not _is_directory(workdir):
        problems.append(
            f"trialbed_dir is {workdir!r}; allowed: an absolute path (starting with /) "
            "without control characters"
        )
    if FREEBSD_ROUTERS in groups:
        iface = variables.get("freebsd_router_management_iface") or ""
        address = (
            variables.get("freebsd_router_management_address")
            or variables.get("ansible_ssh_host")
            or variables.get("ansible_host")
        )
        problems += management_problems(iface, address, list(interfaces or {}), name)
    return problems


def _is_directory(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("/") and not _CONTROL.search(value)


def _is_interface_address(value: Any) -> bool:
    if not isinstance(value, str) or "/" not in value:
        return False
    try:
        ipaddress.IPv4Interface(value)
    except ValueError:
        return False
    return True


def management_problems(
    iface: Any, address: Any, experiment_interfaces: list[str], name: str
) -> list[str]:
    """A FreeBSD router lets its management traffic past the pipes by interface
    (freebsd_router_management_iface) or, without one, by address (`address`: the role's
    freebsd_router_management_address, by default ansible_host, else the inventory name
    `name`), which ipfw reads when the rules load: an address it is, or ipfw looks the name
    up on the router and refuses the ruleset if it cannot resolve it."""
    if iface:
        if not is_interface_name(iface):
            return [f"freebsd_router_management_iface is {iface!r}; allowed: {INTERFACE_RULE}"]
        if iface in experiment_interfaces:
            return [
                f"freebsd_router_management_iface is {iface}, an experiment interface "
                f"(trialbed_interfaces): its traffic would pass the pipes unshaped; allowed: "
                f"the management interface, none of {', '.join(experiment_interfaces)}"
            ]
        return []
    if _templated(address):
        return []
    if address is None:
        return [
            f"neither ansible_host nor freebsd_router_management_iface is set: ipfw's "
            f"management rule would name {name!r}, a host name ipfw must resolve on the "
            "router; allowed: ansible_host (or freebsd_router_management_address) as an IP "
            "address, or freebsd_router_management_iface naming the management interface"
        ]
    if not is_ip_address(address):
        return [
            f"the management address {address!r} (freebsd_router_management_address, else "
            "ansible_host) is not an IP address: ipfw's management rule would name a host ipfw "
            "must resolve on the router; allowed: an IPv4/IPv6 address, or "
            "freebsd_router_management_iface naming the management interface"
        ]
    return []
