"""Metrics and packet matching on small synthetic captures with known answers."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.match import match_packets
from analysis.metrics import (
    one_way_delay,
    owd_upper_bound_ns,
    queue_full_events,
    summarize_owd,
    tcp_goodput,
    tcp_retransmissions,
)
from analysis.pcap import COLUMNS, ip_to_int, read_pcap

from .pcapgen import ethernet, ipv4, tcp_segment, write_pcap

MS = 1_000_000
A, B = ip_to_int("198.18.0.1"), ip_to_int("198.18.0.2")
SYN, ACK, PSH, FIN = 0x02, 0x10, 0x08, 0x01


def packets(rows: list[dict]) -> pd.DataFrame:
    """A read_pcap-shaped frame; unspecified fields are 0 (src/dst default to A -> B)."""
    base = {k: 0 for k in COLUMNS} | {"src": A, "dst": B}
    df = pd.DataFrame([base | r for r in rows], columns=list(COLUMNS))
    return df.astype(COLUMNS)


def tcp(ts: float, seq: int, ack: int, flags: int, length: int = 0, reverse: bool = False):
    """One TCP packet of the A:5000 -> B:80 connection (reverse: B -> A), ts in ms."""
    src, dst, sport, dport = (B, A, 80, 5000) if reverse else (A, B, 5000, 80)
    return {
        "ts_ns": round(ts * MS),
        "src": src,
        "dst": dst,
        "sport": sport,
        "dport": dport,
        "proto": 6,
        "seq": seq % 2**32,
        "ack": ack % 2**32,
        "tcp_flags": flags,
        "payload_len": length,
        "ip_len": 52 + length,
    }


ISN, RISN = 2**32 - 3000, 77  # the data sequence numbers wrap past 2**32 after 3000 bytes


def transfer(segments: int = 10, size: int = 1000, fin: bool = True) -> list[dict]:
    """Handshake, ``segments`` data segments 1 ms apart each ACKed 0.5 ms later, FIN."""
    rows = [
        tcp(0.0, ISN, 0, SYN),
        tcp(0.2, RISN, ISN + 1, SYN | ACK, reverse=True),
        tcp(0.4, ISN + 1, RISN + 1, ACK),
    ]
    for i in range(segments):
        rows.append(tcp(1 + i, ISN + 1 + i * size, RISN + 1, ACK | PSH, size))
        rows.append(tcp(1.5 + i, RISN + 1, ISN + 1 + (i + 1) * size, ACK, reverse=True))
    if fin:
        end = ISN + 1 + segments * size
        rows.append(tcp(segments + 1, end, RISN + 1, FIN | ACK))
        rows.append(tcp(segments + 1.5, RISN + 1, end + 1, FIN | ACK, reverse=True))
    return rows


def test_goodput_whole_flow_with_wraparound() -> None:
    g = tcp_goodput(packets(transfer()))
    assert len(g) == 1  # the ACK-only direction is not a data flow
    row = g.iloc[0]
    assert (row["src"], row["dst"], row["sport"], row["dport"]) == (A, B, 5000, 80)
    assert row["bytes"] == 10_000  # FIN's sequence number not counted
    assert row["seconds"] == pytest.approx(9.5e-3)  # first data packet -> last advancing ACK
    assert row["goodput_bps"] == pytest.approx(10_000 * 8 / 9.5e-3)


def test_goodput_window() -> None:
    g = tcp_goodput(packets(transfer()), start_ns=3 * MS, end_ns=round(7.7 * MS))
    row = g.iloc[0]
    # last ACK at or before 3 ms acks 2000 bytes, at or before 7.7 ms 7000 bytes
    assert row["bytes"] == 5000
    assert row["seconds"] == pytest.approx(4.7e-3)
    assert row["goodput_bps"] == pytest.approx(5000 * 8 / 4.7e-3)
    early = tcp_goodput(packets(transfer()), start_ns=-MS, end_ns=MS)  # before any data ACK
    assert early.iloc[0]["bytes"] == 0


def test_goodput_counts_only_in_order_acked_bytes() -> None:
    rows = transfer(segments=4, fin=False)
    # segment 2 is lost: the receiver's duplicate ACKs stay at 2000 until the retransmission
    rows = [r for r in rows if r["ts_ns"] != round(3.5 * MS)]
    rows[-1]["ack"] = (ISN + 1 + 2000) % 2**32
    rows.append(tcp(6, ISN + 1 + 2000, RISN + 1, ACK, 1000))
    rows.append(tcp(6.5, RISN + 1, ISN + 1 + 4000, ACK, reverse=True))
    g = tcp_goodput(packets(rows)).iloc[0]
    assert g["bytes"] == 4000
    assert g["seconds"] == pytest.approx(5.5e-3)


def test_goodput_through_pcap(tmp_path: Path) -> None:
    frames = []
    for r in transfer(segments=3):
        src, dst = ("198.18.0.2", "198.18.0.1") if r["src"] == B else ("198.18.0.1", "198.18.0.2")
        seg = tcp_segment(r["sport"], r["dport"], r["seq"], r["ack"], r["tcp_flags"])
        seg += bytes(r["payload_len"])
        frames.append((r["ts_ns"] + 10**18, ethernet(ipv4(src, dst, 6, seg))))
    df = read_pcap(write_pcap(tmp_path / "t.pcap", frames, snaplen=96))
    g = tcp_goodput(df).iloc[0]
    assert (g["bytes"], g["seconds"]) == (3000, pytest.approx(2.5e-3))


def test_no_payload_no_flow() -> None:
    rows = transfer(segments=0, fin=False)
    assert tcp_goodput(packets(rows)).empty
    assert tcp_retransmissions(packets(rows)).empty


def test_retransmissions() -> None:
    rows = transfer(segments=5, fin=False)
    rows += [
        tcp(7.0, ISN + 1 + 1000, RISN + 1, ACK, 1000),  # full retransmission
        tcp(7.1, ISN + 1 + 4000, RISN + 1, ACK, 500),  # covered by earlier data
        tcp(7.2, ISN + 1 + 4500, RISN + 1, ACK, 1000),  # overlaps but extends: new data
        tcp(7.3, ISN + 1 + 5500, RISN + 1, ACK, 1000),  # new
    ]
    r = tcp_retransmissions(packets(rows))
    assert len(r) == 1
    row = r.iloc[0]
    assert (row["src"], row["sport"]) == (A, 5000)
    assert row["data_packets"] == 9
    assert row["retransmitted_packets"] == 2
    assert row["retransmitted_bytes"] == 1500


def udp(ts_ns: int, ip_id: int, head: int = 0, sport: int = 7000) -> dict:
    return {
        "ts_ns": ts_ns,
        "proto": 17,
        "sport": sport,
        "dport": 9000,
        "ip_id": ip_id % 65536,
        "payload_head": head,
        "payload_len": 100,
        "ip_len": 128,
    }


def test_one_way_delay_known_delay_and_drop() -> None:
    sent = [udp(i * MS, i) for i in range(100)]
    before = packets([*sent, tcp(0.5, 1, 1, ACK)])  # other protocols are ignored
    after = packets([r | {"ts_ns": r["ts_ns"] + 5 * MS} for r in sent if r["ip_id"] != 42])
    owd = one_way_delay(before, after, max_delay_ns=20 * MS)
    # every packet but 42 arrived, the last at 104 ms: none is left undecided
    assert len(owd) == 100
    assert owd["lost"].tolist() == [i == 42 for i in range(100)]
    assert owd.loc[owd["lost"], "owd_ns"].tolist() == [-1]
    assert (owd.loc[~owd["lost"], "owd_ns"] == 5 * MS).all()
    assert owd["owd_ns"].dtype == np.int64 and owd["ts_out_ns"].dtype == np.int64
    s = summarize_owd(owd)
    assert (s["packets"], s["lost"]) == (100, 1)
    for k in ("min_ms", "median_ms", "mean_ms", "max_ms", "p99_ms"):
        assert s[k] == pytest.approx(5.0)
    assert s["std_ms"] == pytest.approx(0.0)


def test_one_way_delay_cuts_only_packets_that_could_not_have_arrived() -> None:
    """Packets 90 and 95..99 never arrive; the capture after the router ends at 99 ms.
    90 was sent before 94, which arrived (FIFO): lost. 95..99 were sent after the last
    delivered packet and within max_delay of the end: they cannot be judged."""
    sent = [udp(i * MS, i) for i in range(100)]
    before = packets(sent)
    gone = {90, 95, 96, 97, 98, 99}
    after = packets([r | {"ts_ns": r["ts_ns"] + 5 * MS} for r in sent if r["ip_id"] not in gone])
    owd = one_way_delay(before, after, max_delay_ns=20 * MS)
    assert owd["ip_id"].tolist() == list(range(95))
    assert owd.loc[owd["lost"], "ip_id"].tolist() == [90]
    # the median is that of all delivered packets, up to the last one (sent at 94 ms)
    assert (owd.loc[~owd["lost"], "owd_ns"] == 5 * MS).all()
    # with the end far away, the tail counts as lost
    late = one_way_delay(before, after, max_delay_ns=20 * MS, end_ns=10**12)
    assert len(late) == 100 and late["lost"].sum() == 6
    # capture ends at 116 ms: 95 and 96 had their 20 ms and are lost, 97..99 undecided
    later = one_way_delay(before, after, max_delay_ns=20 * MS, end_ns=116 * MS)
    assert later.loc[later["lost"], "ip_id"].tolist() == [90, 95, 96] and len(later) == 97


def test_owd_upper_bound_from_physics() -> None:
    # RTT 50 ms, 60000 B buffer at 1 Mbit/s: 25 + (60000 + 1514) * 8 / 1e6 s = 517.112 ms
    bound = owd_upper_bound_ns(one_way_delay_ns=25 * MS, buffer_bytes=60_000, rate_bps=10**6)
    assert bound == 517_112_000


def test_ip_id_wraparound_gives_no_extra_matches() -> None:
    """70000 packets of one flow with identical payload: IP IDs repeat after 65536."""
    n, delay = 70_000, 3 * MS
    ts = np.arange(n, dtype=np.int64) * MS
    before = packets([udp(0, 0)] * n)
    before["ts_ns"] = ts
    before["ip_id"] = (np.arange(n) % 65536).astype(np.uint16)
    drop = np.zeros(n, dtype=bool)
    drop[[5, 65541, 69_000]] = True  # 5 and 65541 share an IP ID
    after = before[~drop].copy()
    after["ts_ns"] += delay
    m = match_packets(before, after, max_delay_ns=50 * MS)
    assert len(m) == n and m.index.equals(before.index)
    assert (m["forwarded"].to_numpy() == ~drop).all()
    assert (m.loc[m["forwarded"], "ts_out_ns"] - m.loc[m["forwarded"], "ts_ns"] == delay).all()
    assert (m.loc[~m["forwarded"], "ts_out_ns"] == -1).all()
    # without the time window the same keys would pair up across the wrap
    naive = before.merge(after, on=["src", "dst", "proto", "sport", "dport", "ip_id"])
    assert len(naive) > n


def reference_match(before: pd.DataFrame, after: pd.DataFrame, max_delay: int) -> list[int]:
    """Plain-Python greedy: in before time order, take the earliest unused after packet."""
    keys = ["src", "dst", "proto", "sport", "dport", "ip_id", "seq", "payload_head"]
    used: set[int] = set()
    out = [-1] * len(before)
    a_rows = sorted(
        ((t, j, k) for j, (t, *k) in enumerate(after[["ts_ns", *keys]].itertuples(index=False))),
    )
    order = sorted(range(len(before)), key=lambda i: (before["ts_ns"].iat[i], i))
    for i in order:
        t, key = before["ts_ns"].iat[i], list(before[keys].iloc[i])
        for ta, j, ka in a_rows:
            if j not in used and ka == key and t <= ta <= t + max_delay:
                used.add(j)
                out[i] = ta
                break
    return out


@pytest.mark.parametrize("seed", range(6))
def test_match_greedy_with_duplicate_keys(seed: int) -> None:
    rng = random.Random(seed)
    n = 120
    before = packets(
        [udp(rng.randrange(0, 40), rng.randrange(3), rng.randrange(2)) for _ in range(n)]
    )
    after_rows = []
    for r in before.to_dict("records"):
        if rng.random() < 0.7:
            after_rows.append(r | {"ts_ns": r["ts_ns"] + rng.randrange(0, 8)})
    after_rows += [udp(rng.randrange(0, 50), rng.randrange(3), rng.randrange(2)) for _ in range(20)]
    rng.shuffle(after_rows)
    after = packets(after_rows)
    max_delay = rng.choice([0, 3, 6])
    got = match_packets(before, after, max_delay_ns=max_delay)
    assert got["ts_out_ns"].tolist() == reference_match(before, after, max_delay)
    assert (got["forwarded"] == (got["ts_out_ns"] >= 0)).all()


def test_match_empty_inputs() -> None:
    before = packets([udp(1, 1)])
    m = match_packets(before, packets([]).iloc[:0], max_delay_ns=10)
    assert m["forwarded"].tolist() == [False] and m["ts_out_ns"].tolist() == [-1]
    assert len(match_packets(before.iloc[:0], before, max_delay_ns=10)) == 0


def test_queue_full_events() -> None:
    fwd = [1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 1, 0]
    matched = packets([udp(i * 10**9, i) for i in range(len(fwd))])
    matched["forwarded"] = np.array(fwd, dtype=bool)
    matched = matched.iloc[::-1]  # arrival order comes from ts_ns, not row order
    q = queue_full_events(matched, start_ns=0, end_ns=60 * 10**9)
    assert q == {"events": 4, "drops": 7, "minutes": 1.0, "events_per_minute": 4.0}
    # runs starting at 4 s and 7 s; the 7-9 s run counts whole though the window ends at 8 s
    q = queue_full_events(matched, start_ns=2 * 10**9, end_ns=8 * 10**9)
    assert (q["events"], q["drops"]) == (2, 4)
    assert q["events_per_minute"] == pytest.approx(2 / 0.1)


def test_summarize_owd_all_lost() -> None:
    df = pd.DataFrame({"owd_ns": [-1, -1], "lost": [True, True]})
    s = summarize_owd(df)
    assert (s["packets"], s["lost"]) == (2, 2)
    assert np.isnan(s["median_ms"])


def test_connections_between_the_same_hosts_are_told_apart_by_their_ports() -> None:
    """Two connections between the same two hosts, differing only in the client's port: the
    flow kernels' direction table (keyed by whole 5-tuples) keeps them apart."""
    from analysis.startup import delivered_by, flow_starts

    other = packets(transfer(segments=4))  # a second connection from port 6000
    out = other["src"] == A
    other.loc[out, "sport"] = np.uint16(6000)
    other.loc[~out, "dport"] = np.uint16(6000)
    df = pd.concat([packets(transfer()), other], ignore_index=True)
    starts = flow_starts(df)
    assert starts[["sport", "syn_ns", "syns", "first_data_ns"]].values.tolist() == [
        [5000, 0, 1, MS],
        [6000, 0, 1, MS],
    ]
    got = delivered_by(df, [round(2.6 * MS), 100 * MS])
    # ACKs 0.5 ms after each 1000-byte segment, from 1.5 ms on; the FIN is not payload
    assert got[["sport", "bytes"]].values.tolist() == [
        [5000, 2000], [5000, 10_000], [6000, 2000], [6000, 4000],
    ]  # fmt: skip
