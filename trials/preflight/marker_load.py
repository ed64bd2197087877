"""The packets/s a trial offers each of its edge markers (`markers:`), and the check that refuses
a trial whose marker would be offered more than the rack's marker of that implementation
carries (Context.marker_capacities: the inventory's calibration).

A marker is handed the packets its router receives over its links: the NFQUEUE marker the TCP
ones (its iptables rule), the BPF program every one (it runs on the interfaces' tc ingress and
passes the others unmarked). Each generator says what it sends each way
(GeneratorSpec.offered): packets at a rate of its own (a CBR stream; a web flow's handshake,
teardown and last, partial segment), and data, or the ACKs of data, as fast as the slowest link
of a path carries full-size frames (core.link_rules.FULL_FRAME_BYTES). Flows whose data crosses
one link share its rate, so a link is counted once for all of them; a path with no shaped link
is bounded by the rack's rate ceiling (Context.rate_limit). Not counted: packets a queue after
the marker drops and the sender sends again (the VM rack's markers counted 310-370 packets/s
of diffserv.yml at 3 Mbit/s where this counts 300-321: docs/virtual-rack.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.link_rules import FULL_FRAME_BYTES
from core.rack import RackError
from core.units import format_rate, parse_rate
from trials.generators.base import Direction
from trials.network import Egress, ResolvedNetwork
from trials.preflight.context import Context, TrialView, Wants
from trials.spec import EdgeMarker, Experiment

# What each implementation's hook hands the marker: the NFQUEUE marker's iptables rule matches
# TCP (hostside/markers/edge_marker.py, rule()); the BPF program runs on every packet of the
# interfaces' ingress (hostside/bpf_tc/edge_marker/).
TAKES = {"python": ("tcp",), "bpf": ("tcp", "udp")}
# The command that measures what a rack's markers carry (docs/virtual-rack.md).
CALIBRATE = "make bench-marker"


@dataclass(frozen=True)
class Share:
    """Packets/s of the offered load: `what` they are, and the traffic keys they come from."""

    what: str
    keys: tuple[str, ...]
    pps: float

    def text(self) -> str:
        return f"{', '.join(self.keys)}: {self.what}: {self.pps:,.0f}"


@dataclass
class MarkerLoad:
    """What one trial offers the marker markers[index]; `unbounded`: the traffic whose packet
    rate nothing bounds (no shaped link on its path and no rate ceiling on the rack)."""

    index: int
    marker: EdgeMarker
    shares: list[Share] = field(default_factory=list)
    unbounded: list[str] = field(default_factory=list)

    @property
    def pps(self) -> float:
        return sum(s.pps for s in self.shares)

    @property
    def key(self) -> str:
        return f"markers[{self.index}]"


def marker_loads(
    exp: Experiment, net: ResolvedNetwork, ceiling_bps: int | None
) -> list[MarkerLoad]:
    """The load each marker of the experiment is offered on the rack `net` resolves it to;
    `ceiling_bps`: the fastest rate the rack carries (bounds a path with no shaped link)."""
    links = {lk.name: lk for lk in exp.network.links}
    loads = []
    for i, m in enumerate(exp.markers):
        load = MarkerLoad(i, m)
        router = net.host_of(m.at)
        feeders = {net.host_of(n) for name in m.links for n in links[name].ends if n != m.at}
        bounded: dict[tuple, tuple[str, list[str], float]] = {}
        for j, gen in enumerate(exp.traffic):
            key = f"traffic[{j}] ({gen.label(j)})"
            ends: dict[Direction, tuple[str, str]] = {
                "forward": gen.endpoints(),
                "reverse": gen.endpoints()[::-1],
            }
            try:
                bottleneck = net.path_summary(*ends["forward"])["bottleneck"]
                sends = gen.offered(bottleneck["rate_bps"] if bottleneck else None)
                entering = {d: enters(net, *ends[d], router, feeders) for d in sends}
            except RackError:
                continue  # no path: the route check says so
            for direction, one in sends.items():
                if one.protocol not in TAKES[m.implementation] or not entering[direction]:
                    continue
                if one.pps:
                    load.shares.append(Share(one.what, (key,), one.pps))
                for of in one.full_frames_of:
                    kind = "data" if of == direction else "ACKs (one per data segment)"
                    slowest = slowest_link(net, *ends[of])
                    if slowest is not None:
                        rate, where = slowest.shaping.rate, slowest_text(slowest)
                        share_key: tuple = (kind, slowest.host, slowest.iface)
                    elif ceiling_bps:
                        rate, where = ceiling_bps, "the rack's rate ceiling (no shaped link)"
                        share_key = (kind, j, of)
                    else:
                        load.unbounded.append(key)
                        continue
                    what = f"{kind} in full-size frames at {where}"
                    _, keys, _ = bounded.setdefault(share_key, (what, [], frames_per_s(rate)))
                    keys.append(key)
        load.shares += [Share(w, tuple(dict.fromkeys(k)), pps) for w, k, pps in bounded.values()]
        loads.append(load)
    return loads


def enters(net: ResolvedNetwork, src: str, dst: str, router: str, feeders: set[str]) -> bool:
    """Whether packets from node src to node dst enter host `router` from one of `feeders`."""
    hops = net.path(src, dst)
    senders = [host for host, _ in hops]
    receivers = [*senders[1:], net.host_of(dst)]
    return any(r == router and s in feeders for s, r in zip(senders, receivers, strict=True))


def slowest_link(net: ResolvedNetwork, src: str, dst: str) -> Egress | None:
    """The shaped egress of the path from src to dst with the lowest rate (None: none)."""
    rated = [
        e for host, iface in net.path(src, dst) if (e := net.shaping_of(host, iface)) is not None
    ]
    return min((e for e in rated if e.shaping.rate), key=lambda e: e.shaping.rate, default=None)


def slowest_text(e: Egress) -> str:
    return f"link {e.link} ({e.node} -> {e.peer}, {format_rate(e.shaping.rate)})"


def frames_per_s(rate_bps: int) -> float:
    return rate_bps / (8 * FULL_FRAME_BYTES)


def capacity(ctx: Context, implementation: str) -> tuple[float | None, str, str | None]:
    """The packets/s the rack's `implementation` marker carries as the inventory gives it
    (None: not given), where that figure comes from, and what is wrong with it (None: nothing)."""
    var, table = ctx.marker_capacities
    if table is None:
        return None, "", None
    allowed = (
        f"allowed a mapping of implementation ({', '.join(TAKES)}) to the packets/s it "
        f"carries, above 0, and `source`: how it was measured ({CALIBRATE})"
    )
    files = ", ".join(map(str, ctx.rack.inventory)) or "the inventory"
    if not isinstance(table, dict):
        return None, "", f"{files}: key '{var}': {table!r}: {allowed}"
    value = table.get(implementation)
    if value is None:
        return None, "", None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None, "", f"{files}: key '{var}.{implementation}': {value!r}: {allowed}"
    source = table.get("source")
    where = f"{var}.{implementation} in the inventory" + (f": {source}" if source else "")
    return float(value), where, None


def markers_keep_up(ctx: Context, wants: Wants) -> list[str]:
    """Every selected trial's load on each marker against the rack's capacity for its
    implementation: one problem per marker, naming the trial that offers the most."""
    problems: list[str] = []
    max_rate, _ = ctx.rate_limit
    ceiling = parse_rate(max_rate) if max_rate else None
    # (marker, implementation) -> the trial offering the most beyond capacity, how many do
    worst: dict[tuple[int, str], tuple[TrialView, MarkerLoad, int]] = {}
    for view in ctx.views:
        for load in marker_loads(view.exp, view.net, ceiling):
            impl = load.marker.implementation
            carries, _, bad = capacity(ctx, impl)
            if bad and ctx.first_time(("marker capacity", bad)):
                problems.append(bad)
            if carries is None:
                continue
            if load.unbounded and ctx.first_time(("marker unbounded", load.index)):
                problems.append(
                    f"{ctx.source}: key '{load.key}' ({impl} marker at {load.marker.at}): "
                    f"{', '.join(dict.fromkeys(load.unbounded))} reaches it on a path with no "
                    "shaped link, and the rack gives no rate ceiling (trialbed_max_rate): its "
                    "packet rate has no bound; shape a link on its path"
                )
            if load.pps > carries:
                slot = (load.index, impl)
                before = worst.get(slot)
                count = before[2] + 1 if before else 1
                if before is None or load.pps > before[1].pps:
                    worst[slot] = (view, load, count)
                else:
                    worst[slot] = (before[0], before[1], count)
    problems += [overload_message(ctx, *found) for found in worst.values()]
    return problems


def overload_message(ctx: Context, view: TrialView, load: MarkerLoad, count: int) -> str:
    impl, m = load.marker.implementation, load.marker
    carries, where, _ = capacity(ctx, impl)
    var, _ = ctx.marker_capacities
    trials = f" ({count} of {len(ctx.views)} selected trials offer more than it carries)"
    fixes = ["Lower the rates it sees (the links' rate, traffic[*].load, a stream's interval)"]
    if impl == "python":
        bpf, _, _ = capacity(ctx, "bpf")
        figure = f"this rack's figure for it: {bpf:,.0f}" if bpf else "no figure for it here"
        fixes.append(f"run it as the tc BPF program ({load.key}.implementation: bpf; {figure})")
    fixes.append(f"or calibrate this rack's markers ({CALIBRATE}) and set {var}.{impl}")
    return (
        f"{ctx.source}: key '{load.key}' ({m.label(load.index)}, the {impl} marker at {m.at}): "
        f"trial {view.trial.name} offers it about {load.pps:,.0f} packets/s"
        f"{trials if count > 1 else ''}, beyond the {carries:,.0f} packets/s this rack's "
        f"{impl} marker carries ({where}). Counted: "
        f"{'; '.join(s.text() for s in load.shares)}. {'; '.join(fixes)}"
    )
