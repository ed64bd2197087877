"""What the socket bulk sender (hostside/traffic/bulk_socket.py, bulk_tcp's `tool: socket`)
costs and carries, on loopback with no shaping: 8 flows paced to seed 001's high-speed WAN
rate each (155 Mbit/s: SO_MAX_PACING_RATE, so the rate is the sender's, not the loopback's),
then 8 flows as fast as they go (the ceiling of one sender process). Per run: the rate the
receiver counted and the CPU time sender and receiver spent (getrusage: user and system,
from their reports) per second of transfer.

  python tests/bench/bench_bulk_socket.py [--seconds S] [--flows N] [--rate-mbit R]

Runs both ends as subprocesses on 127.0.0.1; touches nothing else.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
PROGRAM = PROJECT / "hostside/traffic/bulk_socket.py"
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def run(directory: Path, seconds: float, flows: int, pacing_bytes: int | None) -> dict:
    """One transfer; the receiver's and the sender's reports."""
    port = free_port()
    recv_out, send_out = directory / "receiver.json", directory / "sender.json"
    receiver = subprocess.Popen(
        [sys.executable, str(PROGRAM), "receiver", "--bind", HOST, "--port", str(port),
         "--out", str(recv_out)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stderr is not None
        assert "ready" in receiver.stderr.readline()
        pacing = ["--pacing-rate", str(pacing_bytes)] if pacing_bytes else []
        subprocess.run(
            [sys.executable, str(PROGRAM), "sender", "--bind", HOST, "--connect", HOST,
             "--port", str(port), "--flows", str(flows), "--duration-s", f"{seconds:g}",
             *pacing, "--out", str(send_out)],
            check=True, timeout=seconds + 30,
        )  # fmt: skip
        time.sleep(0.5)  # the last bytes in the buffers
    finally:
        receiver.send_signal(signal.SIGTERM)
        receiver.communicate(timeout=10)
    return {
        "receiver": json.loads(recv_out.read_text()),
        "sender": json.loads(send_out.read_text()),
    }


def line(label: str, reports: dict, seconds: float) -> str:
    got = sum(c["bytes"] for c in reports["receiver"]["connections"])
    cpu = {k: sum(reports[k]["cpu_s"].values()) for k in ("sender", "receiver")}
    return (
        f"{label}: {got * 8 / seconds / 1e6:,.0f} Mbit/s received over "
        f"{len(reports['receiver']['connections'])} connections; CPU per second of transfer: "
        f"sender {cpu['sender'] / seconds:.3f} s, receiver {cpu['receiver'] / seconds:.3f} s"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--flows", type=int, default=8)
    p.add_argument("--rate-mbit", type=float, default=155.0, help="each flow's paced rate")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-bulk-socket-") as tmp:
        paced = run(Path(tmp), args.seconds, args.flows, int(args.rate_mbit * 1e6 / 8))
        print(line(f"{args.flows} flows paced to {args.rate_mbit:g} Mbit/s each", paced,
                   args.seconds))  # fmt: skip
        free = run(Path(tmp), args.seconds, args.flows, None)
        print(line(f"{args.flows} flows unpaced", free, args.seconds))


if __name__ == "__main__":
    main()
