"""cbr_udp: a constant-bit-rate UDP stream (fixed-size IP packets at a fixed interval),
generated as a pcap and replayed in real time by tcpreplay; a socket sink receives it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from core.command import command
from core.dscp import parse_dscp
from core.link_rules import ETHERNET_HEADER
from trials.fields import Dscp, PacketInterval, Port, TrafficDuration, UdpPacketBytes
from trials.generators.base import Direction, GeneratorSpec, OneWay, TrafficGenerator
from trials.udp_stream import next_hop, rewrite_for_rack, write_stream_template

BASE_PORT = 40000
# The receiver's sink: a UDP socket bound to address $1, port $2 (python3 -c SINK ADDR PORT).
_SINK = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "s.bind((sys.argv[1], int(sys.argv[2])))\n"
    "while True: s.recv(65535)\n"
)


class CbrUdpSpec(GeneratorSpec):
    type: Literal["cbr_udp"]
    packet_bytes: UdpPacketBytes = Field(186, description="IP packet size (headers included)")
    interval: PacketInterval = Field(20_000_000, description="time between packets")
    dscp: Dscp = Field(0, description="DSCP of every packet: 0..63 or a name (ef, af11, ...)")
    duration: TrafficDuration | None = Field(None, description="default: until the trial ends")
    port: Port | None = Field(None, description="default: 40000 + index")

    def tools(self) -> dict[str, list[str]]:
        return {self.from_: ["tcpreplay"], self.to: ["python3"]}

    def offered(self, bottleneck_bps: int | None) -> dict[Direction, OneWay]:
        pps = 1e9 / self.interval
        return {"forward": OneWay("udp", pps=pps, what=f"a CBR stream of {pps:g} packets/s")}

    def bitrate(self) -> float:
        """Ethernet-frame bits per second (what a shaper counts)."""
        return (self.packet_bytes + ETHERNET_HEADER) * 8 * 1e9 / self.interval


class CbrUdp(TrafficGenerator):
    type = "cbr_udp"
    spec_class = CbrUdpSpec
    metrics = ("one_way_delay", "loss")
    spec: CbrUdpSpec

    @property
    def port(self) -> int:
        return self.spec.port or BASE_PORT + self.index

    @property
    def stream_file(self) -> str:
        return f"{self.name}_stream.pcap"

    def prepare(self) -> None:
        """Build the stream's pcap for the rack and put it on the sender."""
        rack, s = self.ctx.rack, self.spec
        self.iface, src_mac, hop_mac = next_hop(rack, self.sender, str(self.dst))
        scratch = Path(tempfile.mkdtemp(prefix="trialbed-udp-"))
        template, stream = scratch / "template.pcap", scratch / self.stream_file
        try:
            write_stream_template(
                template,
                packets=self.duration_ns // s.interval,
                ip_bytes=s.packet_bytes,
                interval_ns=s.interval,
                port=self.port,
                dscp=parse_dscp(s.dscp),
            )
            rewrite_for_rack(
                template,
                stream,
                src_ip=str(self.src),
                dst_ip=str(self.dst),
                src_mac=src_mac,
                next_hop_mac=hop_mac,
            )
            # The copy the sender replayed comes back with its files.
            rack.put(self.sender, stream, f"{self.ctx.daemons.remote[self.sender]}/{stream.name}")
        finally:
            shutil.rmtree(scratch)

    def arm(self) -> None:
        sink = command("python3", "-c", _SINK, str(self.dst), self.port)
        self.ctx.daemons.spawn(self.receiver, f"{self.name}_sink", sink)

    def launch(self, t0: float) -> None:
        replay = command(
            "tcpreplay", "-i", self.iface, "--preload-pcap", "--timer=nano", self.stream_file
        )
        self.ctx.daemons.spawn(
            self.sender, f"{self.name}_replay", replay, start_at=t0 + self.spec.start / 1e9
        )

    def daemon_names(self) -> list[tuple[str, str]]:
        return [(self.sender, f"{self.name}_replay"), (self.receiver, f"{self.name}_sink")]

    def problems(self, trial_dir: Path) -> list[str]:
        # tcpreplay ends with its statistics ("Actual: N packets ...") when it ran through.
        log = trial_dir / self.sender / f"{self.name}_replay.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        if "Actual:" not in text:
            # "File Cache is enabled" is tcpreplay's banner for --preload-pcap, not a cause.
            lines = [ln for ln in text.splitlines() if ln.strip() and "File Cache" not in ln]
            said = "\n".join(lines).strip()[-300:]
            if not said:
                said = "it printed no statistics (stopped before its end, or never started)"
            return [f"{self.name}: tcpreplay on {self.sender} did not finish: {said}"]
        return []

    def record(self) -> dict[str, Any]:
        return {
            **super().record(),
            "proto": 17,
            "port": self.port,
            "dscp": parse_dscp(self.spec.dscp),
            "packet_bytes": self.spec.packet_bytes,
            "interval_ns": self.spec.interval,
            "stream_file": f"{self.sender}/{self.stream_file}",
        }
