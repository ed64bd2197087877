"""The project's bytes, data packets and retransmissions (through the DataFrame API and the
array fast path) agree exactly with tcptrace (and with the generator's truth) on a capture
with real TCP dynamics: handshake, delayed ACKs, losses with duplicate ACKs and fast
retransmissions, sequence numbers wrapping past 2**32."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.fastpath import flow_counters, scan
from analysis.metrics import tcp_goodput, tcp_retransmissions
from analysis.pcap import addresses_as_strings, read_pcap

from .tcpgen import generate
from .tcptrace import FIELDS, tcptrace

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
    # The array fast path (one compiled pass over the file) gives the same numbers.
    fast = pd.DataFrame(flow_counters(scan(tmp_path / "before.pcap")))
    fast = addresses_as_strings(fast).astype({"src": str, "dst": str})
    both = fast.merge(ref, on=KEY, suffixes=("", "_tcptrace"), validate="1:1")
    assert len(both) == len(ref)
    for name in FIELDS.values():
        assert (both[name] == both[f"{name}_tcptrace"]).all(), both[[name, f"{name}_tcptrace"]]
    # The receiver's side of the bottleneck: the same bytes delivered, in order.
    after = tcp_goodput(read_pcap(tmp_path / "after.pcap"))
    assert sorted(after["bytes"]) == sorted(expected["bytes"])
