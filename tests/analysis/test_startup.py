"""Startup-dynamics metrics on synthetic sender-side captures with known answers.

Every expected number below is derived from the construction (times in ms after T0, segment
sizes, which packets exist), not from the functions under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.metrics import FLOW, TCP_COLUMNS, tcp_goodput
from analysis.pcap import COLUMNS, int_to_ip, ip_to_int, read_pcap
from analysis.startup import (
    Flows,
    at_step,
    delivered_by,
    delivered_total,
    effective_throughput_per_flow,
    effective_throughput_table,
    flow_starts,
    loss_events,
    loss_summary,
    slow_start_exit,
    window_bytes,
)
from analysis.tcpflows import TcpPackets

from .pcapgen import ethernet, ipv4, tcp_segment, write_pcap

MS = 1_000_000
S = 1_000_000_000
T0 = 1_700_000_000 * S  # beyond 2**53: a float64 detour would lose nanoseconds
SYN, ACK, PSH, FIN = 0x02, 0x10, 0x08, 0x01


@dataclass
class Conn:
    """One TCP connection src:sport -> dst:dport; the source sends the data.

    Data offsets count from the first data byte (sequence number isn + 1); times are ms
    after T0."""

    src: str
    dst: str
    sport: int
    dport: int
    isn: int
    risn: int = 4242

    def _row(self, ts_ms: float, reverse: bool, seq: int, ack: int, flags: int, n: int):
        src, dst, sport, dport = (
            (self.dst, self.src, self.dport, self.sport)
            if reverse
            else (self.src, self.dst, self.sport, self.dport)
        )
        return {
            "ts_ns": T0 + round(ts_ms * MS),
            "src": ip_to_int(src),
            "dst": ip_to_int(dst),
            "sport": sport,
            "dport": dport,
            "proto": 6,
            "seq": seq % 2**32,
            "ack": ack % 2**32,
            "tcp_flags": flags,
            "payload_len": n,
            "ip_len": 40 + n,
        }

    def syn(self, t: float) -> dict:
        return self._row(t, False, self.isn, 0, SYN, 0)

    def synack(self, t: float) -> dict:
        return self._row(t, True, self.risn, self.isn + 1, SYN | ACK, 0)

    def sender_ack(self, t: float) -> dict:
        return self._row(t, False, self.isn + 1, self.risn + 1, ACK, 0)

    def data(self, t: float, offset: int, n: int) -> dict:
        return self._row(t, False, self.isn + 1 + offset, self.risn + 1, ACK | PSH, n)

    def fin(self, t: float, offset: int) -> dict:
        return self._row(t, False, self.isn + 1 + offset, self.risn + 1, FIN | ACK, 0)

    def ack(self, t: float, offset: int, flags: int = ACK) -> dict:
        """The receiver acknowledging every byte before ``offset``."""
        return self._row(t, True, self.risn + 1, self.isn + 1 + offset, flags, 0)

    def handshake(self, t: float) -> list[dict]:
        return [self.syn(t), self.synack(t + 10), self.sender_ack(t + 20)]


def frame(rows: list[dict]) -> pd.DataFrame:
    """A read_pcap-shaped frame in time order; unspecified columns are 0."""
    zero = dict.fromkeys(COLUMNS, 0)
    df = pd.DataFrame([zero | r for r in rows], columns=list(COLUMNS)).astype(COLUMNS)
    return df.sort_values("ts_ns", kind="stable").reset_index(drop=True)


def through_pcap(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Write the frame's packets as Ethernet/IPv4/TCP to a real pcap and read it back."""
    recs = []
    for r in df.itertuples():
        seg = tcp_segment(r.sport, r.dport, r.seq, r.ack, r.tcp_flags, bytes(r.payload_len))
        pkt = ipv4(int_to_ip(r.src), int_to_ip(r.dst), 6, seg)
        recs.append((r.ts_ns, ethernet(pkt)))
    return read_pcap(write_pcap(path, recs, nano=True, snaplen=96))


# Two flows starting at different times, every segment delivered.
# F1: SYN at 0 ms; data segment i (1000 B, i < 10) at 20 + 100 i, ACKed at 70 + 100 i;
#     FIN at 1000, its ACK (one more sequence number) at 1050.
# F2: SYN at 350 ms; data segment i (500 B, i < 6) at 370 + 200 i, ACKed at 430 + 200 i
#     (80 + 200 i after its SYN). The last packet of the capture is F2's last ACK at 1430.
F1 = Conn("198.18.0.1", "198.19.0.1", 40001, 5001, isn=1_000)
F2 = Conn("198.18.0.2", "198.19.0.2", 40002, 5001, isn=3_000_000_000)
F1_START, F2_START = T0, T0 + 350 * MS


def f1_rows() -> list[dict]:
    rows = F1.handshake(0)
    for i in range(10):
        rows += [F1.data(20 + 100 * i, 1000 * i, 1000), F1.ack(70 + 100 * i, 1000 * (i + 1))]
    return [*rows, F1.fin(1000, 10_000), F1.ack(1050, 10_001, FIN | ACK)]


def f2_rows(with_syn: bool = True) -> list[dict]:
    rows = F2.handshake(350) if with_syn else []
    for i in range(6):
        rows += [F2.data(370 + 200 * i, 500 * i, 500), F2.ack(430 + 200 * i, 500 * (i + 1))]
    return rows


def two_flows(with_syn: bool = True) -> pd.DataFrame:
    return frame(f1_rows() + f2_rows(with_syn))


def key(c: Conn) -> tuple[int, int, int, int]:
    return (ip_to_int(c.src), ip_to_int(c.dst), c.sport, c.dport)


def by_flow(df: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    return {k: g.reset_index(drop=True) for k, g in df.groupby(FLOW, sort=False)}


CUTS_MS = [0, 70, 500, 1000, 2000, 5000]


def test_flow_starts() -> None:
    fs = flow_starts(two_flows())
    assert list(fs.columns) == [*FLOW, "syn_ns", "syn_seen", "syns", "first_data_ns", "start_ns"]
    assert [tuple(r) for r in fs[FLOW].itertuples(index=False)] == [key(F1), key(F2)]
    assert fs["syn_ns"].tolist() == [T0, T0 + 350 * MS]
    assert fs["syn_ns"].dtype == np.int64 and fs["start_ns"].dtype == np.int64
    assert fs["syn_seen"].tolist() == [True, True]
    assert fs["syns"].tolist() == [1, 1]
    assert fs["first_data_ns"].tolist() == [T0 + 20 * MS, T0 + 370 * MS]
    assert fs["start_ns"].tolist() == fs["syn_ns"].tolist()


def test_flow_start_is_the_first_of_retransmitted_syns() -> None:
    # F1's first SYN is lost and sent again 1 s later; everything else shifts by 1 s.
    rows = [F1.syn(-1000), *f1_rows()]
    fs = flow_starts(frame(rows)).iloc[0]
    assert (fs["syn_ns"], fs["syns"], fs["start_ns"]) == (T0 - S, 2, T0 - S)
    d = delivered_by(frame(rows), [S + 70 * MS])  # = 70 ms after the SYN that got through
    assert d["bytes"].tolist() == [1000]


def test_delivered_by_per_flow() -> None:
    d = delivered_by(two_flows(), [c * MS for c in CUTS_MS])
    assert len(d) == 2 * len(CUTS_MS)
    f = by_flow(d)
    one, two = f[key(F1)], f[key(F2)]
    assert one["cutoff_ns"].tolist() == [c * MS for c in CUTS_MS]
    # F1 acks at 70 + 100 i (inclusive at 70 ms); FIN's sequence number not counted
    assert one["bytes"].tolist() == [0, 1000, 5000, 10_000, 10_000, 10_000]
    # F2 acks 80 + 200 i after its own SYN: by 500 ms 80, 280, 480 -> 1500
    assert two["bytes"].tolist() == [0, 0, 1500, 2500, 3000, 3000]
    assert one["start_ns"].tolist() == [F1_START] * len(CUTS_MS)
    assert two["start_ns"].tolist() == [F2_START] * len(CUTS_MS)
    # capture ends at 1430 ms: F1 reaches 1000 ms, F2 (350 + 1000) too, 2000 ms neither
    assert one["covered"].tolist() == [True, True, True, True, False, False]
    assert two["covered"].tolist() == [True, True, True, True, False, False]
    assert d["bytes"].dtype == np.int64


def test_delivered_total_from_earliest_syn() -> None:
    d = delivered_total(two_flows(), [c * MS for c in CUTS_MS])
    assert (d["t0_ns"] == T0).all()
    # F2 at T0 + t has its own progress at t - 350 ms: by 500 -> 500 B, by 1000 -> 1500 B
    assert d["bytes"].tolist() == [0, 1000, 5500, 11_500, 13_000, 13_000]
    assert d["flows"].tolist() == [1, 1, 2, 2, 2, 2]
    assert d["covered"].tolist() == [True, True, True, True, False, False]
    # only F2: t0 is F2's SYN
    only2 = delivered_total(two_flows(), [500 * MS], flows=flow_starts(two_flows()).iloc[[1]]).iloc[
        0
    ]
    assert (only2["t0_ns"], only2["bytes"], only2["flows"]) == (F2_START, 1500, 1)
    with pytest.raises(ValueError, match="not in the capture"):
        delivered_total(
            two_flows(), [0], flows=pd.DataFrame([dict(zip(FLOW, (1, 2, 3, 4), strict=True))])
        )
    with pytest.raises(ValueError, match=">= 0"):
        delivered_by(two_flows(), [-1])


def two_flows_delivered(t_ms: int) -> int:
    """Bytes F1 and F2 had acknowledged by T0 + t_ms, from their construction: F1 1000 B per
    ACK at 70 + 100 i (i < 10), F2 500 B per ACK at 430 + 200 i (i < 6)."""
    f1 = min(10, max(0, (t_ms - 70) // 100 + 1))
    f2 = min(6, max(0, (t_ms - 430) // 200 + 1))
    return 1000 * f1 + 500 * f2


def test_steps_give_the_bytes_delivered_at_a_time_known_after_the_ack_pass() -> None:
    """Flows.add_steps/steps/at_step: the bytes every flow delivered at any time of a window,
    from one ACK pass run before that time is known (a trial's first data SYN may be in a
    capture read later): delivered_total's aggregate, from any origin in the window."""
    df = two_flows()
    f = Flows.of(TcpPackets.of_columns({k: df[k].to_numpy() for k in TCP_COLUMNS}), -1)
    lo, hi = T0 + 100 * MS, T0 + 1100 * MS
    f.add_steps("w", lo, hi)
    f.acks()
    steps = f.steps("w")
    assert steps[0][0] == lo and (np.diff(steps[0]) > 0).all() and steps[0][-1] <= hi
    for t_ms in range(100, 1101, 5):
        assert at_step(steps, T0 + t_ms * MS) == two_flows_delivered(t_ms), t_ms
    assert at_step(steps, lo - 1) is None  # before the window: not known
    # The same as the DataFrame API's aggregate from F1's SYN (T0)
    cuts = [c * MS for c in (100, 430, 500, 1000)]
    total = delivered_total(df, cuts)["bytes"].tolist()
    assert [at_step(steps, T0 + c) for c in cuts] == total


def test_effective_throughput_table() -> None:
    t = effective_throughput_table(two_flows(), (0.5, 1, 2), capacity_bps=1_000_000)
    assert t["cutoff_s"].tolist() == [0.5, 1.0, 2.0]
    assert t["bytes"].tolist() == [5500, 11_500, 13_000]
    assert t["throughput_bps"].tolist() == pytest.approx([88_000, 92_000, 52_000])
    assert t["utilization"].tolist() == pytest.approx([0.088, 0.092, 0.052])
    assert t["covered"].tolist() == [True, True, False]
    with pytest.raises(ValueError, match="capacity_bps"):
        effective_throughput_table(two_flows(), capacity_bps=0)


def test_effective_throughput_per_flow() -> None:
    t = by_flow(effective_throughput_per_flow(two_flows(), (0.5, 1), capacity_bps=100_000))
    one, two = t[key(F1)], t[key(F2)]
    assert one["bytes"].tolist() == [5000, 10_000]
    assert one["throughput_bps"].tolist() == pytest.approx([80_000, 80_000])
    assert two["bytes"].tolist() == [1500, 2500]
    assert two["utilization"].tolist() == pytest.approx([0.24, 0.2])


def test_capture_without_syn() -> None:
    fs = flow_starts(two_flows(with_syn=False))
    assert fs["syn_seen"].tolist() == [True, False]
    assert fs["syn_ns"].tolist() == [T0, -1]
    assert fs["syns"].tolist() == [1, 0]
    assert fs["start_ns"].tolist() == [T0, T0 + 370 * MS]  # F2 falls back to its first data
    d = by_flow(delivered_by(two_flows(with_syn=False), [70 * MS, 500 * MS]))
    # F2's ACKs now come 60 + 200 i after its start
    assert d[key(F2)]["bytes"].tolist() == [500, 1500]
    assert d[key(F2)]["syn_seen"].tolist() == [False, False]
    assert d[key(F1)]["bytes"].tolist() == [1000, 5000]


def test_sequence_numbers_wrapping_during_the_flow() -> None:
    # First data byte 2500 below 2**32: segment 2 straddles the wrap, ACKs wrap too.
    c = Conn("198.18.0.3", "198.19.0.3", 40003, 5001, isn=2**32 - 2501)
    rows = c.handshake(0)
    for i in range(8):
        rows += [c.data(20 + 10 * i, 1000 * i, 1000), c.ack(40 + 10 * i, 1000 * (i + 1))]
    rows += [c.data(200, 4000, 1000)]  # segment 4 again, its seq already wrapped
    df = frame(rows)
    assert df["seq"].max() > 2**32 - 3000 and df["ack"].min() < 10_000  # really wraps
    d = delivered_by(df, [40 * MS, 59 * MS, 60 * MS, 150 * MS])
    assert d["bytes"].tolist() == [1000, 2000, 3000, 8000]
    ev = loss_events(df, rto_threshold_ns=100 * MS)
    assert ev["seq"].tolist() == [1500]  # 2**32 - 2500 + 4000 - 2**32
    assert ev["offset"].tolist() == [4000]
    assert ev["idle_ns"].tolist() == [(200 - 90) * MS]
    assert ev["kind"].tolist() == ["timeout"]
    assert slow_start_exit(df)["exit_ns"].tolist() == [200 * MS]


# A flow with one fast retransmit and one timeout. The first data byte is 3000 below 2**32, so
# segment 3 (offset 3000, lost) starts exactly at sequence number 0.
#   0 SYN, 10 SYN-ACK, 20 ACK; segments 0..6 (1000 B) at 21..27 ms
#   ACKs 1000, 2000, 3000 at 41, 42, 43; three duplicate ACKs of 3000 at 45, 46, 47
#   52: fast retransmit of segment 3 (5 ms after the third duplicate; idle 52 - 27 = 25 ms)
#   72: ACK 7000; 73, 74: segments 7, 8 (both lost); silence
#   1274: segment 7 again (idle 1274 - 74 = 1200 ms: the timeout)
#   1294: ACK 8000; 1295: segment 8 again (idle 21 ms, no duplicate ACKs: "other")
#   1315: ACK 9000; 1316: segment 9; 1336: ACK 10000; 1337 FIN; 1357 its ACK
L = Conn("198.18.1.1", "198.19.1.1", 40010, 5001, isn=2**32 - 3001)


def lossy_rows(dupacks: int = 3) -> list[dict]:
    rows = L.handshake(0)
    rows += [L.data(21 + i, 1000 * i, 1000) for i in range(7)]
    rows += [L.ack(41 + i, 1000 * (i + 1)) for i in range(3)]
    rows += [L.ack(45 + i, 3000) for i in range(dupacks)]
    rows += [L.data(52, 3000, 1000), L.ack(72, 7000)]
    rows += [L.data(73, 7000, 1000), L.data(74, 8000, 1000)]
    rows += [L.data(1274, 7000, 1000), L.ack(1294, 8000)]
    rows += [L.data(1295, 8000, 1000), L.ack(1315, 9000)]
    rows += [L.data(1316, 9000, 1000), L.ack(1336, 10_000)]
    return [*rows, L.fin(1337, 10_000), L.ack(1357, 10_001, FIN | ACK)]


def test_loss_events_timeout_and_fast_retransmit() -> None:
    ev = loss_events(frame(lossy_rows()), rto_threshold_ns=200 * MS)
    assert [tuple(r) for r in ev[FLOW].itertuples(index=False)] == [key(L)] * 3
    assert ev["ts_ns"].tolist() == [T0 + 52 * MS, T0 + 1274 * MS, T0 + 1295 * MS]
    assert ev["seq"].tolist() == [0, 4000, 5000]
    assert ev["offset"].tolist() == [3000, 7000, 8000]
    assert ev["payload_len"].tolist() == [1000] * 3
    assert ev["idle_ns"].tolist() == [25 * MS, 1200 * MS, 21 * MS]
    assert ev["dupacks"].tolist() == [3, 0, 0]
    assert ev["kind"].tolist() == ["fast", "timeout", "other"]

    s = loss_summary(frame(lossy_rows()), rto_threshold_ns=200 * MS).iloc[0]
    assert s["start_ns"] == T0
    assert (s["retransmissions"], s["timeouts"], s["fast_retransmits"]) == (3, 1, 1)
    assert s["other_retransmits"] == 1
    assert s["timeout_idle_ns"] == 1200 * MS
    assert (s["timeout_idle_mean_ns"], s["timeout_idle_max_ns"]) == (1200 * MS, 1200 * MS)


def test_loss_event_thresholds() -> None:
    def kinds(rows: list[dict], rto_ms: float) -> list[str]:
        return loss_events(frame(rows), rto_threshold_ns=round(rto_ms * MS))["kind"].tolist()

    assert kinds(lossy_rows(), 1200) == ["fast", "timeout", "other"]  # idle >= threshold
    assert kinds(lossy_rows(), 1200.000001) == ["fast", "other", "other"]
    assert kinds(lossy_rows(), 25) == ["timeout", "timeout", "other"]  # timeout wins
    assert kinds(lossy_rows(dupacks=2), 200) == ["other", "timeout", "other"]
    # a duplicate ACK arriving with the retransmission (same ts) is not before it
    late = [*lossy_rows(dupacks=2), L.ack(52, 3000)]
    assert loss_events(frame(late), rto_threshold_ns=200 * MS)["dupacks"].tolist()[0] == 2


def test_idle_counts_any_packet_from_the_sender() -> None:
    # a pure ACK from the sender in the silence (e.g. a window update) shortens it
    rows = [*lossy_rows(), L.sender_ack(674)]
    ev = loss_events(frame(rows), rto_threshold_ns=1000 * MS)
    assert ev["idle_ns"].tolist() == [25 * MS, 600 * MS, 21 * MS]
    assert ev["kind"].tolist() == ["fast", "other", "other"]


def test_slow_start_exit() -> None:
    df = frame(lossy_rows() + f1_rows())
    s = by_flow(slow_start_exit(df))
    lossy, clean = s[key(L)].iloc[0], s[key(F1)].iloc[0]
    assert lossy["first_retx_ns"] == T0 + 52 * MS
    assert lossy["exit_ns"] == 52 * MS
    assert lossy["acked_bytes"] == 3000
    assert clean["first_retx_ns"] == -1
    assert np.isnan(clean["exit_ns"])
    assert clean["acked_bytes"] == 10_000


def test_delivered_through_losses() -> None:
    d = delivered_by(frame(lossy_rows()), [71 * MS, 72 * MS, 1294 * MS, 2 * S])
    assert d["bytes"].tolist() == [3000, 7000, 8000, 10_000]


def test_window_bytes_is_tcp_goodput() -> None:
    df = two_flows()
    lo, hi = T0 + 100 * MS, T0 + 500 * MS
    w = window_bytes(df, lo, hi)
    pd.testing.assert_frame_equal(w, tcp_goodput(df, start_ns=lo, end_ns=hi))
    # F1: 1000 acked by 100 ms, 5000 by 500 ms; F2: none by 100 ms, 500 by 500 ms
    assert w["bytes"].tolist() == [4000, 500]


def test_no_tcp_data() -> None:
    df = frame(F1.handshake(0))
    assert flow_starts(df).empty
    assert delivered_by(df, [S]).empty
    t = delivered_total(df, [S]).iloc[0]
    assert (t["bytes"], t["flows"], t["covered"]) == (0, 0, False)
    assert loss_events(df, rto_threshold_ns=S).empty
    assert loss_summary(df, rto_threshold_ns=S).empty
    assert slow_start_exit(df).empty


def test_round_trip_through_pcap(tmp_path: Path) -> None:
    df = frame(f1_rows() + f2_rows() + lossy_rows())
    back = through_pcap(df, tmp_path / "startup.pcap")
    assert len(back) == len(df)
    cuts = [c * MS for c in CUTS_MS]
    pd.testing.assert_frame_equal(flow_starts(back), flow_starts(df))
    pd.testing.assert_frame_equal(delivered_by(back, cuts), delivered_by(df, cuts))
    ev = loss_events(back, rto_threshold_ns=200 * MS)
    pd.testing.assert_frame_equal(ev, loss_events(df, rto_threshold_ns=200 * MS))
    assert ev["kind"].tolist() == ["fast", "timeout", "other"]
    t = effective_throughput_table(back, (0.5,), capacity_bps=1e6)
    # F1 5000 + F2 500 + L: 10 000 (acked at 1336 ms) is beyond; by 500 ms L has 7000
    assert t["bytes"].tolist() == [12_500]
    assert flow_starts(back)["syn_ns"].tolist() == [T0, T0, T0 + 350 * MS]  # F1, L, F2


def test_first_segment_lost_duplicate_acks_must_be_pure() -> None:
    # Segment 0 is lost. The SYN-ACK is the first ACK of offset 0; the three pure ACKs of
    # offset 0 that follow are duplicates, the receiver's own data carrying ACK 0 is not.
    c = Conn("198.18.0.4", "198.19.0.4", 40004, 5001, isn=123)
    rows = [*c.handshake(0), *(c.data(21 + i, 1000 * i, 1000) for i in range(4))]
    dup = [*rows, *(c.ack(41 + i, 0) for i in range(3)), c.data(48, 0, 1000)]
    ev = loss_events(frame(dup), rto_threshold_ns=200 * MS)
    assert (ev["dupacks"].tolist(), ev["kind"].tolist()) == ([3], ["fast"])
    reply = [
        {**c.ack(41 + i, 0), "seq": c.risn + 1 + 100 * i, "payload_len": 100, "ip_len": 140}
        for i in range(3)
    ]
    ev = loss_events(frame([*rows, *reply, c.data(48, 0, 1000)]), rto_threshold_ns=200 * MS)
    ev = ev[ev["sport"] == c.sport]  # the receiver's replies make a data flow of their own
    assert (ev["dupacks"].tolist(), ev["kind"].tolist()) == ([0], ["other"])


def test_passive_open_sender_has_no_syn_of_its_own() -> None:
    # The data sender accepted the connection: its SYN carries ACK, the peer's SYN is not its.
    c = Conn("198.18.0.5", "198.19.0.5", 5001, 40005, isn=77, risn=999)
    rows = [
        c._row(0, True, c.risn, 0, SYN, 0),  # the receiver opens the connection
        c._row(10, False, c.isn, c.risn + 1, SYN | ACK, 0),
        c._row(20, True, c.risn + 1, c.isn + 1, ACK, 0),
        c.data(21, 0, 1000),
        c.ack(41, 1000),
    ]
    fs = flow_starts(frame(rows)).iloc[0]
    assert (fs["syn_seen"], fs["syn_ns"], fs["start_ns"]) == (False, -1, T0 + 21 * MS)
