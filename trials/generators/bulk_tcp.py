"""bulk_tcp: iperf3 bulk transfers, one or several parallel flows from one node to another."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictBool, model_validator

from core.command import command
from core.dscp import parse_dscp
from trials.fields import CongestionControl, Dscp, Flows, Port, TrafficDuration, TransferBytes
from trials.generators.base import GeneratorSpec, TrafficGenerator

BASE_PORT = 5201
# SO_MAX_PACING_RATE far above any rack rate: it switches on TCP's internal pacing
# (Linux >= 4.13, no fq qdisc needed) at TCP's own rate without capping it.
PACING_CAP = "10G"


class BulkTcpSpec(GeneratorSpec):
    type: Literal["bulk_tcp"]
    flows: Flows = Field(1, description="parallel TCP connections (iperf3 -P)")
    cc: CongestionControl | None = Field(None, description="default: the sender host's")
    duration: TrafficDuration | None = Field(None, description="default: until the trial ends")
    bytes: TransferBytes | None = Field(
        None, description="send this many bytes instead (iperf3 -n)"
    )
    pacing: StrictBool = Field(False, description="TCP internal pacing (SO_MAX_PACING_RATE)")
    port: Port | None = Field(None, description="default: 5201 + index")
    dscp: Dscp | None = Field(
        None,
        description="DSCP of the data packets, set on the sender's socket (iperf3 -S): 0..63 "
        "or a name (af11, af12, ef, ...); default: unmarked. iperf3's control connection stays "
        "unmarked: to mark every packet of the flow (e.g. into a RIO queue's IN class), use a "
        "network.marking rule with flow: instead",
    )

    @model_validator(mode="after")
    def _length(self) -> BulkTcpSpec:
        if self.duration is not None and self.bytes is not None:
            raise ValueError("give duration or bytes, not both")
        return self

    def tools(self) -> dict[str, list[str]]:
        return {self.from_: ["iperf3"], self.to: ["iperf3"]}


class BulkTcp(TrafficGenerator):
    type = "bulk_tcp"
    spec_class = BulkTcpSpec
    metrics = ("goodput", "retransmissions", "startup")
    spec: BulkTcpSpec

    @property
    def port(self) -> int:
        return self.spec.port or BASE_PORT + self.index

    def arm(self) -> None:
        server = command(
            "iperf3", "-s", "-1", "-B", str(self.dst), "-p", self.port, "-J",
            "--logfile", f"{self.name}_server.json",
        )  # fmt: skip
        self.ctx.daemons.spawn(self.receiver, f"{self.name}_server", server)

    def launch(self, t0: float) -> None:
        s = self.spec
        words = ["iperf3", "-c", str(self.dst), "-B", str(self.src), "-p", str(self.port)]
        words += ["-n", str(s.bytes)] if s.bytes else ["-t", f"{self.duration_ns / 1e9:g}"]
        words += ["-P", str(s.flows), *(["-C", s.cc] if s.cc else [])]
        words += ["--fq-rate", PACING_CAP] if s.pacing else []
        # iperf3 -S takes the whole ToS byte: the DSCP is its upper six bits.
        words += ["-S", str(parse_dscp(s.dscp) << 2)] if s.dscp is not None else []
        words += ["-J", "--logfile", f"{self.name}_client.json"]
        self.ctx.daemons.spawn(
            self.sender, f"{self.name}_client", command(*words), start_at=t0 + s.start / 1e9
        )

    @property
    def runs_to_its_end(self) -> bool:
        return self.spec.bytes is None  # iperf3 -n ends when the bytes are sent

    def daemon_names(self) -> list[tuple[str, str]]:
        return [(self.sender, f"{self.name}_client"), (self.receiver, f"{self.name}_server")]

    def problems(self, trial_dir: Path) -> list[str]:
        out = []
        for host, side in ((self.sender, "client"), (self.receiver, "server")):
            path = trial_dir / host / f"{self.name}_{side}.json"
            text = path.read_text(errors="replace") if path.exists() else ""
            try:
                report = json.loads(text)
            except json.JSONDecodeError:
                log = trial_dir / host / f"{self.name}_{side}.log"
                said = log.read_text().strip()[-300:] if log.exists() else ""
                what = "an empty report" if path.exists() and not text.strip() else "no report"
                out.append(f"{self.name}: iperf3 {side} on {host} left {what} {said}".strip())
                continue
            if report.get("error"):
                out.append(f"{self.name}: iperf3 {side} on {host}: {report['error']}")
        return out

    def record(self) -> dict[str, Any]:
        return {
            **super().record(),
            "proto": 6,
            "port": self.port,
            "client_json": f"{self.sender}/{self.name}_client.json",
            **({"dscp": parse_dscp(self.spec.dscp)} if self.spec.dscp is not None else {}),
        }
