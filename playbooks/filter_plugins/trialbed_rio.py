"""Filters that turn a linux_router_links entry with qdisc rio into GRED's virtual queues and
the clsact filters that choose them, through core/rio.py (the code the experiment schema and
the runner use): the thresholds are given in packets and converted here, once, to bytes."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

# The core of the checkout this plugin belongs to, ahead of any other on the path (an
# installed one may be another checkout's).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from core import link_rules, rio


def rio_virtual_queues(link: dict) -> list[dict]:
    """IN (VQ 0) and OUT (VQ 1) in bytes, with their burst (GRED's EWMA weight) and prio."""
    try:
        return [vq.record() for vq in rio.virtual_queues(link.get("rio") or {}, link["buffer"])]
    except (rio.RioError, KeyError) as e:
        raise AnsibleFilterError(f"linux_router_links entry {link.get('iface')}: {e}") from e


def rio_filters(link: dict) -> list[dict]:
    """The ToS value/mask of every DSCP that is IN (a clsact egress flower filter each)."""
    try:
        return rio.tos_filters(link.get("rio") or {})
    except rio.RioError as e:
        raise AnsibleFilterError(f"linux_router_links entry {link.get('iface')}: {e}") from e


def rio_record(links: list[dict]) -> dict[str, list[dict]]:
    """Per rio interface: its virtual queues as applied (thresholds in packets and bytes, the
    mean packet size that converted them, w_q asked and used), for the applied record."""
    return {
        link["iface"]: rio_virtual_queues(link)
        for link in links
        if link_rules.qdisc_of(link) == "rio"
    }


class FilterModule:
    def filters(self):
        return {
            "trialbed_rio_virtual_queues": rio_virtual_queues,
            "trialbed_rio_filters": rio_filters,
            "trialbed_rio_record": rio_record,
        }
