"""An experiment's network resolved against a rack: which inventory host each node is, which
interface each link end is, what each shaped egress does, where each capture point listens,
and the path (hops, propagation RTT, bottleneck) of every generator's traffic.

Interfaces are found from the inventory alone (two nodes share a link when they have
interfaces on one subnet), so the same file runs on the virtual rack and on a lab rack.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import yaml

from core import link_rules
from core.link_rules import RIO_IMPLEMENTATIONS
from core.rack import PROJECT_DIR, Host, Rack, RackError
from trials.generators import GENERATOR_TYPES
from trials.generators.base import TrialContext
from trials.spec import Experiment, HostSettings, Link, Shaping

ROUTER_GROUPS = ("linux_routers", "freebsd_routers")
# Hosts that run FreeBSD: dummynet routers, and end hosts whose cwnd SIFTR records.
FREEBSD_GROUPS = ("freebsd_routers", "freebsd_hosts")
IMPLICIT_GROUPS = ("all", "senders", "receivers")


@dataclass(frozen=True)
class Egress:
    """One shaped direction: packets `node` sends through `iface` (towards `peer`)."""

    link: str
    direction: str  # forward | reverse
    node: str
    host: str
    iface: str
    peer: str
    shaping: Shaping


@dataclass(frozen=True)
class CaptureSite:
    name: str
    node: str
    host: str
    iface: str
    clock: str


@dataclass
class ResolvedNetwork:
    source: str
    nodes: dict[str, str]  # node -> host
    hosts: dict[str, Host]  # host -> inventory host
    routers: set[str]  # nodes that forward
    egress: list[Egress] = field(default_factory=list)
    captures: list[CaptureSite] = field(default_factory=list)
    mtu: dict[tuple[str, str], int] = field(default_factory=dict)  # (host, iface) -> MTU
    bottleneck: str | None = None  # the link named as the congestion point, if any
    # host -> its DSCP marking rules as the role dscp_marker takes them (addresses resolved)
    marking: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # router host -> the RIO implementation its rio links ask for (gred, bpf) and the key that
    # asks; a router whose rio links all say auto is not here (the role chooses)
    rio_implementation: dict[str, tuple[str, str]] = field(default_factory=dict)

    def host_of(self, node: str) -> str:
        return self.nodes[node]

    def address_of(self, node: str) -> ipaddress.IPv4Address:
        return self.hosts[self.host_of(node)].experiment_address()

    def shaping_of(self, host: str, iface: str) -> Egress | None:
        return next((e for e in self.egress if e.host == host and e.iface == iface), None)

    def path(self, src: str, dst: str) -> list[tuple[str, str]]:
        """(host, egress interface) of every hop from node src to node dst: the shortest path
        over shared subnets, forwarding only through routers."""
        start, goal = self.host_of(src), self.host_of(dst)
        goal_addr = self.address_of(dst)
        prev: dict[str, tuple[str, str] | None] = {start: None}
        todo = deque([start])
        while todo:
            here = todo.popleft()
            if here == goal:
                break
            if here != start and here not in self.router_hosts:
                continue
            for iface, itf in self.hosts[here].interfaces.items():
                for other, host in self.hosts.items():
                    if other in prev:
                        continue
                    if any(o.network == itf.network for o in host.interfaces.values()):
                        prev[other] = (here, iface)
                        todo.append(other)
        if goal not in prev:
            raise RackError(f"{self.source}: no path from {src} to {dst} ({goal_addr}) in the rack")
        hops: list[tuple[str, str]] = []
        node = goal
        while prev[node] is not None:
            host, iface = prev[node]  # type: ignore[misc]
            hops.append((host, iface))
            node = host
        return hops[::-1]

    @property
    def router_hosts(self) -> set[str]:
        return {self.nodes[n] for n in self.routers}

    def runs_freebsd(self, host: str) -> bool:
        return any(g in self.hosts[host].groups for g in FREEBSD_GROUPS)

    def dummynet_numbers(self, host: str) -> dict[str, dict[str, Any]]:
        """A FreeBSD router's numbers per shaped egress interface (rule, pipe, sched, queue,
        rio's in and out queues), as roles/freebsd_router gives them: core/link_rules.py's
        dummynet_numbers over the host's linux_router_links (host_vars lists them in this
        order) from its freebsd_router_number_base."""
        base = self.hosts[host].vars.get(
            "freebsd_router_number_base", link_rules.DUMMYNET_NUMBER_BASE
        )
        links = [e for e in self.egress if e.host == host]
        numbers = link_rules.dummynet_numbers([e.shaping.qdisc for e in links], int(base))
        return {e.iface: n for e, n in zip(links, numbers, strict=True)}

    def dummynet_pipes(self, host: str) -> dict[str, int]:
        """A FreeBSD router's pipe number per shaped egress interface."""
        return {iface: n["pipe"] for iface, n in self.dummynet_numbers(host).items()}

    def path_summary(self, src: str, dst: str) -> dict[str, Any]:
        """Propagation RTT and bottleneck between two nodes, from the shaping on the path."""
        fwd, back = self.path(src, dst), self.path(dst, src)

        def shaped(hops):
            return [self.shaping_of(h, i) for h, i in hops]

        fwd_e, back_e = shaped(fwd), shaped(back)
        rated = [e for e in fwd_e if e is not None and e.shaping.rate is not None]
        named = [e for e in rated if e.link == self.bottleneck]
        bottleneck = named[0] if named else min(rated, key=lambda e: e.shaping.rate, default=None)
        mtus = [self.mtu.get((h, i), link_rules.MTU) for h, i in fwd]
        return {
            "hops": [f"{h}:{i}" for h, i in fwd],
            "return_hops": [f"{h}:{i}" for h, i in back],
            "rtt_ns": sum(e.shaping.delay for e in fwd_e + back_e if e is not None),
            "one_way_delay_ns": sum(e.shaping.delay for e in fwd_e if e is not None),
            "bottleneck": None
            if bottleneck is None
            else {
                "link": bottleneck.link,
                "host": bottleneck.host,
                "iface": bottleneck.iface,
                "rate_bps": bottleneck.shaping.rate,
                "buffer": str(bottleneck.shaping.buffer),
                "qdisc": bottleneck.shaping.qdisc,
            },
            "mtu": min(mtus) if mtus else link_rules.MTU,
        }

    def record(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "routers": sorted(self.routers),
            "addresses": {n: str(self.address_of(n)) for n in self.nodes if n not in self.routers},
            "interfaces": {
                h: {i: str(a) for i, a in host.interfaces.items()} for h, host in self.hosts.items()
            },
            "egress": [
                {
                    "link": e.link,
                    "direction": e.direction,
                    "node": e.node,
                    "host": e.host,
                    "iface": e.iface,
                    "towards": e.peer,
                    **e.shaping.model_dump(mode="json", by_alias=True),
                }
                for e in self.egress
            ],
            "captures": {
                c.name: {"node": c.node, "host": c.host, "iface": c.iface, "clock": c.clock}
                for c in self.captures
            },
            "marking": self.marking,
        }


def _shared_interfaces(a: Host, b: Host) -> list[tuple[str, str]]:
    return [
        (ia, ib)
        for ia, xa in a.interfaces.items()
        for ib, xb in b.interfaces.items()
        if xa.network == xb.network
    ]


def resolve_network(exp: Experiment, rack: Rack, source: str) -> ResolvedNetwork:
    """Bind every node to a rack host and every link, capture point and host setting to
    interfaces; raise RackError naming the file and key when the rack cannot do it."""
    net = exp.network
    nodes = {n: net.host_of(n) for n in exp.nodes()}
    hosts: dict[str, Host] = {}
    for node, host in nodes.items():
        try:
            hosts[host] = rack.host(host)
        except RackError as exc:
            where = f"key 'network.nodes.{node}.host'" if node in net.nodes else f"node {node}"
            raise RackError(f"{source}: {where}: {exc}") from None
    # Routers on the paths between the experiment's nodes forward its packets too.
    for name, host in rack.hosts.items():
        if any(g in host.groups for g in ROUTER_GROUPS) and name not in hosts:
            hosts[name] = host
            nodes.setdefault(name, name)
    routers = {n for n, h in nodes.items() if any(g in hosts[h].groups for g in ROUTER_GROUPS)}
    resolved = ResolvedNetwork(source, nodes, hosts, routers, bottleneck=net.bottleneck)

    for i, gen in enumerate(exp.traffic):
        for key, node in zip(("from", "to"), gen.endpoints(), strict=True):
            if node in routers:
                raise RackError(
                    f"{source}: key 'traffic[{i}].{key}': {node} is a router; traffic runs "
                    "between end hosts"
                )
            host = hosts[nodes[node]]
            if len(host.interfaces) != 1:
                raise RackError(
                    f"{source}: key 'traffic[{i}].{key}': end host {node} has "
                    f"{len(host.interfaces)} experiment interfaces; it needs exactly one"
                )

    seen: dict[tuple[str, str], Egress] = {}
    for i, link in enumerate(net.links):
        a, b = link.ends
        pairs = _shared_interfaces(hosts[nodes[a]], hosts[nodes[b]])
        if len(pairs) != 1:
            have = "; ".join(
                f"{n}: {', '.join(f'{k} {v}' for k, v in hosts[nodes[n]].interfaces.items())}"
                for n in (a, b)
            )
            why = "share no subnet" if not pairs else "share several subnets"
            raise RackError(
                f"{source}: key 'network.links[{i}]' ({link.name}): {a} and {b} {why} ({have})"
            )
        ia, ib = pairs[0]
        resolved.mtu[(nodes[a], ia)] = link.mtu
        resolved.mtu[(nodes[b], ib)] = link.mtu
        directions = [("forward", a, ia, b)] + ([] if link.one_way else [("reverse", b, ib, a)])
        for which, node, iface, peer in directions:
            shaping = link.direction(which)  # type: ignore[arg-type]
            if not shaping.shaped:
                continue
            if shaping.delay and node not in routers:
                raise RackError(
                    f"{source}: key 'network.links[{i}]' ({link.name}): the {which} direction "
                    f"is sent by end host {node}, which cannot add delay (TCP small queues "
                    f"throttle a sender whose own packets are held); put the delay on a "
                    f"router's direction and set {which}: {{delay: 0s}}"
                )
            egress = Egress(link.name, which, node, nodes[node], iface, peer, shaping)
            other = seen.get((egress.host, iface))
            if other is not None and other.shaping != shaping:
                raise RackError(
                    f"{source}: key 'network.links[{i}]' ({link.name}): {node}'s interface "
                    f"{iface} already carries link {other.link} ({other.direction}) with other "
                    "settings; one egress interface has one queue"
                )
            if other is None:
                seen[(egress.host, iface)] = egress
                resolved.egress.append(egress)
                _ask_rio_implementation(resolved, egress, rio_key(link, which), source)

    links = {lk.name: lk for lk in net.links}
    clock_default = rack.vars.get("trialbed_clock_domain")
    for i, point in enumerate(exp.capture.points):
        if point.link is not None:
            link = links[point.link]
            a, b = link.ends
            ia, ib = _shared_interfaces(hosts[nodes[a]], hosts[nodes[b]])[0]
            node, iface = (a, ia) if point.at == a else (b, ib)
        else:
            node, iface = point.node, point.interface  # type: ignore[assignment]
            if iface not in hosts[nodes[node]].interfaces:
                raise RackError(
                    f"{source}: key 'capture.points[{i}].interface': {node} has no experiment "
                    f"interface {iface!r}; it has: {', '.join(hosts[nodes[node]].interfaces)}"
                )
        host = hosts[nodes[node]]
        clock = host.vars.get("trialbed_clock_domain") or clock_default or host.name
        resolved.captures.append(CaptureSite(point.name, node, host.name, iface, str(clock)))
    resolved.marking = resolve_marking(exp, resolved, source)
    return resolved


def rio_key(link: Link, which: str) -> str:
    """The key of a link direction's RIO implementation: its forward/reverse override's
    where that gives rio, else the link's."""
    override = link.forward if which == "forward" else link.reverse
    return (
        f"network.links[{link.name}].{f'{which}.' if 'rio' in override else ''}rio.implementation"
    )


def _ask_rio_implementation(net: ResolvedNetwork, e: Egress, key: str, source: str) -> None:
    """Note what a rio egress asks of its router's one RIO implementation (gred, bpf; auto
    leaves it to the role); RackError naming both keys when another rio link of that router
    asked for the other."""
    if e.shaping.qdisc != "rio" or e.shaping.rio is None:
        return
    asked = e.shaping.rio.implementation
    if asked == RIO_IMPLEMENTATIONS[0]:
        return
    have, have_key = net.rio_implementation.setdefault(e.host, (asked, key))
    if have != asked:
        raise RackError(
            f"{source}: key '{key}': {asked} on router {e.node} ({e.host}), whose other rio "
            f"link asks for {have} ('{have_key}'); a router runs one implementation of RIO "
            f"(linux_router_rio_implementation): ask both for the same, or leave one auto"
        )


PROTOCOLS = {6: "tcp", 17: "udp", 1: "icmp"}


def resolve_marking(
    exp: Experiment, net: ResolvedNetwork, source: str
) -> dict[str, list[dict[str, Any]]]:
    """Each marking host's rules with nodes and flows turned into addresses, protocol and port
    (what role dscp_marker takes); a rule that could never mark what it names is refused."""
    ctx = TrialContext(rack=None, network=net, daemons=None, duration_ns=exp.duration)  # type: ignore[arg-type]
    flows = {
        name: GENERATOR_TYPES[spec.type](spec, name, i, ctx)
        for i, (spec, name) in enumerate(zip(exp.traffic, exp.generator_names(), strict=True))
    }
    out: dict[str, list[dict[str, Any]]] = {}
    for i, rule in enumerate(exp.network.marking):
        key = f"{source}: key 'network.marking[{i}]"
        if rule.at not in net.nodes:
            raise RackError(
                f"{key}.at': no node {rule.at!r} in the rack; nodes: {', '.join(sorted(net.nodes))}"
            )
        host = net.host_of(rule.at)
        if "freebsd_routers" in net.hosts[host].groups:
            raise RackError(
                f"{key}.at': {rule.at} is a FreeBSD router, which has no nftables; static "
                "marking there (ipfw) is not built: mark at the sender or a Linux router"
            )
        entry: dict[str, Any] = {"name": rule.label(i)}
        if rule.flow is not None:
            gen = flows[rule.flow]
            on_path = [h for h, _ in net.path(gen.spec.from_, gen.spec.to)]  # sender, routers
            if host not in on_path:
                raise RackError(
                    f"{key}.at': {rule.at} is not on the path of flow {rule.flow} "
                    f"({' -> '.join([*on_path, gen.receiver])}); mark it at {' or '.join(on_path)}"
                )
            if gen.type == "cbr_udp" and host == gen.sender:
                raise RackError(
                    f"{key}.at': flow {rule.flow} is replayed by tcpreplay, whose packets leave "
                    f"{rule.at} through a packet socket past nftables (measured: counter 0, DSCP "
                    f"unchanged); set its DSCP with traffic[].dscp or mark it on a router of "
                    f"its path ({', '.join(on_path[1:]) or 'none'})"
                )
            rec = gen.record()
            entry.update(
                src=str(gen.src), dst=str(gen.dst), proto=PROTOCOLS[rec["proto"]], dport=rec["port"]
            )
        for which in ("src", "dst"):
            value = getattr(rule, which)
            if value is None:
                continue
            if value[:1].isdigit():
                entry[which] = value
            elif value not in net.nodes or value in net.routers:
                raise RackError(
                    f"{key}.{which}': {value!r} is not an end host of the rack (a router has "
                    "several addresses: give one, or its prefix)"
                )
            else:
                entry[which] = str(net.address_of(value))
        for k in ("proto", "sport", "dport"):
            if getattr(rule, k) is not None:
                entry[k] = getattr(rule, k)
        entry["dscp"] = rule.code
        out.setdefault(host, []).append(entry)
    return out


def unknown_host_keys(exp: Experiment, nodes: set[str], groups: set[str], source: str) -> list[str]:
    """One line per ``hosts.<key>`` that names neither a node, an inventory group nor one of
    IMPLICIT_GROUPS."""
    allowed = set(IMPLICIT_GROUPS) | groups | nodes
    return [
        f"{source}: key 'hosts.{key}': not a node, an inventory group or one of "
        f"{', '.join(IMPLICIT_GROUPS)}; nodes: {', '.join(sorted(nodes))}; "
        f"groups: {', '.join(sorted(groups))}"
        for key in exp.hosts
        if key not in allowed
    ]


def host_settings(
    exp: Experiment, resolved: ResolvedNetwork, source: str
) -> dict[str, HostSettings]:
    """Each node's merged settings: all, inventory groups (a child group over its parents),
    senders/receivers, the node."""
    known_groups = {g for h in resolved.hosts.values() for g in h.groups}
    unknown = unknown_host_keys(exp, set(resolved.nodes), known_groups, source)
    if unknown:
        raise RackError(unknown[0])
    senders, receivers = set(exp.senders()), set(exp.receivers())
    out = {}
    for node, host in resolved.nodes.items():
        layers = ["all", *resolved.hosts[host].groups]  # parent groups before children
        layers += (["senders"] if node in senders else []) + (
            ["receivers"] if node in receivers else []
        )
        layers.append(node)
        merged: dict[str, Any] = {}
        for layer in layers:
            if layer in exp.hosts:
                merged.update(exp.hosts[layer].model_dump(mode="json", exclude_unset=True))
        out[node] = HostSettings.model_validate(merged)
        shaped = sorted({e.iface for e in resolved.egress if e.host == host})
        if out[node].pacing and shaped:
            raise RackError(
                f"{source}: key 'hosts.*.pacing': node {node} shapes its own egress on "
                f"{', '.join(shaped)}, where the shaping's HTB is the root qdisc; fq cannot "
                "pace there. Pace its flows with traffic[].pacing (TCP's own pacing), or "
                "shape that link on the router's side"
            )
    return out


def host_cc(settings: dict[str, HostSettings]) -> dict[str, tuple[str | None, str | None]]:
    """Per node, its host's own congestion control and the implementation asked for (None:
    the host's default; auto): a generator's TrialContext.host_cc."""
    return {node: (s.cc, s.cc_implementation) for node, s in settings.items()}


TOPOLOGIES = PROJECT_DIR / "inventory" / "virtual" / "topologies"


def virtual_topology_problems(exp: Experiment, source: str) -> list[str]:
    """What the virtual rack of the experiment's ``topology`` cannot give it, read from the
    topology file alone (before a rack is brought up or replaced): an unknown topology, nodes
    that are not its hosts, ``hosts.<key>`` that name neither a node nor a group."""
    path = TOPOLOGIES / f"{exp.topology}.yml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in TOPOLOGIES.glob("*.yml")))
        return [
            f"{source}: key 'topology': {exp.topology!r} is not a virtual rack topology; the "
            f"topologies are: {known} (inventory/virtual/topologies/)"
        ]
    hosts: dict[str, Any] = (yaml.safe_load(path.read_text()) or {}).get("hosts") or {}
    groups = {g for h in hosts.values() for g in (h or {}).get("groups", [])}
    problems = []
    for where, node in exp.node_references():
        host = exp.network.host_of(node)
        if host not in hosts and node in exp.network.nodes:  # the binding is at fault
            problems.append(
                f"{source}: key 'network.nodes.{node}.host': {host!r} (node {node}) is not a "
                f"host of the {exp.topology} topology; its hosts are: {', '.join(hosts)}"
            )
        elif host not in hosts:
            problems.append(
                f"{source}: key '{where}': node {node!r} is not a host of the {exp.topology} "
                f"topology; its hosts are: {', '.join(hosts)}"
            )
    problems += unknown_host_keys(exp, {*hosts, *exp.nodes()}, groups, source)
    return list(dict.fromkeys(problems))
