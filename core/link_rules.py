"""The rules of a shaped link, written once for the runner, the analysis and the roles: the
queue disciplines of the link model and what Linux and dummynet make of each, the packet and
frame sizes, the numbers roles/freebsd_router gives its ipfw rules, pipes and queues, the
nftables table of the DSCP marking, the implementations of a congestion control a host may
be asked for, and the configure.yml tag of each trial variable.

Python imports it; the roles read it through playbooks/filter_plugins/trialbed_link_rules.py
(`'name' | trialbed_link_rule`, `trialbed_dummynet_numbers`); a program sent to a host as
source carries it inside (core/program_source.py). Standard library only, no project import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# -- packet and frame sizes -----------------------------------------------------------------
# IP bytes of a full-size packet: Ethernet's MTU, every rack interface's unless the inventory
# or the experiment says otherwise. A buffer counted in packets holds packets of this size.
MTU = 1500
# The MTUs a host's interface may be given: IPv4's least (RFC 791) to an IP packet's largest.
SMALLEST_MTU, LARGEST_MTU = 68, 65535
# Bytes an Ethernet frame adds to its IP packet (no FCS), as tc's bfifo and a shaper count it.
ETHERNET_HEADER = 14
# A full-size frame as the shaper counts it: the least a byte buffer must hold, and what the
# shaper may be sending when a packet arrives (the OWD bound's serialization term).
FULL_FRAME_BYTES = MTU + ETHERNET_HEADER
# The payload of a full-size TCP segment with timestamps (IP 20, TCP 20, the option 12 bytes):
# what a full frame carries for a bulk flow's goodput.
TCP_PAYLOAD_BYTES = MTU - 20 - 20 - 12


# -- queue disciplines ----------------------------------------------------------------------
EXACT = "exact"
APPROXIMATED = "approximated"


@dataclass(frozen=True)
class Qdisc:
    """A queue discipline of the link model (linux_router_links' and experiment files' qdisc)
    and what each router makes of it."""

    name: str
    # The kernel qdisc Linux builds it from ("" for droptail: bfifo/pfifo, always there) and
    # every kernel module it needs there.
    linux_qdisc: str
    linux_modules: tuple[str, ...]
    # On a FreeBSD dummynet router: EXACT, APPROXIMATED (and recorded as such), or None when
    # dummynet has no counterpart (roles/freebsd_router refuses it).
    dummynet: str | None


def _kernel(name: str, dummynet: str | None = EXACT) -> Qdisc:
    return Qdisc(name, name, (f"sch_{name}",), dummynet)


# In the order messages list them. droptail is bfifo (a byte buffer) or pfifo (packets) under
# HTB, dummynet's pipe queue; red, gred, pie and codel sit on a dummynet pipe's queue, fq_codel
# is a dummynet scheduler. rio is GRED in RIO mode on Linux, whose virtual queue a clsact
# (sch_ingress) egress filter chooses (flower for IN, matchall for OUT); dummynet approximates
# it with two RED queues on one pipe. cake is Linux's only.
QDISCS: dict[str, Qdisc] = {
    q.name: q
    for q in (
        Qdisc("droptail", "", (), EXACT),
        _kernel("red"),
        _kernel("gred"),
        Qdisc(
            "rio", "gred", ("sch_gred", "sch_ingress", "cls_flower", "cls_matchall"), APPROXIMATED
        ),
        _kernel("fq_codel"),
        _kernel("pie"),
        _kernel("codel"),
        _kernel("cake", dummynet=None),
    )
}
QDISC_NAMES = tuple(QDISCS)
DEFAULT_QDISC = "droptail"
DUMMYNET_QDISCS = tuple(name for name, q in QDISCS.items() if q.dummynet)
LINUX_ONLY_QDISCS = tuple(name for name, q in QDISCS.items() if not q.dummynet)
# Every kernel qdisc a Linux host may need: the shaping's own (HTB's rate, netem's delay, fq's
# pacing) and those the link model's qdiscs are built from; a host's facts say which it has.
LINUX_KERNEL_QDISCS = tuple(
    dict.fromkeys(
        ["htb", "netem", "fq", *(q.linux_qdisc for q in QDISCS.values() if q.linux_qdisc)]
    )
)
# What a dummynet router adds to its pipe's own queue (droptail), as its facts list them.
DUMMYNET_AQMS = tuple(name for name in DUMMYNET_QDISCS if name != DEFAULT_QDISC)
# How roles/freebsd_router's record (delay_backend.json "rio") and the trial name dummynet's
# construction for rio, where RIO itself is meant.
DUMMYNET_RIO_LABEL = "approximated by two dummynet RED queues (IN, OUT) on one pipe"


def qdisc_of(link: Mapping) -> str:
    """The qdisc of a linux_router_links entry (or a record of one): the default when unset."""
    return link.get("qdisc") or DEFAULT_QDISC


# -- queue limits and RED thresholds from a buffer ------------------------------------------
RED_MAX_P = 0.1  # drop probability at the max threshold (tc red `probability`, ipfw max_p)
RED_AVPKT = 1000  # tc-red(8)'s avpkt: the mean packet its burst (EWMA weight) is sized with


def limit_packets(amount: int, packets: bool) -> int:
    """A queue limit in packets (fq_codel, pie, codel): a buffer in packets as given, one in
    bytes as the full-size packets it holds, rounded up; at least one."""
    return max(1, amount if packets else math.ceil(amount / MTU))


def red_thresholds(amount: int, packets: bool) -> tuple[int, int]:
    """RED's (min, max) thresholds for a queue of `amount` bytes, or packets when `packets`,
    in the queue's own unit: max a third of the queue, min a third of max (Floyd's max = 3
    min), at least two and one full-size packets."""
    packet = 1 if packets else MTU
    max_th = max(amount // 3, 2 * packet)
    return max(max_th // 3, packet), max_th


# -- dummynet (roles/freebsd_router) --------------------------------------------------------
# The role's first number (its management rule); link i (from 1) has rule and pipe base+i.
DUMMYNET_NUMBER_BASE = 10000
# ipfw's rules end at 65534, and `ipfw queue show N` lists queues below 65535 (dummynet.c
# parse_range): the largest number the role may use.
LARGEST_IPFW_NUMBER = 65534
# dummynet.c keeps RED's w_q and max_p as fixed point, (int)(x * 2^SCALE_RED).
DUMMYNET_SCALE_RED = 16


def dummynet_numbers(qdiscs: Sequence[str | None], base: int = DUMMYNET_NUMBER_BASE) -> list[dict]:
    """Per link (the qdiscs of linux_router_links, in order; i from 1), the numbers
    roles/freebsd_router gives it: rule and pipe base+i; for fq_codel its sched and queue
    base+i; for rio its two queues, IN base+i and OUT base+N+i (N links). None where a link
    has no such object."""
    base, count = int(base), len(qdiscs)
    out = []
    for i, qdisc in enumerate(qdiscs, start=1):
        n = base + i
        q = qdisc or DEFAULT_QDISC
        out.append(
            {
                "rule": n,
                "pipe": n,
                "sched": n if q == "fq_codel" else None,
                "queue": n if q == "fq_codel" else None,
                "rio": {"in": n, "out": n + count} if q == "rio" else None,
            }
        )
    return out


def dummynet_owned(qdiscs: Sequence[str | None], base: int = DUMMYNET_NUMBER_BASE) -> dict:
    """Every number the role owns for these links: the management rule (base) and each link's
    rule, its pipe, fq_codel's scheds, and the queues (fq_codel's, rio's IN and OUT)."""
    numbers = dummynet_numbers(qdiscs, base)
    rio = [n["rio"] for n in numbers if n["rio"]]
    return {
        "rules": [int(base)] + [n["rule"] for n in numbers],
        "pipes": [n["pipe"] for n in numbers],
        "scheds": [n["sched"] for n in numbers if n["sched"] is not None],
        "queues": sorted(
            [n["queue"] for n in numbers if n["queue"] is not None]
            + [q["in"] for q in rio]
            + [q["out"] for q in rio]
        ),
    }


def dummynet_fixed_point(value: float) -> float:
    """The value dummynet keeps of a RED w_q or max_p: 0.0012 -> 78 / 2^16."""
    return int(value * 2**DUMMYNET_SCALE_RED) / 2**DUMMYNET_SCALE_RED


# -- DSCP marking (roles/dscp_marker) -------------------------------------------------------
# The nftables table the role owns (its dscp_marker_table's default) and its family.
DSCP_TABLE_FAMILY = "inet"
DSCP_TABLE_NAME = "trialbed_dscp"

# -- congestion controls (roles/testbed_host, trials/bpf_cc.py) ----------------------------
# Which implementation of a congestion control a host runs (hosts.<key>.cc_implementation,
# testbed_host_cc_implementation): auto, the kernel's own where it has one (built in or a
# module) and else the BPF one of hostside/bpf_cc; module, the kernel's own or an error; bpf,
# hostside/bpf_cc's even where the kernel has its own.
CC_IMPLEMENTATIONS = ("auto", "module", "bpf")
# What `bpf` registers hostside/bpf_cc/<cc>/ as, beside a kernel's own <cc> (a kernel refuses a
# second congestion control of one name); the host's flows select it by this name.
BPF_CC_PREFIX = "bpf_"


def cc_kernel_name(cc: str, implementation: str | None) -> str:
    """The name the kernel knows congestion control `cc` by when run as `implementation`."""
    return BPF_CC_PREFIX + cc if implementation == "bpf" else cc


# -- RIO's implementation (roles/linux_router, network.links[].rio.implementation) -----------
# Which implementation runs qdisc rio on a Linux router (linux_router_rio_implementation, one
# per router): auto, GRED in RIO mode where the kernel has it and else the BPF program of
# hostside/bpf_tc/rio; gred, GRED or an error; bpf, the BPF program even where GRED is there.
RIO_IMPLEMENTATIONS = ("auto", "gred", "bpf")


# -- configure.yml's tags -------------------------------------------------------------------
# The tag that applies each trial variable: when only these changed on a host since the
# runner applied it, only their tags run there (`--tags cc,shaping`). tests/unit/
# test_link_rules.py checks them against the tags of playbooks/configure.yml and its roles.
CONFIGURE_TAGS = {
    "testbed_host_cc": "cc",
    "testbed_host_cc_params": "cc",
    "testbed_host_cc_choices": "cc",
    "testbed_host_cc_choice_params": "cc",
    "trialbed_flow_cc": "cc",
    "testbed_host_cc_implementation": "cc",
    "testbed_host_sysctls": "sysctls",
    "testbed_host_mtu": "mtu",
    "testbed_host_route_metrics": "routes",
    "testbed_host_pacing_interfaces": "pacing",
    "linux_router_forwarding": "shaping",
    "linux_router_links": "shaping",
    "linux_router_links_choices": "shaping",
    "linux_router_rio_implementation": "shaping",
    "dscp_marker_rules": "marking",
    "capture_points": "captures",
}
# configure.yml's other tags: the input checks (the runner skips them: its schema checked every
# value) and what only a full run does (no trial variable changes it).
CONFIGURE_INPUT_CHECKS_TAG = "input_checks"
CONFIGURE_FULL_RUN_TAGS = ("offloads", "daemons", "tools", "packages")
