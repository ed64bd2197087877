"""Filters that give the roles the link rules of core/link_rules.py (and the DSCP table of
core/dscp.py), the module the runner and the analysis import: a template or a role variable
looks a rule up instead of writing it again.

    "{{ 'mtu' | trialbed_link_rule }}"                                  -> 1500
    "{{ links | trialbed_dummynet_numbers(freebsd_router_number_base) }}" -> per link its numbers
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

# The core of the checkout this plugin belongs to, ahead of any other on the path (an
# installed one may be another checkout's).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from core import dscp, link_rules

# The rules a role may look up by name.
RULES = {
    "mtu": link_rules.MTU,
    "full_frame_bytes": link_rules.FULL_FRAME_BYTES,
    "tcp_payload_bytes": link_rules.TCP_PAYLOAD_BYTES,
    "smallest_mtu": link_rules.SMALLEST_MTU,
    "largest_mtu": link_rules.LARGEST_MTU,
    "default_qdisc": link_rules.DEFAULT_QDISC,
    "rio_kernel_modules": list(link_rules.QDISCS["rio"].linux_modules),
    "dummynet_number_base": link_rules.DUMMYNET_NUMBER_BASE,
    "largest_ipfw_number": link_rules.LARGEST_IPFW_NUMBER,
    "dscp_names": dict(dscp.DSCP_NAMES),
    "dscp_table_family": link_rules.DSCP_TABLE_FAMILY,
    "dscp_table_name": link_rules.DSCP_TABLE_NAME,
    "cc_implementations": list(link_rules.CC_IMPLEMENTATIONS),
    "bpf_cc_prefix": link_rules.BPF_CC_PREFIX,
}


def link_rule(name: str) -> object:
    """The rule called `name` (RULES)."""
    if name not in RULES:
        raise AnsibleFilterError(
            f"trialbed_link_rule: no rule {name!r} in core/link_rules.py; "
            f"there are: {', '.join(RULES)}"
        )
    return RULES[name]


def _qdiscs(links: list) -> list[str]:
    if not isinstance(links, list) or not all(isinstance(link, dict) for link in links):
        raise AnsibleFilterError(
            f"a list of linux_router_links entries was expected, not {links!r}"
        )
    return [link_rules.qdisc_of(link) for link in links]


def dummynet_numbers(links: list, base: object = link_rules.DUMMYNET_NUMBER_BASE) -> list[dict]:
    """Per link (in order): its rule, pipe, sched, queue and rio {in, out} numbers."""
    return link_rules.dummynet_numbers(_qdiscs(links), int(base))  # type: ignore[call-overload]


def dummynet_owned(links: list, base: object = link_rules.DUMMYNET_NUMBER_BASE) -> dict:
    """Every rule, pipe, sched and queue number the role owns with these links."""
    return link_rules.dummynet_owned(_qdiscs(links), int(base))  # type: ignore[call-overload]


class FilterModule:
    def filters(self):
        return {
            "trialbed_link_rule": link_rule,
            "trialbed_dummynet_numbers": dummynet_numbers,
            "trialbed_dummynet_owned": dummynet_owned,
        }
