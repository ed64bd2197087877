"""Queue occupancy reconstructed from a capture pair, against a drop-tail FIFO simulated here
(known answer), and against tc -s samples recorded on a real router namespace."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.match import match_packets
from analysis.pcap import ip_to_int, read_pcap
from analysis.queue import occupancy_at, queue_occupancy, queue_summary
from analysis.tc_samples import compare_with_samples, leaf_samples, read_tc_samples

from .pcapgen import ethernet, ipv4, tcp_segment, udp_datagram, write_pcap
from .queue_oracle import queue_events

MS = 1_000_000
T0 = 1_763_700_000 * 10**9
DATA = Path(__file__).resolve().parents[1] / "data" / "router_run"


def simulate(arrivals: list[tuple[int, int]], *, rate_bps: int, buffer_bytes: int):
    """A drop-tail FIFO of ``buffer_bytes`` served at ``rate_bps`` (a packet leaves the queue
    when the previous one has been sent). arrivals: (time at the queue, frame bytes), sorted.
    Returns per packet the departure time or None (dropped)."""
    out: list[int | None] = []
    link_free = 0
    for t, size in arrivals:
        queued = sum(
            s for (a, s), d in zip(arrivals, out, strict=False) if d is not None and a <= t < d
        )
        if queued + size > buffer_bytes:
            out.append(None)
            continue
        d = max(t, link_free)
        link_free = d + size * 8 * 10**9 // rate_bps
        out.append(d)
    return out


def frames(n: int, seed: int) -> list[bytes]:
    """UDP and TCP packets of two flows, sizes from 60 to 1514 bytes, distinct IP IDs."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = rng.choice([46, 200, 1000, 1472])
        if rng.random() < 0.5:
            l4 = udp_datagram(4000, 5000, rng.randbytes(size - 8))
            out.append(ethernet(ipv4("198.18.1.1", "198.18.2.2", 17, l4, ip_id=i)))
        else:
            l4 = tcp_segment(40000, 5201, i * 1448, 1, 0x10, rng.randbytes(size - 20))
            out.append(ethernet(ipv4("198.18.1.3", "198.18.2.2", 6, l4, ip_id=i)))
    return out


def test_queue_matches_simulated_drop_tail_fifo(tmp_path: Path) -> None:
    rng = random.Random(7)
    n, delay, rate, buffer = 400, 7 * MS, 2_000_000, 6000
    pkts = frames(n, seed=3)
    t, arrivals = 0, []
    for p in pkts:  # bursts and gaps: the queue fills, drops, and drains
        t += rng.choice([10_000, 50_000, 200_000, 3 * MS])
        arrivals.append((t, len(p)))
    departs = simulate(arrivals, rate_bps=rate, buffer_bytes=buffer)
    before = [(T0 + a - delay, p) for (a, _), p in zip(arrivals, pkts, strict=True)]
    after = sorted((T0 + d, p) for d, p in zip(departs, pkts, strict=True) if d is not None)
    b = read_pcap(write_pcap(tmp_path / "in.pcap", before, nano=True))
    a = read_pcap(write_pcap(tmp_path / "out.pcap", after, nano=True))
    matched = match_packets(b, a, max_delay_ns=delay + 100 * MS)
    q = queue_occupancy(matched, delay_ns=delay, max_delay_ns=delay + 100 * MS)

    dropped = [i for i, d in enumerate(departs) if d is None]
    assert 10 < len(dropped) < n // 2  # the scenario exercises drops
    assert (q["event"] == "drop").sum() == len(dropped)
    assert (q["event"] == "arrival").sum() == (q["event"] == "departure").sum() == n - len(dropped)
    assert q["packets"].iloc[-1] == 0 and q["bytes"].iloc[-1] == 0
    # After the last event at each timestamp, the occupancy is the simulator's: packets that
    # reached the queue and have not left it.
    last = np.r_[q["ts_ns"].to_numpy()[1:] != q["ts_ns"].to_numpy()[:-1], True]
    for row in q[last].itertuples():
        t = row.ts_ns - T0
        inside = [
            s for (a, s), d in zip(arrivals, departs, strict=True) if d is not None and a <= t < d
        ]
        assert (row.packets, row.bytes) == (len(inside), sum(inside)), row
    # Each drop met a queue with no room for it, each arrival one with room.
    size_at = q["frame_bytes"].to_numpy()
    before_event = q["bytes"].to_numpy() - np.where(q["event"] == "arrival", size_at, 0)
    drops = (q["event"] == "drop").to_numpy()
    assert (before_event[drops] + size_at[drops] > buffer).all()
    assert (
        before_event[~drops & (q["event"] == "arrival").to_numpy()]
        + size_at[~drops & (q["event"] == "arrival").to_numpy()]
        <= buffer
    ).all()
    assert q["src"].map(type).eq(str).all()  # addresses are stored as strings
    s = queue_summary(q, start_ns=int(q["ts_ns"].iloc[0]), end_ns=int(q["ts_ns"].iloc[-1]))
    assert s["max_bytes"] <= buffer and s["drops"] == len(dropped)


def test_hand_worked_queue() -> None:
    """Three 1000-byte IP packets reach the queue at 0, 1, 2 ms and leave at 4, 8, 12 ms (a
    4 ms service time); the fourth, at 3 ms, is dropped; the delay line adds 1 ms first. The
    capture after the router runs to 50 ms, so the fourth could have arrived: a drop."""
    rows = []
    for i, (t_in, t_out) in enumerate([(0, 4), (1, 8), (2, 12), (3, None)]):
        rows.append(
            {
                "ts_ns": (t_in - 1) * MS,
                "src": ip_to_int("198.18.1.1"),
                "dst": ip_to_int("198.18.2.2"),
                "proto": 17,
                "sport": 1,
                "dport": 2,
                "ip_len": 1000,
                "ip_id": i,
                "ts_out_ns": -1 if t_out is None else t_out * MS,
                "forwarded": t_out is not None,
            }
        )
    q = queue_occupancy(pd.DataFrame(rows), delay_ns=1 * MS, max_delay_ns=20 * MS, end_ns=50 * MS)
    assert q["event"].astype(str).tolist() == [
        "arrival", "arrival", "arrival", "drop", "departure", "departure", "departure"
    ]  # fmt: skip
    assert q["ts_ns"].tolist() == [0, MS, 2 * MS, 3 * MS, 4 * MS, 8 * MS, 12 * MS]
    assert q["packets"].tolist() == [1, 2, 3, 3, 2, 1, 0]
    assert q["bytes"].tolist() == [1014, 2028, 3042, 3042, 2028, 1014, 0]
    at = occupancy_at(q, np.array([-1, 0, 5 * MS, 20 * MS]))
    assert at["packets"].tolist() == [0, 1, 2, 0]
    s = queue_summary(q, start_ns=0, end_ns=12 * MS)
    # packets: 1 for 1 ms, 2 for 1 ms, 3 for 2 ms, 2 for 4 ms, 1 for 4 ms -> 21 / 12
    assert s["mean_packets"] == pytest.approx(21 / 12) and s["max_packets"] == 3 and s["drops"] == 1


def test_queue_in_transit_at_capture_end_is_not_a_drop() -> None:
    """The capture after the router stops while packets are still queued: those sent after the
    last departed one are left out, not counted as drops."""
    rows = [
        {"ts_ns": i * MS, "src": 1, "dst": 2, "proto": 17, "sport": 1, "dport": 2,
         "ip_len": 100, "ts_out_ns": (i * 5 + 5) * MS if i < 3 else -1, "forwarded": i < 3}
        for i in range(6)
    ]  # fmt: skip
    q = queue_occupancy(pd.DataFrame(rows), max_delay_ns=50 * MS)
    assert (q["event"] == "drop").sum() == 0 and (q["event"] == "arrival").sum() == 3


def test_queue_against_tc_samples_on_a_real_router() -> None:
    """Recorded on this machine (tests/data/router_run/README): iperf3 reno through a router
    namespace shaping to 10 Mbit/s with a 15000-byte bfifo; captures on both sides of it and
    tc -s every 10 ms. The reconstruction is within a few packets of tc at every sample (tc's
    own call takes ~3 ms, 2-3 packet times), and the drop counts agree exactly."""
    b = read_pcap(DATA / "router_in.pcap")
    a = read_pcap(DATA / "router_out.pcap")
    sender, receiver = ip_to_int("198.18.250.1"), ip_to_int("198.18.251.2")
    b = b[(b.src == sender) & (b.dst == receiver)]
    a = a[(a.src == sender) & (a.dst == receiver)]
    matched = match_packets(b, a, max_delay_ns=10**9)
    q = queue_occupancy(matched, max_delay_ns=10**9)
    pd.testing.assert_frame_equal(q, queue_events(matched, max_delay_ns=10**9))
    leaf = leaf_samples(read_tc_samples(DATA / "tc_samples.jsonl.gz"), "tbr1")
    cmp = compare_with_samples(q, leaf)
    busy = cmp[(cmp.ts_ns > q.ts_ns.iloc[0]) & (cmp.ts_ns < q.ts_ns.iloc[-1])]
    assert len(busy) > 50 and busy.tc_packets.max() >= 5  # the queue did fill
    assert busy.diff_packets.abs().max() <= 4
    assert abs(busy.diff_packets.mean()) < 0.5
    assert busy.tc_drops.iloc[-1] == busy.drops.iloc[-1] > 0
