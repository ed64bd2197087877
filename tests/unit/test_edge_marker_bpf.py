"""The BPF edge marker (hostside/bpf_tc/edge_marker/) against its reference, the Python marker
(hostside/markers/markers.py, with edge_marker.py's parsing and DSCP rewrite): seeded random
packet sequences of many flows (new data, retransmissions single, repacketized and go-back-N,
pure ACKs, SYNs again, FINs, RSTs, flows that began before the marker, sequence wraparound,
bursts and idle gaps across the expiry) go through both, and every frame must come out the
same, byte for byte, with a valid IPv4 checksum; so must the counters. Run in the kernel
with BPF_PROG_TEST_RUN (tests/bpf_tc.py). `pytest -s` prints what was compared."""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from core.dscp import af_code_points
from tests import bpf_tc
from tests.hostside import load
from tests.unit.test_markers import ip_checksum

markers = load("markers/markers.py")
SYN, ACK, FIN, RST, SEQ_MOD = markers.SYN, markers.ACK, markers.FIN, markers.RST, markers.SEQ_MOD
ETHER_IP = bytes(12) + b"\x08\x00"
NOT_TCP = [  # frames the marker must leave alone: ARP, IPv6, IPv4 UDP
    bytes(12) + b"\x08\x06" + bytes(28),
    bytes(12) + b"\x86\xdd" + b"\x60" + bytes(39),
]
SECOND = 10**9

pytestmark = pytest.mark.skipif(bool(bpf_tc.missing()), reason=bpf_tc.missing() or "")


@pytest.fixture(scope="module")
def edge():
    pytest.importorskip("netfilterqueue")  # edge_marker.py imports it
    return load("markers/edge_marker.py")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return bpf_tc.build(tmp_path_factory.mktemp("bpf_tc"), "edge_marker")


def ipv4(
    src: bytes, dst: bytes, proto: int, body: bytes, tos: int, ident: int, options: int = 0
) -> bytes:
    """An IPv4 frame; `options`: 4-byte words of IP options (no-ops)."""
    length = 20 + 4 * options
    fields = (0x40 | length // 4, tos, length + len(body), ident, 0x4000, 64, proto, 0, src, dst)
    header = bytearray(struct.pack("!BBHHHBBH4s4s", *fields) + b"\x01" * 4 * options)
    header[10:12] = ip_checksum(bytes(header)).to_bytes(2, "big")
    return ETHER_IP + bytes(header) + body


def tcp(
    key: tuple, seq: int, flags: int, payload: int, tos: int, ident: int, options: tuple
) -> bytes:
    """A frame of flow `key` (src, dst, sport, dport); `options`: 4-byte words of IP and of
    TCP options."""
    src, dst, sport, dport = key
    ip_words, tcp_words = options
    head = struct.pack("!HHIIBBHHH", sport, dport, seq % SEQ_MOD, 1, (5 + tcp_words) << 4,
                       flags, 65535, 0, 0)  # fmt: skip
    body = head + b"\x01" * 4 * tcp_words + bytes(payload)
    return ipv4(src, dst, 6, body, tos, ident, ip_words)


@dataclass
class Sender:
    """One direction of a TCP connection: what it sent, to send again."""

    key: tuple
    isn: int
    mss: int
    loss: float = 0.0  # the share of its steps that send data again
    next: int = 0
    sent: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.next = self.isn + 1


@dataclass
class Traffic:
    """A seeded random packet sequence: (now_ns, frame) pairs."""

    rng: random.Random
    idle_ns: int
    now: int = SECOND
    ident: int = 0
    flows: list[Sender] = field(default_factory=list)
    frames: list[tuple[int, bytes]] = field(default_factory=list)

    def emit(self, frame: bytes) -> None:
        self.frames.append((self.now, frame))

    def packet(self, s: Sender, seq: int, flags: int, payload: int) -> None:
        rng = self.rng
        self.ident = (self.ident + 1) & 0xFFFF
        tos = rng.choice([0, 0, 1, 2, 3, 0x28, 0xB8, 0x30 | rng.randrange(4)])  # ECN bits kept
        options = (rng.choice([0, 0, 0, 0, 1]), rng.choice([0, 0, 0, 3]))
        self.emit(tcp(s.key, seq, flags, payload, tos, self.ident, options))

    def new_flow(self) -> Sender:
        rng = self.rng
        if self.flows and rng.random() < 0.1:  # the 4-tuple of an earlier connection again
            key = rng.choice(self.flows).key
        else:
            src = bytes([198, 18, 1, rng.randrange(1, 5)])
            dst = bytes([198, 18, 2, rng.randrange(1, 5)])
            key = (src, dst, rng.randrange(1024, 65536), rng.choice([80, 5201, 9100]))
        isn = rng.choice([rng.randrange(SEQ_MOD), SEQ_MOD - rng.randrange(1, 40000)])  # wraps
        loss = rng.choice([0.002, 0.02, 0.1, 0.3]) if self.flows else 0.005  # the long one
        s = Sender(key, isn, rng.choice([536, 1448, 1460]), loss)
        self.flows.append(s)
        if rng.random() < 0.9:
            self.packet(s, s.isn, SYN, 0)
            if rng.random() < 0.3:  # the receiver's SYN-ACK comes in here too
                back = (key[1], key[0], key[3], key[2])
                self.packet(Sender(back, rng.randrange(SEQ_MOD), 1448), 0, SYN | ACK, 0)
        # else: it began before the marker; its first packet here is data
        return s

    def step(self) -> None:
        rng = self.rng
        if not self.flows or rng.random() < 0.03:
            self.new_flow()
            return
        # The first flow is the long-lived one (a third of the steps), the others short.
        s = self.flows[0] if rng.random() < 0.3 else rng.choice(self.flows[-12:])
        action = rng.random()
        if s.sent and action < s.loss:  # a retransmission of one of three kinds
            kind = rng.random()
            if kind < 0.6:  # one segment again
                seq, size = rng.choice(s.sent[-40:])
                self.packet(s, seq, ACK, size)
            elif kind < 0.75:  # go-back-N from a segment on
                start = rng.randrange(max(0, len(s.sent) - 80), len(s.sent))
                for seq, size in s.sent[start:]:
                    self.packet(s, seq, ACK, size)
                    self.now += rng.randrange(1, 50_000)
            else:  # repacketized: starts inside an earlier segment
                seq, size = rng.choice(s.sent[-40:])
                self.packet(s, seq + rng.randrange(size), ACK, rng.randrange(1, 2 * s.mss))
        elif action < s.loss + 0.2:
            self.packet(s, s.next, ACK, 0)  # a pure ACK
        elif action < s.loss + 0.205:
            self.packet(s, s.isn, SYN, 0)  # the SYN again: the flow starts afresh
        elif action < s.loss + 0.225:  # the end, with or without data
            size = rng.choice([0, rng.randrange(1, s.mss)])
            self.packet(s, s.next, FIN | ACK, size)
            s.next += size
        elif action < s.loss + 0.23:
            self.packet(s, s.next, RST, 0)
        elif action < s.loss + 0.25:
            self.emit(rng.choice([*NOT_TCP, ipv4(s.key[0], s.key[1], 17, bytes(30), 0, 1)]))
        elif action < s.loss + 0.27:
            self.now += rng.choice([self.idle_ns, self.idle_ns + 1, 2 * self.idle_ns])
        else:  # new data, full or not
            size = s.mss if rng.random() < 0.8 else rng.randrange(1, s.mss)
            self.packet(s, s.next, ACK, size)
            s.sent.append((s.next, size))
            s.next += size

    def run(self, packets: int) -> list[tuple[int, bytes]]:
        while len(self.frames) < packets:
            # bursts (back to back), a steady pace, then slow: the clock only matters for expiry
            self.now += self.rng.choice([1_000, 100_000, 20_000_000])
            self.step()
        return self.frames


def reference(edge, frames: list, marker, dscp: dict) -> Iterator[bytes]:
    """The Python marker on each frame, as edge_marker.py marks what NFQUEUE gives it, with
    idle flows forgotten before every packet."""
    for now, frame in frames:
        fields = edge.tcp_fields(frame[14:]) if frame[12:14] == ETHER_IP[12:] else None
        if fields is None:
            yield frame  # iptables sends the marker IPv4 TCP only
            continue
        marker.expire(now)
        yield frame[:14] + edge.remark(frame[14:], dscp[marker.mark(*fields, now)])


def compare(edge, built: Path, frames: list, kind: str, af_class: int = 1, **params) -> dict:
    """Both markers on `frames`: asserts every frame and counter alike; returns the counts."""
    dscp = dict(enumerate(af_code_points(af_class), start=1))
    python = markers.Marker(kind, **params)
    expected = list(reference(edge, frames, python, dscp))
    got = bpf_tc.run(
        built, "edge_marker", frames, marker=kind, **params,
        **{f"dscp{p}": d for p, d in dscp.items()},
    )  # fmt: skip
    assert got.verdicts == [0] * len(frames)  # TC_ACT_OK: never dropped
    differ = [i for i, (a, b) in enumerate(zip(got.frames, expected, strict=True)) if a != b]
    assert not differ, (
        f"{kind} {params}: {len(differ)} of {len(frames)} frames differ; the first, #{differ[0]}:"
        f" in {frames[differ[0]][1][:40].hex()} bpf {got.frames[differ[0]][:40].hex()}"
        f" python {expected[differ[0]][:40].hex()}"
    )
    for out in got.frames:
        if out[12:14] == ETHER_IP[12:] and out[23] in (6, 17):
            header = out[14 : 14 + (out[14] & 0x0F) * 4]
            assert ip_checksum(header) == 0  # a valid header sums to 0xFFFF
    stats = got.summary["stats"]
    tcp_packets = sum(python.counts.values())
    assert [stats[f"precedence{p}"] for p in (1, 2, 3)] == [python.counts[p] for p in (1, 2, 3)]
    assert stats["not_marked"] == len(frames) - tcp_packets
    assert stats["flows_lost"] == stats["gso"] == 0
    if kind != "NM":
        assert (stats["retransmissions"], stats["control"]) == (
            python.retransmissions,
            python.control,
        )
    marked = {p: c for p, c in python.counts.items() if c}
    print(f"{kind} {params} AF{af_class}: {len(frames)} frames alike, precedences {marked}, "
          f"retransmissions {python.retransmissions}")  # fmt: skip
    return {"frames": len(frames), "counts": python.counts, "python": python}


PAPER = {"a0": 7.0, "alpha": 0.5, "n_s": 5, "n_a": 5}
SETTINGS = [  # (kind, AF class, parameters): the paper's, then others that round differently
    *[(kind, 1, PAPER) for kind in ("NM", "APM", "WPM", "MPM")],
    ("APM", 2, {"a0": 7.5, "alpha": 0.3}),
    ("APM", 3, {"a0": 1.0, "alpha": 0.0}),
    ("APM", 4, {"a0": 0.6, "alpha": 0.9}),
    ("MPM", 1, {"a0": 3.3, "alpha": 0.1, "n_s": 2, "n_a": 1}),
    ("WPM", 2, {"n_s": 0, "n_a": 1}),
    ("WPM", 3, {"n_s": 10, "n_a": 0}),
]


@pytest.mark.parametrize("kind,af_class,params", SETTINGS)
@pytest.mark.parametrize("seed", [1, 2])
def test_random_sequences_are_marked_as_the_python_marker_marks_them(
    edge, built: Path, kind: str, af_class: int, params: dict, seed: int
) -> None:
    idle_ns = 2 * SECOND if seed == 1 else 120 * SECOND
    frames = Traffic(random.Random(seed), idle_ns).run(3000)
    got = compare(edge, built, frames, kind, af_class, idle_ns=idle_ns, **params)
    counts = got["counts"]
    if kind in ("APM", "WPM"):
        assert counts[1] and counts[2]  # both colours occur
    if kind == "MPM":
        assert counts[1] and counts[2] and counts[3]
    if kind != "NM":
        assert got["python"].retransmissions > 100


def test_a_long_run_of_retransmissions_takes_a_in_through_subnormals_to_zero(edge, built) -> None:
    """A_IN halves at each retransmission: 1100 in a row take it below the smallest double."""
    t = Traffic(random.Random(7), idle_ns=120 * SECOND)
    s = t.new_flow()
    for _ in range(20):
        t.packet(s, s.next, ACK, 1448)
        s.sent.append((s.next, 1448))
        s.next += 1448
    seq, size = s.sent[3]
    for _ in range(1100):
        t.packet(s, seq, ACK, size)
    for _ in range(40):
        t.packet(s, s.next, ACK, 1448)
        s.next += 1448
    for kind in ("APM", "MPM"):
        python = compare(edge, built, t.frames, kind, **PAPER)["python"]
        assert python.flows[s.key].apm.a_in > 0  # grown again from zero by the new packets
    # The reference did reach zero on the way (a_in after the retransmissions alone):
    zero = markers.Marker("APM")
    for now, frame in t.frames[: len(t.frames) - 40]:
        zero.mark(*edge.tcp_fields(frame[14:]), now)
    assert zero.flows[s.key].apm.a_in == 0.0


def test_a_flow_idle_for_exactly_the_limit_is_kept_and_one_ns_longer_forgotten(edge, built):
    idle = 5 * SECOND
    for gap, forgotten in ((idle, False), (idle + 1, True)):
        t = Traffic(random.Random(3), idle_ns=idle)
        s = t.new_flow()
        for i in range(12):
            if i == 8:
                t.now += gap
            t.packet(s, s.next, ACK, 1000)
            s.next += 1000
        python = compare(edge, built, t.frames, "WPM", idle_ns=idle, n_s=5, n_a=5)["python"]
        in_packets = python.counts[1] - (len(t.frames) - 12)  # the SYN (and SYN-ACK) are IN
        assert in_packets == (9 if forgotten else 5)  # a new flow: 5 protected from packet 9


def test_a_pure_ack_keeps_its_flow_from_being_forgotten(edge, built) -> None:
    idle = 5 * SECOND
    t = Traffic(random.Random(3), idle_ns=idle)
    s = t.new_flow()
    for i in range(12):
        if i == 8:  # a gap longer than the limit, with a pure ACK in its middle
            t.now += idle // 2
            t.packet(s, s.next, ACK, 0)
            t.now += idle // 2 + 1
        t.packet(s, s.next, ACK, 1000)
        s.next += 1000
    python = compare(edge, built, t.frames, "WPM", idle_ns=idle, n_s=5, n_a=5)["python"]
    assert python.counts[2] == 7  # kept: only the first 5 data packets protected


def test_a_in_keeps_fractions_far_below_one_packet(edge, built) -> None:
    """50 retransmissions in a row take A_IN to 2^-47; the next OUT makes it 1 + 2^-46, so the
    packet after it is IN (1 < A_IN), and later 3 + 2^-45 lets a third one through. A fixed
    point with fewer than 46 fractional bits would mark both OUT."""
    t = Traffic(random.Random(5), idle_ns=120 * SECOND)
    s = t.new_flow()
    first = s.next
    t.packet(s, first, ACK, 1000)
    s.next += 1000
    for _ in range(50):
        t.packet(s, first, ACK, 1000)
    for _ in range(7):
        t.packet(s, s.next, ACK, 1000)
        s.next += 1000
    python = markers.Marker("APM", **PAPER)
    marks = list(reference(edge, t.frames, python, {1: 1, 2: 2, 3: 3}))
    assert [m[15] >> 2 for m in marks[-7:]] == [2, 1, 2, 1, 1, 1, 2]  # O I O I I I O
    assert python.flows[s.key].apm.a_in == 7 + 2**-44  # 2 (3 + 2^-45) + 1
    compare(edge, built, t.frames, "APM", **PAPER)


def test_the_daemon_builds_once_per_source(tmp_path: Path) -> None:
    daemon = load("markers/bpf_edge_marker.py")
    digest = daemon.source_sha256()
    obj, tool = daemon.build(str(tmp_path), digest)
    built_at = Path(obj).stat().st_mtime_ns
    assert daemon.build(str(tmp_path), digest) == (obj, tool)
    assert Path(obj).stat().st_mtime_ns == built_at  # not built again
    assert Path(obj).parent.name == digest and not list(tmp_path.glob(".build-*"))
    params = json.loads(subprocess.run([tool, "params", obj], capture_output=True).stdout)
    assert params["marker"] == "NM" and params["a0"] == 7.0  # the program's defaults
    copy = tmp_path / "copy"
    shutil.copytree(bpf_tc.BPF_TC, copy)
    assert daemon.source_sha256(str(copy)) == digest
    (copy / "double.h").write_text((copy / "double.h").read_text() + "\n")
    assert daemon.source_sha256(str(copy)) != digest
