"""Ask every host of the selected trials what it has, read-only, and refuse what it cannot
run faithfully: congestion controls, their module parameters, tools, queue disciplines,
rates beyond what the rack carries, free disk."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.rack import Rack, RackError
from core.units import format_rate, parse_rate
from trials.network import host_settings, resolve_network
from trials.plan import Trial
from trials.rack_kind import vm_max_rate
from trials.spec import SpecError

_FACTS_SOURCE = (Path(__file__).with_name("host_facts.py")).read_text()
# host_facts.STATIC (that module runs on the hosts and is not imported here).
STATIC_FACTS = ("hostname", "kernel", "cc_modules", "qdiscs", "tracepoints", "tools")
MIN_FREE_DISK = 200 * 10**6
SHAPING_TOOLS = ["tc"]
CAPTURE_TOOLS = ["tcpdump"]
# Which role installs a tool on a host of its own (the virtual rack shares make setup's).
INSTALLED_BY = {
    "gcc": "the transactions role with transactions_install_packages: true",
    "nft": "the dscp_marker role with dscp_marker_install_packages: true",
    "": "the testbed_host role with testbed_host_install_packages: true",
}


def host_facts(
    rack: Rack,
    names: list[str],
    before: Callable[[str], str] | None = None,
    static: dict[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Facts of each host (host_facts.py run there), gathered in parallel; `before(host)`:
    a command run first on that host in the same round trip (it must succeed). With
    `static` (a cache the caller keeps), a host's unchanging facts (kernel, modules, tool
    versions) are read on its first call only and taken from the cache after."""
    commands = {}
    for name in names:
        host = rack.host(name)
        words = [host.workdir, *host.interfaces]
        if static is not None and name in static:
            words.append("--changing")
        args = " ".join(shlex.quote(a) for a in words)
        first = f"{before(name)} && " if before else ""
        commands[name] = f"{first}python3 -c {shlex.quote(_FACTS_SOURCE)} {args}"
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
        lines.append(
            f"{name} (kernel {f['kernel']}): cc {' '.join(ccs)}; "
            f"qdiscs {' '.join(f.get('qdiscs') or []) or '?'}; "
            f"tracepoints {' '.join(trace) if trace else ('none' if trace == [] else '?')}"
        )
    return lines


def qdiscs_available(rack: Rack, hosts: list[str], names: set[str]) -> dict[str, set[str]]:
    """Which of the named qdiscs each host's kernel has (loaded, built in, or loadable)."""
    if not names or not hosts:
        return {h: set() for h in hosts}
    probe = "; ".join(
        f"(test -d /sys/module/sch_{q} || modprobe -n sch_{q}) >/dev/null 2>&1 && echo {q}"
        for q in sorted(names)
    )
    out = rack.run_parallel({h: probe + "; true" for h in hosts})
    return {h: set(text.split()) for h, text in out.items()}


def preflight(trials: list[Trial], rack: Rack, source: str) -> dict[str, dict[str, Any]]:
    """Raise SpecError listing every problem of the selected trials on this rack."""
    problems: list[str] = []
    needs_cc: dict[str, dict[str, str]] = {}  # host -> cc -> key that asks for it
    needs_params: dict[tuple[str, str], dict[str, str]] = {}  # (host, cc) -> param -> key
    needs_tools: dict[str, dict[str, str]] = {}  # host -> tool -> why
    needs_qdisc: dict[str, dict[str, str]] = {}  # host -> qdisc -> link
    max_rate = rack.vars.get("trialbed_max_rate")
    limit_from = f"trialbed_max_rate {max_rate}, measured"
    if measured := vm_max_rate(rack):  # the VM rack: its own calibration's number
        max_rate = measured
        limit_from = f"{measured}, measured by the VM rack's calibration at rack-up"
    for trial in trials:
        exp = trial.experiment
        try:
            net = resolve_network(exp, rack, source)
            settings = host_settings(exp, net, source)
        except RackError as exc:
            problems.append(str(exc))
            continue
        for i, gen in enumerate(exp.traffic):
            for node, tools in gen.tools().items():
                for tool in tools:
                    needs_tools.setdefault(net.host_of(node), {})[tool] = (
                        f"traffic[{i}] ({gen.type})"
                    )
            cc = getattr(gen, "cc", None)
            for node in gen.endpoints():
                chosen = cc or settings[node].cc
                if chosen:
                    key = f"traffic[{i}].cc" if cc else _cc_key(trial, exp, node)
                    needs_cc.setdefault(net.host_of(node), {})[chosen] = key
        for node, s in settings.items():
            for cc, params in s.cc_params.items():
                for param in params:
                    key = f"hosts.*.cc_params.{cc}.{param}"
                    needs_params.setdefault((net.host_of(node), cc), {})[param] = key
        for e in net.egress:
            for tool in SHAPING_TOOLS:
                needs_tools.setdefault(e.host, {})[tool] = f"link {e.link}"
            if e.shaping.qdisc != "droptail":
                needs_qdisc.setdefault(e.host, {})[e.shaping.qdisc] = e.link
            if max_rate and e.shaping.rate and e.shaping.rate > parse_rate(max_rate):
                problems.append(
                    f"{source}: link {e.link} ({e.direction}, {e.node}:{e.iface}): "
                    f"{format_rate(e.shaping.rate)} is beyond what this rack carries faithfully "
                    f"({limit_from}); scale the experiment's rates "
                    "down and say so in its description, or use a faster rack"
                )
        for node, s in settings.items():
            if s.pacing:
                needs_qdisc.setdefault(net.host_of(node), {})["fq"] = f"hosts.*.pacing ({node})"
        for c in net.captures:
            for tool in CAPTURE_TOOLS:
                needs_tools.setdefault(c.host, {})[tool] = f"capture {c.name}"
        for host, rules in net.marking.items():  # role dscp_marker renders an nftables table
            needs_tools.setdefault(host, {})["nft"] = f"network.marking ({rules[0]['name']})"

    hosts = sorted(set(needs_tools) | set(needs_cc) | {h for h, _ in needs_params})
    facts = host_facts(rack, hosts) if hosts else {}
    for host, ccs in needs_cc.items():
        f = facts[host]
        for cc, key in ccs.items():
            if cc not in f["cc_loaded"] and cc not in f["cc_modules"]:
                modules = ", ".join(f["cc_modules"]) or "none"
                problems.append(
                    f"{source}: key '{key}': {cc!r} is not available on host {host} "
                    f"(kernel {f['kernel']}): it has {', '.join(f['cc_loaded'])} (CC modules: "
                    f"{modules}). Remove it from the experiment (or pick trials without it "
                    "with --only) or use a rack whose kernel has it."
                )
    used_cc = {(h, cc) for h, ccs in needs_cc.items() for cc in ccs}
    for (host, cc), params in needs_params.items():
        have = facts[host]["cc_params"].get(cc)
        if have is None or (host, cc) not in used_cc:
            continue  # module not loaded yet (the role checks after loading) or not used
        for param, key in params.items():
            if param not in have:
                problems.append(
                    f"{source}: key '{key.replace('*', _layer_of(trials, cc, param))}': "
                    f"tcp_{cc} on host {host} has no such parameter; it has: "
                    f"{', '.join(sorted(have)) or 'none'}"
                )
    for host, tools in needs_tools.items():
        for tool, why in tools.items():
            if not facts[host]["tools"].get(tool):
                problems.append(
                    f"host {host} lacks {tool} (needed by {why}): install it (make setup, or "
                    f"{INSTALLED_BY.get(tool, INSTALLED_BY[''])})"
                )
    have_qdisc = qdiscs_available(
        rack, sorted(needs_qdisc), {q for d in needs_qdisc.values() for q in d}
    )
    for host, qdiscs in needs_qdisc.items():
        for qdisc, link in qdiscs.items():
            if qdisc not in have_qdisc[host]:
                kernel = facts.get(host, {}).get("kernel", "?")
                if link.startswith("hosts."):
                    problems.append(
                        f"{source}: key '{link}': pacing needs the fq qdisc, which is not in the "
                        f"kernel of host {host} ({kernel}); use traffic[].pacing (TCP's own "
                        "pacing, per flow) instead, or a rack whose kernel has sch_fq"
                    )
                    continue
                problems.append(
                    f"{source}: link {link}: qdisc {qdisc!r} is not in the kernel of host {host} "
                    f"({kernel}); use droptail here, or a rack whose kernel has sch_" + qdisc
                )
    for name, f in facts.items():
        if f["free_disk_bytes"] < MIN_FREE_DISK:
            problems.append(
                f"host {name}: only {f['free_disk_bytes'] / 1e6:.0f} MB free in "
                f"{rack.host(name).workdir}; captures need at least "
                f"{MIN_FREE_DISK / 1e6:.0f} MB"
            )
    if problems:
        have = "\n".join(f"  {line}" for line in available(facts))
        raise SpecError("\n".join(dict.fromkeys(problems)) + f"\nWhat the hosts have:\n{have}")
    return facts


def _cc_key(trial: Trial, exp, node: str) -> str:
    """The key a node's congestion control came from (a factor, or the hosts block)."""
    for key in trial.overrides:
        if key.startswith("hosts.") and key.endswith(".cc"):
            return f"factors.{key}"
    for layer in (node, "senders", "receivers", "all"):
        if layer in exp.hosts and exp.hosts[layer].cc:
            return f"hosts.{layer}.cc"
    return "hosts.cc"


def _layer_of(trials: list[Trial], cc: str, param: str) -> str:
    for trial in trials:
        for layer, s in trial.experiment.hosts.items():
            if param in s.cc_params.get(cc, {}):
                return layer
    return "all"
