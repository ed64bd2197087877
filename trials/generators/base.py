"""The interface every traffic generator implements, and what it gets from the runner."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import Field

from trials.fields import Name, StartOffset, Strict

if TYPE_CHECKING:
    from core.daemons import Daemons
    from core.rack import Rack


# A generator's two directions: forward (from -> to) and reverse (to -> from, a TCP flow's ACKs).
Direction = Literal["forward", "reverse"]
# The most packets each end of a TCP connection sends beyond its data segments: its SYN (or
# SYN-ACK), the ACK that ends the handshake, its FIN and the ACK of the other end's FIN.
CONNECTION_PACKETS = 4


@dataclass(frozen=True)
class OneWay:
    """What a generator sends one way, as preflight's marker capacity check counts it
    (trials/preflight/marker_load.py): `pps` packets/s at a rate of its own (`what` they are),
    plus, for each direction in `full_frames_of`, as many packets/s as the slowest link of that
    direction's path carries in full-size frames: this direction's own data, or at most one
    ACK per data segment of the other direction."""

    protocol: Literal["tcp", "udp"]
    pps: float = 0.0
    what: str = ""
    full_frames_of: tuple[Direction, ...] = ()


class GeneratorSpec(Strict):
    """What every generator's entry in `traffic:` has: endpoints and a start offset."""

    type: str
    name: Name | None = Field(None, description="label in results (default: <type><index>)")
    from_: Name = Field(alias="from", description="sending node")
    to: Name = Field(description="receiving node")
    start: StartOffset = Field(0, description="start time after T0")

    def label(self, index: int) -> str:
        return self.name or f"{self.type}{index}"

    def endpoints(self) -> tuple[str, str]:
        return (self.from_, self.to)

    def tools(self) -> dict[str, list[str]]:
        """Programs each node needs (checked by preflight before anything is touched)."""
        raise NotImplementedError

    def offered(self, bottleneck_bps: int | None) -> dict[Direction, OneWay]:
        """The packets it sends each way (a direction it sends nothing in is left out);
        `bottleneck_bps`: the rate of its forward path's bottleneck (None: unshaped), as
        TrialNetwork.path_summary names it."""
        raise NotImplementedError


class TrialNetwork(Protocol):
    """What a generator asks of the trial's resolved network (trials.network.ResolvedNetwork
    has it; the generators do not import that module, which imports them)."""

    def host_of(self, node: str) -> str: ...

    def address_of(self, node: str) -> ipaddress.IPv4Address: ...

    def path_summary(self, src: str, dst: str) -> dict[str, Any]: ...


@dataclass
class TrialContext:
    """What a generator may use during a trial."""

    rack: Rack
    network: TrialNetwork
    daemons: Daemons
    duration_ns: int  # of the whole trial, from T0
    # Per node: its host's own congestion control (hosts.*.cc, None: the host's default) and
    # the implementation asked for (hosts.*.cc_implementation, None: auto), which decides the
    # name a flow selects (core/link_rules.py cc_kernel_name).
    host_cc: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)


class TrafficGenerator:
    """One generator of one trial. Lifecycle: prepare -> arm -> launch(t0) -> [running] ->
    stop; `record` says what the analysis needs (addresses, ports, files, metrics)."""

    type: ClassVar[str]
    spec_class: ClassVar[type[GeneratorSpec]]
    # Metrics the analysis computes for this type (analysis/traffic/<type>.py).
    metrics: ClassVar[tuple[str, ...]]
    # Whether the runner records cwnd/ssthresh/srtt (tcp:tcp_probe) of this generator's TCP
    # flows on its sender.
    records_cwnd: ClassVar[bool] = True

    def __init__(self, spec: GeneratorSpec, name: str, index: int, ctx: TrialContext):
        self.spec, self.name, self.index, self.ctx = spec, name, index, ctx
        net = ctx.network
        self.sender, self.receiver = net.host_of(spec.from_), net.host_of(spec.to)
        self.src, self.dst = net.address_of(spec.from_), net.address_of(spec.to)

    @property
    def runs_to_its_end(self) -> bool:
        """Its processes run until start + duration_ns (the trial's watch takes an earlier end
        for a crash); False where it may finish sooner (a set number of bytes or
        transactions)."""
        return True

    @property
    def duration_ns(self) -> int:
        """How long it sends: its own duration, else until the end of the trial."""
        own = getattr(self.spec, "duration", None)
        return own if own is not None else self.ctx.duration_ns - self.spec.start

    def prepare(self) -> None:
        """Build and place inputs (before captures start)."""

    def arm(self) -> None:
        """Start receivers and servers (after captures, before T0)."""

    def launch(self, t0: float) -> None:
        """Start the senders at t0 + start (absolute time, one clock)."""
        raise NotImplementedError

    def daemon_names(self) -> list[tuple[str, str]]:
        """(host, daemon) of every process it started; senders first."""
        raise NotImplementedError

    def senders(self) -> list[tuple[str, str]]:
        """The processes whose end means the generator is done."""
        return self.daemon_names()[:1]

    def problems(self, trial_dir: Path) -> list[str]:
        """After collection: what its tools reported as failed (a crash, a refused
        connection), from their own output under trial_dir/<host>/. Empty when it ran."""
        return []

    def record(self) -> dict[str, Any]:
        """What the analysis needs, written into trial.json under traffic.<name>."""
        return {
            "type": self.type,
            "from": self.spec.from_,
            "to": self.spec.to,
            "sender": self.sender,
            "receiver": self.receiver,
            "src": str(self.src),
            "dst": str(self.dst),
            "start_ns": self.spec.start,
            "duration_ns": self.duration_ns,
            "metrics": list(self.metrics),
            "spec": self.spec.model_dump(mode="json", by_alias=True),
        }
