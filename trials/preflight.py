"""Ask every host of the selected trials what it has, read-only, and refuse what it cannot
run faithfully: reachability over SSH (with what to check when it fails), congestion controls,
their module parameters, tools, queue disciplines, interfaces with their addresses and link
speed, each end's route to the other out of its experiment interface through the rack's next
hop, a FreeBSD router's kernel tick (kern.hz), rates beyond what the rack carries, free disk
for the captures the trials will write, and the clock offset between hosts whose captures are
compared (one declared clock domain)."""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import yaml

from core.rack import PROJECT_DIR, Rack, RackError
from core.units import format_rate, parse_duration_ns, parse_rate
from trials.generators import GENERATOR_TYPES
from trials.generators.base import TrialContext
from trials.network import (
    FREEBSD_GROUPS,
    CaptureSite,
    ResolvedNetwork,
    host_settings,
    resolve_network,
)
from trials.plan import Trial
from trials.rack_kind import vm_max_rate
from trials.spec import SpecError
from trials.watch import watch_timeout_s

_FACTS_SOURCE = (Path(__file__).with_name("host_facts.py")).read_text()
# host_facts.STATIC (that module runs on the hosts and is not imported here).
STATIC_FACTS = ("hostname", "kernel", "cc_modules", "qdiscs", "tracepoints", "tools", "siftr")
MIN_FREE_DISK = 200 * 10**6
# What a capture writes per packet: the capture role's snaplen (128) and pcap's 16-byte record
# header; packets are taken as 500 bytes on average (full-size data and 66-byte ACKs mixed).
CAPTURE_BYTES_PER_PACKET = 128 + 16
MEAN_PACKET_BYTES = 500
CLOCK_SAMPLES = 5
DEFAULT_MAX_CLOCK_OFFSET = "1ms"
SHAPING_TOOLS = ["tc"]
# A FreeBSD router (group freebsd_routers) shapes with ipfw and dummynet (roles/freebsd_router).
FREEBSD_SHAPING_TOOLS = ["ipfw"]
# Kernel modules of a link's qdisc where it is not sch_<qdisc> alone. rio: GRED in RIO mode,
# whose virtual queue a clsact (sch_ingress) egress filter sets: flower for IN, matchall OUT.
QDISC_MODULES = {"rio": ["sch_gred", "sch_ingress", "cls_flower", "cls_matchall"]}
CAPTURE_TOOLS = ["tcpdump"]
# The kernel tick roles/freebsd_router needs unless the inventory says otherwise (its default).
FREEBSD_ROUTER_HZ = yaml.safe_load(
    (PROJECT_DIR / "roles/freebsd_router/defaults/main.yml").read_text()
)["freebsd_router_kern_hz"]
# Which role installs a tool on a host of its own (the virtual rack shares make setup's).
INSTALLED_BY = {
    "gcc": "the transactions role with transactions_install_packages: true",
    "nft": "the dscp_marker role with dscp_marker_install_packages: true",
    "": "the testbed_host role with testbed_host_install_packages: true",
}
# What to do about a tool of FreeBSD's base system that a FreeBSD host lacks.
FREEBSD_TOOL_HINTS = {
    "ipfw": (
        "it is in FreeBSD's base system (/sbin/ipfw), which roles/freebsd_router needs with "
        "dummynet: restore it there, or make the host a Linux router (group linux_routers)"
    ),
}


def host_facts(
    rack: Rack,
    names: list[str],
    before: Callable[[str], str] | None = None,
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
        args = shlex.join(words)
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


def siftr_senders(exp, net: ResolvedNetwork, rack: Rack) -> dict[str, str]:
    """FreeBSD sender host -> the generator whose TCP cwnd SIFTR records there (the runner's
    recorders: TrialRunner.tcp_senders)."""
    if not any(runs_freebsd(rack, net.host_of(spec.from_)) for spec in exp.traffic):
        return {}
    ctx = TrialContext(rack=rack, network=net, daemons=None, duration_ns=exp.duration)  # type: ignore[arg-type]
    out: dict[str, str] = {}
    names = exp.generator_names()
    for i, (spec, name) in enumerate(zip(exp.traffic, names, strict=True)):
        if not runs_freebsd(rack, net.host_of(spec.from_)):
            continue
        g = GENERATOR_TYPES[spec.type](spec, name, i, ctx)
        if g.records_cwnd and g.record().get("proto") == 6:
            out.setdefault(g.sender, f"traffic[{i}] ({spec.type})")
    return out


def kernel_modules(qdisc: str) -> list[str]:
    """The kernel modules a link's qdisc needs (rio: GRED, clsact, flower and matchall)."""
    return QDISC_MODULES.get(qdisc, [f"sch_{qdisc}"])


def qdiscs_available(rack: Rack, hosts: list[str], names: set[str]) -> dict[str, set[str]]:
    """Which of the named qdiscs each host's kernel has (every module it needs loaded, built
    in, or loadable)."""
    if not names or not hosts:
        return {h: set() for h in hosts}
    # { ...; } groups, never "((": the shell would read that as arithmetic.
    probe = "; ".join(
        "{ "
        + " && ".join(
            f"{{ test -d /sys/module/{m} || modprobe -n {m}; }}" for m in kernel_modules(q)
        )
        + f"; }} >/dev/null 2>&1 && echo {q}"
        for q in sorted(names)
    )
    out = rack.run_parallel({h: probe + "; true" for h in hosts})
    return {h: set(text.split()) for h, text in out.items()}


def preflight(
    trials: list[Trial],
    rack: Rack,
    source: str,
    results: Path | None = None,
    static: dict[str, dict[str, Any]] | None = None,
    plan_trials: list[Trial] | None = None,
) -> dict[str, dict[str, Any]]:
    """Raise SpecError listing every problem of the selected trials on this rack (and, given
    the results directory, on the controller's disk that receives their captures).
    `plan_trials`: every trial of their plan (the runner configures the congestion controls
    the whole plan selects on a host; default: the selected ones). `static`:
    host_facts' cache of unchanging facts, filled here for the trials that follow."""
    watch_timeout_s(rack)  # a malformed rack setting stops here, before any host is asked
    problems: list[str] = []
    batch_volume = 0.0  # every capture of every selected trial, brought back to `results`
    needs_cc: dict[str, dict[str, str]] = {}  # host -> cc -> key that asks for it
    needs_params: dict[tuple[str, str], dict[str, str]] = {}  # (host, cc) -> param -> key
    needs_tools: dict[str, dict[str, str]] = {}  # host -> tool -> why
    needs_qdisc: dict[str, dict[str, str]] = {}  # host -> qdisc -> link
    needs_siftr: dict[str, str] = {}  # FreeBSD sender host -> generator whose cwnd it records
    needs_disk: dict[str, dict[str, float]] = {}  # host -> capture point -> bytes it writes
    needs_speed: dict[tuple[str, str], tuple[int, str]] = {}  # (host, iface) -> (rate, link)
    needs_route: dict[str, dict[str, Route]] = {}  # host -> address -> the route it needs
    unapplied: dict[tuple[str, str], str] = {}  # (layer, cc) -> cc_params no role would set
    host_ccs = own_ccs(plan_trials or trials, rack, source)
    needs_hz: set[str] = set()  # FreeBSD routers that shape a link (dummynet's tick)
    clocks: dict[str, set[str]] = {}  # declared clock domain -> hosts that capture in it
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
            try:
                for host, route in expected_routes(net, gen.endpoints(), f"traffic[{i}]"):
                    needs_route.setdefault(host, {}).setdefault(route.address, route)
            except RackError as exc:
                problems.append(str(exc))
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
            given = [n for n in gen.endpoints() if settings[n].cc_params.get(cc or "")]
            if cc and given and not any(cc in host_ccs.get(n, ()) for n in gen.endpoints()):
                # The roles set the module parameters of the congestion controls the plan
                # selects for a host (testbed_host_cc, and testbed_host_cc_choices when it
                # switches between several), never of one only a flow selects (iperf3 -C).
                node = given[0]
                layer = _params_layer(exp, node, cc)
                unapplied.setdefault(
                    (layer, cc),
                    f"{source}: key 'hosts.{layer}.cc_params.{cc}': {cc} runs only as "
                    f"traffic[{i}]'s own congestion control (traffic[{i}].cc) and no trial "
                    f"selects it for host {node} (hosts.*.cc); module parameters are set only "
                    f"for a host's congestion control, so these would not apply. Select it for "
                    f"the host (hosts.{node}.cc: {cc}) or remove them",
                )
        for node, s in settings.items():
            for cc, params in s.cc_params.items():
                for param in params:
                    key = f"hosts.*.cc_params.{cc}.{param}"
                    needs_params.setdefault((net.host_of(node), cc), {})[param] = key
        for host, why in siftr_senders(exp, net, rack).items():
            needs_siftr.setdefault(host, why)
        for e in net.egress:
            shaping_tools = FREEBSD_SHAPING_TOOLS if runs_freebsd(rack, e.host) else SHAPING_TOOLS
            for tool in shaping_tools:
                needs_tools.setdefault(e.host, {})[tool] = f"link {e.link}"
            if "freebsd_routers" in rack.host(e.host).groups:
                needs_hz.add(e.host)
            if e.shaping.rate and e.shaping.rate > needs_speed.get((e.host, e.iface), (0,))[0]:
                needs_speed[(e.host, e.iface)] = (e.shaping.rate, e.link)
            if e.shaping.qdisc != "droptail":
                needs_qdisc.setdefault(e.host, {})[e.shaping.qdisc] = e.link
            if e.shaping.rio and e.shaping.rio.high and runs_freebsd(rack, e.host):
                problems.append(
                    f"{source}: key 'network.links[{e.link}].rio.high': host {e.host} is a "
                    "FreeBSD router, whose approximation of RIO has two dummynet queues (IN, "
                    "OUT); a third drop level needs a Linux router (GRED)"
                )
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
            clocks.setdefault(c.clock, set()).add(c.host)
            volume = capture_bytes(net, c, exp.duration + exp.drain)
            batch_volume += volume
            if volume > needs_disk.get(c.host, {}).get(c.name, 0):
                needs_disk.setdefault(c.host, {})[c.name] = volume
        for host, rules in net.marking.items():  # role dscp_marker renders an nftables table
            needs_tools.setdefault(host, {})["nft"] = f"network.marking ({rules[0]['name']})"

    problems += list(unapplied.values())
    hosts = sorted(
        set(needs_tools) | set(needs_cc) | {h for h, _ in needs_params} | set(needs_route)
    )
    answered, unreachable = reachability(rack, hosts)
    problems += unreachable
    for gone in set(hosts) - set(answered):  # nothing more can be asked of them
        for needs in (needs_tools, needs_cc, needs_qdisc, needs_disk, needs_siftr, needs_route):
            needs.pop(gone, None)
        needs_hz.discard(gone)
        needs_params = {k: v for k, v in needs_params.items() if k[0] != gone}
        needs_speed = {k: v for k, v in needs_speed.items() if k[0] != gone}
        clocks = {d: members - {gone} for d, members in clocks.items()}
    hosts = answered
    routes = {h: sorted(needs_route.get(h, {})) for h in hosts}
    facts = host_facts(rack, hosts, static=static, route_to=routes) if hosts else {}
    for host in hosts:
        for iface, itf in rack.host(host).interfaces.items():
            if facts[host]["mtu"].get(iface) is None:
                problems.append(
                    f"host {host} has no interface {iface!r} (trialbed_interfaces in "
                    f"{', '.join(map(str, rack.inventory))}); it has: "
                    f"{', '.join(facts[host].get('interfaces') or []) or '?'}"
                )
                continue
            has = (facts[host].get("addresses") or {}).get(iface)
            if has is not None and str(itf) not in has:
                problems.append(
                    f"host {host}: interface {iface} lacks the address {itf} that "
                    f"trialbed_interfaces gives it ({', '.join(map(str, rack.inventory))}); it has "
                    f"{', '.join(has) or 'no IPv4 address'}: set the address on the host "
                    "(its own network configuration) or correct the inventory"
                )
        for route in needs_route.get(host, {}).values():
            problems += route_problems(host, route, facts[host].get("route_to"))
    for host in sorted(needs_hz):
        hz = facts[host].get("sysctls", {}).get("kern.hz")
        want = int(rack.host(host).vars.get("freebsd_router_kern_hz", FREEBSD_ROUTER_HZ))
        if hz is not None and int(hz) != want:
            problems.append(
                f"host {host} runs kern.hz={hz}; dummynet delays are whole ticks, and "
                f"roles/freebsd_router needs {want} (freebsd_router_kern_hz): run make "
                f"configure INVENTORY=... (it writes kern.hz to /boot/loader.conf), then "
                f"reboot {host}"
            )
    for (host, iface), (rate, link) in needs_speed.items():
        speed = facts[host].get("speed", {}).get(iface)
        if speed and speed * 10**6 < rate:
            problems.append(
                f"{source}: link {link}: {format_rate(rate)} out of {host}:{iface}, whose NIC "
                f"runs at {speed} Mbit/s ({'ifconfig' if runs_freebsd(rack, host) else 'ethtool'} "
                f"{iface}); the shaper cannot send faster "
                "than the wire: lower the rate or use a faster port"
            )
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
                if tool in FREEBSD_TOOL_HINTS and runs_freebsd(rack, host):
                    problems.append(
                        f"host {host} lacks {tool} (needed by {why}): {FREEBSD_TOOL_HINTS[tool]}"
                    )
                    continue
                problems.append(
                    f"host {host} lacks {tool} (needed by {why}): install it (the virtual "
                    f"rack: make setup; a lab rack: {INSTALLED_BY.get(tool, INSTALLED_BY[''])}, "
                    "which make configure INVENTORY=... runs)"
                )
    for host, why in needs_siftr.items():
        if facts[host].get("siftr") is False:
            problems.append(
                f"host {host} runs FreeBSD and has no SIFTR (siftr(4): not loaded, no siftr.ko), "
                f"which records the cwnd of {why} there: load it (kldload siftr) or use a "
                "kernel that has it"
            )
    bsd_qdisc = {h: d for h, d in needs_qdisc.items() if runs_freebsd(rack, h)}
    linux_qdisc = {h: d for h, d in needs_qdisc.items() if h not in bsd_qdisc}
    have_qdisc = qdiscs_available(
        rack, sorted(linux_qdisc), {q for d in linux_qdisc.values() for q in d}
    )
    problems += freebsd_qdisc_problems(source, bsd_qdisc, facts)
    for host, qdiscs in linux_qdisc.items():
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
                needed = kernel_modules(qdisc)
                modules = ", ".join(needed[:-1]) + " and " + needed[-1] if needed[1:] else needed[0]
                vm = (
                    ""
                    if rack.vars.get("trialbed_rack_kind") == "vm"
                    else " (RACK=vm: the VM rack, whose Debian kernel has them)"
                )
                problems.append(
                    f"{source}: link {link}: qdisc {qdisc!r} is not in the kernel of host {host} "
                    f"({kernel}): it needs {modules}; use droptail here, or a rack whose "
                    f"kernel has {'them' if needed[1:] else 'it'}{vm}"
                )
    for name, f in facts.items():
        points = needs_disk.get(name, {})
        written = sum(points.values())  # a trial's capture points on a host write at once
        need = max(MIN_FREE_DISK, int(2 * written))
        if f["free_disk_bytes"] < need:
            why = (
                f"the captures at {', '.join(sorted(points))} write up to "
                f"{written / 1e6:.0f} MB in one trial, and twice that is kept free"
                if need > MIN_FREE_DISK
                else f"captures need at least {MIN_FREE_DISK / 1e6:.0f} MB"
            )
            problems.append(
                f"host {name}: only {f['free_disk_bytes'] / 1e6:.0f} MB free in "
                f"{rack.host(name).workdir}/trials (where trialbed_dir's trials land); {why}: "
                "free space there, mount a larger disk there or point trialbed_dir at one"
            )
    problems += clock_problems(rack, clocks)
    if results is not None:
        problems += results_disk_problems(results, batch_volume, len(trials))
    if problems:
        have = "\n".join(f"  {line}" for line in available(facts))
        said = "\n".join(dict.fromkeys(problems))
        raise SpecError(said + (f"\nWhat the hosts have:\n{have}" if facts else ""))
    return facts


@dataclass(frozen=True)
class Route:
    """The route a host needs to an address for the experiment's traffic: out of its
    experiment interface ``dev``, through ``gateway`` (``via``, a rack host) or, with
    gateway None, straight to the address on that interface's subnet."""

    address: str
    dev: str
    gateway: str | None
    via: str | None
    why: str


def expected_routes(
    net: ResolvedNetwork, endpoints: tuple[str, str], why: str
) -> list[tuple[str, Route]]:
    """The routes every host on the rack's path between two ends takes to the far end, both
    ways (data one way, ACKs or replies the other): each hop (ResolvedNetwork.path) leaves
    through its interface towards the next host's address on that interface's subnet, the
    last straight to the far end. Routers included: on a lab rack with two routers the first
    needs a route to the far segment via the second, which no role sets."""
    out = []
    if net.host_of(endpoints[0]) == net.host_of(endpoints[1]):
        return out  # both ends on one host: no route between them to check
    for here, there in (endpoints, endpoints[::-1]):
        hops = net.path(here, there)
        address = str(net.address_of(there))
        for (host, dev), following in zip(hops, [*hops[1:], None], strict=True):
            gateway = via = None
            if following is not None:
                via = following[0]
                subnet = net.hosts[host].interfaces[dev].network
                gateway = next(
                    str(i.ip) for i in net.hosts[via].interfaces.values() if i.network == subnet
                )
            out.append((host, Route(address, dev, gateway, via, f"{there}, {why}")))
    return out


def route_problems(host: str, need: Route, found: dict[str, Any] | None) -> list[str]:
    """What is wrong with the route host's kernel picks to need.address (facts' route_to;
    None where the host has no command to ask)."""
    if found is None:
        return []
    got = found.get(need.address)
    hop = f"via {need.via} ({need.gateway}) " if need.gateway else ""
    fix = f"the host's own network configuration needs a route to {need.address} {hop}on {need.dev}"
    if got is None:
        return [f"host {host} has no route to {need.address} ({need.why}): {fix}"]
    if got.get("dev") != need.dev:
        return [
            f"host {host}'s route to {need.address} ({need.why}) leaves through "
            f"{got.get('dev')}, not its experiment interface {need.dev}: the traffic would "
            f"bypass the rack's links; {fix}"
        ]
    if got.get("gateway") != need.gateway:
        went = f"via {got['gateway']}" if got.get("gateway") else "straight to it"
        return [
            f"host {host}'s route to {need.address} ({need.why}) goes {went} on {need.dev}, "
            f"not {hop.strip() or 'straight to it'}: the traffic would miss the rack's path; "
            f"{fix}"
        ]
    return []


def freebsd_qdisc_problems(
    source: str, needs: dict[str, dict[str, str]], facts: dict[str, dict[str, Any]]
) -> list[str]:
    """The qdiscs FreeBSD hosts lack: a router has the dummynet AQMs its facts list
    (host_facts.DUMMYNET_AQMS, none without dummynet); fq pacing is Linux's only."""
    problems = []
    for host, qdiscs in needs.items():
        f = facts.get(host, {})
        have = f.get("qdiscs") or []
        kernel = f.get("kernel", "?")
        for qdisc, link in qdiscs.items():
            if link.startswith("hosts."):
                problems.append(
                    f"{source}: key '{link}': pacing needs Linux's fq qdisc and host {host} runs "
                    f"FreeBSD ({kernel}), which roles/freebsd_host refuses pacing on; use "
                    "traffic[].pacing instead, or a Linux host"
                )
            elif qdisc not in have:
                offers = (
                    f"its dummynet offers {', '.join(have)}"
                    if have
                    else "dummynet is neither loaded nor loadable there (kldstat -m dummynet)"
                )
                problems.append(
                    f"{source}: link {link}: qdisc {qdisc!r} is not available on the FreeBSD "
                    f"host {host} ({kernel}): {offers}; use droptail or one of those here, or a "
                    "Linux router"
                )
    return problems


def own_ccs(trials: list[Trial], rack: Rack, source: str) -> dict[str, set[str]]:
    """Per node, the congestion controls the trials select as its host's own (hosts.*.cc)."""
    out: dict[str, set[str]] = {}
    for t in trials:
        if t.error or t.experiment is None:
            continue
        try:
            net = resolve_network(t.experiment, rack, source)
            settings = host_settings(t.experiment, net, source)
        except (SpecError, RackError):
            continue  # that trial's own problem, named where it is checked
        for node, s in settings.items():
            if s.cc:
                out.setdefault(node, set()).add(s.cc)
    return out


def _params_layer(exp, node: str, cc: str) -> str:
    """The hosts layer that gives `node` its cc_params of `cc`: the node's own, else a group
    (senders, receivers, an inventory group), else all."""
    layers = [layer for layer, s in exp.hosts.items() if cc in s.cc_params]
    for layer in (node, *(x for x in layers if x not in (node, "all")), "all"):
        if layer in layers:
            return layer
    return "all"


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


def results_disk_problems(results: Path, volume: float, trials: int) -> list[str]:
    """The controller's disk under `results` must hold what the trials bring back: their
    captures (`volume`, at most), with MIN_FREE_DISK as a floor."""
    existing = results.resolve()
    while not existing.exists():  # it is made by the run
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    need = max(MIN_FREE_DISK, int(volume))
    if free >= need:
        return []
    return [
        f"results {results}: only {free / 1e6:.0f} MB free on its disk; the {trials} trial(s) "
        f"bring back up to {volume / 1e6:.0f} MB of captures (at least "
        f"{MIN_FREE_DISK / 1e6:.0f} MB must be free): free space there or give --results "
        "a larger disk"
    ]


def capture_bytes(net: ResolvedNetwork, site: CaptureSite, duration_ns: int) -> float:
    """What a capture point writes in one trial, at most: both directions through its
    interface for the whole trial, CAPTURE_BYTES_PER_PACKET per MEAN_PACKET_BYTES on the wire.
    A direction without a rate of its own counts at the fastest rate of the experiment (its
    traffic crosses a shaped link somewhere); with no rate anywhere, 0 (MIN_FREE_DISK
    applies)."""
    fastest = max((e.shaping.rate or 0 for e in net.egress), default=0)
    out = net.shaping_of(site.host, site.iface)
    inbound = [e for e in net.egress if e.peer == site.node and (out is None or e.link == out.link)]
    rates = [
        out.shaping.rate if out and out.shaping.rate else fastest,
        inbound[0].shaping.rate if len(inbound) == 1 and inbound[0].shaping.rate else fastest,
    ]
    return sum(rates) * duration_ns / 1e9 / 8 / MEAN_PACKET_BYTES * CAPTURE_BYTES_PER_PACKET


def reachability(rack: Rack, names: list[str]) -> tuple[list[str], list[str]]:
    """Run `true` on every host at once: the hosts that answered, and one line per host that
    did not, saying what to check."""
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        futures = {n: pool.submit(rack.run, n, "true", timeout=30) for n in names}
    answered, problems = [], []
    for name, future in futures.items():
        try:
            future.result()
            answered.append(name)
        except RackError as exc:
            problems.append(ssh_problem(rack, name, exc))
    return answered, problems


def ssh_problem(rack: Rack, name: str, exc: RackError) -> str:
    """What went wrong reaching a host over SSH, and what to check."""
    host = rack.host(name)
    ssh = host.ssh
    port = f":{ssh.port}" if ssh.port not in (None, 22) else ""
    through = (
        f" through {', '.join(h.host for h in ssh.jump)} (ProxyJump)"
        if ssh.jump
        else (f" through ProxyCommand {ssh.proxy_command!r}" if ssh.proxy_command else "")
    )
    where = f"host {name} ({host.user}@{host.address}{port}{through})"
    cause = exc.__cause__
    key = ssh.key
    if isinstance(cause, paramiko.AuthenticationException):
        return (
            f"{where}: the SSH key {key or '(none: set ansible_ssh_private_key_file)'} was "
            f"refused. Check that {key + '.pub' if key else 'its public key'} is in "
            f"~{host.user}/.ssh/authorized_keys there, and that sshd may read it: with "
            "StrictModes it refuses keys below a group- or world-writable directory (a rack "
            "whose checkout is under /tmp)"
        )
    known = host.vars.get("trialbed_known_hosts") or ssh.known_hosts
    if isinstance(cause, FileNotFoundError):
        return (
            f"{where}: {cause.filename} does not exist (trialbed_known_hosts or "
            "ansible_ssh_private_key_file in the inventory): write it first, e.g. "
            f"ssh-keyscan {host.address} >> {known or '~/.ssh/known_hosts'} for the host key"
        )
    if "not found in known_hosts" in str(cause):  # paramiko's RejectPolicy: an unknown key
        port = f"-p {ssh.port} " if ssh.port else ""
        return (
            f"{where}: its host key is in none of "
            f"{known or '~/.ssh/known_hosts, /etc/ssh/ssh_known_hosts'}, and Ansible's "
            f"host_key_checking refuses an unknown key: add it (ssh-keyscan {port}"
            f"{host.address} >> {known or '~/.ssh/known_hosts'}, once you trust it), or turn "
            "host_key_checking off for Ansible and the runner alike"
        )
    if isinstance(cause, paramiko.BadHostKeyException) or "known_hosts" in str(cause):
        return (
            f"{where}: its host key is not the one in {known or 'known_hosts'}. If the host was "
            "reinstalled, remove its old line there and add the new key (ssh-keyscan); "
            "otherwise something else answers at that address"
        )
    return (
        f"{where} is unreachable over SSH ({cause or exc}). Check the address (ansible_host), "
        f"that the host is up and its sshd listens (port {ssh.port or 22}: ansible_port), "
        + ("the jump host or proxy, " if through else "")
        + "and the management network"
    )


def clock_offset(rack: Rack, name: str) -> tuple[int, int]:
    """The host's clock minus the controller's, and the uncertainty (half the round trip of the
    quickest of CLOCK_SAMPLES reads), in ns. The reads run in one shell loop over one SSH
    channel (a new command per read would cost an exec and a shell each: hundreds of ms on a
    loaded controller); the read is trialbed_clock_read (default `date +%s%N`), for a host
    whose clock is read otherwise."""
    read = rack.host(name).vars.get("trialbed_clock_read", "date +%s%N")
    conn = rack.connection(name)
    conn.open()
    loop = rack.host(name).command(f"while read -r _; do {read}; done")
    stdin, stdout, _ = conn.client.exec_command(loop, timeout=30)
    best: tuple[int, int] | None = None
    try:
        for _ in range(CLOCK_SAMPLES + 1):  # the first read waits for the shell to start
            sent = time.time_ns()
            stdin.write("\n")
            stdin.flush()
            line = stdout.readline()
            back = time.time_ns()
            try:
                remote = int(line.split()[0])
            except (IndexError, ValueError):
                raise RackError(
                    f"{name}: the clock read {read!r} (trialbed_clock_read) printed {line!r}, "
                    "not nanoseconds since the epoch"
                ) from None
            sample = (remote - (sent + back) // 2, (back - sent) // 2)
            if best is None or sample[1] < best[1]:
                best = sample
    finally:
        stdin.close()
    assert best is not None
    return best


def clock_problems(rack: Rack, clocks: dict[str, set[str]]) -> list[str]:
    """Hosts that capture in one declared clock domain must read the same time: one line per
    host whose offset from the domain's median host is beyond trialbed_max_clock_offset by
    more than the measurement's uncertainty."""
    text = str(rack.vars.get("trialbed_max_clock_offset", DEFAULT_MAX_CLOCK_OFFSET))
    limit = parse_duration_ns(text)
    problems = []
    for domain, members in sorted(clocks.items()):
        if len(members) < 2:
            continue
        names = sorted(members)
        with ThreadPoolExecutor(max_workers=len(names)) as pool:
            offsets = dict(
                zip(names, pool.map(lambda n: clock_offset(rack, n), names), strict=True)
            )
        by_offset = sorted(names, key=lambda n: offsets[n][0])
        ref = by_offset[(len(by_offset) - 1) // 2]
        ref_off, ref_unc = offsets[ref]
        for name in names:
            off, unc = offsets[name]
            diff, within = off - ref_off, unc + ref_unc
            if name != ref and abs(diff) - within > limit:
                problems.append(
                    f"hosts {ref} and {name} capture in clock domain {domain!r}, but {name}'s "
                    f"clock is {diff / 1e6:+.2f} ms off {ref}'s (\u00b1{within / 1e6:.2f} ms, "
                    f"read over SSH), beyond trialbed_max_clock_offset {text}: discipline both "
                    "to one clock (chrony against one server, or PTP with hardware timestamps), "
                    "or give them clock domains of their own (one-way delays between their "
                    "captures are then not computed)"
                )
    return problems
