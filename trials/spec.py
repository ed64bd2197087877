"""Experiment files: parsed into typed, frozen objects, or rejected with a clear message.

One schema for every family (../shared/DESIGN.md, "Experiment model"): a `network` of nodes
and shaped links, `traffic` as a list of typed generators, named `captures`, per-host
settings, and `factors` over any dotted key. A message names the file, the key and what is
allowed, before any host is touched.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from core.dscp import parse_dscp
from core.rio import DEFAULTS as RIO_DEFAULTS
from core.rio import HIGH_DSCP, IN_DSCP, MAX_OVER_MIN, MEAN_PACKET, RioError, virtual_queues
from core.units import ETHERNET_HEADER, parse_bytes, parse_duration_ns
from trials.fields import (
    BufferSize,
    Bytes,
    CongestionControl,
    DurationNs,
    Name,
    OffsetNs,
    RateBps,
    Strict,
)
from trials.generators import GENERATOR_TYPES, Generator

# Queue disciplines of a link direction. droptail is bfifo (byte buffer) or pfifo (packet
# buffer); the AQMs are accepted here and checked against the router's kernel by preflight.
# rio is GRED in RIO mode with the drop precedence taken from the DSCP (core/rio.py).
QDISCS = ("droptail", "red", "gred", "rio", "fq_codel", "pie", "codel", "cake")
# The kernel qdisc a link's qdisc needs, where the names differ.
KERNEL_QDISC = {"rio": "gred"}


class SpecError(ValueError):
    """An experiment file that cannot be run as written."""


def require_unique(what: str, names: list[str]) -> None:
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{what} names must be unique; repeated: {', '.join(dup)}")


# -- network -----------------------------------------------------------------------------------


def _packets(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{value!r} is not a number of packets; give a whole number >= 1 (the paper's "
            "thresholds are in packets; rio.mean_packet converts them to bytes)"
        )
    return value


Packets = Annotated[int, BeforeValidator(_packets)]


class RedLevel(Strict):
    """RED thresholds of one drop precedence of RIO, in packets as the paper gives them."""

    min: Packets | None = Field(None, description="min threshold, packets")
    max: Packets | None = Field(
        None, description=f"max threshold, packets (default {MAX_OVER_MIN} x min)"
    )
    pmax: float | None = Field(None, gt=0, le=1, description="drop probability at max")
    w_q: float | None = Field(None, gt=0, lt=1, description="weight of the average queue")


def _dscp_names(value: Any) -> list[int | str]:
    values = value if isinstance(value, list) else [value]
    for v in values:
        parse_dscp(v)
    return values


class Rio(Strict):
    """RIO (RED with IN and OUT) sharing one physical queue, the link's buffer: GRED in RIO
    mode, IN and OUT taken from the DSCP, and a third level (high) when given. Defaults:
    ../shared/EXPERIMENTS.md §4."""

    mean_packet: Bytes = Field(
        parse_bytes(MEAN_PACKET),
        description="bytes per packet that convert the thresholds (and GRED's avpkt)",
    )
    in_: RedLevel = Field(
        default_factory=RedLevel,
        alias="in",
        description="IN: min {min}, max {m} x min, pmax {pmax}, w_q {w_q}".format(
            m=MAX_OVER_MIN, **RIO_DEFAULTS["in"]
        ),
    )
    out: RedLevel = Field(
        default_factory=RedLevel,
        description="OUT: min {min}, max {m} x min, pmax {pmax}, w_q {w_q}".format(
            m=MAX_OVER_MIN, **RIO_DEFAULTS["out"]
        ),
    )
    in_dscp: Annotated[list[int | str], BeforeValidator(_dscp_names)] = Field(
        default_factory=lambda: list(IN_DSCP),
        min_length=1,
        description="DSCPs that are IN (every other packet is OUT)",
    )
    high: RedLevel | None = Field(
        None,
        description="a third level, RFC 2597's high drop precedence (VQ 2; seed 004's MPM "
        "sends its probes there): min, max, pmax, w_q, defaults OUT's; none: two levels",
    )
    high_dscp: Annotated[list[int | str], BeforeValidator(_dscp_names)] | None = Field(
        None,
        min_length=1,
        description="with high: its DSCPs (default {})".format(", ".join(HIGH_DSCP)),
    )

    def settings(self) -> dict[str, Any]:
        """The form core/rio.py and role linux_router take (packets, mean_packet with unit)."""
        return {
            "mean_packet": f"{self.mean_packet}B",
            "in": self.in_.model_dump(exclude_none=True),
            "out": self.out.model_dump(exclude_none=True),
            "in_dscp": list(self.in_dscp),
            **({"high": self.high.model_dump(exclude_none=True)} if self.high else {}),
            **({"high_dscp": list(self.high_dscp)} if self.high_dscp else {}),
        }


class Shaping(Strict):
    """What one direction of a link does to the packets sent into it."""

    rate: RateBps | None = Field(None, description="link rate; none = not shaped")
    buffer: BufferSize | None = Field(None, description="drop-tail limit, bytes or packets")
    delay: OffsetNs = Field(0, description="one-way propagation delay")
    qdisc: Literal[QDISCS] = "droptail"  # type: ignore[valid-type]
    rio: Rio | None = Field(None, description="qdisc rio: thresholds per drop precedence")

    @model_validator(mode="before")
    @classmethod
    def _rio_defaults(cls, data: Any) -> Any:
        # qdisc rio without thresholds: the defaults, written out so that the trial records them
        if isinstance(data, dict) and data.get("qdisc") == "rio" and data.get("rio") is None:
            return {**data, "rio": {}}
        return data

    @model_validator(mode="after")
    def _buffer_with_rate(self) -> Shaping:
        if self.rate is not None and self.buffer is None:
            raise ValueError("a shaped direction (rate) needs a buffer, e.g. 60000B or 20pkt")
        if self.buffer is not None and self.rate is None:
            raise ValueError("a buffer needs a rate to drain it")
        if self.rio is not None and self.qdisc != "rio":
            raise ValueError(f"rio: thresholds given for qdisc {self.qdisc!r}; set qdisc: rio")
        if self.qdisc == "rio":
            if self.rate is None:
                raise ValueError("qdisc rio needs a rate and a buffer (its physical queue)")
            try:
                virtual_queues(self.rio.settings(), self.buffer)  # type: ignore[union-attr]
            except RioError as e:
                raise ValueError(str(e)) from None
        return self

    def virtual_queues(self):
        """GRED's virtual queues of a rio direction (core/rio.py), else []."""
        if self.qdisc != "rio" or self.rio is None:
            return []
        return virtual_queues(self.rio.settings(), self.buffer)

    @property
    def shaped(self) -> bool:
        return self.rate is not None or self.delay > 0


class Link(Strict):
    """A link between two nodes (both directions), or one direction of it (from/to).

    Each direction is shaped on the egress interface of the node sending into it; `forward`
    and `reverse` override the shared settings for between[0] -> between[1] and back.
    """

    name: Name
    between: tuple[str, str] | None = None
    from_: str | None = Field(None, alias="from")
    to: str | None = None
    rate: RateBps | None = None
    buffer: BufferSize | None = None
    delay: OffsetNs = 0
    qdisc: Literal[QDISCS] = "droptail"  # type: ignore[valid-type]
    rio: Rio | None = Field(None, description="qdisc rio: thresholds per drop precedence")
    mtu: int = Field(1500, ge=68, le=9000)
    forward: dict[str, Any] = Field(default_factory=dict)
    reverse: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ends(self) -> Link:
        if (self.between is None) == (self.from_ is None or self.to is None):
            raise ValueError(
                "give either between: [X, Y] (both directions) or from: X and to: Y (one)"
            )
        if self.between is None and self.reverse:
            raise ValueError("a one-way link (from/to) has no reverse direction")
        a, b = self.ends
        if a == b:
            raise ValueError(f"a link joins two different nodes, not {a} to itself")
        for which in ("forward", "reverse"):
            self.direction(which)  # validates the override
        return self

    @property
    def ends(self) -> tuple[str, str]:
        return self.between or (self.from_, self.to)  # type: ignore[return-value]

    @property
    def one_way(self) -> bool:
        return self.between is None

    def direction(self, which: Literal["forward", "reverse"]) -> Shaping:
        base = self.model_dump(
            mode="json", by_alias=True, include={"rate", "buffer", "delay", "qdisc", "rio"}
        )
        override = self.forward if which == "forward" else self.reverse
        unknown = set(override) - set(base)
        if unknown:
            raise ValueError(
                f"{which}: unknown key {', '.join(sorted(unknown))}; allowed: {', '.join(base)}"
            )
        said = f"{which}: " if override else ""  # named by its direction where one was written
        try:
            shaping = Shaping.model_validate({**base, **override})
        except ValidationError as exc:
            raise ValueError(f"{said}{_first_message(exc)}") from None
        frame = self.mtu + ETHERNET_HEADER  # a full-size frame
        if (
            shaping.buffer is not None
            and not shaping.buffer.packets
            and shaping.buffer.amount < frame
        ):
            raise ValueError(
                f"{said}buffer {shaping.buffer} cannot hold one full-size frame ({frame} B at mtu "
                f"{self.mtu}): every such packet would be dropped; give at least {frame}B, "
                "or packets (e.g. 20pkt)"
            )
        return shaping


_PORTS = re.compile(r"^([0-9]{1,5})(?:-([0-9]{1,5}))?$")


def _ports(value: Any) -> int | str:
    """A port (5201) or a range of ports ('5201-5209')."""
    m = _PORTS.match(str(value)) if isinstance(value, int | str) else None
    if m is None or isinstance(value, bool):
        raise ValueError(f"{value!r} is not a port; give a number 1..65535 or a range lo-hi")
    lo, hi = int(m[1]), int(m[2] or m[1])
    if not 1 <= lo <= hi <= 65535:
        raise ValueError(f"{value!r}: ports run from 1 to 65535, low before high")
    return lo if m[2] is None else f"{lo}-{hi}"


def _address_or_node(value: str) -> str:
    """An IPv4 address or prefix (kept as written), or a node's name (resolved on the rack)."""
    if value[:1].isdigit():
        try:
            ipaddress.IPv4Network(value, strict=False)
        except ValueError:
            raise ValueError(
                f"{value!r} is neither an IPv4 address or prefix (198.18.1.11, 198.18.1.0/24) "
                "nor a node"
            ) from None
    return value


Ports = Annotated[int | str, BeforeValidator(_ports)]
AddressOrNode = Annotated[str, BeforeValidator(_address_or_node)]


class MarkRule(Strict):
    """Static DSCP marking at one node (a sender, or an edge router on the flow's path): its
    IPv4 packets that match get `dscp` as they leave it (nftables, role dscp_marker). Match a
    traffic generator's packets by `flow`, or by addresses, protocol and ports; the first
    matching rule of a node wins."""

    name: Name | None = Field(None, description="label of the rule's counter (default: mark<i>)")
    at: str = Field(description="the node that marks: a sender or a router")
    flow: str | None = Field(
        None, description="a traffic generator's name: its packets from sender to receiver"
    )
    src: AddressOrNode | None = Field(None, description="source: IPv4 address, prefix or node")
    dst: AddressOrNode | None = Field(None, description="destination: address, prefix or node")
    proto: Literal["tcp", "udp", "icmp"] | None = None
    sport: Ports | None = Field(None, description="source port or range lo-hi (tcp, udp)")
    dport: Ports | None = Field(None, description="destination port or range (tcp, udp)")
    dscp: int | str = Field(description="0..63 or a name: be, ef, af11..af43, cs0..cs7")

    @field_validator("dscp")
    @classmethod
    def _dscp(cls, value: int | str) -> int | str:
        parse_dscp(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> MarkRule:
        given = [k for k in ("src", "dst", "proto", "sport", "dport") if getattr(self, k)]
        if self.flow is not None and given:
            raise ValueError(
                f"flow {self.flow!r} already gives the addresses, protocol and port; give "
                f"either flow or {', '.join(given)}"
            )
        if (self.sport is not None or self.dport is not None) and self.proto not in (
            "tcp",
            "udp",
        ):
            raise ValueError("sport and dport need proto: tcp or proto: udp")
        return self

    def label(self, index: int) -> str:
        return self.name or f"mark{index}"

    @property
    def code(self) -> int:
        return parse_dscp(self.dscp)

    def named_nodes(self) -> list[str]:
        """The nodes it names: where it marks, and src/dst given as nodes."""
        ends = [v for v in (self.src, self.dst) if v is not None and not v[:1].isdigit()]
        return [self.at, *ends]


class Network(Strict):
    """The nodes the experiment uses, bound to inventory hosts, its shaped links, and the
    static DSCP marking its senders and edge routers do."""

    nodes: dict[str, str] = Field(
        default_factory=dict,
        description="node -> inventory host; a node not listed is the host of the same name",
    )
    links: list[Link] = Field(default_factory=list)
    bottleneck: str | None = Field(
        None,
        description="the link where the traffic congests (default: the slowest shaped hop of "
        "each path); metrics are taken on either side of it",
    )
    marking: list[MarkRule] = Field(
        default_factory=list, description="static DSCP marking rules, in order"
    )

    @model_validator(mode="after")
    def _unique(self) -> Network:
        require_unique("link", [link.name for link in self.links])
        require_unique("marking rule", [r.label(i) for i, r in enumerate(self.marking)])
        return self

    def host_of(self, node: str) -> str:
        return self.nodes.get(node, node)

    def link(self, name: str) -> Link | None:
        return next((link for link in self.links if link.name == name), None)


class EdgeMarker(Strict):
    """A per-flow adaptive marker of seed 004 at an ingress edge router (trials/markers.py,
    run on the packet path by trials/edge_marker.py): the TCP packets `at` receives over
    `links` get the DSCP AF<af_class><p> of the drop precedence p the marker gives them."""

    name: Name | None = Field(None, description="label in results (default: marker<index>)")
    at: str = Field(description="the edge router that marks (a router node)")
    links: list[str] = Field(min_length=1, description="links whose packets into `at` it marks")
    marker: Literal["NM", "APM", "WPM", "MPM"] = Field(description="NM, APM, WPM or MPM")
    af_class: int = Field(1, ge=1, le=4, description="AF class of the DSCPs written")
    a0: float = Field(7.0, gt=0, description="APM: initial A_IN")
    alpha: float = Field(0.5, ge=0, lt=1, description="APM: filter weight of A_IN")
    n_s: int = Field(5, ge=0, le=1000, description="WPM: packets protected at a flow's start")
    n_a: int = Field(5, ge=0, le=1000, description="WPM: packets protected after a loss")

    def label(self, index: int) -> str:
        return self.name or f"marker{index}"


# -- captures, hosts ---------------------------------------------------------------------------


class CapturePoint(Strict):
    """A tcpdump point: a node's end of a link (link + at), or a node's interface by name."""

    name: Name
    link: str | None = None
    at: str | None = Field(None, description="which end of the link: one of its two nodes")
    node: str | None = None
    interface: str | None = None

    @model_validator(mode="after")
    def _one_form(self) -> CapturePoint:
        by_link = self.link is not None and self.at is not None
        by_iface = self.node is not None and self.interface is not None
        if by_link == by_iface or (self.link is None) != (self.at is None):
            raise ValueError("give either link and at (a node of that link), or node and interface")
        return self


class Capture(Strict):
    snaplen: int = Field(128, ge=96, le=65535)
    points: list[CapturePoint] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Capture:
        require_unique("capture point", [p.name for p in self.points])
        return self


class HostSettings(Strict):
    """TCP settings of a host or group (all, senders, receivers, an inventory group, a node)."""

    cc: CongestionControl | None = None
    cc_params: dict[CongestionControl, dict[str, int | str]] = Field(
        default_factory=dict, description="module parameters per congestion control"
    )
    initcwnd: int | None = Field(None, ge=1, le=1000, description="route initcwnd")
    rto_min: DurationNs | None = Field(None, description="route rto_min")
    rcvbuf: Bytes | None = Field(None, description="largest TCP receive buffer (tcp_rmem max)")
    sndbuf: Bytes | None = Field(None, description="largest TCP send buffer (tcp_wmem max)")
    tcp_no_metrics_save: Literal[0, 1] | None = None
    tcp_timestamps: Literal[0, 1] | None = Field(
        None,
        description="net.ipv4.tcp_timestamps; 0: no timestamp option, so a full segment "
        "carries 12 more bytes (1460 at MTU 1500, as on the EFT paper's hosts)",
    )
    pacing: bool | None = Field(
        None,
        description="fq as the root qdisc of the host's experiment interfaces, which paces "
        "every TCP flow (needs sch_fq; traffic[].pacing asks TCP's own pacing per flow)",
    )

    @field_validator("rto_min")
    @classmethod
    def _whole_ms(cls, value: int | None) -> int | None:
        if value is not None and (value % 10**6 or not 10**6 <= value <= 120 * 10**9):
            raise ValueError("rto_min is a whole number of milliseconds from 1ms to 120s")
        return value


# -- the experiment ----------------------------------------------------------------------------


class Experiment(Strict):
    """One experiment file."""

    experiment: Name = Field(description="the family's report (collateral_damage, startup, ...)")
    name: str = ""
    description: str = ""
    topology: Name = Field("dumbbell", description="the rack topology it needs")
    network: Network = Field(default_factory=Network)
    traffic: list[Generator] = Field(min_length=1)
    capture: Capture = Field(default_factory=Capture)
    markers: list[EdgeMarker] = Field(
        default_factory=list, description="adaptive per-flow DSCP markers at edge routers"
    )
    hosts: dict[str, HostSettings] = Field(default_factory=dict)
    duration: DurationNs
    warmup: OffsetNs = Field(0, description="start of the steady-state window after T0")
    drain: OffsetNs = Field(
        default=parse_duration_ns("1s"), description="wait after traffic ends (queues drain)"
    )
    factors: dict[str, Annotated[list[Any], BeforeValidator(lambda v: _as_list(v))]] = Field(
        default_factory=dict
    )
    repetitions: int = Field(1, ge=1, le=100)
    seed: int = 1
    report: dict[str, Any] = Field(
        default_factory=dict, description="settings of the family's report"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Experiment:
        if self.warmup >= self.duration:
            raise ValueError(
                f"warmup ({self.warmup / 1e9:g} s) must be shorter than duration "
                f"({self.duration / 1e9:g} s)"
            )
        require_unique("traffic", self.generator_names())
        self._check_references()
        self._check_markers()
        for i, gen in enumerate(self.traffic):
            if gen.start >= self.duration:
                raise ValueError(
                    f"traffic[{i}].start ({gen.start / 1e9:g} s) is not before the end of the "
                    f"trial (duration {self.duration / 1e9:g} s)"
                )
            own = getattr(gen, "duration", None)
            if own is not None and gen.start + own > self.duration:
                raise ValueError(
                    f"traffic[{i}].duration ({own / 1e9:g} s from its start at "
                    f"{gen.start / 1e9:g} s) runs past the end of the trial (duration "
                    f"{self.duration / 1e9:g} s); shorten it, or leave it out to run until the end"
                )
        return self

    def _check_markers(self) -> None:
        require_unique("marker", [m.label(i) for i, m in enumerate(self.markers)])
        links = {lk.name: lk for lk in self.network.links}
        for i, m in enumerate(self.markers):
            for j, name in enumerate(m.links):
                link = links.get(name)
                if link is None:
                    raise ValueError(
                        f"markers[{i}].links[{j}]: no link named {name!r}; the links are: "
                        f"{', '.join(links) or 'none'}"
                    )
                if m.at not in link.ends:
                    raise ValueError(
                        f"markers[{i}].links[{j}]: link {name} joins {' and '.join(link.ends)}, "
                        f"not {m.at} (markers[{i}].at)"
                    )

    def node_references(self) -> list[tuple[str, str]]:
        """(key, node) of every place the file names a node: links, traffic, marking rules."""
        used = [
            (f"network.links[{i}]", n) for i, lk in enumerate(self.network.links) for n in lk.ends
        ]
        used += [
            (f"traffic[{i}].{k}", n)
            for i, g in enumerate(self.traffic)
            for k, n in zip(("from", "to"), g.endpoints(), strict=True)
        ]
        used += [
            (f"network.marking[{i}]", n)
            for i, r in enumerate(self.network.marking)
            for n in r.named_nodes()
        ]
        return used

    def _check_references(self) -> None:
        """Names that point elsewhere in the file must exist there."""
        for i, gen in enumerate(self.traffic):
            if gen.from_ == gen.to:
                raise ValueError(f"traffic[{i}]: from and to are the same node ({gen.to})")
        declared = self.network.nodes
        if declared:
            for where, node in self.node_references():
                if node not in declared:
                    raise ValueError(
                        f"{where}: node {node!r} is not in network.nodes ({', '.join(declared)})"
                    )
        flows = self.generator_names()
        for i, rule in enumerate(self.network.marking):
            if rule.flow is not None and rule.flow not in flows:
                raise ValueError(
                    f"network.marking[{i}].flow: no traffic named {rule.flow!r}; the traffic "
                    f"is: {', '.join(flows)}"
                )
        links = {lk.name: lk for lk in self.network.links}
        if self.network.bottleneck is not None and self.network.bottleneck not in links:
            raise ValueError(
                f"network.bottleneck: no link named {self.network.bottleneck!r}; the links are: "
                f"{', '.join(links) or 'none'}"
            )
        for i, point in enumerate(self.capture.points):
            if point.link is None:
                continue
            link = links.get(point.link)
            if link is None:
                raise ValueError(
                    f"capture.points[{i}].link: no link named {point.link!r}; the links are: "
                    f"{', '.join(links) or 'none'}"
                )
            if point.at not in link.ends:
                raise ValueError(
                    f"capture.points[{i}].at: {point.at!r} is not an end of link {link.name} "
                    f"({' and '.join(link.ends)})"
                )

    def generator_names(self) -> list[str]:
        return [g.label(i) for i, g in enumerate(self.traffic)]

    def nodes(self) -> list[str]:
        """Every node the experiment names (links, traffic, captures, network.nodes)."""
        found: dict[str, None] = dict.fromkeys(self.network.nodes)
        for link in self.network.links:
            found.update(dict.fromkeys(link.ends))
        for gen in self.traffic:
            found.update(dict.fromkeys(gen.endpoints()))
        for point in self.capture.points:
            if point.node:
                found[point.node] = None
        for rule in self.network.marking:
            found.update(dict.fromkeys(rule.named_nodes()))
        return list(found)

    def senders(self) -> list[str]:
        return list(dict.fromkeys(g.from_ for g in self.traffic))

    def receivers(self) -> list[str]:
        return list(dict.fromkeys(g.to for g in self.traffic))

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json(by_alias=True).encode()).hexdigest()[:12]


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def _first_message(err: ValidationError) -> str:
    e = err.errors()[0]
    key = _key(e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    return f"{key}: {msg}" if key else msg


_LEADING_KEY = re.compile(
    r"(?:Value error, )?([A-Za-z_]\w*(?:\[[^\]]+\])*(?:\.[A-Za-z_]\w*(?:\[[^\]]+\])*)*)(?::| \()"
)


def _named_key(msg: str) -> str:
    """Where a check across keys points: the key its message begins with, else 'keys'."""
    m = _LEADING_KEY.match(msg)
    return f"key '{m[1]}'" if m else "keys"


def _key(loc: tuple[Any, ...]) -> str:
    parts = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in GENERATOR_TYPES:  # the union's branch name is not part of the file
            continue
        else:
            parts.append(f".{p}")
    return "".join(parts).lstrip(".")


def format_errors(source: str | Path, err: ValidationError, prefix: str = "") -> str:
    lines = []
    for e in err.errors():
        key = _key(e["loc"])
        if prefix:
            key = f"{prefix}.{key}" if key and not key.startswith("[") else f"{prefix}{key}"
        where = f"key '{key}'" if key else _named_key(e["msg"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{key}'; allowed here: {_allowed_at(e['loc'])}")
        elif e["type"] == "missing":
            lines.append(f"{source}: key '{key}' is required")
        elif e["type"] == "union_tag_invalid":
            lines.append(f"{source}: {where}: {e['msg']}")
        elif e["type"] == "union_tag_not_found":  # a generator without its type
            types = ", ".join(GENERATOR_TYPES)
            lines.append(f"{source}: {where}: needs a type; the types are: {types}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {where}: {msg}")
    return "\n".join(dict.fromkeys(lines))


def _allowed_at(loc: tuple[Any, ...]) -> str:
    """Field names (as written in files) of the model that holds the unknown key."""
    model: Any = Experiment
    mapping_key = False  # the part before was a mapping of names (hosts): this is a name
    for part in loc[:-1]:
        if isinstance(part, int) or mapping_key:
            mapping_key = False
            continue
        if part in GENERATOR_TYPES:
            model = GENERATOR_TYPES[part].spec_class
            continue
        field = model.model_fields.get(part) if isinstance(model, type) else None
        if field is None:
            # a key written under its alias (from)
            field = (
                next((f for f in model.model_fields.values() if f.alias == part), None)
                if isinstance(model, type)
                else None
            )
        if field is None:
            return "see experiments/*.yml"
        model = _inner_model(field.annotation)
        if model is None:
            return "see experiments/*.yml"
        mapping_key = _is_mapping(field.annotation)
    return ", ".join(f.alias or n for n, f in model.model_fields.items())


def _is_mapping(annotation: Any) -> bool:
    """Whether the annotation is (or allows) a dict: its keys are names, not fields."""
    if get_origin(annotation) is dict:
        return True
    return any(_is_mapping(arg) for arg in get_args(annotation))


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, but a key given twice in one mapping is an error (PyYAML keeps the last
    one silently: a second `duration:` would win over the first without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} given twice (first on line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; a syntax error names the file, line and column."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such experiment file") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: a directory, not an experiment file") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise SpecError(f"{path}: {where}: not valid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None


def validate(raw: Any, source: str | Path) -> Experiment:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping of keys at the top level")
    try:
        return Experiment.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_errors(source, exc)) from None


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"
