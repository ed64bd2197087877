"""Flow completion time of web flows (analysis.traffic.web_poisson) on packet tables whose
answer is known: a loss at the bottleneck, a spurious retransmission, sequence wraparound, a
flow without data and a reused source port; and the web client/server program on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from analysis.pcap import ip_to_int
from analysis.traffic.web_poisson import (
    attach_schedule,
    flow_completion,
    read_flow_list,
    receiver_turnaround,
    turnaround_summary,
)
from core.hostside import SOURCE, WEB_FLOWS

SRC, DST, PORT = "198.18.1.10", "198.18.17.10", 8000
MS = 1_000_000
MSS = 1448
SYN, ACK = 0x02, 0x10
PROGRAM = SOURCE / WEB_FLOWS


def packet(ts_ms: float, sport: int, seq: int, payload: int = 0, flags: int = ACK, back=False):
    src, dst = (DST, SRC) if back else (SRC, DST)
    return {
        "ts_ns": int(ts_ms * MS),
        "proto": 6,
        "src": ip_to_int(src),
        "dst": ip_to_int(dst),
        "sport": PORT if back else sport,
        "dport": sport if back else PORT,
        "seq": seq % 2**32,
        "ack": 0,
        "tcp_flags": flags,
        "payload_len": payload,
    }


def handshake(t: float, sport: int, isn: int, rtt_ms: float) -> list[dict]:
    synack = packet(t + rtt_ms, sport, 777, flags=SYN | ACK, back=True)
    synack["ack"] = (isn + 1) % 2**32
    return [packet(t, sport, isn, flags=SYN), synack]


def data(t: float, sport: int, isn: int, index: int, size: int = MSS) -> dict:
    return packet(t, sport, isn + 1 + index * MSS, payload=size)


def test_fct_from_syn_to_every_byte_seen() -> None:
    a_isn, b_isn, d1_isn, d2_isn = 2**32 - 2000, 5000, 10, 900_000
    syn_side = [
        *handshake(0, 40001, a_isn, 100),  # A: wraps after its first segment
        *handshake(0, 40002, b_isn, 120),  # B: segment 1 lost at the bottleneck
        *handshake(0, 40003, 1, 90),  # C: no data at all
        *handshake(0, 40004, d1_isn, 100),  # D: the port serves two connections
        *handshake(5000, 40004, d2_isn, 100),
    ]
    end_side = [
        packet(50, 40001, a_isn, flags=SYN),
        data(200, 40001, a_isn, 0),
        data(210, 40001, a_isn, 1),
        data(220, 40001, a_isn, 2, size=100),
        data(900, 40001, a_isn, 1),  # spurious retransmission: already seen
        packet(50, 40002, b_isn, flags=SYN),
        data(200, 40002, b_isn, 0),
        data(215, 40002, b_isn, 2),
        data(500, 40002, b_isn, 1),  # the retransmission of the lost segment
        packet(50, 40003, 1, flags=SYN),
        packet(50, 40004, d1_isn, flags=SYN),
        data(300, 40004, d1_isn, 0, size=119),
        packet(5050, 40004, d2_isn, flags=SYN),
        data(5300, 40004, d2_isn, 0),
        data(5400, 40004, d2_isn, 1),
    ]
    flows = flow_completion(
        pd.DataFrame(syn_side), pd.DataFrame(end_side), src=SRC, dst=DST, port=PORT
    ).sort_values(["sport", "syn_ns"])
    got = {
        (int(r.sport), int(r.isn)): (
            None if pd.isna(r.fct_ns) else r.fct_ns / MS,
            int(r.bytes_seen),
            None if pd.isna(r.syn_rtt_ns) else r.syn_rtt_ns / MS,
        )
        for r in flows.itertuples()
    }
    assert got == {
        (40001, a_isn): (220, 2 * MSS + 100, 100),
        (40002, b_isn): (500, 3 * MSS, 120),
        (40003, 1): (None, 0, 90),
        (40004, d1_isn): (300, 119, 100),
        (40004, d2_isn): (400, 2 * MSS, 100),
    }
    assert str(flows.fct_ns.dtype) == "Int64"  # exact nanoseconds, missing where no data

    listed = pd.DataFrame(
        [
            {"flow": 0, "group": 13, "bytes": 2 * MSS + 100, "sport": 40001, "connect_ns": 0},
            {"flow": 1, "group": 14, "bytes": 3 * MSS, "sport": 40002, "connect_ns": 0},
            {"flow": 2, "group": 1, "bytes": 119, "sport": 40003, "connect_ns": 0},
            {"flow": 3, "group": 1, "bytes": 119, "sport": 40004, "connect_ns": 0},
            {"flow": 4, "group": 9, "bytes": 2 * MSS, "sport": 40004, "connect_ns": 5000 * MS},
            {"flow": -1, "group": 0, "bytes": None, "sport": 40009, "connect_ns": 0},
        ]
    ).assign(sched_ns=0, status="done")
    joined = attach_schedule(flows, listed).set_index("flow")
    assert joined.loc[4, "group"] == 9 and joined.loc[3, "group"] == 1  # by port and time
    assert joined.complete.to_dict() == {0: True, 1: True, 2: False, 3: True, 4: True}


def test_receiver_turnaround_and_its_excess_over_the_least() -> None:
    """At the capture behind the bottleneck: SYN to the first SYN-ACK answering its ISN. A SYN
    sent again (same ISN) counts from its first copy; a SYN-ACK for another ISN answers
    nothing; a connection with no SYN-ACK seen is left out."""
    seen = [
        *handshake(0, 40001, 100, 62),
        *handshake(10, 40002, 200, 70),
        *handshake(20, 40003, 300, 62.5),
        packet(30, 40004, 400, flags=SYN),
        packet(1030, 40004, 400, flags=SYN),  # the first copy went missing behind the capture
        *handshake(1030, 40004, 400, 62)[1:],  # answered 1062 ms after the first copy
        packet(40, 40005, 500, flags=SYN),  # never answered
        *handshake(50, 40006, 600, 65)[1:],  # a SYN-ACK whose SYN this capture did not see
    ]
    turn = receiver_turnaround(pd.DataFrame(seen), src=SRC, dst=DST, port=PORT)
    assert sorted(turn / MS) == [62, 62.5, 70, 1062]
    summary = turnaround_summary(turn)
    assert summary["receiver_turnaround_handshakes"] == 4
    assert summary["receiver_turnaround_ms_min"] == 62
    assert summary["receiver_turnaround_excess_ms_median"] == (0.5 + 8) / 2
    assert summary["receiver_turnaround_excess_ms_max"] == 1000
    assert turnaround_summary(turn[:0]) == {"receiver_turnaround_handshakes": 0}


def play(tmp_path: Path, schedule: dict, *client_args: str) -> None:
    """The program's server on loopback, and its client playing `schedule` against it
    (CLIENT_ARGS: --duration-s and the rest) into tmp_path/flows.jsonl."""
    (tmp_path / "s.json").write_text(json.dumps(schedule))
    port = 18000 + (time.time_ns() // 1000 % 2000)
    server = subprocess.Popen(
        [sys.executable, str(PROGRAM), "server", "--bind", "127.0.0.1", "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "ready" in server.stderr.readline()
        done = subprocess.run(
            [sys.executable, str(PROGRAM), "client", "--schedule", str(tmp_path / "s.json"),
             "--bind", "127.0.0.1", "--connect", "127.0.0.1", "--port", str(port),
             *client_args, "--out", str(tmp_path / "flows.jsonl")],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)
        server.stderr.close()


def test_the_client_waits_for_its_start(tmp_path: Path) -> None:
    """--start-at: the schedule's zero is that time, not the client's own start (the runner
    starts clients during the lead; their interpreter's start took seconds under TCG)."""
    start_at = time.time() + 5  # after the client's interpreter started, however loaded
    schedule = {"t_ns": [0], "group": [1], "bytes": [119]}
    play(tmp_path, schedule, "--duration-s", "0.5", "--start-at", repr(start_at))
    (row,) = [json.loads(x) for x in (tmp_path / "flows.jsonl").read_text().splitlines()]
    assert row["status"] == "done" and row["sched_ns"] == int(start_at * 1e9)
    assert 0 <= row["connect_ns"] - row["sched_ns"] < 200 * MS


def test_client_and_server_on_loopback(tmp_path: Path) -> None:
    """The program plays a schedule: every flow sends its bytes and ends; one backlogged; a
    flow due 1 ns before the end still starts (the wake-up for it comes after the end)."""
    schedule = {"t_ns": [0, 50 * MS, 60 * MS, 300 * MS, 10**9 - 1], "group": [1, 15, 9, 14, 1]}
    schedule["bytes"] = [119, 284454, 1650, 26641, 119]
    play(tmp_path, schedule, "--duration-s", "1", "--backlogged")
    flows = read_flow_list(tmp_path / "flows.jsonl").set_index("flow")
    assert flows.loc[[0, 1, 2, 3], "status"].tolist() == ["done"] * 4
    assert flows.loc[[0, 1, 2, 3], "bytes"].tolist() == schedule["bytes"][:4]
    rows = [json.loads(x) for x in (tmp_path / "flows.jsonl").read_text().splitlines()]
    sent = {r["flow"]: r["sent"] for r in rows}
    assert [sent[i] for i in range(4)] == schedule["bytes"][:4] and sent[-1] > 0
    assert sorted(flows.index) == [-1, 0, 1, 2, 3, 4]  # every scheduled flow started
    started = {r["flow"]: r["connect_ns"] - r["sched_ns"] for r in rows if r["flow"] >= 0}
    # The flows opened on time: the bounds catch a client that starts late or drifts (8 s
    # late under TCG before it pre-started), with room for a machine busy booting the VM
    # rack beside this test (20 ms missed once in a full suite, 25 ms seen under load): most
    # within 50 ms, none as late as half a second.
    late = sorted(started.values())
    print(f"flows opened late by {[round(x / MS, 1) for x in late]} ms")
    assert late[len(late) // 2] < 50 * MS and late[-1] < 500 * MS
