"""A whole EFT trial directory, generated (seed 003's `transaction` generator, A -> C through
the router R): trial.json in the shape the runner writes (the generator's record of
trials/generators/transaction.py, its spec as the plan resolved it), the client's CSV in
trialbed-transact's columns, and R's capture on the client's segment, in which each
transaction begins with its first request packet (EFT-SHORT over TCP: its SYN) and ends with
the server's reply (EFT-SHORT over TCP: its FIN), inside the client's own timing. A file
transfer over TCP also carries full segments, one partial segment and the server's pure ACKs.
The truth (the rows written and each transaction's time in the capture) is returned."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.traffic.transaction import UDP_HEADER, UDP_REPLY_PAYLOAD
from trials.generators.transaction import Transaction, TransactionSpec

from .pcapgen import ethernet, ipv4, tcp_segment, udp_datagram, write_pcap

CLIENT, SERVER = "198.18.1.10", "198.18.2.10"
PORT = 45000  # the generator's first (trials/generators/transaction.py: BASE_PORT)
CLIENT_PORT = 40000
T0_NS = 1_764_000_000 * 10**9
POINT = "client_side"  # R's interface on the client's segment, as the EFT files name it
INSIDE_NS = 5_000  # the capture's packets this far inside the client's start and end
FULL = 1460  # payload of a full segment without TCP timestamps
SYN, FIN_ACK, ACK, PSH_ACK = 0x02, 0x11, 0x10, 0x18


@dataclass
class GeneratedEft:
    dir: Path
    rows: pd.DataFrame  # the client's rows as written
    capture_ns: np.ndarray  # each transaction's span in the capture (end - start)


def _record(
    name: str, spec: TransactionSpec, rate_bps: int, duration_ns: int, overrides: dict,
    repetition: int, status: str, captured: int,
) -> dict:  # fmt: skip
    tcp = spec.protocol == "tcp"
    interfaces = {
        "A": {"left": f"{CLIENT}/24"},
        "C": {"right": f"{SERVER}/24"},
        "R": {"left": "198.18.1.1/24", "right": "198.18.2.1/24"},
    }
    bottleneck = {"link": "lan_fwd", "host": "R", "iface": "right", "rate_bps": rate_bps}
    bottleneck |= {"buffer": "100pkt", "qdisc": "droptail"}
    gen = {
        "type": "transaction", "from": "A", "to": "C", "sender": "A", "receiver": "C",
        "src": CLIENT, "dst": SERVER, "start_ns": 0, "duration_ns": duration_ns,
        "metrics": list(Transaction.metrics),
        "spec": spec.model_dump(mode="json", by_alias=True),
        "proto": 6 if tcp else 17, "port": PORT, "workload": spec.workload,
        "protocol": spec.protocol, "pairs": spec.pairs, "request_bytes": spec.request_bytes,
        "send_bytes": spec.send_bytes, "sockbuf": spec.tcp_window if tcp else None,
        "window_bytes": None if tcp else spec.window_bytes,
        "udp_header_bytes": None if tcp else UDP_HEADER,
        "client_csv": "A/eft_client.csv", "server_log": "C/eft_server.log",
        "path": {
            "hops": ["A:left", "R:right"], "return_hops": ["C:right", "R:left"], "rtt_ns": 0,
            "one_way_delay_ns": 0, "bottleneck": bottleneck, "mtu": 1500,
        },
    }  # fmt: skip
    egress = [
        {"link": link, "direction": "forward", "node": "R", "host": "R", "iface": iface,
         "towards": towards, "rate": f"{rate_bps}bit", "delay": "0s", "buffer": "100pkt",
         "qdisc": "droptail", "rio": None}
        for link, iface, towards in (("lan_fwd", "right", "C"), ("lan_rev", "left", "A"))
    ]  # fmt: skip
    site = {"host": "R", "node": "R", "iface": "left", "clock": "controller"}
    return {
        "trial": name, "id": "generated", "batch": "generated", "status": status,
        "family": "eft", "repetition": repetition, "overrides": overrides,
        "parameters": {
            "duration": f"{duration_ns // 10**9}s", "warmup": "0s", "drain": "1s",
            "experiment": "eft", "capture": {"snaplen": 96, "points": [{"name": POINT}]},
            "network": {"links": [{"name": "lan_fwd", "rate": f"{rate_bps}bit"}]},
        },
        "network": {
            "nodes": {n: n for n in ("A", "C", "R")}, "routers": ["R"],
            "addresses": {"A": CLIENT, "C": SERVER}, "interfaces": interfaces,
            "egress": egress, "captures": {POINT: site},
        },
        "capture": {POINT: {"captured": captured, "dropped_by_kernel": 0,
                            "received_by_filter": captured}},
        "host_settings": {n: {"cc_params": {}} for n in ("A", "C")},
        "traffic": {"eft": gen},
        "times": {"started": "2026-12-07T04:40:00+00:00", "t0_ns": T0_NS},
        "errors": [] if status == "complete" else ["the generator's client failed"],
    }  # fmt: skip


def up(l4: bytes, proto: int) -> bytes:
    return ethernet(ipv4(CLIENT, SERVER, proto, l4))


def down(l4: bytes, proto: int) -> bytes:
    return ethernet(ipv4(SERVER, CLIENT, proto, l4))


def _packets(spec: TransactionSpec, port: int, start: int, end: int, k: int) -> list:
    """The transaction's packets in the capture on the client's segment (time, frame)."""
    if spec.protocol == "udp":
        sent = UDP_HEADER + min(spec.request_bytes, spec.send_bytes)
        reply = bytes(UDP_REPLY_PAYLOAD)
        return [
            (start, up(udp_datagram(port, PORT, bytes(sent)), 17)),
            (end, down(udp_datagram(PORT, port, reply), 17)),
        ]
    if spec.workload == "eft_short":  # its own connection: the SYN, the server's FIN
        return [
            (start, up(tcp_segment(port, PORT, 1000, flags=SYN), 6)),
            (end, down(tcp_segment(PORT, port, 5000, 1101, flags=FIN_ACK), 6)),
        ]
    seq = 1 + k * spec.request_bytes
    if spec.workload == "eft_long":
        return [
            (start, up(tcp_segment(port, PORT, seq, flags=PSH_ACK, payload=bytes(100)), 6)),
            (end, down(tcp_segment(PORT, port, 1 + k, seq + 100, PSH_ACK, bytes(1)), 6)),
        ]
    # A file: three full segments, one partial, two pure ACKs from the server, then the reply.
    step = (end - start) // 8
    out = []
    for i, size in enumerate((FULL, FULL, FULL, 100)):
        out.append((start + i * step, up(tcp_segment(port, PORT, seq, payload=bytes(size)), 6)))
        seq += size
    for i in (4, 5):
        out.append((start + i * step, down(tcp_segment(PORT, port, 1 + k, seq, ACK), 6)))
    return [*out, (end, down(tcp_segment(PORT, port, 1 + k, seq, PSH_ACK, bytes(1)), 6))]


def write_eft_trial(
    trial_dir: Path, spec: TransactionSpec, rate_bps: int, *, transactions: int = 40,
    seed: int = 1, overrides: dict | None = None, repetition: int = 1,
    status: str = "complete", duration_ns: int = 20 * 10**9, slower: float = 1.0,
) -> GeneratedEft:  # fmt: skip
    """A trial directory of ``transactions`` transactions of ``spec`` (as the plan resolved
    it) on a link of ``rate_bps``, one after the other from T0: a file takes its bytes' time
    at the rate and some more, a short transaction 100-300 us, each ``slower`` times that (a
    slow repetition); the capture sees each one INSIDE_NS after the client's clock starts and
    before it stops."""
    rng = np.random.default_rng(seed)
    file = spec.workload == "filetransf_long"
    wire_ns = spec.request_bytes * 8 * 10**9 // rate_bps if file else 0
    response = wire_ns + rng.integers(100_000, 300_000, transactions)
    response = (response * slower).astype(np.int64)
    gap = rng.integers(20_000, 60_000, transactions)
    start = T0_NS + np.cumsum(gap + np.r_[0, response[:-1]])
    short_tcp = spec.workload == "eft_short" and spec.protocol == "tcp"
    ports = CLIENT_PORT + (np.arange(transactions) if short_tcp else np.zeros(transactions, int))
    rows = pd.DataFrame(
        {
            "pair": 0, "seq": np.arange(transactions), "start_ns": start,
            "end_ns": start + response, "bytes": spec.request_bytes, "ok": 1, "retrans": 0,
            "local_port": ports,
        }
    )  # fmt: skip
    client = trial_dir / "A"
    client.mkdir(parents=True)
    with (client / "eft_client.csv").open("w") as f:
        f.write(
            f"# trialbed-transact proto={spec.protocol} request={spec.request_bytes} "
            f"send_size={spec.send_bytes}\n# kernel sndbuf=17520 rcvbuf=17520 mss={FULL} "
            "user_s=0.010000 sys_s=0.020000\n"
        )
        rows.to_csv(f, index=False)
    frames = []
    for k, r in enumerate(rows.itertuples()):
        inside = (r.start_ns + INSIDE_NS, r.end_ns - INSIDE_NS)
        frames += _packets(spec, int(r.local_port), *inside, k)
    router = trial_dir / "R"
    router.mkdir()
    write_pcap(router / f"{POINT}.pcap", sorted(frames, key=lambda p: p[0]), nano=True)
    record = _record(
        trial_dir.name, spec, rate_bps, duration_ns, overrides or {}, repetition, status,
        len(frames),
    )  # fmt: skip
    (trial_dir / "trial.json").write_text(json.dumps(record, indent=1) + "\n")
    return GeneratedEft(trial_dir, rows, response - 2 * INSIDE_NS)
