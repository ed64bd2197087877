"""trialbed-transact (hostside/traffic/transact/), built here with the role's
own flags and run for real: each workload over TCP and UDP against a server on loopback with
known answers (transactions, bytes, connections), and the reliable UDP scheme through a real
kernel drop path (nftables rules in two network namespaces of this test's own), where every
byte must arrive in order and the retransmissions must show in a capture."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis.pcap import read_pcap
from analysis.traffic.transaction import read_client

PROJECT = Path(__file__).resolve().parents[2]
ROLE = PROJECT / "roles/transactions"
SOURCES = sorted((PROJECT / "hostside/traffic/transact").glob("*.c"))
UDP_HEADER = 20


@pytest.fixture(scope="session")
def program(tmp_path_factory) -> Path:
    if not shutil.which("gcc"):
        pytest.skip("gcc is not installed (make setup installs build-essential)")
    flags = yaml.safe_load((ROLE / "defaults/main.yml").read_text())["transactions_cflags"]
    out = tmp_path_factory.mktemp("transact") / "trialbed-transact"
    subprocess.run(["gcc", *flags, "-o", str(out), *map(str, SOURCES)], check=True)
    return out


def free_port(kind: int, count: int = 1) -> int:
    """A loopback port with `count` free ports from it on (UDP pairs use port + i)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + count < 65536:
            return port
    raise RuntimeError("no free port")


def served(log: str) -> dict[str, float]:
    line = next(x for x in log.splitlines() if x.startswith("served "))
    return {k: float(v) for k, v in (w.split("=") for w in line.split()[1:])}


def run_pair(
    program: Path,
    tmp_path: Path,
    proto: str,
    workload: str,
    request: int,
    count: int,
    *extra: str,
    pairs: int = 1,
    host: str = "127.0.0.1",
    port: int | None = None,
    netns: tuple[str, str] | None = None,
) -> tuple[dict[str, str], object, dict[str, float]]:
    """Run a server and a client to completion; the client's header and rows, and the
    server's counters (it prints them on SIGTERM)."""
    wrap_s = ["ip", "netns", "exec", netns[1]] if netns else []
    wrap_c = ["ip", "netns", "exec", netns[0]] if netns else []
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    port = port or free_port(kind, pairs)
    server_host = host if not netns else "198.18.254.2"
    first = ["--close-first"] if workload == "short" else []
    common = ["--proto", proto, "--port", str(port), "--pairs", str(pairs)]
    common += ["--request", str(request)]
    server = subprocess.Popen(
        [*wrap_s, str(program), "server", "--bind", server_host, *common, *first],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert "listening on" in server.stdout.readline()
        out = tmp_path / f"{proto}-{workload}.csv"
        subprocess.run(
            [
                *wrap_c,
                str(program),
                "client",
                "--connect",
                server_host,
                *common,
                "--workload",
                workload,
                "--count",
                str(count),
                "--duration",
                "60",
                "--out",
                str(out),
                *extra,
            ],
            check=True,
            timeout=90,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        log, _ = server.communicate(timeout=10)
    meta, rows = read_client(out)
    return meta, rows, served(log)


CASES = [
    ("tcp", "short", 100, 200),
    ("tcp", "long", 100, 500),
    ("tcp", "file", 1_460_000, 20),
    ("udp", "short", 100, 200),
    ("udp", "long", 100, 500),
    ("udp", "file", 1_460_000, 20),
]


@pytest.mark.parametrize(("proto", "workload", "size", "count"), CASES)
def test_workload_on_loopback(program, tmp_path, proto, workload, size, count):
    meta, rows, srv = run_pair(program, tmp_path, proto, workload, size, count)
    assert len(rows) == count and rows.ok.all()
    assert (rows.end_ns > rows.start_ns).all()
    # One after the other: each begins after the previous one ended.
    assert (rows.start_ns.to_numpy()[1:] >= rows.end_ns.to_numpy()[:-1]).all()
    # What the server saw: every request, every byte.
    assert srv["requests"] == count
    assert srv["bytes"] == count * size
    if proto == "tcp":
        # EFT-SHORT: one connection per transaction, each from its own port.
        expected = count if workload == "short" else 1
        assert srv["connections"] == expected
        assert rows.local_port.nunique() == expected
        assert int(meta["mss"]) > 0
    else:
        assert srv["mismatched_datagrams"] == 0 and srv["naks"] == 0
        # EFT-SHORT: a socket per transaction (random ephemeral ports may repeat).
        ports = rows.local_port.nunique()
        assert ports > 0.9 * count if workload == "short" else ports == 1


def test_pairs_run_at_once(program, tmp_path):
    for proto in ("tcp", "udp"):
        # Enough transactions (tens of ms a pair) that a late thread start cannot serialize them.
        _, rows, srv = run_pair(program, tmp_path, proto, "long", 100, 3000, pairs=3)
        assert rows.groupby("pair").size().to_dict() == {0: 3000, 1: 3000, 2: 3000}
        assert srv["requests"] == 9000 and srv["bytes"] == 900_000
        # Concurrent: the pairs' transactions overlap in time.
        spans = rows.groupby("pair").agg(first=("start_ns", "min"), last=("end_ns", "max"))
        assert spans["first"].max() < spans["last"].min()


def test_socket_buffer_and_send_size(program, tmp_path):
    meta, _, srv = run_pair(
        program, tmp_path, "tcp", "file", 100_000, 5, "--send-size", "1461", "--sockbuf", "8760"
    )
    # Linux doubles what setsockopt asks for (its bookkeeping overhead).
    assert int(meta["sndbuf"]) == int(meta["rcvbuf"]) == 2 * 8760
    assert meta["send_size"] == "1461" and srv["bytes"] == 500_000


def test_bad_options_are_refused(program):
    done = subprocess.run(
        [str(program), "client", "--connect", "127.0.0.1", "--port", "9", "--workload", "x"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--workload is short, long or file" in done.stderr
    done = subprocess.run(
        [
            *(str(program), "client", "--proto", "udp", "--connect", "127.0.0.1", "--port", "9"),
            *("--workload", "file", "--send-size", "9000", "--window", "8000"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--window at least one send" in done.stderr


# -- the reliable UDP scheme through a real drop path ------------------------------------------

LOSS_PERCENT = 10


@pytest.fixture
def lossy_link(tmp_path):
    """Two namespaces of this test's own joined by a veth (198.18.254.1 and .2/30), each
    dropping LOSS_PERCENT % of the scheme's datagrams it receives (nftables input hook: after
    a capture on the interface has seen them, after reassembly of IP fragments)."""
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft (network namespaces, nftables)")
    tag = f"te{os.getpid() % 100000}"
    client, server = f"{tag}c", f"{tag}s"

    def sh(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True)

    try:
        sh("ip", "netns", "add", client)
        sh("ip", "netns", "add", server)
        sh("ip", "link", "add", f"{tag}a", "netns", client, "type", "veth", "peer", "name",
           f"{tag}b", "netns", server)  # fmt: skip
        for ns, dev, addr in ((client, f"{tag}a", "198.18.254.1/30"),
                              (server, f"{tag}b", "198.18.254.2/30")):  # fmt: skip
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield client, server, f"{tag}b"
    finally:
        for ns in (client, server):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def drop_rules(ns: str, match: str) -> None:
    ruleset = (
        "table inet loss {\n chain input {\n  type filter hook input priority 0;\n"
        f"  {match} numgen random mod 100 < {LOSS_PERCENT} counter drop\n }}\n}}\n"
    )
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=ruleset, text=True,
                   check=True)  # fmt: skip


def dropped(ns: str) -> int:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "table", "inet", "loss"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split("counter packets ")[1].split()[0])


@pytest.mark.parametrize(("workload", "size", "count"), [("long", 100, 300), ("file", 100_000, 30)])
def test_reliable_udp_under_loss(program, tmp_path, lossy_link, workload, size, count):
    client, server, server_dev = lossy_link
    port = 47000
    drop_rules(server, f"udp dport {port}")  # requests and files on their way in
    drop_rules(client, f"udp sport {port}")  # ACKs, NAKs and replies on their way back
    pcap = tmp_path / "server.pcap"
    capture = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            server,
            "tcpdump",
            "-i",
            server_dev,
            "-n",
            "-s",
            "96",
            "-U",
            "--immediate-mode",  # every packet reaches the file before SIGINT ends it
            "--time-stamp-precision=nano",
            "-w",
            str(pcap),
            "udp",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert capture.stderr is not None
        assert "listening on" in capture.stderr.readline()
        _, rows, srv = run_pair(
            program, tmp_path, "udp", workload, size, count, "--rto-ms", "20",
            port=port, netns=(client, server),
        )  # fmt: skip
    finally:
        time.sleep(0.2)
        capture.send_signal(signal.SIGINT)
        capture.communicate(timeout=10)
    # Every transaction completed, every byte arrived once, in order and intact.
    assert len(rows) == count and rows.ok.all()
    assert srv["requests"] == count and srv["bytes"] == count * size
    assert srv["mismatched_datagrams"] == 0
    # The kernel really dropped packets both ways, and the scheme recovered them.
    lost_in, lost_back = dropped(server), dropped(client)
    assert lost_in > 0 and lost_back > 0
    assert rows.retrans.sum() > 0
    # The retransmissions show in the capture: datagrams (txn, offset) sent more than once,
    # exactly as many as the client says it sent again.
    packets = read_pcap(pcap)
    data = packets[(packets.dport == port) & (packets.payload_len > UDP_HEADER)]
    key = data.payload_head.to_numpy()
    _, seen = np.unique(key, return_counts=True)
    assert (seen - 1).sum() == rows.retrans.sum()
    if workload == "file":
        assert srv["naks"] > 0  # a gap inside a window is answered by a NAK
