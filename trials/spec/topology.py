"""The `network` block of an experiment file: nodes bound to inventory hosts, shaped links
(rate, buffer, delay, queue discipline, RIO thresholds, per direction) and static DSCP
marking rules."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    model_serializer,
    model_validator,
)

from core.dscp import parse_dscp
from core.link_rules import (
    DEFAULT_QDISC,
    ETHERNET_HEADER,
    MTU,
    QDISC_NAMES,
    RIO_IMPLEMENTATIONS,
)
from core.rio import DEFAULTS as RIO_DEFAULTS
from core.rio import HIGH_DSCP, IN_DSCP, MAX_OVER_MIN, MEAN_PACKET, RioError, virtual_queues
from core.units import parse_bytes
from trials.fields import (
    Allowed,
    BufferSize,
    Dscp,
    InventoryHost,
    LinkDelay,
    LinkRate,
    MeanPacket,
    Mtu,
    Name,
    Probability,
    QueuePackets,
    QueueWeight,
    Strict,
    shown,
)
from trials.spec.errors import At, first_message, require_unique

# Queue disciplines of a link direction (core.link_rules: each one's capabilities).
QDISCS = QDISC_NAMES
# How many DSCPs one list may name: there are 64 code points.
_MOST_DSCPS = 64


class RedLevel(Strict):
    """RED thresholds of one drop precedence of RIO, in packets as the paper gives them."""

    min: QueuePackets | None = Field(None, description="min threshold, packets")
    max: QueuePackets | None = Field(
        None, description=f"max threshold, packets (default {MAX_OVER_MIN} x min)"
    )
    pmax: Probability | None = Field(None, description="drop probability at max")
    w_q: QueueWeight | None = Field(None, description="weight of the average queue")


DscpList = Annotated[
    list[Dscp],
    BeforeValidator(lambda v: v if isinstance(v, list) else [v]),
    Field(min_length=1, max_length=_MOST_DSCPS),
]


class Rio(Strict):
    """RIO (RED with IN and OUT) sharing one physical queue, the link's buffer: GRED in RIO
    mode, IN and OUT taken from the DSCP, and a third level (high) when given. Defaults:
    ../shared/EXPERIMENTS.md §4."""

    mean_packet: MeanPacket = Field(
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
    in_dscp: DscpList = Field(
        default_factory=lambda: list(IN_DSCP),
        description="DSCPs that are IN (every other packet is OUT)",
    )
    high: RedLevel | None = Field(
        None,
        description="a third level, RFC 2597's high drop precedence (VQ 2; seed 004's MPM "
        "sends its probes there): min, max, pmax, w_q, defaults OUT's; none: two levels",
    )
    high_dscp: DscpList | None = Field(
        None, description="with high: its DSCPs (default {})".format(", ".join(HIGH_DSCP))
    )
    implementation: Literal[RIO_IMPLEMENTATIONS] = Field(  # type: ignore[valid-type]
        RIO_IMPLEMENTATIONS[0],
        description="which implementation runs it on a Linux router: auto (GRED in RIO mode "
        "where the kernel has it, else the tc BPF program of hostside/bpf_tc/rio), gred "
        "(GRED; a kernel without it is an error) or bpf (the BPF program even beside GRED). "
        "One per router: its rio links that ask for gred or bpf ask for the same",
    )

    def settings(self) -> dict[str, Any]:
        """The form core/rio.py and role linux_router take (packets, mean_packet with unit);
        the implementation is the router's (linux_router_rio_implementation), not the link's."""
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

    rate: LinkRate | None = Field(None, description="link rate; none = not shaped")
    buffer: BufferSize | None = Field(None, description="drop-tail limit, bytes or packets")
    delay: LinkDelay = Field(0, description="one-way propagation delay")
    qdisc: Literal[QDISCS] = DEFAULT_QDISC  # type: ignore[valid-type]
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
    between: tuple[Name, Name] | None = Field(None, description="[X, Y]: both directions")
    from_: Name | None = Field(None, alias="from", description="with to: one direction")
    to: Name | None = None
    rate: LinkRate | None = Field(None, description="link rate; none = not shaped")
    buffer: BufferSize | None = Field(None, description="drop-tail limit, bytes or packets")
    delay: LinkDelay = Field(0, description="one-way propagation delay")
    qdisc: Literal[QDISCS] = Field(DEFAULT_QDISC, description="queue discipline")  # type: ignore[valid-type]
    rio: Rio | None = Field(None, description="qdisc rio: thresholds per drop precedence")
    mtu: Mtu = Field(MTU, description="MTU of both ends' interfaces")
    forward: dict[str, Any] = Field(
        default_factory=dict,
        description="between[0] -> between[1] (or from -> to): rate, buffer, delay, qdisc, "
        "rio of this direction",
    )
    reverse: dict[str, Any] = Field(
        default_factory=dict, description="between[1] -> between[0]: as forward"
    )

    @model_validator(mode="after")
    def _ends(self) -> Link:
        if (self.between is None) == (self.from_ is None or self.to is None):
            raise ValueError(
                "give either between: [X, Y] (both directions) or from: X and to: Y (one)"
            )
        if self.between is None and self.reverse:
            raise At("reverse", "a one-way link (from/to) has no reverse direction")
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
                f"{which}: unknown key {', '.join(sorted(str(k)[:60] for k in unknown))}; allowed: "
                f"{', '.join(base)}"
            )
        said = f"{which}: " if override else ""  # named by its direction where one was written
        try:
            shaping = Shaping.model_validate({**base, **override})
        except ValidationError as exc:
            raise ValueError(f"{said}{first_message(exc)}") from None
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


_PORTS = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")


def _ports(value: Any) -> int | str:
    """A port (5201) or a range of ports ('5201-5209')."""
    m = _PORTS.fullmatch(str(value)) if isinstance(value, int | str) else None
    if m is None or isinstance(value, bool):
        raise ValueError(f"{shown(value)} is not a port; give a number 1..65535 or a range lo-hi")
    lo, hi = int(m[1]), int(m[2] or m[1])
    if not 1 <= lo <= hi <= 65535:
        raise ValueError(f"{value!r}: ports run from 1 to 65535, low before high")
    return lo if m[2] is None else f"{lo}-{hi}"


_NODE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


def _address_or_node(value: Any) -> str:
    """An IPv4 address or prefix (kept as written), or a node's name (resolved on the rack)."""
    if isinstance(value, str) and value[:1].isdigit():
        try:
            ipaddress.IPv4Network(value, strict=False)
            return value
        except ValueError:
            pass
    elif isinstance(value, str) and _NODE.fullmatch(value):
        return value
    raise ValueError(
        f"{shown(value)} is neither an IPv4 address or prefix (198.18.1.11, 198.18.1.0/24) "
        "nor a node"
    )


Ports = Annotated[
    int | str, BeforeValidator(_ports), Allowed("port", "1 to 65535, or a range lo-hi")
]
AddressOrNode = Annotated[
    str,
    BeforeValidator(_address_or_node),
    Allowed("address or node", "an IPv4 address or prefix, or a node's name"),
]


class MarkRule(Strict):
    """Static DSCP marking at one node (a sender, or an edge router on the flow's path): its
    IPv4 packets that match get `dscp` as they leave it (nftables, role dscp_marker). Match a
    traffic generator's packets by `flow`, or by addresses, protocol and ports; the first
    matching rule of a node wins."""

    name: Name | None = Field(None, description="label of the rule's counter (default: mark<i>)")
    at: Name = Field(description="the node that marks: a sender or a router")
    flow: Name | None = Field(
        None, description="a traffic generator's name: its packets from sender to receiver"
    )
    src: AddressOrNode | None = Field(None, description="source: IPv4 address, prefix or node")
    dst: AddressOrNode | None = Field(None, description="destination: address, prefix or node")
    proto: Literal["tcp", "udp", "icmp"] | None = None
    sport: Ports | None = Field(None, description="source port or range lo-hi (tcp, udp)")
    dport: Ports | None = Field(None, description="destination port or range (tcp, udp)")
    dscp: Dscp = Field(description="0..63 or a name: be, ef, af11..af43, cs0..cs7")

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


class Node(Strict):
    """A node of the experiment bound to an inventory host; `A: host` is short for
    `A: {host: host}` (and is how it is recorded)."""

    host: InventoryHost = Field(description="the inventory host: an IP address or a DNS name")

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        return {"host": data} if not isinstance(data, dict) else data

    @model_serializer
    def _as_host(self) -> str:
        return self.host


class Network(Strict):
    """The nodes the experiment uses, bound to inventory hosts, its shaped links, and the
    static DSCP marking its senders and edge routers do."""

    nodes: dict[Name, Node] = Field(
        default_factory=dict,
        description="node -> inventory host; a node not listed is the host of the same name",
    )
    links: list[Link] = Field(default_factory=list)
    bottleneck: Name | None = Field(
        None,
        description="the link where the traffic congests (default: the slowest shaped hop of "
        "each path); metrics are taken on either side of it",
    )
    marking: list[MarkRule] = Field(
        default_factory=list, description="static DSCP marking rules, in order"
    )

    @model_validator(mode="after")
    def _unique(self) -> Network:
        require_unique("link", "links", [link.name for link in self.links])
        require_unique("marking rule", "marking", [r.label(i) for i, r in enumerate(self.marking)])
        return self

    def host_of(self, node: str) -> str:
        declared = self.nodes.get(node)
        return declared.host if declared else node

    def link(self, name: str) -> Link | None:
        return next((link for link in self.links if link.name == name), None)
