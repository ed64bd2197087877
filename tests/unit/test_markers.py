"""The seed-004 markers (hostside/markers/markers.py) on packet sequences whose markings follow
by hand from EXPERIMENTS.md §4: no loss, retransmissions, sequence wraparound, interleaved
flows."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.dscp import af_code_points
from tests.hostside import load

markers = load("markers/markers.py")
ACK, FIN, SYN, SEQ_MOD = markers.ACK, markers.FIN, markers.SYN, markers.SEQ_MOD
IN, OUT = markers.IN, markers.OUT
Marker, seq_after = markers.Marker, markers.seq_after

PROJECT = Path(__file__).resolve().parents[2]
KEY = ("198.18.1.11", "198.18.2.13", 6, 40000, 80)
MSS = 1448


class Flow:
    """Drives one TCP flow through a marker: a SYN, then data segments by index (1-based),
    new or retransmitted; returns the precedence of every data packet."""

    def __init__(self, marker: Marker, isn: int = 1000, key: tuple = KEY, syn: bool = True):
        self.m, self.isn, self.key = marker, isn, key
        if syn:
            assert marker.mark(key, isn, 0, SYN) == IN

    def seq(self, i: int) -> int:
        return (self.isn + 1 + (i - 1) * MSS) % SEQ_MOD

    def send(self, i: int) -> int:
        return self.m.mark(self.key, self.seq(i), MSS, ACK)

    def run(self, plan: list[int]) -> list[int]:
        return [self.send(i) for i in plan]


def marks(text: str) -> list[int]:
    """'IIO' -> [IN, IN, OUT]; for MPM '1', '2', '3' are the precedences."""
    table = {"I": IN, "O": OUT, "1": 1, "2": 2, "3": 3}
    return [table[c] for c in text.replace(" ", "")]


def test_seq_after_is_modulo_2_32() -> None:
    assert seq_after(5, 4) and not seq_after(4, 5) and not seq_after(7, 7)
    assert seq_after(3, SEQ_MOD - 2)  # wrapped: 3 comes after 2^32 - 2
    assert not seq_after(SEQ_MOD - 2, 3)
    assert seq_after(2**31 - 1, 0) and not seq_after(2**31 + 1, 0)


def test_dscp_of_af_classes() -> None:
    assert af_code_points(1) == (10, 12, 14)  # AF11 AF12 AF13
    assert af_code_points(4)[0] == 34


def test_nm_marks_everything_in() -> None:
    m = Marker("NM")
    flow = Flow(m)
    assert flow.run([*range(1, 40), 5, 6]) == [IN] * 41
    assert m.counts == {1: 42, 2: 0, 3: 0}  # with the SYN


def test_apm_without_loss_marks_out_after_growing_in_bursts() -> None:
    # A_IN = 7: packets 1-6 IN, the 7th OUT (A := 15); 14 IN then OUT (A := 31); 30 IN, OUT.
    got = Flow(Marker("APM")).run(list(range(1, 61)))
    expected = marks("IIIIII O" + "I" * 14 + "O" + "I" * 30 + "O" + "I" * 7)
    assert got == expected
    assert [i + 1 for i, p in enumerate(got) if p == OUT] == [7, 22, 53]


def test_apm_retransmission_filters_the_burst_length() -> None:
    m = Marker("APM")
    flow = Flow(m)
    # 3 new (L = 3), then segment 2 again: A := 0.5*7 + 0.5*3 = 5, L := 0, IN.
    assert flow.run([1, 2, 3]) == marks("III")
    assert flow.send(2) == IN
    assert m.flows[KEY].apm.a_in == 5 and m.flows[KEY].apm.l_in == 0
    # Now IN while L < 5: 4 IN, the 5th new packet OUT, A := 11.
    assert flow.run([4, 5, 6, 7, 8]) == marks("IIIIO")
    assert m.flows[KEY].apm.a_in == 11
    # A second retransmission right after the OUT (L = 0): A := 5.5; then 5 IN, OUT.
    assert flow.send(8) == IN
    assert m.flows[KEY].apm.a_in == 5.5
    assert flow.run(list(range(9, 15))) == marks("IIIII O")
    assert m.retransmissions == 2


def test_apm_short_flows_are_all_in() -> None:
    # "APM does not act on very short flows (less than 7 packets)"
    m = Marker("APM")
    for port in range(6):
        key = (*KEY[:3], 41000 + port, 80)
        assert Flow(m, key=key).run(list(range(1, 7))) == [IN] * 6
    assert m.counts[OUT] == 0


def test_wpm_protects_the_start_and_after_a_loss() -> None:
    m = Marker("WPM")
    flow = Flow(m)
    assert flow.run(list(range(1, 13))) == marks("IIIII OOOOOOO")
    # A retransmission of 9: itself and the next 4 data packets IN, then OUT again.
    assert flow.run([9, 13, 14, 15, 16, 17, 18]) == marks("IIIII OO")
    # A second loss inside the protected window restarts the count of N_a.
    assert flow.run([19, 20, 21, 20, 22, 23, 24, 25, 26]) == marks("OOO IIIII O")
    # Go-back-N: every retransmitted segment is a loss seen again; 4 IN after the last one.
    assert flow.run([24, 25, 26, 27, 28, 29, 30, 31]) == marks("III IIII O")


def test_mpm_three_colours() -> None:
    # WPM protects 1-5 (AFx1); APM's probe is the 7th (AFx3); the rest AFx2.
    m = Marker("MPM")
    flow = Flow(m)
    assert flow.run(list(range(1, 23))) == marks("11111 2 3" + "2" * 14 + "3")
    # A loss: WPM protects the retransmission and 4 more; APM: A := 0.5*31 + 0.5*0 = 15.5.
    assert flow.run([20, 23, 24, 25, 26, 27]) == marks("11111 2")
    assert m.flows[KEY].apm.a_in == 15.5


def test_mpm_protection_wins_over_a_probe() -> None:
    # No start protection (N_s = 0). A retransmission at L = 1: A := 4, so APM's 4th new
    # packet is a probe, but WPM protects the retransmission and the next 4 data packets.
    m = Marker("MPM", n_s=0)
    flow = Flow(m)
    assert flow.run([1]) == marks("2")
    assert flow.send(1) == 1  # retransmission: A := 0.5*7 + 0.5*1 = 4, protected
    assert flow.run([2, 3, 4, 5]) == marks("1111")  # APM's 4th new packet is a probe
    assert m.flows[KEY].apm.a_in == 9  # ... and APM's state counted it as one
    assert flow.run([6, 7]) == marks("22")


@pytest.mark.parametrize("kind", ["APM", "WPM", "MPM"])
def test_sequence_wraparound_changes_nothing(kind: str) -> None:
    plan = [*range(1, 30), 12, *range(30, 45), 44, 43, *range(45, 60)]
    plain = Flow(Marker(kind), isn=1000).run(plan)
    # ISN 3 segments before 2^32: the sequence numbers wrap after the third segment.
    wrap = Flow(Marker(kind), isn=SEQ_MOD - 3 * MSS).run(plan)
    assert wrap == plain
    # and a retransmission from before the wrap is still a retransmission after it
    m = Marker(kind)
    flow = Flow(m, isn=SEQ_MOD - 3 * MSS)
    flow.run([1, 2, 3, 4, 5, 6])
    assert flow.seq(2) > flow.seq(6)  # raw numbers: the old segment looks "higher"
    before = m.retransmissions
    flow.send(2)
    assert m.retransmissions == before + 1


def test_partial_retransmission_and_pure_acks() -> None:
    m = Marker("APM")
    flow = Flow(m)
    flow.run([1, 2, 3])
    # pure ACKs and a bare FIN change nothing and are IN
    assert m.mark(KEY, flow.seq(4), 0, ACK) == IN
    assert m.mark(KEY, flow.seq(4), 0, ACK | FIN) == IN
    assert m.flows[KEY].apm.l_in == 3
    # a repacketized retransmission starting inside segment 3 is a retransmission
    assert m.mark(KEY, flow.seq(3) + 100, 500, ACK) == IN
    assert m.retransmissions == 1 and m.flows[KEY].apm.l_in == 0


def test_flows_are_independent_per_5_tuple() -> None:
    plan = list(range(1, 25))
    alone = Flow(Marker("MPM")).run(plan)
    m = Marker("MPM")
    a = Flow(m, key=KEY)
    b = Flow(m, key=(*KEY[:3], 40001, 80), isn=77)
    reverse = Flow(m, key=(KEY[1], KEY[0], 6, 80, 40000), isn=5)  # the other direction
    got_a, got_b = [], []
    for i in plan:
        got_a.append(a.send(i))
        reverse.send(1)  # the same segment over and over: retransmissions of the reverse flow
        got_b.append(b.send(i))
    assert got_a == alone and got_b == alone


def test_a_new_syn_restarts_the_flow_and_a_flow_without_syn_starts_new() -> None:
    m = Marker("WPM")
    flow = Flow(m)
    flow.run(list(range(1, 9)))
    again = Flow(m, isn=999_999)  # same 5-tuple, a new connection
    assert again.run(list(range(1, 8))) == marks("IIIII OO")
    late = Flow(Marker("WPM"), isn=123, syn=False)  # the marker started mid-flow
    assert late.run(list(range(10, 17))) == marks("IIIII OO")


def test_idle_flows_expire() -> None:
    m = Marker("APM", idle_ns=10)
    m.mark(KEY, 1, 0, SYN, now_ns=0)
    m.mark((*KEY[:3], 2, 80), 1, 0, SYN, now_ns=100)
    assert m.expire(now_ns=105) == 1 and list(m.flows) == [(*KEY[:3], 2, 80)]


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="allowed NM, APM, WPM, MPM"):
        Marker("RIO")
    with pytest.raises(ValueError, match="alpha"):
        Marker("APM", alpha=1.0)


def ip_checksum(header: bytes) -> int:
    total = sum(int.from_bytes(header[i : i + 2], "big") for i in range(0, len(header), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@pytest.mark.parametrize("tos", [0x00, 0x01, 0x02, 0x03, 0x28, 0xB8, 0xFF])
def test_dscp_rewrite_keeps_ecn_and_a_valid_checksum(tos: int) -> None:
    pytest.importorskip("netfilterqueue")
    edge = load("markers/edge_marker.py")
    header = bytearray.fromhex("45000034c0de40004006" + "0000" + "c612e601" + "c612e701")
    header[1] = tos
    header[10:12] = ip_checksum(bytes(header)).to_bytes(2, "big")
    packet = bytes(header) + b"tcp header and data"
    for dscp in (0, 10, 12, 14, 46, 63):
        out = edge.remark(packet, dscp)
        assert out[1] >> 2 == dscp and out[1] & 3 == tos & 3
        assert ip_checksum(out[:20]) == 0  # a valid header sums to 0xFFFF
        assert out[20:] == packet[20:] and out[2:10] == packet[2:10]
        assert (out is packet) == ((tos >> 2) == dscp)
