"""The transaction generator's own overhead, on loopback with no shaping: per workload and
protocol, the response time it reports next to (1) its overhead as a capture on `lo` sees it:
the client's time minus the time from its first request packet to the reply packet, per
transaction, matched as the trial analysis matches them; (2) the CPU time client and server
spend per transaction in user space (the program's own work; getrusage, tick-sampled) and in
the kernel (socket calls, which a real application pays too).

  python tests/bench/bench_transact.py [--count N] [--file-count N]

Builds hostside/traffic/transact/ with the role's flags into a temporary
directory; touches nothing else. Traffic stays on loopback (client 127.0.0.1, server
127.0.0.2, so that a capture tells the directions apart).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

from analysis.pcap import read_pcap  # noqa: E402
from analysis.traffic.transaction import (  # noqa: E402
    capture_transactions,
    cross_check,
    own_packets,
    read_client,
)

ROLE = PROJECT / "roles/transactions"
CLIENT, SERVER = "127.0.0.1", "127.0.0.2"
WORKLOADS = {"short": "eft_short", "long": "eft_long", "file": "filetransf_long"}


def build(directory: Path) -> Path:
    flags = yaml.safe_load((ROLE / "defaults/main.yml").read_text())["transactions_cflags"]
    out = directory / "trialbed-transact"
    sources = sorted((PROJECT / "hostside/traffic/transact").glob("*.c"))
    subprocess.run(["gcc", *flags, "-o", str(out), *map(str, sources)], check=True)
    return out


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(program: Path, directory: Path, proto: str, workload: str, request: int, count: int):
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    port = free_port(kind)
    common = ["--proto", proto, "--port", str(port), "--request", str(request)]
    first = ["--close-first"] if workload == "short" else []
    pcap = directory / f"{proto}-{workload}.pcap"
    capture = subprocess.Popen(
        [
            *("tcpdump", "-i", "lo", "-n", "-s", "96", "-U", "--immediate-mode", "-B", "16384"),
            *("--time-stamp-precision=nano", "-w", str(pcap), f"port {port}"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert capture.stderr is not None
    capture.stderr.readline()  # listening on lo
    server = subprocess.Popen(
        [str(program), "server", "--bind", SERVER, *common, *first],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    server.stdout.readline()
    out = directory / f"{proto}-{workload}.csv"
    try:
        subprocess.run(
            [
                *(str(program), "client", "--connect", SERVER, "--bind", CLIENT, *common),
                *("--workload", workload, "--count", str(count), "--out", str(out)),
            ],
            check=True,
            stderr=subprocess.DEVNULL,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        log, _ = server.communicate()
        time.sleep(0.2)
        capture.send_signal(signal.SIGINT)
        capture.communicate()
    srv = dict(w.split("=") for w in log.split("served ", 1)[1].split())
    meta, rows = read_client(out)
    response_us = rows.response_ns.to_numpy() / 1e3
    n = len(rows)
    gen = {"src": CLIENT, "dst": SERVER, "port": port, "pairs": 1, "workload": WORKLOADS[workload]}
    gen["proto"] = 6 if proto == "tcp" else 17
    check = cross_check(rows, capture_transactions(own_packets(read_pcap(pcap), gen), gen))
    excess_us = check.excess_ns.to_numpy() / 1e3
    user_us = (float(meta["user_s"]) + float(srv["user_s"])) / n * 1e6
    sys_us = (float(meta["sys_s"]) + float(srv["sys_s"])) / n * 1e6
    return {
        "n": n,
        "median": float(np.median(response_us)),
        "mean": float(response_us.mean()),
        "p99": float(np.percentile(response_us, 99)),
        "matched": len(check) / n,
        "excess": float(np.median(excess_us)),
        "excess_p99": float(np.percentile(excess_us, 99)),
        "user": user_us,
        "sys": sys_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20000, help="EFT transactions per run")
    parser.add_argument("--file-count", type=int, default=50, help="file transfers per run")
    args = parser.parse_args()
    if not shutil.which("gcc"):
        sys.exit("gcc is missing (make setup installs build-essential)")
    with tempfile.TemporaryDirectory(prefix="bench-transact-") as tmp:
        directory = Path(tmp)
        program = build(directory)
        print("trialbed-transact on loopback, no shaping; per transaction, client + server:")
        print(
            f"{'workload':<10}{'proto':<6}{'n':>7}{'median us':>11}{'p99 us':>9}{'matched':>9}"
            f"{'excess us':>11}{'p99':>9}{'excess/median':>15}{'user us':>9}{'sys us':>9}"
        )
        for workload, request, count in (
            ("short", 100, args.count // 4),
            ("long", 100, args.count),
            ("file", 1_460_000, args.file_count),
        ):
            for proto in ("tcp", "udp"):
                r = run(program, directory, proto, workload, request, count)
                print(
                    f"{workload:<10}{proto:<6}{r['n']:>7}{r['median']:>11.1f}{r['p99']:>9.1f}"
                    f"{r['matched']:>9.1%}{r['excess']:>11.1f}{r['excess_p99']:>9.1f}"
                    f"{r['excess'] / r['median']:>15.1%}{r['user']:>9.2f}{r['sys']:>9.1f}"
                )
        print(
            "excess: the client's time beyond the capture's (first request packet to reply "
            "packet) per transaction, median and p99: the generator's overhead, socket calls "
            "included (EFT-SHORT: socket, connect, close). user us / sys us: CPU per "
            "transaction, both ends. Compare the excess with the response times on the rack."
        )


if __name__ == "__main__":
    main()
