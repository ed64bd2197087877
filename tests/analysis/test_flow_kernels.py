"""The TCP flow kernels (analysis/tcpflows.py) of a scan and of a frame's columns: the
generator's truth, a capture with records moved, request-response flows, packets that carry
acks or not, and their directions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.directions import directions_of
from analysis.metrics import tcp_flow_counters, tcp_goodput, tcp_retransmissions
from analysis.pcap import COLUMNS, read_columns, read_pcap
from analysis.scan import scan

from .pcapgen import write_pcap
from .scans import conversations, flows_capture, shuffled
from .tcpgen import generate
from .test_pcap import random_capture


def _signed(steps: pd.Series) -> pd.Series:
    """32-bit sequence-number steps as signed numbers (unwrapping, summed)."""
    return ((steps + 2**31) % 2**32) - 2**31


def _last_advance_minus_first_data(frame: pd.DataFrame, flow: dict) -> int:
    """The flow's goodput period worked out from the packets with pandas, apart from the
    kernels: from its first payload packet to the last ACK that acknowledged new payload
    (its FIN's ACK acknowledges no payload)."""
    mine = frame[(frame.src == flow["src"]) & (frame.sport == flow["sport"])]
    data = mine[mine.payload_len > 0]
    s0 = int(data.seq.iloc[0])
    seq = s0 + _signed(data.seq.astype(np.int64).diff().fillna(0)).cumsum()
    base, end = int(seq.min()), int((seq + data.payload_len).max())
    back = frame[(frame.src == flow["dst"]) & (frame.dport == flow["sport"])]
    back = back[back.tcp_flags & 0x10 > 0]
    first_ack = int(_signed(pd.Series([int(back.ack.iloc[0]) - s0])).iloc[0])
    steps = _signed(back.ack.astype(np.int64).diff().fillna(0))
    acked = (s0 + first_ack + steps.cumsum()).clip(upper=end)
    advanced = (acked > acked.cummax().shift(fill_value=base)) & (acked > base)
    return int(back.ts_ns[advanced].max()) - int(data.ts_ns.min())


def test_flow_counters_are_the_generators_truth(tmp_path: Path) -> None:
    """A scan, read_columns' columns and the frame metrics count what the generator wrote:
    unique bytes, data packets, retransmitted packets and bytes, per flow in order of first
    data, on flows that lose packets and whose sequence numbers wrap; the goodput period is
    the one pandas works out apart from the kernels."""
    truth = generate(
        tmp_path / "b.pcap", tmp_path / "a.pcap", packets=40_000, flows=3, loss=0.003,
        duration_ns=5 * 10**9, seed=4,
    )  # fmt: skip
    frame = read_pcap(tmp_path / "b.pcap")
    data = frame[frame.payload_len > 0]
    assert (
        data.groupby("sport").seq.apply(lambda s: (s.astype("int64").diff() < -(2**31)).any())
    ).any()
    want = pd.DataFrame(truth.flows)
    assert want.retransmitted_packets.gt(0).all()
    names = ["src", "dst", "sport", "dport", "bytes", "data_packets", "retransmitted_packets",
             "retransmitted_bytes"]  # fmt: skip
    firsts = data.groupby("sport").ts_ns.min()
    want = want.assign(first=want.sport.map(firsts)).sort_values("first", kind="stable")[names]
    columns = pd.DataFrame(tcp_flow_counters(read_columns(tmp_path / "b.pcap", COLUMNS)))
    scanned = pd.DataFrame(tcp_flow_counters(scan(tmp_path / "b.pcap")))
    frames = tcp_retransmissions(frame).merge(tcp_goodput(frame)[["sport", "bytes"]], on="sport")
    for got in (columns, scanned, frames):
        assert got[names].astype("int64").values.tolist() == want.astype("int64").values.tolist()
    periods = [_last_advance_minus_first_data(frame, f) for f in want.to_dict("records")]
    assert columns.span_ns.tolist() == scanned.span_ns.tolist() == periods
    assert (tcp_goodput(frame).seconds * 1e9).round().astype("int64").tolist() == periods


def test_flows_without_losses(tmp_path: Path) -> None:
    """The generator writes flows that lose nothing (no hole to fill), and their counters are
    its truth: every byte once, no retransmission."""
    truth = generate(
        tmp_path / "b.pcap", tmp_path / "a.pcap", packets=6000, flows=2, loss=0.0,
        duration_ns=10**9,
    )  # fmt: skip
    got = tcp_flow_counters(scan(tmp_path / "b.pcap"))
    assert got["retransmitted_packets"].tolist() == [0, 0]
    assert got["bytes"].tolist() == [f["bytes"] for f in truth.flows]


def test_directions_of_many_flows(tmp_path: Path) -> None:
    """The direction ids of a frame's columns (directions_of): one per (src, dst, sport,
    dport) of the TCP packets in order of first appearance, -1 for other packets, and each
    direction's reverse; thousands of them, so the table grows several times."""
    path = write_pcap(tmp_path / "r.pcap", random_capture(seed=5, n=6000))
    cols = read_columns(path, ["src", "dst", "sport", "dport", "proto"])
    swap = {"src": "dst", "dst": "src", "sport": "dport", "dport": "sport", "proto": "proto"}
    cols = {c: np.r_[cols[c], cols[swap[c]][:500]] for c in cols}  # some replies
    ids, m, rev = directions_of(
        cols["src"], cols["dst"], cols["sport"], cols["dport"], cols["proto"]
    )
    seen: dict[tuple[int, ...], int] = {}
    want = []
    for src, dst, sport, dport, proto in zip(*(cols[c].tolist() for c in cols), strict=True):
        want.append(seen.setdefault((src, dst, sport, dport), len(seen)) if proto == 6 else -1)
    assert ids.tolist() == want and m == len(seen) > 2 * 1024
    keys = list(seen)
    back = [seen.get((dst, src, dport, sport), -1) for src, dst, sport, dport in keys]
    assert rev.tolist() == back and max(back) >= 0


def _bounds(cols: dict[str, np.ndarray]) -> list[dict[str, int]]:
    t = np.sort(cols["ts_ns"])
    return [{}, {"start_ns": int(t[len(t) // 3]), "end_ns": int(t[2 * len(t) // 3])}]


def test_acks_carried_by_data_count(pair: tuple[Path, Path]) -> None:
    """A packet that acknowledges a flow's data counts as its ACK whether or not it carries
    data of its own: each flow's counters stay as they are when a third of the packets of
    its reverse direction (pure ACKs before) carry data, with and without a window."""
    cols = read_columns(pair[0], COLUMNS)
    four = ("src", "dst", "sport", "dport")
    key = pd.MultiIndex.from_arrays([cols[c] for c in four])
    sends = key[cols["payload_len"] > 0].unique()
    reverse = ~key.isin(sends) & (cols["proto"] == 6)  # the directions of the ACKs
    both = {**cols, "payload_len": cols["payload_len"].copy()}
    answers = reverse & (np.random.default_rng(2).random(len(reverse)) < 1 / 3)
    both["payload_len"][answers] = 700
    for bounds in _bounds(cols):
        one_way = pd.DataFrame(tcp_flow_counters(cols, **bounds))
        two_way = pd.DataFrame(tcp_flow_counters(both, **bounds))
        assert len(two_way) == 2 * len(one_way) and one_way.bytes.gt(0).all()
        same = one_way.merge(two_way, on=list(four), suffixes=("", "_both"))
        assert len(same) == len(one_way)
        for c in ("bytes", "span_ns", "data_packets", "retransmitted_packets"):
            assert same[c].tolist() == same[f"{c}_both"].tolist(), c


def test_packets_without_the_ack_flag_ack_nothing(pair: tuple[Path, Path]) -> None:
    """SYNs and RSTs without the ACK flag sent back on the flows (their ack field any
    number) change no flow's counters."""
    cols = read_columns(pair[0], COLUMNS)
    key = pd.MultiIndex.from_arrays([cols[c] for c in ("src", "dst", "sport", "dport")])
    sends = key[cols["payload_len"] > 0].unique()
    reverse = np.flatnonzero(~key.isin(sends) & (cols["proto"] == 6))
    rng = np.random.default_rng(8)
    extra = rng.choice(reverse, size=len(reverse) // 10, replace=False)
    more = {c: np.r_[cols[c], cols[c][extra]] for c in cols}  # after the rest in the file
    more["tcp_flags"][len(cols["ts_ns"]) :] = rng.choice([0x02, 0x04], len(extra))  # SYN, RST
    more["ack"][len(cols["ts_ns"]) :] = rng.integers(0, 2**32, len(extra))
    for bounds in _bounds(cols):
        ref, got = tcp_flow_counters(cols, **bounds), tcp_flow_counters(more, **bounds)
        assert ref["bytes"].sum() > 0
        for c in ref:
            assert np.array_equal(got[c], ref[c]), c


@pytest.mark.parametrize("window", [False, True], ids=["whole", "window"])
def test_flow_counters_of_a_scan(pair: tuple[Path, Path], tmp_path: Path, window: bool) -> None:
    """The kernels give the same numbers on a scan and on read_pcap's columns, captures in
    time order or not, with or without a window; packets are counted in time order, so the
    capture with some records moved gives the original's numbers."""
    tables = []
    for path in (pair[0], pair[1], shuffled(pair[0], tmp_path / "shuffled.pcap", seed=4)):
        cols = read_columns(path, COLUMNS)
        bounds = _bounds(cols)[window]
        ref = tcp_flow_counters(cols, **bounds)
        cap = scan(path, matched=[] if path == pair[1] else None)
        assert cap.in_order == (path.name != "shuffled.pcap")
        got = tcp_flow_counters(cap, **bounds)
        assert list(got) == list(ref)
        for c in ref:
            assert np.array_equal(got[c], ref[c]), (path.name, c)
        assert ref["retransmitted_packets"].sum() > 0
        tables.append(ref)
    original, moved = (
        pd.DataFrame(t).sort_values(["src", "dst", "sport", "dport"], ignore_index=True)
        for t in (tables[0], tables[2])
    )  # flows are numbered in file order: the moved records may change their order
    pd.testing.assert_frame_equal(moved, original)


@pytest.mark.parametrize("threads", [1, 2], ids=["one-reading", "two-halves"])
def test_flow_counters_of_request_response_flows(
    tmp_path: Path, joins: list[int], threads: int
) -> None:
    """Data packets that also ACK the other direction's data (both ends send): the kernels
    give the same numbers on a scan (read whole or as two halves) and on read_pcap's columns,
    with and without a window, the capture in time order and with records moved."""
    path = conversations(tmp_path / "c.pcap", seed=3, connections=40)
    for p in (path, shuffled(path, tmp_path / "moved.pcap", seed=5)):
        cols = read_columns(p, COLUMNS)
        joins.clear()
        cap = scan(p, threads=threads)
        assert len(joins) == threads - 1 and cap.in_order == (p == path)
        for bounds in _bounds(cols):
            ref = tcp_flow_counters(cols, **bounds)
            got = tcp_flow_counters(cap, **bounds)
            assert len(ref["src"]) == 80 and (ref["bytes"] > 0).sum() >= 40
            for c in ref:
                assert np.array_equal(got[c], ref[c]), (p.name, bounds, c)


def test_flow_counters_of_many_directions(tmp_path: Path) -> None:
    """70,000 flows (32-bit direction ids in a scan): one data packet each, the kernels count
    each as a flow of its own, in file order."""
    path = flows_capture(tmp_path / "many.pcap", range(70_000))
    cap = scan(path, threads=1)
    got = tcp_flow_counters(cap)
    ref = tcp_flow_counters(read_columns(path, COLUMNS))
    assert cap.direction.dtype == np.int32 and len(got["src"]) == 70_000
    for c in ref:
        assert np.array_equal(got[c], ref[c]), c
