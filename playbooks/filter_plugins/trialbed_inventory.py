"""Filters that give the roles the inventory checks of core/inventory.py, the rules the runner
applies when it loads an inventory: a role refuses what the runner would.

    "{{ freebsd_router_management_iface | trialbed_management_problems(address, ifaces, name) }}"
"""

from __future__ import annotations

import sys
from pathlib import Path

# The core of the checkout this plugin belongs to, ahead of any other on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from core.inventory import management_problems


def trialbed_management_problems(
    iface: str, address: str, experiment_interfaces: list[str], name: str
) -> list[str]:
    """What is wrong with a FreeBSD router's management settings (empty: nothing)."""
    return management_problems(iface, address, list(experiment_interfaces), name)


class FilterModule:
    def filters(self):
        return {"trialbed_management_problems": trialbed_management_problems}
