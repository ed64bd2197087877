"""The transaction generator's own overhead, on loopback with no shaping: per workload and
protocol, the response time it reports next to the CPU time its client and server spend in
user space per transaction (the program's own work: loops, timestamps, the UDP scheme's
bookkeeping) and in the kernel (socket calls, which a real application pays too).

  python tests/bench/bench_transact.py [--count N] [--file-count N]

Builds roles/transactions/files/trialbed_transact.c with the role's flags into a temporary
directory; touches nothing else. Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

from analysis.traffic.transaction import read_client  # noqa: E402

ROLE = PROJECT / "roles/transactions"


def build(directory: Path) -> Path:
    flags = yaml.safe_load((ROLE / "defaults/main.yml").read_text())["transactions_cflags"]
    out = directory / "trialbed-transact"
    subprocess.run(
        ["gcc", *flags, "-o", str(out), str(ROLE / "files/trialbed_transact.c")], check=True
    )
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
    server = subprocess.Popen(
        [str(program), "server", "--bind", "127.0.0.1", *common, *first],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    server.stdout.readline()
    out = directory / f"{proto}-{workload}.csv"
    try:
        subprocess.run(
            [
                *(str(program), "client", "--connect", "127.0.0.1", *common),
                *("--workload", workload, "--count", str(count), "--out", str(out)),
            ],
            check=True,
            stderr=subprocess.DEVNULL,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        log, _ = server.communicate()
    srv = dict(w.split("=") for w in log.split("served ", 1)[1].split())
    meta, rows = read_client(out)
    response_us = rows.response_ns.to_numpy() / 1e3
    n = len(rows)
    user_us = (float(meta["user_s"]) + float(srv["user_s"])) / n * 1e6
    sys_us = (float(meta["sys_s"]) + float(srv["sys_s"])) / n * 1e6
    return {
        "n": n,
        "median": float(np.median(response_us)),
        "mean": float(response_us.mean()),
        "p99": float(np.percentile(response_us, 99)),
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
            f"{'workload':<16}{'proto':<6}{'n':>7}{'median us':>11}{'mean us':>10}{'p99 us':>9}"
            f"{'user us':>9}{'sys us':>9}{'user/median':>13}"
        )
        for workload, request, count in (
            ("short", 100, args.count // 4),
            ("long", 100, args.count),
            ("file", 1_460_000, args.file_count),
        ):
            for proto in ("tcp", "udp"):
                r = run(program, directory, proto, workload, request, count)
                print(
                    f"{workload:<16}{proto:<6}{r['n']:>7}{r['median']:>11.1f}{r['mean']:>10.1f}"
                    f"{r['p99']:>9.1f}{r['user']:>9.2f}{r['sys']:>9.1f}"
                    f"{r['user'] / r['median']:>12.1%}"
                )
        print(
            "user us: the program's own work per transaction (both ends); sys us: the socket "
            "calls in the kernel. On the rack, compare user us with the response times there."
        )


if __name__ == "__main__":
    main()
