"""Seed-003 EFT transactions on the dumbbell: each workload over TCP and over reliable UDP at
10 Mbit/s for a few seconds, through the runner (the transactions role builds the program on
the hosts), judged against the server's own counters and the captures at the router."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from analysis.pcap import ip_to_int, read_pcap
from analysis.traffic.transaction import read_client
from collect.fetch import verify_manifest
from tests.e2e.conftest import PROJECT, only_batch, trials_run

pytestmark = pytest.mark.rack

EXPERIMENT = PROJECT / "experiments" / "eft.yml"
RATE_BPS = 10_000_000
SYN, ACK = 0x02, 0x10


@pytest.fixture(scope="module")
def eft(test_rack, tmp_path_factory) -> dict[str, dict]:
    results = tmp_path_factory.mktemp("eft")
    done = subprocess.run(
        trials_run(
            str(EXPERIMENT),
            "--set",
            "duration=5s",
            "--only",
            "rate-10mbit_*",
            inventory=test_rack.inventory,
            results=results,
        ),
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    batch = only_batch(results)
    trials = {}
    for trial_dir in (batch / "trials").iterdir():
        record = json.loads((trial_dir / "trial.json").read_text())
        trials[trial_dir.name] = {
            "dir": trial_dir,
            "record": record,
            "gen": record["traffic"]["eft"],
            "summary": json.loads((trial_dir / "analysis/summary.json").read_text())["generators"][
                "eft"
            ],
        }
    return trials


def served(trial_dir: Path, gen: dict) -> dict[str, float]:
    log = (trial_dir / gen["server_log"]).read_text()
    line = next(x for x in log.splitlines() if x.startswith("served "))
    return {k: float(v) for k, v in (w.split("=") for w in line.split()[1:])}


def test_every_workload_runs_over_both_protocols(eft):
    kinds = {(t["gen"]["workload"], t["gen"]["protocol"]) for t in eft.values()}
    assert len(kinds) == 6, kinds
    for name, t in eft.items():
        assert t["record"]["status"] == "complete", (name, t["record"]["errors"])
        assert verify_manifest(t["dir"]) == []
        for point, counts in t["record"]["capture"].items():
            assert counts["dropped_by_kernel"] == 0, (name, point)
        s = t["summary"]
        us = {k: s[k] * 1e3 for k in ("response_median_ms", "capture_response_median_ms")}
        thr = s.get("throughput_median_mbps")
        print(
            f"{name}: {s['transactions']} transactions, response median "
            f"{us['response_median_ms']:.0f} us (capture {us['capture_response_median_ms']:.0f} "
            f"us), p99 {s['response_p99_ms'] * 1e3:.0f} us, client excess median "
            f"{s['client_excess_median_us']:.0f} us" + (f", {thr:.2f} Mbit/s" if thr else "")
        )
        assert s["transactions"] > 0 and s["failed"] == 0, name
        # The server counted every request and byte the client timed.
        _, rows = read_client(t["dir"] / t["gen"]["client_csv"])
        srv = served(t["dir"], t["gen"])
        assert srv["requests"] == len(rows), name
        assert srv["bytes"] == rows.bytes.sum(), name


def test_response_times_agree_with_the_captures(eft):
    for name, t in eft.items():
        s = t["summary"]
        # Every transaction the client timed is found in the capture at the router.
        assert s["capture_matched_share"] >= 0.99, (name, s["capture_matched_share"])
        # One clock: the client's interval always holds the capture's (request in, reply out;
        # EFT-SHORT over TCP: SYN in, the server's FIN out), and the difference is the
        # client's own work plus one hop each way.
        assert s["client_excess_min_us"] >= 0, name
        assert s["response_median_ms"] >= s["capture_response_median_ms"], name


def test_connections_seen_in_the_captures(eft):
    for name, t in eft.items():
        gen = t["gen"]
        if gen["protocol"] != "tcp":
            continue
        packets = read_pcap(t["dir"] / "R" / "client_side.pcap")
        syns = packets[
            (packets.proto == 6)
            & (packets.src == ip_to_int(gen["src"]))
            & (packets.dport == gen["port"])
            & ((packets.tcp_flags & (SYN | ACK)) == SYN)
        ]
        expected = t["summary"]["transactions"] if gen["workload"] == "eft_short" else 1
        assert len(syns) == expected, (name, len(syns))


def test_short_transactions_pay_for_their_connections_over_tcp(eft):
    """The paper's ordering: over TCP, EFT-SHORT (a connection per transaction) is slower
    than EFT-LONG; judged from the captures, which the generator's own time does not touch."""
    by = {(t["gen"]["workload"], t["gen"]["protocol"]): t["summary"] for t in eft.values()}
    short, long_ = by[("eft_short", "tcp")], by[("eft_long", "tcp")]
    assert short["capture_response_median_ms"] > long_["capture_response_median_ms"]


def test_file_transfers_fill_the_link(eft):
    for name, t in eft.items():
        if t["gen"]["workload"] != "filetransf_long":
            continue
        mbps = t["summary"]["throughput_median_mbps"]
        # Payload below the link's rate (headers), and most of it used by one transfer.
        assert 0.8 * RATE_BPS / 1e6 <= mbps <= RATE_BPS / 1e6, (name, mbps)
        # The same from the packets: the file's payload the client sent, as the router saw it
        # (TCP: each sequence number once), over the transfers' times in that capture.
        gen = t["gen"]
        packets = read_pcap(t["dir"] / "R" / "client_side.pcap")
        sent = packets[(packets.src == ip_to_int(gen["src"])) & (packets.payload_len > 0)]
        if gen["protocol"] == "tcp":
            sent = sent.drop_duplicates(["sport", "seq"])
        check = pd.read_parquet(t["dir"] / "analysis" / "transaction_check.parquet")
        seen = sent.payload_len.sum() * 8 / check.cap_response_ns.sum() * 1e3  # Mbit/s
        print(f"{name}: client {mbps:.2f} Mbit/s, capture {seen:.2f} Mbit/s")
        assert len(check) == t["summary"]["transactions"], name
        assert 0.8 * RATE_BPS / 1e6 <= seen <= RATE_BPS / 1e6, (name, seen)
