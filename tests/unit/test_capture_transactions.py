"""How a capture's packets become transactions (analysis/traffic/transaction.py): per client
port, a reply ends one that began with the first client packet after the previous reply."""

from __future__ import annotations

import pandas as pd

from analysis.pcap import ip_to_int
from analysis.traffic.transaction import UDP_REPLY_PAYLOAD, capture_transactions

CLIENT, SERVER, PORT = "198.18.0.1", "198.18.0.2", 5000
GEN = {"src": CLIENT, "dst": SERVER, "port": PORT, "proto": 17, "workload": "eft_long"}


def packet(ts: int, way: str, port: int, **columns: int) -> dict[str, int]:
    """One packet between the client's `port` and the server, 'up' (to the server) or
    'down', with the columns the analysis reads (`columns`: proto, payload_len, ...)."""
    up = way == "up"
    return {
        "ts_ns": ts,
        "src": ip_to_int(CLIENT if up else SERVER),
        "dst": ip_to_int(SERVER if up else CLIENT),
        "sport": port if up else PORT,
        "dport": PORT if up else port,
        **columns,
    }


def udp(packets: list[tuple[int, str, int]]) -> pd.DataFrame:
    """(time ns, 'up' or 'down', client port) -> the columns the analysis reads."""
    return pd.DataFrame(
        [
            packet(ts, way, port, proto=17, tcp_flags=0, seq=0,
                   payload_len=120 if way == "up" else UDP_REPLY_PAYLOAD)
            for ts, way, port in packets
        ]
    )  # fmt: skip


def as_rows(frame: pd.DataFrame) -> set[tuple[int, int, int, int]]:
    return {
        (int(r.local_port), int(r.k), int(r.cap_start_ns), int(r.cap_end_ns))
        for r in frame.itertuples()
    }


def test_each_reply_ends_the_transaction_its_port_began_since_the_previous_one():
    packets = udp(
        [
            (100, "down", 40001),  # a reply with no request before it: not a transaction
            (110, "up", 40001),
            (115, "up", 40001),  # a retransmitted request: the first one started it
            (150, "up", 40002),
            (160, "down", 40001),
            (170, "down", 40001),  # a duplicate reply: no request since the last one
            (180, "up", 40001),
            (190, "down", 40002),
            (200, "down", 40001),
            (210, "up", 40001),  # a request whose reply the capture did not see
            (220, "up", 40003),  # a port that never got a reply
        ]
    )
    assert as_rows(capture_transactions(packets, GEN)) == {
        (40001, 0, 110, 160),
        (40001, 1, 180, 200),
        (40002, 0, 150, 190),
    }


def test_a_reply_at_the_same_time_as_a_request_does_not_end_it():
    # the first request strictly after the previous reply, which ended at 300
    packets = udp([(100, "up", 40001), (300, "down", 40001), (300, "up", 40001)])
    packets = pd.concat([packets, udp([(400, "down", 40001)])], ignore_index=True)
    assert as_rows(capture_transactions(packets, GEN)) == {(40001, 0, 100, 300)}


def test_no_packets_give_an_empty_table_with_the_columns():
    empty = udp([(100, "up", 40001)]).iloc[0:0]
    frame = capture_transactions(empty, GEN)
    assert frame.empty and set(frame.columns) == {"local_port", "k", "cap_start_ns", "cap_end_ns"}


FIN, SYN, ACK = 0x01, 0x02, 0x10


def tcp(packets: list[tuple[int, str, int, int, int, int]]) -> pd.DataFrame:
    """(time ns, 'up' or 'down', client port, flags, seq, payload bytes) -> TCP packets."""
    return pd.DataFrame(
        [
            packet(ts, way, port, proto=6, payload_len=n, tcp_flags=flags, seq=seq)
            for ts, way, port, flags, seq, n in packets
        ]
    )


def test_a_short_tcp_transaction_runs_from_its_syn_to_the_servers_fin():
    """EFT-SHORT: set-up and teardown are part of each transaction (the paper; the client
    stops its clock when the server's FIN reaches it), so the capture's ends at that FIN, not
    at the reply before it."""
    packets = tcp(
        [
            (100, "up", 40001, SYN, 10, 0),
            (110, "down", 40001, SYN | ACK, 70, 0),
            (120, "up", 40001, ACK, 11, 0),
            (121, "up", 40001, ACK, 11, 100),  # the request
            (150, "down", 40001, ACK, 71, 1),  # the reply
            (157, "down", 40001, FIN | ACK, 72, 0),  # the server closes first
            (158, "down", 40001, FIN | ACK, 72, 0),  # its FIN again
            (160, "up", 40001, FIN | ACK, 111, 0),
            (200, "up", 40002, SYN, 20, 0),
            (210, "down", 40002, SYN | ACK, 80, 0),
            (221, "up", 40002, ACK, 21, 100),
            (250, "down", 40002, FIN | ACK, 81, 1),  # reply and FIN in one segment
            (300, "up", 40003, SYN, 30, 0),  # no FIN seen: no transaction
            (330, "down", 40003, ACK, 90, 1),
        ]
    )
    short = {**GEN, "proto": 6, "workload": "eft_short"}
    assert as_rows(capture_transactions(packets, short)) == {
        (40001, 0, 100, 157),
        (40002, 0, 200, 250),
    }
    # Read as EFT-LONG (a connection set up before): request data to the reply.
    long_ = {**GEN, "proto": 6, "workload": "eft_long"}
    assert as_rows(capture_transactions(packets, long_)) == {
        (40001, 0, 121, 150),
        (40002, 0, 221, 250),
    }
