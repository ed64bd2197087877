"""The preflight checks, one row each in CHECKS: what each reads from a selected trial (its
`need`) and how it judges what the hosts answered (its `judge`). Adding a check is writing
those two small functions and adding its row; the rows run in the table's order."""

from __future__ import annotations

import yaml

from core import rio_bpf
from core.rack import PROJECT_DIR, RackError
from core.units import format_rate, parse_rate
from trials.bpf_cc import BUILD_TOOLS, bpf_cc_problem
from trials.preflight.cc import cc_key, layer_of, params_layer, siftr_senders
from trials.preflight.clocks import clock_problems
from trials.preflight.context import Check, Context, TrialView, Wants
from trials.preflight.disk import (
    MIN_FREE_DISK,
    capture_bytes,
    results_disk_problems,
    trial_capture_bytes,
)
from trials.preflight.facts import kernel_modules, qdiscs_available
from trials.preflight.marker_load import markers_keep_up
from trials.preflight.rio import (
    missing_rio_implementation,
    need_rio_implementation,
    rio_bpf_lacks,
)
from trials.preflight.routes import expected_routes, route_problems

SHAPING_TOOLS = ["tc"]
# A FreeBSD router (group freebsd_routers) shapes with ipfw and dummynet (roles/freebsd_router).
FREEBSD_SHAPING_TOOLS = ["ipfw"]
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


# -- what the trials show by themselves ------------------------------------------------------


def flows_own_cc_params(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """Module parameters of a congestion control that only a flow selects (iperf3 -C): the
    roles set those of the congestion controls the plan selects for a host (testbed_host_cc,
    and testbed_host_cc_choices when it switches between several), so these would not apply."""
    problems = []
    for i, gen in enumerate(view.exp.traffic):
        cc = getattr(gen, "cc", None)
        given = [n for n in gen.endpoints() if view.settings[n].cc_params.get(cc or "")]
        if not cc or not given or any(cc in ctx.host_ccs.get(n, ()) for n in gen.endpoints()):
            continue
        node = given[0]
        layer = params_layer(view.exp, node, cc)
        if ctx.first_time(("flows_own_cc_params", layer, cc)):
            problems.append(
                f"{ctx.source}: key 'hosts.{layer}.cc_params.{cc}': {cc} runs only as "
                f"traffic[{i}]'s own congestion control (traffic[{i}].cc) and no trial "
                f"selects it for host {node} (hosts.*.cc); module parameters are set only "
                f"for a host's congestion control, so these would not apply. Select it for "
                f"the host (hosts.{node}.cc: {cc}) or remove them"
            )
    return problems


def rio_levels_on_freebsd(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """A third RIO drop level (rio.high) on a FreeBSD router, whose RIO has two queues."""
    return [
        f"{ctx.source}: key 'network.links[{e.link}].rio.high': host {e.host} is a "
        "FreeBSD router, whose approximation of RIO has two dummynet queues (IN, "
        "OUT); a third drop level needs a Linux router (GRED)"
        for e in view.net.egress
        if e.shaping.rio and e.shaping.rio.high and ctx.freebsd(e.host)
    ]


def rates_the_rack_carries(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """A link rate beyond what the rack carries faithfully (Context.rate_limit)."""
    problems = []
    for e in view.net.egress:
        if not e.shaping.rate:
            continue
        max_rate, limit_from = ctx.rate_limit
        if max_rate and e.shaping.rate > parse_rate(max_rate):
            problems.append(
                f"{ctx.source}: link {e.link} ({e.direction}, {e.node}:{e.iface}): "
                f"{format_rate(e.shaping.rate)} is beyond what this rack carries faithfully "
                f"({limit_from}); scale the experiment's rates "
                "down and say so in its description, or use a faster rack"
            )
    return problems


# -- what each host must have ----------------------------------------------------------------


def need_routes(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """host -> address -> Route: every host on the path between a flow's ends, both ways."""
    problems = []
    for i, gen in enumerate(view.exp.traffic):
        try:
            for host, route in expected_routes(view.net, gen.endpoints(), f"traffic[{i}]"):
                wants.setdefault(host, {}).setdefault(route.address, route)
        except RackError as exc:
            problems.append(str(exc))
    return problems


def host_networks(ctx: Context, wants: Wants) -> list[str]:
    """Each answering host's own network configuration, host by host: the interfaces the
    inventory gives it, with their addresses, then the routes the trials' paths need."""
    problems = []
    for host in sorted(ctx.facts):
        problems += interface_problems(ctx, host)
        for route in wants.get(host, {}).values():
            problems += route_problems(host, route, ctx.facts[host].get("route_to"))
    return problems


def interface_problems(ctx: Context, host: str) -> list[str]:
    """Every interface the inventory gives the host exists there, with its address."""
    problems = []
    f = ctx.facts[host]
    for iface, itf in ctx.rack.host(host).interfaces.items():
        if f["mtu"].get(iface) is None:
            problems.append(
                f"host {host} has no interface {iface!r} (trialbed_interfaces in "
                f"{inventory_files(ctx)}); it has: {', '.join(f.get('interfaces') or []) or '?'}"
            )
            continue
        has = (f.get("addresses") or {}).get(iface)
        if has is not None and str(itf) not in has:
            problems.append(
                f"host {host}: interface {iface} lacks the address {itf} that "
                f"trialbed_interfaces gives it ({inventory_files(ctx)}); it has "
                f"{', '.join(has) or 'no IPv4 address'}: set the address on the host "
                "(its own network configuration) or correct the inventory"
            )
    return problems


def inventory_files(ctx: Context) -> str:
    return ", ".join(map(str, ctx.rack.inventory))


def need_kernel_tick(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """host -> links it shapes: the FreeBSD routers, whose dummynet delays are whole ticks."""
    for e in view.net.egress:
        if "freebsd_routers" in ctx.rack.host(e.host).groups:
            wants.setdefault(e.host, set()).add(e.link)
    return []


def wrong_kernel_tick(ctx: Context, wants: Wants) -> list[str]:
    problems = []
    for host in sorted(wants):
        hz = ctx.facts[host].get("sysctls", {}).get("kern.hz")
        want = int(ctx.rack.host(host).vars.get("freebsd_router_kern_hz", FREEBSD_ROUTER_HZ))
        if hz is not None and int(hz) != want:
            problems.append(
                f"host {host} runs kern.hz={hz}; dummynet delays are whole ticks, and "
                f"roles/freebsd_router needs {want} (freebsd_router_kern_hz): run make "
                f"configure INVENTORY=... (it writes kern.hz to /boot/loader.conf), then "
                f"reboot {host}"
            )
    return problems


def need_link_speed(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """host -> interface -> (the fastest rate shaped out of it, its link)."""
    for e in view.net.egress:
        fastest = wants.get(e.host, {}).get(e.iface, (0, ""))[0]
        if e.shaping.rate and e.shaping.rate > fastest:
            wants.setdefault(e.host, {})[e.iface] = (e.shaping.rate, e.link)
    return []


def slow_links(ctx: Context, wants: Wants) -> list[str]:
    problems = []
    for host, ifaces in wants.items():
        for iface, (rate, link) in ifaces.items():
            speed = ctx.facts[host].get("speed", {}).get(iface)
            if speed and speed * 10**6 < rate:
                tool = "ifconfig" if ctx.freebsd(host) else "ethtool"
                problems.append(
                    f"{ctx.source}: link {link}: {format_rate(rate)} out of {host}:{iface}, "
                    f"whose NIC runs at {speed} Mbit/s ({tool} {iface}); the shaper cannot "
                    "send faster than the wire: lower the rate or use a faster port"
                )
    return problems


def need_cc(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """host -> {"cc": {cc: the key that selects it}, "params": {cc: {param: key}}}."""

    def of(node: str) -> dict[str, dict]:
        return wants.setdefault(view.net.host_of(node), {"cc": {}, "params": {}, "impl": {}})

    for i, gen in enumerate(view.exp.traffic):
        cc = getattr(gen, "cc", None)
        for node in gen.endpoints():
            if chosen := cc or view.settings[node].cc:
                key = f"traffic[{i}].cc" if cc else cc_key(view.trial, view.exp, node)
                of(node)["cc"][chosen] = key
                if impl := view.settings[node].cc_implementation:
                    impl_key = cc_key(view.trial, view.exp, node, "cc_implementation")
                    of(node)["impl"][chosen] = (impl, impl_key)
    for node, s in view.settings.items():
        for cc, params in s.cc_params.items():
            for param in params:
                of(node)["params"].setdefault(cc, {})[param] = f"hosts.*.cc_params.{cc}.{param}"
    return []


def missing_cc(ctx: Context, wants: Wants) -> list[str]:
    """Congestion controls a host's kernel lacks (or lacks as the implementation asked for),
    then module parameters its loaded module lacks (one not loaded yet is checked by the role
    after loading it)."""
    problems = []
    for host, want in wants.items():
        f = ctx.facts[host]
        for cc, key in want["cc"].items():
            impl, impl_key = want.get("impl", {}).get(cc, ("auto", None))
            if impl != "auto" and (problem := bpf_cc_problem(f, cc, impl)):
                problems.append(
                    f"{ctx.source}: key '{impl_key}': {cc!r} cannot run as {impl} on host "
                    f"{host}: {problem}."
                )
                continue
            if problem := bpf_cc_problem(f, cc):
                modules = ", ".join(f["cc_modules"]) or "none"
                problems.append(
                    f"{ctx.source}: key '{key}': {cc!r} is not available on host {host}: "
                    f"{problem}. It has {', '.join(f['cc_loaded'])} (CC modules: {modules}). "
                    "Remove it from the experiment (or pick trials without it with --only) or "
                    "use a rack whose kernel has it."
                )
    for host, want in wants.items():
        for cc, params in want["params"].items():
            have = ctx.facts[host]["cc_params"].get(cc)
            if have is None or cc not in want["cc"]:
                continue
            for param, key in params.items():
                if param not in have:
                    problems.append(
                        f"{ctx.source}: key '{key.replace('*', layer_of(ctx.trials, cc, param))}'"
                        f": tcp_{cc} on host {host} has no such parameter; it has: "
                        f"{', '.join(sorted(have)) or 'none'}"
                    )
    return problems


def need_tools(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """host -> tool -> what needs it: the generators', the shapers', the captures' and the
    DSCP marker's (role dscp_marker renders an nftables table)."""
    for i, gen in enumerate(view.exp.traffic):
        for node, tools in gen.tools().items():
            for tool in tools:
                wants.setdefault(view.net.host_of(node), {})[tool] = f"traffic[{i}] ({gen.type})"
    for e in view.net.egress:
        for tool in FREEBSD_SHAPING_TOOLS if ctx.freebsd(e.host) else SHAPING_TOOLS:
            wants.setdefault(e.host, {})[tool] = f"link {e.link}"
    for c in view.net.captures:
        for tool in CAPTURE_TOOLS:
            wants.setdefault(c.host, {})[tool] = f"capture {c.name}"
    for host, rules in view.net.marking.items():
        wants.setdefault(host, {})["nft"] = f"network.marking ({rules[0]['name']})"
    return []


def missing_tools(ctx: Context, wants: Wants) -> list[str]:
    problems = []
    for host, tools in wants.items():
        for tool, why in tools.items():
            if ctx.facts[host]["tools"].get(tool):
                continue
            if tool in FREEBSD_TOOL_HINTS and ctx.freebsd(host):
                fix = FREEBSD_TOOL_HINTS[tool]
            else:
                fix = (
                    f"install it (the virtual rack: make setup; a lab rack: "
                    f"{INSTALLED_BY.get(tool, INSTALLED_BY[''])}, which make configure "
                    "INVENTORY=... runs)"
                )
            problems.append(f"host {host} lacks {tool} (needed by {why}): {fix}")
    return problems


def need_bpf_tc(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """host -> the key of each marker it runs as a tc BPF program (hostside/bpf_tc/, built on
    the host by hostside/markers/bpf_edge_marker.py when it starts)."""
    for i, m in enumerate(view.exp.markers):
        if m.implementation == "bpf" and m.at in view.net.routers:
            wants.setdefault(view.net.host_of(m.at), {})[f"markers[{i}].implementation"] = m.marker
    return []


def missing_bpf_tc(ctx: Context, wants: Wants) -> list[str]:
    """What a host lacks to build a tc BPF program: clang, a C compiler, libbpf's headers."""
    problems = []
    for host, keys in wants.items():
        support = ctx.facts[host].get("bpf_cc_kernel")
        if support is None:
            lacking = "a Linux kernel (no bpf_cc_kernel fact: not a Linux host?)"
        else:
            tools = [
                pkg
                for name, pkg in BUILD_TOOLS.items()
                if name != "bpftool" and not support["tools"].get(name)
            ]
            if not support["libbpf_headers"]:
                tools.append("libbpf-dev")
            lacking = ", ".join(tools)
        if not lacking:
            continue
        for key, marker in keys.items():
            problems.append(
                f"{ctx.source}: key '{key}': bpf runs marker {marker} as a tc BPF program "
                f"built on host {host}, which lacks {lacking} (Debian packages; the virtual "
                "rack: make setup): install them there, or set it to python (the NFQUEUE "
                "marker)"
            )
    return problems


def need_siftr(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """FreeBSD sender host -> the generator whose TCP cwnd SIFTR records there."""
    for host, why in siftr_senders(view.exp, view.net, ctx.rack).items():
        wants.setdefault(host, why)
    return []


def missing_siftr(ctx: Context, wants: Wants) -> list[str]:
    return [
        f"host {host} runs FreeBSD and has no SIFTR (siftr(4): not loaded, no siftr.ko), "
        f"which records the cwnd of {why} there: load it (kldload siftr) or use a "
        "kernel that has it"
        for host, why in wants.items()
        if ctx.facts[host].get("siftr") is False
    ]


def need_qdiscs(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """host -> qdisc -> the link that shapes with it, or the hosts key of fq pacing."""
    for e in view.net.egress:
        if e.shaping.qdisc != "droptail":
            wants.setdefault(e.host, {})[e.shaping.qdisc] = e.link
    for node, s in view.settings.items():
        if s.pacing:
            wants.setdefault(view.net.host_of(node), {})["fq"] = f"hosts.*.pacing ({node})"
    return []


def missing_qdiscs(ctx: Context, wants: Wants) -> list[str]:
    """FreeBSD hosts by their facts (freebsd_qdisc_problems); Linux hosts by asking whether
    their kernel can load every module a qdisc needs."""
    bsd = {h: qdiscs for h, qdiscs in wants.items() if ctx.freebsd(h)}
    linux = {h: qdiscs for h, qdiscs in wants.items() if h not in bsd}
    names = {q for d in linux.values() for q in d}
    if "rio" in names:  # GRED, or else the BPF RIO (roles/linux_router chooses the same way)
        names.add(rio_bpf.PROBE)
    have = qdiscs_available(ctx.rack, sorted(linux), names)
    problems = freebsd_qdisc_problems(ctx.source, bsd, ctx.facts)
    for host, qdiscs in linux.items():
        kernel = ctx.facts.get(host, {}).get("kernel", "?")
        for qdisc, link in qdiscs.items():
            if qdisc in have[host]:
                continue
            bpf_lacks = ""
            if qdisc == "rio":
                lacking = rio_bpf_lacks(ctx.facts.get(host, {}), rio_bpf.PROBE in have[host])
                if not lacking:
                    continue  # the BPF RIO runs there
                bpf_lacks = (
                    "; nor can it run as the BPF program hostside/bpf_tc/rio there, which needs "
                    + ", ".join(lacking)
                )
            if link.startswith("hosts."):
                problems.append(
                    f"{ctx.source}: key '{link}': pacing needs the fq qdisc, which is not in the "
                    f"kernel of host {host} ({kernel}); use traffic[].pacing (TCP's own "
                    "pacing, per flow) instead, or a rack whose kernel has sch_fq"
                )
                continue
            needed = kernel_modules(qdisc)
            modules = ", ".join(needed[:-1]) + " and " + needed[-1] if needed[1:] else needed[0]
            vm = (
                ""
                if ctx.rack.vars.get("trialbed_rack_kind") == "vm"
                else " (RACK=vm: the VM rack, whose Debian kernel has them)"
            )
            problems.append(
                f"{ctx.source}: link {link}: qdisc {qdisc!r} is not in the kernel of host {host} "
                f"({kernel}): it needs {modules}{bpf_lacks}; use droptail here, or a rack whose "
                f"kernel has {'them' if needed[1:] else 'it'}{vm}"
            )
    return problems


def freebsd_qdisc_problems(
    source: str, needs: dict[str, dict[str, str]], facts: dict[str, dict]
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


def need_capture_disk(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """host -> capture point -> the most it writes in one trial."""
    for c in view.net.captures:
        volume = capture_bytes(view.net, c, view.exp.duration + view.exp.drain)
        points = wants.setdefault(c.host, {})
        points[c.name] = max(volume, points.get(c.name, 0))
    return []


def full_disks(ctx: Context, wants: Wants) -> list[str]:
    """Every answering host keeps MIN_FREE_DISK free, and twice what its capture points write
    in one trial (they write at once)."""
    problems = []
    for name, f in ctx.facts.items():
        points = wants.get(name, {})
        written = sum(points.values())
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
                f"{ctx.rack.host(name).workdir}/trials (where trialbed_dir's trials land); {why}: "
                "free space there, mount a larger disk there or point trialbed_dir at one"
            )
    return problems


def need_clock_domain(ctx: Context, view: TrialView, wants: Wants) -> list[str]:
    """host -> the clock domains it captures in."""
    for c in view.net.captures:
        wants.setdefault(c.host, set()).add(c.clock)
    return []


def clocks_apart(ctx: Context, wants: Wants) -> list[str]:
    domains: dict[str, set[str]] = {}
    for host, clocks in wants.items():
        for clock in clocks:
            domains.setdefault(clock, set()).add(host)
    return clock_problems(ctx.rack, domains)


def full_results_disk(ctx: Context, wants: Wants) -> list[str]:
    """The controller's disk under the results directory holds the captures of the largest
    selected trial (a batch's workers check each next trial again before they run it)."""
    if ctx.results is None or not ctx.views:
        return []
    volume, name = max(
        (trial_capture_bytes(v.net, v.exp.duration + v.exp.drain), v.trial.name) for v in ctx.views
    )
    return results_disk_problems(ctx.results, volume, name)


CHECKS = [
    Check("interfaces and routes", need=need_routes, judge=host_networks, asks_routes=True),
    Check("rio levels on FreeBSD", need=rio_levels_on_freebsd),
    Check("rates the rack carries", need=rates_the_rack_carries),
    Check("packets/s the markers carry", judge=markers_keep_up),
    Check("a flow's own cc_params", need=flows_own_cc_params),
    Check("kernel tick", need=need_kernel_tick, judge=wrong_kernel_tick),
    Check("link speed", need=need_link_speed, judge=slow_links),
    Check("congestion controls", need=need_cc, judge=missing_cc),
    Check("tools", need=need_tools, judge=missing_tools),
    Check("siftr", need=need_siftr, judge=missing_siftr),
    Check("BPF markers", need=need_bpf_tc, judge=missing_bpf_tc),
    Check("qdiscs", need=need_qdiscs, judge=missing_qdiscs),
    Check("rio implementation", need=need_rio_implementation, judge=missing_rio_implementation),
    Check("host disk", need=need_capture_disk, judge=full_disks),
    Check("clocks", need=need_clock_domain, judge=clocks_apart),
    Check("results disk", judge=full_results_disk),
]
