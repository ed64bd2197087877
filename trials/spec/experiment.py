"""One experiment file as a typed, frozen object: its network, traffic, captures, edge
markers and per-host settings, the trial's timing, and the checks across keys (every name it
refers to exists, every flow fits in the trial)."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, field_validator, model_validator

from core.link_rules import CC_IMPLEMENTATIONS
from core.units import parse_duration_ns
from trials.fields import (
    AfClass,
    CcParamName,
    CcParamValue,
    CongestionControl,
    Description,
    Drain,
    FilterWeight,
    HostKey,
    InitCwnd,
    InitialAllowance,
    InterfaceName,
    Label,
    Name,
    ProtectedPackets,
    Repetitions,
    Seed,
    Snaplen,
    SocketBuffer,
    StartOffset,
    Strict,
    Timeout,
    TrialDuration,
    whole,
)
from trials.generators import Generator
from trials.spec.errors import At, require_unique
from trials.spec.topology import Network

Switch = whole(0, 1, "a sysctl switch: 0 off, 1 on")


class EdgeMarker(Strict):
    """A per-flow adaptive marker of seed 004 at an ingress edge router
    (hostside/markers/markers.py, run on the packet path by hostside/markers/edge_marker.py,
    or as the tc BPF program hostside/bpf_tc/edge_marker/ checked against it): the TCP packets
    `at` receives over `links` get the DSCP AF<af_class><p> of the drop precedence p the
    marker gives them."""

    name: Name | None = Field(None, description="label in results (default: marker<index>)")
    at: Name = Field(description="the edge router that marks (a router node)")
    links: list[Name] = Field(min_length=1, description="links whose packets into `at` it marks")
    marker: Literal["NM", "APM", "WPM", "MPM"] = Field(description="NM, APM, WPM or MPM")
    af_class: AfClass = Field(1, description="AF class of the DSCPs written")
    a0: InitialAllowance = Field(7.0, description="APM: initial A_IN")
    alpha: FilterWeight = Field(0.5, description="APM: filter weight of A_IN")
    n_s: ProtectedPackets = Field(5, description="WPM: packets protected at a flow's start")
    n_a: ProtectedPackets = Field(5, description="WPM: packets protected after a loss")
    implementation: Literal["python", "bpf"] = Field(
        "python",
        description="python: the NFQUEUE program; bpf: the tc BPF program on the router's "
        "ingress (built there: clang, libbpf-dev, gcc)",
    )

    def label(self, index: int) -> str:
        return self.name or f"marker{index}"


class CapturePoint(Strict):
    """A tcpdump point: a node's end of a link (link + at), or a node's interface by name."""

    name: Name
    link: Name | None = None
    at: Name | None = Field(None, description="which end of the link: one of its two nodes")
    node: Name | None = None
    interface: InterfaceName | None = None

    @model_validator(mode="after")
    def _one_form(self) -> CapturePoint:
        by_link = self.link is not None and self.at is not None
        by_iface = self.node is not None and self.interface is not None
        if by_link == by_iface or (self.link is None) != (self.at is None):
            raise ValueError("give either link and at (a node of that link), or node and interface")
        return self


class Capture(Strict):
    snaplen: Snaplen = Field(128, description="bytes kept of each packet")
    points: list[CapturePoint] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Capture:
        require_unique("capture point", "points", [p.name for p in self.points])
        return self


class HostSettings(Strict):
    """TCP settings of a host or group (all, senders, receivers, an inventory group, a node)."""

    cc: CongestionControl | None = None
    cc_params: dict[CongestionControl, dict[CcParamName, CcParamValue]] = Field(
        default_factory=dict, description="module parameters per congestion control"
    )
    cc_implementation: Literal[CC_IMPLEMENTATIONS] | None = Field(  # type: ignore[valid-type]
        None,
        description="which implementation runs the host's congestion controls: auto (the "
        "default: the kernel's own, built in or a module, where it has one, else the BPF one "
        "of hostside/bpf_cc), module (the kernel's own; a kernel without it is an error) or "
        "bpf (hostside/bpf_cc's even where the kernel has its own: registered beside it as "
        "bpf_<cc>, which the host's bulk_tcp flows select; the record still says cc <cc>)",
    )
    initcwnd: InitCwnd | None = Field(None, description="route initcwnd")
    rto_min: Timeout | None = Field(None, description="route rto_min, whole milliseconds")
    rcvbuf: SocketBuffer | None = Field(
        None, description="largest TCP receive buffer (tcp_rmem max)"
    )
    sndbuf: SocketBuffer | None = Field(None, description="largest TCP send buffer (tcp_wmem max)")
    tcp_no_metrics_save: Switch | None = None
    tcp_timestamps: Switch | None = Field(
        None,
        description="net.ipv4.tcp_timestamps; 0: no timestamp option, so a full segment "
        "carries 12 more bytes (1460 at MTU 1500, as on the EFT paper's hosts)",
    )
    pacing: StrictBool | None = Field(
        None,
        description="fq as the root qdisc of the host's experiment interfaces, which paces "
        "every TCP flow (needs sch_fq; traffic[].pacing asks TCP's own pacing per flow)",
    )

    @field_validator("rto_min")
    @classmethod
    def _whole_ms(cls, value: int | None) -> int | None:
        if value is not None and value % 10**6:
            raise ValueError("rto_min is a whole number of milliseconds from 1ms to 120s")
        return value


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


class Experiment(Strict):
    """One experiment file."""

    experiment: Name = Field(description="the family's report (collateral_damage, startup, ...)")
    name: Label = Field("", description="a label, on one line")
    description: Description = Field("", description="free text")
    topology: Name = Field("dumbbell", description="the rack topology it needs")
    network: Network = Field(default_factory=Network)
    traffic: list[Generator] = Field(
        min_length=1, description="typed generators, one table per type below"
    )
    capture: Capture = Field(default_factory=Capture)
    markers: list[EdgeMarker] = Field(
        default_factory=list, description="adaptive per-flow DSCP markers at edge routers"
    )
    hosts: dict[HostKey, HostSettings] = Field(default_factory=dict)
    duration: TrialDuration
    warmup: StartOffset = Field(0, description="start of the steady-state window after T0")
    drain: Drain = Field(
        default=parse_duration_ns("1s"), description="wait after traffic ends (queues drain)"
    )
    factors: dict[str, Annotated[list[Any], BeforeValidator(_as_list)]] = Field(
        default_factory=dict, description="dotted key -> its levels (one trial per combination)"
    )
    repetitions: Repetitions = Field(1, description="runs of each factor combination")
    seed: Seed = Field(1, description="the seed of the trials' order and of the generators")
    report: dict[str, Any] = Field(
        default_factory=dict, description="settings of the family's report"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Experiment:
        if self.warmup >= self.duration:
            raise At(
                "warmup",
                f"warmup ({self.warmup / 1e9:g} s) must be shorter than duration "
                f"({self.duration / 1e9:g} s)",
            )
        require_unique("traffic", "traffic", self.generator_names())
        self._check_references()
        self._check_markers()
        for i, gen in enumerate(self.traffic):
            if gen.start >= self.duration:
                raise At(
                    f"traffic[{i}].start",
                    f"traffic[{i}].start ({gen.start / 1e9:g} s) is not before the end of the "
                    f"trial (duration {self.duration / 1e9:g} s)",
                )
            own = getattr(gen, "duration", None)
            if own is not None and gen.start + own > self.duration:
                raise At(
                    f"traffic[{i}].duration",
                    f"traffic[{i}].duration ({own / 1e9:g} s from its start at "
                    f"{gen.start / 1e9:g} s) runs past the end of the trial (duration "
                    f"{self.duration / 1e9:g} s); shorten it, or leave it out to run until the "
                    "end",
                )
        return self

    def _check_markers(self) -> None:
        require_unique("marker", "markers", [m.label(i) for i, m in enumerate(self.markers)])
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
        """(key, node) of every place the file names a node: links, traffic, marking rules,
        capture points by interface, markers."""
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
        used += [
            (f"capture.points[{i}].node", p.node)
            for i, p in enumerate(self.capture.points)
            if p.node is not None
        ]
        used += [(f"markers[{i}].at", m.at) for i, m in enumerate(self.markers)]
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
