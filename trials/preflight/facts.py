"""What the hosts have, as they answer it: their facts (hostside/probes/host_facts.py run on
each, in parallel), what a host's kernel offers in one line, and which queue disciplines a Linux
kernel can load."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from core import rio_bpf
from core.command import DEV_NULL, STDOUT, Command, and_then, command, or_else, redirected, sequence
from core.hostside import PROBES, SOURCE, load_program
from core.link_rules import QDISCS
from core.program_source import program_source
from core.rack import Rack
from trials.network import FREEBSD_GROUPS


@functools.cache
def facts_source() -> str:
    """The probe's text as it is sent, built on first use (not when trials is imported)."""
    return program_source(SOURCE / PROBES["host_facts"])


STATIC_FACTS = load_program(PROBES["host_facts"]).STATIC  # what a runner reads once per host
# Kernel modules of each link qdisc (core.link_rules; droptail's bfifo/pfifo need none).
QDISC_MODULES = {name: list(q.linux_modules) for name, q in QDISCS.items()}


def host_facts(
    rack: Rack,
    names: list[str],
    before: Callable[[str], Command] | None = None,
    static: dict[str, dict[str, Any]] | None = None,
    route_to: dict[str, list[str]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Facts of each host (host_facts.py run there), gathered in parallel; `before(host)`:
    a command run first on that host in the same round trip (it must succeed). With
    `static` (a cache the caller keeps), a host's unchanging facts (kernel, modules, tool
    versions) are read on its first call only and taken from the cache after. `route_to`:
    per host, addresses whose route its kernel picks (the facts' route_to)."""
    commands = {}
    for name in names:
        host = rack.host(name)
        words = [host.workdir, *host.interfaces]
        asked = (route_to or {}).get(name, [])
        words += [f"--route-to={a}" for a in asked]
        if asked and len(host.interfaces) == 1:  # an end host: routes from its address
            words.append(f"--route-from={next(iter(host.interfaces.values())).ip}")
        if static is not None and name in static:
            words.append("--changing")
        probe = command("python3", "-c", facts_source(), *words)
        commands[name] = and_then(before(name), probe) if before else probe
    facts = {name: json.loads(out) for name, out in rack.run_parallel(commands).items()}
    if static is not None:
        for name, f in facts.items():
            known = static.setdefault(name, {k: f[k] for k in STATIC_FACTS if k in f})
            facts[name] = {**known, **f}
    return facts


def available(facts: dict[str, dict[str, Any]]) -> list[str]:
    """One line per host: what its kernel offers (congestion controls, queue disciplines,
    tracepoints)."""
    lines = []
    for name, f in sorted(facts.items()):
        ccs = sorted(set(f["cc_loaded"]) | set(f["cc_modules"]))
        trace = f.get("tracepoints")
        siftr = f"; siftr {'yes' if f['siftr'] else 'no'}" if "siftr" in f else ""  # FreeBSD
        lines.append(
            f"{name} (kernel {f['kernel']}): cc {' '.join(ccs)}; "
            f"qdiscs {' '.join(f.get('qdiscs') or []) or '?'}; "
            f"tracepoints {' '.join(trace) if trace else ('none' if trace == [] else '?')}" + siftr
        )
    return lines


def runs_freebsd(rack: Rack, host: str) -> bool:
    """A host of the groups freebsd_routers or freebsd_hosts (ResolvedNetwork.runs_freebsd)."""
    return any(g in rack.host(host).groups for g in FREEBSD_GROUPS)


def kernel_modules(qdisc: str) -> list[str]:
    """The kernel modules a link's qdisc needs (rio: GRED, clsact, flower and matchall; the
    BPF RIO, core.rio_bpf.PROBE: clsact and the BPF classifier)."""
    if qdisc == rio_bpf.PROBE:
        return list(rio_bpf.KERNEL_MODULES)
    return QDISC_MODULES.get(qdisc, [f"sch_{qdisc}"])


def qdiscs_available(rack: Rack, hosts: list[str], names: set[str]) -> dict[str, set[str]]:
    """Which of the named qdiscs each host's kernel has (every module it needs loaded, built
    in, or loadable)."""
    if not names or not hosts:
        return {h: set() for h in hosts}
    probe = sequence(*(_qdisc_probe(q) for q in sorted(names)), command("true"))
    out = rack.run_parallel({h: probe for h in hosts})
    return {h: set(text.split()) for h, text in out.items()}


# A module built into the kernel has no /sys/module entry unless it has parameters, and
# modprobe -n cannot tell without /lib/modules (this machine's kernel has neither): a function
# of the module's own among the kernel's symbols shows it. Those the BPF RIO needs.
BUILTIN_SYMBOLS = {"sch_ingress": "clsact_find", "cls_bpf": "cls_bpf_classify"}


def _qdisc_probe(qdisc: str) -> Command:
    """Prints the qdisc's name when every module it needs is loaded, loadable or built in."""
    loadable = [
        or_else(
            command("test", "-d", f"/sys/module/{m}"),
            command("modprobe", "-n", m),
            *(
                [command("grep", "-qw", BUILTIN_SYMBOLS[m], "/proc/kallsyms")]
                if m in BUILTIN_SYMBOLS
                else []
            ),
        )
        for m in kernel_modules(qdisc)
    ]
    if not loadable:
        return command("echo", qdisc)
    return and_then(
        redirected(and_then(*loadable), DEV_NULL, stderr=STDOUT), command("echo", qdisc)
    )
