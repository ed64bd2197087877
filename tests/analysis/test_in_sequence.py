"""The in-sequence pass (analysis/tcpflows.py): where each payload packet moves its flow's
in-sequence point, against a model that keeps every byte that passed in a set (segments
reordered, duplicated, overlapping, beyond gaps, across a sequence-number wrap, flows
interleaved), and against the generated captures' truth after the bottleneck (the receiver's
in-order point after each arrival)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.pcap import COLUMNS, read_columns
from analysis.tcpflows import TcpPackets, data_pass, in_sequence

from .tcpgen import MSS, generate

ACK, PSH, SYN, FIN = 0x10, 0x08, 0x02, 0x01


def segments(rng: np.random.Generator, n: int, isn: int) -> list[tuple[int, int]]:
    """(seq on the wire, length) of n segments of a flow as a capture after a lossy, reordering
    path sees them: some lost (sent again later), some duplicated, some reordered, some
    retransmitted as one larger segment over two."""
    size = rng.integers(1, 1500, n)
    start = np.r_[0, np.cumsum(size)[:-1]]
    order = list(range(n))
    for _ in range(n // 5):  # swaps of neighbours: reordering
        i = int(rng.integers(0, n - 1))
        order[i], order[i + 1] = order[i + 1], order[i]
    out = []
    late = []
    for i in order:
        r = rng.random()
        if r < 0.1:  # lost here: passes later
            late.append(i)
        else:
            out.append((int(start[i]), int(size[i])))
            if r < 0.15:
                out.append((int(start[i]), int(size[i])))  # a duplicate
        if late and rng.random() < 0.2:
            j = late.pop(0)
            if j + 1 < n and rng.random() < 0.5:  # repacketized with its successor
                out.append((int(start[j]), int(size[j] + size[j + 1])))
            else:
                out.append((int(start[j]), int(size[j])))
    out += [(int(start[j]), int(size[j])) for j in late]
    return [((isn + 1 + s) % 2**32, length) for s, length in out]


def model(segs: list[tuple[int, int]], isn: int) -> list[int]:
    """After each segment, how far the contiguous bytes from the first one reach."""
    have: set[int] = set()
    point, out = 0, []
    for seq, length in segs:
        s = (seq - isn - 1) % 2**32
        have.update(range(s, s + length))
        before = point
        while point in have:
            point += 1
        out.append(point - before)
    return out


def columns(flows: list[list[tuple[int, int]]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The flows' packets interleaved at random times, a SYN before each flow's first and a FIN
    after its last, as read_pcap's columns; each packet's flow and index within it."""
    rows = []
    for f, segs in enumerate(flows):
        isn = int(segs[0][0]) - 1  # the generator's isn + 1 is the first byte (with wrap)
        times = np.sort(rng.integers(1_000, 10**9, len(segs)))
        rows.append((0, f, -1, isn, 0, SYN))
        rows += [
            (int(t), f, k, s, n, ACK | PSH)
            for k, (t, (s, n)) in enumerate(zip(times, segs, strict=True))
        ]
        end = max((s - isn - 1) % 2**32 + n for s, n in segs)
        rows.append((10**9 + 1, f, -1, (isn + 1 + end) % 2**32, 0, FIN | ACK))
    rows.sort(key=lambda r: r[0])
    ts, flow, k, seq, plen, flags = (np.array(c, np.int64) for c in zip(*rows, strict=True))
    cols = {
        "ts_ns": ts, "src": 10 + flow, "dst": np.full(len(ts), 99), "sport": 40_000 + flow,
        "dport": np.full(len(ts), 5201), "proto": np.full(len(ts), 6), "tcp_flags": flags,
        "seq": seq, "ack": np.zeros(len(ts), np.int64), "payload_len": plen,
    }  # fmt: skip
    return cols | {"flow": flow, "k": k}


def test_moves_are_the_byte_set_models(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    isns = [2**32 - 5_000, 1_000, 2**31 + 17]  # the first wraps within its first segments
    flows = [segments(rng, 400, isn) for isn in isns]
    cols = columns(flows, rng)
    p = TcpPackets.of_columns(cols)
    data = data_pass(p)
    moved = in_sequence(p, data, np.ones(p.directions, bool))
    assert (np.diff(moved["ts"]) >= 0).all()  # time order
    for f, (segs, isn) in enumerate(zip(flows, isns, strict=True)):
        want = model(segs, isn)
        assert sum(want) == max((s - isn - 1) % 2**32 + n for s, n in segs)  # all passed
        rows = np.flatnonzero((cols["flow"] == f) & (cols["k"] >= 0))
        d = p.ids[rows[0]]
        mine = moved["direction"] == d
        got = dict(zip(moved["ts"][mine].tolist(), moved["bytes"][mine].tolist(), strict=True))
        expected = {int(cols["ts_ns"][r]): w for r, w in zip(rows, want, strict=True) if w}
        assert got == expected, f
    # Up to a time: the moves by then, the pass stopping there.
    until = int(np.median(moved["ts"]))
    early = in_sequence(p, data, np.ones(p.directions, bool), until)
    for k in ("direction", "ts", "bytes"):
        assert early[k].tolist() == moved[k][moved["ts"] <= until].tolist()
    # Only the chosen flows, and only their moves.
    chosen = np.zeros(p.directions, bool)
    chosen[p.ids[np.flatnonzero(cols["flow"] == 1)[0]]] = True
    one = in_sequence(p, data, chosen)
    assert set(one["direction"].tolist()) == {int(np.flatnonzero(chosen)[0])}
    assert one["bytes"].sum() == sum(model(flows[1], isns[1]))


def test_after_the_bottleneck_it_is_the_receivers_in_order_point(tmp_path: Path) -> None:
    """tcpgen's flows lose segments at the bottleneck: in the capture after it the segments
    after a loss pass beyond the gap until the retransmission closes it; the in-sequence
    point after each arrival is the receiver's in-order point, which its next ACK carries."""
    truth = generate(
        tmp_path / "b.pcap", tmp_path / "a.pcap", packets=30_000, flows=3, loss=0.004,
        duration_ns=4 * 10**9, seed=11, shared_queue=True,
    )  # fmt: skip
    assert all(f["retransmitted_packets"] for f in truth.flows)
    cols = read_columns(tmp_path / "a.pcap", COLUMNS)
    p = TcpPackets.of_columns(cols)
    moved = in_sequence(p, data_pass(p), np.ones(p.directions, bool))
    for f, flow in enumerate(truth.flows):
        d = int(
            np.flatnonzero((p.ends["src"] == flow["src"]) & (p.ends["sport"] == flow["sport"]))[0]
        )
        mine = moved["direction"] == d
        at, point = truth.in_order_after[f]
        steps = np.flatnonzero(np.diff(np.r_[0, point]) > 0)
        assert moved["ts"][mine].tolist() == at[steps].tolist()
        assert np.cumsum(moved["bytes"][mine]).tolist() == point[steps].tolist()
        assert point[-1] == flow["bytes"] == moved["bytes"][mine].sum() > 0
        assert MSS in set(moved["bytes"][mine].tolist())
        # More than one segment at once: a retransmission closing a gap.
        assert moved["bytes"][mine].max() > MSS


@pytest.mark.parametrize("chosen", [False, True])
def test_no_flow_moves_nothing(chosen: bool) -> None:
    cols = columns([[(1_001, 100)]], np.random.default_rng(1))
    p = TcpPackets.of_columns(cols)
    moved = in_sequence(p, data_pass(p), np.full(p.directions, chosen))
    assert moved["bytes"].tolist() == ([100] if chosen else [])
