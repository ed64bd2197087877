"""The project's bytes, data packets and retransmissions (through the DataFrame API, and in
a whole trial's analysis: what `trials report` writes) agree exactly with tcptrace and with
the generator's truth on captures with real TCP dynamics: handshake, delayed ACKs, losses
with duplicate ACKs and fast retransmissions, sequence numbers wrapping past 2**32."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.metrics import tcp_goodput, tcp_retransmissions
from analysis.pcap import addresses_as_strings, read_pcap
from analysis.trial import analyse_trial

from .tcpgen import generate
from .tcptrace import FIELDS, tcptrace
from .trialgen import write_trial

KEY = ["src", "dst", "sport", "dport"]


@pytest.mark.skipif(shutil.which("tcptrace") is None, reason="tcptrace not installed")
def test_agrees_with_tcptrace(tmp_path: Path) -> None:
    truth = generate(
        tmp_path / "before.pcap",
        tmp_path / "after.pcap",
        packets=60_000,
        flows=4,
        loss=0.003,
        duration_ns=10 * 10**9,
        seed=4,  # a flow whose sequence numbers wrap (checked below)
    )
    packets = read_pcap(tmp_path / "before.pcap")
    data = packets[packets.payload_len > 0]
    wraps = data.groupby("sport").seq.apply(lambda s: (s.astype("int64").diff() < -(2**31)).any())
    assert wraps.any()
    ours = tcp_retransmissions(packets).merge(tcp_goodput(packets)[[*KEY, "bytes"]], on=KEY)
    ours = addresses_as_strings(ours).astype({"src": str, "dst": str})
    ref = tcptrace(tmp_path / "before.pcap")
    both = ours.merge(ref, on=KEY, suffixes=("", "_tcptrace"), validate="1:1")
    assert len(both) == len(ref) == len(truth.flows) == 4
    for name in FIELDS.values():
        assert (both[name] == both[f"{name}_tcptrace"]).all(), both[[name, f"{name}_tcptrace"]]
    assert both.retransmitted_packets.sum() > 20  # losses happened, in every flow
    assert (both.retransmitted_packets > 0).all()
    expected = pd.DataFrame(truth.flows).sort_values("sport")
    got = both.sort_values("sport")
    for name in ("bytes", "data_packets", "retransmitted_packets", "retransmitted_bytes"):
        assert got[name].tolist() == expected[name].tolist()
    # The receiver's side of the bottleneck: the same bytes delivered, in order.
    after = tcp_goodput(read_pcap(tmp_path / "after.pcap"))
    assert sorted(after["bytes"]) == sorted(expected["bytes"])


@pytest.mark.skipif(shutil.which("tcptrace") is None, reason="tcptrace not installed")
def test_a_trials_analysis_agrees_with_tcptrace_and_the_truth(tmp_path: Path) -> None:
    """A generated trial (tests/analysis/trialgen.py: eight bulk_tcp pairs and a UDP stream
    through one FIFO queue, tcp_probe recordings, the router's tc samples) analysed as `trials
    report` does: its flows table agrees with tcptrace on the capture before the router
    (bytes acknowledged, data packets, retransmitted packets and bytes), and every figure the
    generator knows is its truth (bytes, retransmissions, UDP losses, the queue's drops
    against the capture and the router's counters, congestion epochs from tcp_probe, the
    queue's occupancy against the router's samples)."""
    trial = write_trial(tmp_path / "t", packets=120_000, seed=4)
    summary = analyse_trial(trial.dir)
    flows = pd.read_parquet(trial.dir / "analysis" / "flows.parquet")
    ours = flows.rename(columns={"lifetime_bytes": "bytes"}).astype({"src": str, "dst": str})
    ref = tcptrace(trial.captures[0])
    both = ours.merge(ref, on=KEY, suffixes=("", "_tcptrace"), validate="1:1")
    assert len(both) == len(ref) == len(trial.truth.flows) == 8
    for name in FIELDS.values():
        assert (both[name] == both[f"{name}_tcptrace"]).all(), both[[name, f"{name}_tcptrace"]]
    expected = pd.DataFrame(trial.truth.flows).sort_values("sport")
    got = both.sort_values("sport")
    for name in ("bytes", "data_packets", "retransmitted_packets", "retransmitted_bytes"):
        assert got[name].tolist() == expected[name].tolist(), name
    assert (got.retransmitted_packets > 0).all()
    generators = summary["generators"]
    epochs = [generators[f"tcp{f}"]["congestion_epochs"] for f in range(8)]
    assert epochs == [[n] for n in trial.congestion_epochs] and min(trial.congestion_epochs) > 0
    udp = generators["voip"]
    assert (udp["udp_packets"], udp["udp_lost"]) == (trial.truth.udp_sent, trial.truth.udp_lost)
    queue = summary["queues"]["downstream"]
    assert queue["queue_drops_capture"] == queue["queue_drops_tc"] == trial.queue_drops > 0
    assert queue["queue_undecided_at_end"] == 0 and queue["tc_samples"] > 1000
    assert queue["tc_diff_packets_median"] == 0 and queue["tc_drops"] == trial.queue_drops
