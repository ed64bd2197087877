"""transaction: request/response workloads of the EFT family (seed 003): EFT-SHORT, EFT-LONG and
FILETRANSF-LONG over TCP or over UDP with the paper's reliable window scheme, by the
trialbed-transact program (C; built on every end host by the `transactions` role). The
client times every transaction and writes one row per transaction (start, end, bytes, ok)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from core.command import command
from trials.fields import (
    SOCKET_BUFFER,
    MessageBytes,
    Pairs,
    Port,
    Timeout,
    TrafficDuration,
    Transactions,
)
from trials.generators.base import Direction, GeneratorSpec, OneWay, TrafficGenerator

BASE_PORT = 45000  # + 100 * index; UDP pair i uses port + i
PROGRAM = "trialbed-transact"
WORKLOADS = {"eft_short": "short", "eft_long": "long", "filetransf_long": "file"}
# The paper's values (Lipovac et al. 2009, section 3.1): send size per call, UDP window.
SEND_SIZE = {"tcp": 32767, "udp": 8863}
EFT_REQUEST = 100
FILE_SIZE = 1_460_000
UDP_WINDOW = 17726
UDP_RTO_NS = 200_000_000
UDP_HEADER = 20  # the reliable scheme's header before each datagram's data
MAX_UDP_SEND = 65507 - UDP_HEADER
MAX_TCP_SEND = 1 << 24


class TransactionSpec(GeneratorSpec):
    type: Literal["transaction"]
    workload: Literal["eft_short", "eft_long", "filetransf_long"] = Field(
        description="eft_short (connect, request, 1-byte reply, close), eft_long (one "
        "connection, repeated request/reply), filetransf_long (one connection, repeated "
        "file / 1-byte ack)"
    )
    protocol: Literal["tcp", "udp"] = Field("tcp", description="udp: the reliable window scheme")
    request: MessageBytes | None = Field(None, description="EFT request size (default 100 B)")
    file_size: MessageBytes | None = Field(
        None, description="FILETRANSF-LONG file (default 1460000 B)"
    )
    send_size: MessageBytes | None = Field(
        None, description="bytes per send call (default 32767 B for tcp, 8863 B for udp)"
    )
    tcp_window: MessageBytes | None = Field(
        None,
        description=f"tcp: SO_SNDBUF and SO_RCVBUF of both ends ({SOCKET_BUFFER.text()}; "
        "the paper's 8760B); not "
        "applied to udp (its window is `window`), so one file may cross both protocols",
    )
    window: MessageBytes | None = Field(None, description="udp: bytes per window (default 17726 B)")
    rto: Timeout | None = Field(None, description="udp: retransmission timeout (default 200ms)")
    pairs: Pairs = Field(1, description="concurrent client/server pairs")
    count: Transactions | None = Field(
        None, description="transactions per pair (default: until the duration ends)"
    )
    duration: TrafficDuration | None = Field(None, description="default: until the trial ends")
    port: Port | None = Field(None, description="default: 45000 + 100 * index")

    @model_validator(mode="after")
    def _consistent(self) -> TransactionSpec:
        tcp = self.protocol == "tcp"
        if self.workload == "filetransf_long" and self.request is not None:
            raise ValueError(
                "request applies to eft_short and eft_long; filetransf_long sends file_size"
            )
        if self.workload != "filetransf_long" and self.file_size is not None:
            raise ValueError(
                f"file_size applies to workload filetransf_long only, not "
                f"{self.workload} (whose request size is `request`)"
            )
        for key in ("window", "rto"):
            if tcp and getattr(self, key) is not None:
                raise ValueError(f"{key} applies to protocol udp only (TCP's is tcp_window)")
        limit = MAX_TCP_SEND if tcp else MAX_UDP_SEND
        if not 1 <= self.send_bytes <= limit:
            raise ValueError(
                f"send_size {self.send_bytes} B: allowed 1 to {limit} B for "
                f"{self.protocol}" + ("" if tcp else " (one datagram per send)")
            )
        if self.tcp_window is not None and not SOCKET_BUFFER.holds(self.tcp_window):
            raise ValueError(
                f"tcp_window {self.tcp_window} B: allowed {SOCKET_BUFFER.low} B to "
                f"{SOCKET_BUFFER.high} B"
            )
        if not tcp and self.window_bytes < self.send_bytes:
            raise ValueError(
                f"window {self.window_bytes} B must hold at least one send "
                f"(send_size {self.send_bytes} B)"
            )
        if self.port is not None and self.port + self.pairs - 1 > 65535:
            raise ValueError(f"port {self.port} + pairs {self.pairs} goes beyond port 65535")
        return self

    @property
    def request_bytes(self) -> int:
        if self.workload == "filetransf_long":
            return FILE_SIZE if self.file_size is None else self.file_size
        return EFT_REQUEST if self.request is None else self.request

    @property
    def send_bytes(self) -> int:
        return SEND_SIZE[self.protocol] if self.send_size is None else self.send_size

    @property
    def window_bytes(self) -> int:
        return UDP_WINDOW if self.window is None else self.window

    @property
    def rto_ns(self) -> int:
        return UDP_RTO_NS if self.rto is None else self.rto

    def tools(self) -> dict[str, list[str]]:
        # The transactions role builds the program on each end host with its gcc.
        return {self.from_: ["gcc"], self.to: ["gcc"]}

    def offered(self, bottleneck_bps: int | None) -> dict[Direction, OneWay]:
        # Requests one way, replies the other, each with the other's ACKs. Counted as data in
        # full-size segments both ways: a small message's rate is bounded by round trips,
        # which are not counted (eft_short's connection per transaction offers more).
        both: tuple[Direction, ...] = ("forward", "reverse")
        return {d: OneWay(self.protocol, full_frames_of=both) for d in both}


def read_client_csv(path: Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The client's `# key=value` header lines as one dict, and its rows."""
    meta: dict[str, str] = {}
    with path.open() as f:
        lines = f.readlines()
    for line in lines:
        if line.startswith("#"):
            meta.update(w.split("=", 1) for w in line[1:].split() if "=" in w)
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    return meta, rows


class Transaction(TrafficGenerator):
    type = "transaction"
    spec_class = TransactionSpec
    metrics = ("response_time", "throughput", "capture_check")
    # Requests of 100 bytes and replies of one never grow a window: tcp_probe would only log
    # every ACK of thousands of connections (53 MB in a 20 s EFT-SHORT trial) for no figure.
    records_cwnd = False
    spec: TransactionSpec

    @property
    def port(self) -> int:
        return self.spec.port or BASE_PORT + 100 * self.index

    def program(self, host: str) -> str:
        return f"{self.ctx.rack.host(host).workdir}/bin/{PROGRAM}"

    def common(self) -> list[str]:
        """The words both ends are given."""
        s = self.spec
        words = ["--proto", s.protocol, "--port", str(self.port), "--pairs", str(s.pairs)]
        words += ["--request", str(s.request_bytes)]
        return words + (["--sockbuf", str(s.tcp_window)] if self.sockbuf else [])

    @property
    def sockbuf(self) -> int | None:
        """The socket buffers set on both ends: tcp_window for TCP; UDP keeps the kernel's."""
        return self.spec.tcp_window if self.spec.protocol == "tcp" else None

    def arm(self) -> None:
        # EFT-SHORT over TCP: the server closes first, so TIME-WAIT stays on the server and
        # the client's ports never run out however many connections a trial makes.
        first = ["--close-first"] if self.spec.workload == "eft_short" else []
        server = command(
            self.program(self.receiver), "server", "--bind", str(self.dst), *self.common(), *first
        )
        self.ctx.daemons.spawn(self.receiver, f"{self.name}_server", server, ready="listening on")

    def launch(self, t0: float) -> None:
        s = self.spec
        words = [self.program(self.sender), "client", "--connect", str(self.dst)]
        words += ["--bind", str(self.src), *self.common()]
        words += ["--workload", WORKLOADS[s.workload], "--send-size", str(s.send_bytes)]
        if s.protocol == "udp":
            rto_ms = max(1, s.rto_ns // 1_000_000)
            words += ["--window", str(s.window_bytes), "--rto-ms", str(rto_ms)]
        if s.count:
            words += ["--count", str(s.count)]
        words += ["--duration", f"{self.duration_ns / 1e9:g}", "--out", f"{self.name}_client.csv"]
        self.ctx.daemons.spawn(
            self.sender, f"{self.name}_client", command(*words), start_at=t0 + s.start / 1e9
        )

    @property
    def runs_to_its_end(self) -> bool:
        return self.spec.count is None  # a set number of transactions ends when done

    def daemon_names(self) -> list[tuple[str, str]]:
        return [(self.sender, f"{self.name}_client"), (self.receiver, f"{self.name}_server")]

    def problems(self, trial_dir: Path) -> list[str]:
        path = trial_dir / self.sender / f"{self.name}_client.csv"
        log = trial_dir / self.sender / f"{self.name}_client.log"
        said = log.read_text(errors="replace").strip()[-300:] if log.exists() else ""
        if not path.exists():
            return [f"{self.name}: {PROGRAM} client on {self.sender} left no rows: {said}"]
        _, rows = read_client_csv(path)
        ok = sum(r["ok"] == "1" for r in rows)
        if not ok:
            return [f"{self.name}: no transaction succeeded ({len(rows)} tried): {said}"]
        return []

    def record(self) -> dict[str, Any]:
        s = self.spec
        return {
            **super().record(),
            "proto": 6 if s.protocol == "tcp" else 17,
            "port": self.port,
            "workload": s.workload,
            "protocol": s.protocol,
            "pairs": s.pairs,
            "request_bytes": s.request_bytes,
            "send_bytes": s.send_bytes,
            "sockbuf": self.sockbuf,
            "window_bytes": s.window_bytes if s.protocol == "udp" else None,
            "udp_header_bytes": UDP_HEADER if s.protocol == "udp" else None,
            "client_csv": f"{self.sender}/{self.name}_client.csv",
            "server_log": f"{self.receiver}/{self.name}_server.log",
        }
