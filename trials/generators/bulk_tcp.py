"""bulk_tcp: bulk transfers, one or several parallel flows from one node to another, by iperf3
(the default) or by the socket sender (hostside/traffic/bulk_socket.py), which writes from
connect as a real bulk transfer does: no control connection, no set-up exchange."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictBool, model_validator

from core.command import Command, command
from core.dscp import parse_dscp
from core.hostside import BULK_SOCKET, program_command, remote_dir
from core.link_rules import cc_kernel_name
from trials.fields import CongestionControl, Dscp, Flows, Port, TrafficDuration, TransferBytes
from trials.generators.base import Direction, GeneratorSpec, OneWay, TrafficGenerator

BASE_PORT = 5201
# SO_MAX_PACING_RATE far above any rack rate: it switches on TCP's internal pacing
# (Linux >= 4.13, no fq qdisc needed) at TCP's own rate without capping it.
PACING_CAP_BPS = 10_000_000_000


class BulkTcpSpec(GeneratorSpec):
    type: Literal["bulk_tcp"]
    flows: Flows = Field(1, description="parallel TCP connections (iperf3 -P)")
    cc: CongestionControl | None = Field(None, description="default: the sender host's")
    duration: TrafficDuration | None = Field(None, description="default: until the trial ends")
    bytes: TransferBytes | None = Field(
        None,
        description="send this many bytes instead (iperf3 -n), over all its flows (socket: "
        "split evenly, at least one per flow)",
    )
    pacing: StrictBool = Field(False, description="TCP internal pacing (SO_MAX_PACING_RATE)")
    port: Port | None = Field(None, description="default: 5201 + index")
    dscp: Dscp | None = Field(
        None,
        description="DSCP of the data packets, set on the sender's socket (iperf3 -S): 0..63 "
        "or a name (af11, af12, ef, ...); default: unmarked. iperf3's control connection stays "
        "unmarked: to mark every packet of the flow (e.g. into a RIO queue's IN class), use a "
        "network.marking rule with flow: instead (the socket sender has no control connection; "
        "the receiver's ACKs stay unmarked with either tool)",
    )
    tool: Literal["iperf3", "socket"] = Field(
        "iperf3",
        description="iperf3: a control connection and a set-up exchange first, its data one "
        "round trip after the data connection's handshake; socket: hostside/traffic/"
        "bulk_socket.py, which connects and writes at once, as an FTP or HTTP transfer does "
        "(data right after the handshake's last ACK)",
    )

    @model_validator(mode="after")
    def _length(self) -> BulkTcpSpec:
        if self.duration is not None and self.bytes is not None:
            raise ValueError("give duration or bytes, not both")
        if self.tool == "socket" and self.bytes is not None and self.bytes < self.flows:
            raise ValueError(
                f"bytes {self.bytes} B with tool socket: at least one byte per flow "
                f"(flows {self.flows})"
            )
        return self

    def tools(self) -> dict[str, list[str]]:
        program = ["iperf3"] if self.tool == "iperf3" else ["python3"]
        return {self.from_: program, self.to: program}

    def offered(self, bottleneck_bps: int | None) -> dict[Direction, OneWay]:
        # Data as fast as the path carries it, and its ACKs (a few handshake packets aside).
        return {d: OneWay("tcp", full_frames_of=("forward",)) for d in ("forward", "reverse")}


class BulkTcp(TrafficGenerator):
    type = "bulk_tcp"
    spec_class = BulkTcpSpec
    metrics = ("goodput", "retransmissions", "startup")
    spec: BulkTcpSpec

    @property
    def port(self) -> int:
        return self.spec.port or BASE_PORT + self.index

    def files(self, side: str) -> str:
        """The report of its client (sender) or server (receiver), in that host's directory."""
        return f"{self.name}_{side}.json"

    def _socket(self, host: str, *args: str) -> Command:
        """bulk_socket.py from the host's shipped programs."""
        return program_command(remote_dir(self.ctx.rack.host(host).workdir), BULK_SOCKET, *args)

    def arm(self) -> None:
        name, out = f"{self.name}_server", self.files("server")
        if self.spec.tool == "socket":
            args = ("receiver", "--bind", str(self.dst), "--port", str(self.port), "--out", out)
            self.ctx.daemons.spawn(
                self.receiver, name, self._socket(self.receiver, *args), ready="ready"
            )
            return
        server = command(
            "iperf3", "-s", "-1", "-B", str(self.dst), "-p", self.port, "-J", "--logfile", out
        )
        self.ctx.daemons.spawn(self.receiver, name, server)

    def launch(self, t0: float) -> None:
        s, name = self.spec, f"{self.name}_client"
        start_at = t0 + s.start / 1e9
        if s.tool == "socket":
            # Started now, in the lead, and waiting for its start itself (as web_flows.py: a
            # Python start took seconds under TCG, the VM rack's emulation).
            args = self.socket_args(start_at)
            self.ctx.daemons.spawn(self.sender, name, self._socket(self.sender, *args))
            return
        words = ["iperf3", "-c", str(self.dst), "-B", str(self.src), "-p", str(self.port)]
        words += ["-n", str(s.bytes)] if s.bytes else ["-t", f"{self.duration_ns / 1e9:g}"]
        words += ["-P", str(s.flows), *(["-C", cc] if (cc := self.cc_selected()) else [])]
        words += ["--fq-rate", str(PACING_CAP_BPS)] if s.pacing else []
        # iperf3 -S takes the whole ToS byte: the DSCP is its upper six bits.
        words += ["-S", str(parse_dscp(s.dscp) << 2)] if s.dscp is not None else []
        words += ["-J", "--logfile", self.files("client")]
        self.ctx.daemons.spawn(self.sender, name, command(*words), start_at=start_at)

    def socket_args(self, start_at: float) -> list[str]:
        """bulk_socket.py sender's arguments: the same options as iperf3's, in its words."""
        s = self.spec
        words = ["sender", "--bind", str(self.src), "--connect", str(self.dst)]
        words += ["--port", str(self.port), "--flows", str(s.flows)]
        words += (
            ["--bytes", str(s.bytes)]
            if s.bytes
            else ["--duration-s", f"{self.duration_ns / 1e9:g}"]
        )
        cc = self.cc_selected()
        words += ["--start-at", repr(start_at), *(["--cc", cc] if cc else [])]
        words += ["--pacing-rate", str(PACING_CAP_BPS // 8)] if s.pacing else []  # bytes/s
        words += ["--tos", str(parse_dscp(s.dscp) << 2)] if s.dscp is not None else []
        return [*words, "--out", self.files("client")]

    def cc_selected(self) -> str | None:
        """The congestion control the flow's sockets select (iperf3 -C, bulk_socket.py --cc),
        by the name the sender's kernel knows it by: the flow's own cc, or its host's where that
        runs as another implementation than the host's default (cc_implementation bpf:
        bpf_<cc>); None: the host's default."""
        own, implementation = self.ctx.host_cc.get(self.spec.from_, (None, None))
        cc = self.spec.cc or own
        if cc is None:
            return None
        name = cc_kernel_name(cc, implementation)
        return name if self.spec.cc or name != cc else None

    @property
    def runs_to_its_end(self) -> bool:
        return self.spec.bytes is None  # a set number of bytes ends when they are sent

    def daemon_names(self) -> list[tuple[str, str]]:
        return [(self.sender, f"{self.name}_client"), (self.receiver, f"{self.name}_server")]

    def problems(self, trial_dir: Path) -> list[str]:
        out = []
        tool = self.spec.tool if self.spec.tool == "iperf3" else "bulk_socket"
        for host, side in ((self.sender, "client"), (self.receiver, "server")):
            path = trial_dir / host / self.files(side)
            text = path.read_text(errors="replace") if path.exists() else ""
            try:
                report = json.loads(text)
            except json.JSONDecodeError:
                log = trial_dir / host / f"{self.name}_{side}.log"
                said = log.read_text().strip()[-300:] if log.exists() else ""
                what = "an empty report" if path.exists() and not text.strip() else "no report"
                out.append(f"{self.name}: {tool} {side} on {host} left {what} {said}".strip())
                continue
            if report.get("error"):
                # bulk_socket.py's report: each failed flow's reason beside the count
                failed = {f["error"] for f in report.get("flows", []) if f["status"] == "error"}
                why = f" ({', '.join(sorted(failed))})" if failed else ""
                out.append(f"{self.name}: {tool} {side} on {host}: {report['error']}{why}")
        return out

    def record(self) -> dict[str, Any]:
        return {
            **super().record(),
            "proto": 6,
            "port": self.port,
            "tool": self.spec.tool,
            "client_json": f"{self.sender}/{self.files('client')}",
            "server_json": f"{self.receiver}/{self.files('server')}",
            **({"dscp": parse_dscp(self.spec.dscp)} if self.spec.dscp is not None else {}),
        }
