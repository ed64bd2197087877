"""Preflight's check of the RIO implementation an experiment asks for
(network.links[].rio.implementation, one per router: trials/network.py): gred where the kernel
cannot load GRED and the filters that feed it, bpf where the host cannot build and attach the
BPF program of hostside/bpf_tc/rio, and either on a FreeBSD router (dummynet's two queues are
its only RIO). What a host lacks for the BPF program is said here for the qdisc check too."""

from __future__ import annotations

from core import rio_bpf
from trials.preflight.context import Context, TrialView, Wants
from trials.preflight.facts import kernel_modules, qdiscs_available


def rio_bpf_lacks(facts: dict, modules: bool) -> list[str]:
    """What a Linux host lacks to run qdisc rio as the BPF program (roles/linux_router builds
    it with clang and libbpf-dev's headers and loads it with Python through libbpf): `modules`
    says whether its kernel can load core.rio_bpf.KERNEL_MODULES."""
    lacking = [] if modules else [" and ".join(rio_bpf.KERNEL_MODULES) + " in the kernel"]
    support = facts.get("bpf_cc_kernel") or {}
    if not (support.get("tools") or {}).get("clang"):
        lacking.append("clang")
    if not support.get("libbpf_headers"):
        lacking.append("libbpf-dev")
    if not (facts.get("tools") or {}).get("python3"):
        lacking.append("python3")
    return lacking


def need_rio_implementation(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """host -> (implementation, key) of the Linux routers whose rio links ask for gred or bpf;
    one asked of a FreeBSD router is a problem by itself."""
    problems = []
    for host, (asked, key) in view.net.rio_implementation.items():
        if ctx.freebsd(host):
            problems.append(
                f"{ctx.source}: key '{key}': {asked} on host {host}, a FreeBSD router, whose "
                "RIO is dummynet's approximation (two queues), neither GRED nor the BPF "
                "program: leave it auto there, or use a Linux router"
            )
        else:
            wants[host] = (asked, key)
    return problems


def missing_rio_implementation(ctx: Context, wants: Wants) -> list[str]:
    """gred asked of a kernel that cannot load GRED's modules; bpf of a host that lacks what
    the BPF program needs (rio_bpf_lacks)."""
    have = qdiscs_available(ctx.rack, sorted(wants), {"rio", rio_bpf.PROBE})
    problems = []
    for host, (asked, key) in sorted(wants.items()):
        facts = ctx.facts.get(host, {})
        kernel = facts.get("kernel", "?")
        if asked == "gred" and "rio" not in have[host]:
            problems.append(
                f"{ctx.source}: key '{key}': gred on host {host}, whose kernel ({kernel}) "
                f"cannot load {', '.join(kernel_modules('rio'))} (GRED in RIO mode and the "
                "filters that feed it); ask for auto or bpf (hostside/bpf_tc/rio), or use a "
                "rack whose kernel has GRED (RACK=vm: the VM rack)"
            )
        elif asked == "bpf" and (lacking := rio_bpf_lacks(facts, rio_bpf.PROBE in have[host])):
            problems.append(
                f"{ctx.source}: key '{key}': bpf on host {host} runs RIO as the BPF program "
                f"hostside/bpf_tc/rio, which needs {', '.join(lacking)} there; install them "
                "(Debian packages; the virtual rack: make setup), or ask for auto or gred"
            )
    return problems
