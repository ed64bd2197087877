"""read_pcap against tcpdump on synthetic captures, plus error handling."""

from __future__ import annotations

import random
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import blocks
from analysis.pcap import COLUMNS, PcapError, PcapTruncatedWarning, int_to_ip, ip_to_int, read_pcap

from .pcapgen import (
    arp_frame,
    ethernet,
    ipv4,
    ipv6_frame,
    sll,
    tcp_segment,
    udp_datagram,
    write_pcap,
)

T0 = 1_763_700_000_000_000_000
needs_tcpdump = pytest.mark.skipif(shutil.which("tcpdump") is None, reason="needs tcpdump")


def random_capture(seed: int, n: int = 300, *, vlan_share: float = 0.2) -> list[tuple[int, bytes]]:
    """Mixed IPv4 TCP/UDP/ICMP with options, VLAN tags, padding; plus ARP and IPv6 to skip."""
    rng = random.Random(seed)
    hosts = ["198.18.1.11", "198.18.2.22", "198.18.0.1", "198.19.255.254"]
    ts = T0 + rng.randrange(10**9)
    out = []
    for _ in range(n):
        ts += rng.randrange(1, 2_000_000)
        src, dst = rng.sample(hosts, 2)
        payload = rng.randbytes(rng.choice([0, 0, 1, 5, 8, 9, 100, 1448]))
        kind = rng.random()
        if kind < 0.45:
            opts = rng.choice([b"", b"\x02\x04\x05\xb4", b"\x01\x01\x08\x0a" + rng.randbytes(8)])
            seg = tcp_segment(
                rng.randrange(30000, 60000),  # high ports: no tcpdump protocol dissectors
                rng.randrange(30000, 60000),
                rng.randrange(2**32),
                rng.randrange(2**32),
                rng.choice([0x02, 0x12, 0x10, 0x18, 0x11, 0x04]),
                payload,
                options=opts,
            )
            l4, proto = seg, 6
        elif kind < 0.85:
            ports = rng.randrange(30000, 60000), rng.randrange(30000, 60000)
            l4, proto = udp_datagram(*ports, payload), 17
        elif kind < 0.92:
            l4, proto = b"\x08\x00\x00\x00\x00\x01\x00\x01" + payload, 1
        elif kind < 0.96:
            out.append((ts, arp_frame()))
            continue
        else:
            out.append((ts, ipv6_frame()))
            continue
        ip_opts = b"\x01\x01\x01\x01" if rng.random() < 0.1 else b""
        packet = ipv4(src, dst, proto, l4, ip_id=rng.randrange(65536), options=ip_opts)
        vlan = rng.randrange(4096) if rng.random() < vlan_share else None
        tpid = rng.choice([0x8100, 0x88A8])
        out.append((ts, ethernet(packet, vlan=vlan, tpid=tpid)))
    return out


_LINE = re.compile(r"^(\d+)\.(\d+) IP \((.*)\)$")
_ENDPOINTS = re.compile(r"^\s+([\d.]+) > ([\d.]+): (.*)$")


def tcpdump_packets(path: Path, nano: bool) -> list[dict]:
    """IPv4 packets as tcpdump -v -S prints them (-S: absolute sequence numbers)."""
    cmd = ["tcpdump", "-n", "-tt", "-v", "-S", "-r", str(path)]
    if nano:
        cmd.insert(1, "--time-stamp-precision=nano")
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    packets = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _LINE.match(line)
        if not m:
            continue
        sec, frac, info = m.groups()
        p = {
            "ts_ns": int(sec) * 10**9 + int(frac) * (1 if nano else 1000),
            "ip_id": int(re.search(r"\bid (\d+)", info)[1]),
            "proto": int(re.search(r"proto \w+ \((\d+)\)", info)[1]),
            "ip_len": int(re.search(r"\blength (\d+)", info)[1]),
        }
        e = _ENDPOINTS.match(lines[i + 1])
        src, dst, rest = e.groups()
        if src.count(".") == 4:  # a.b.c.d.port
            (src, sport), (dst, dport) = (a.rsplit(".", 1) for a in (src, dst))
            p["sport"], p["dport"] = int(sport), int(dport)
        if p["proto"] in (6, 17) and "[|" not in rest:  # not cut by the snaplen
            p["payload_len"] = int(re.search(r"length (\d+)", rest)[1])
            if seq := re.search(r"\bseq (\d+)", rest):
                p["seq"] = int(seq[1])
            if ack := re.search(r"\back (\d+)", rest):
                p["ack"] = int(ack[1])
        p["src"], p["dst"] = ip_to_int(src), ip_to_int(dst)
        packets.append(p)
    return packets


def assert_matches_tcpdump(path: Path, nano: bool) -> pd.DataFrame:
    df = read_pcap(path)
    ref = tcpdump_packets(path, nano)
    assert len(df) == len(ref)
    rows = df.to_dict("records")
    for i, (got, want) in enumerate(zip(rows, ref, strict=True)):
        for k, v in want.items():
            assert got[k] == v, f"packet {i} field {k}: read_pcap {got[k]}, tcpdump {v}"
    return df


@needs_tcpdump
@pytest.mark.parametrize("nano", [False, True], ids=["micro", "nano"])
@pytest.mark.parametrize("big_endian", [False, True], ids=["le", "be"])
@pytest.mark.parametrize("snaplen", [65535, 96, 64])
def test_matches_tcpdump(tmp_path: Path, nano: bool, big_endian: bool, snaplen: int) -> None:
    recs = random_capture(seed=snaplen + 2 * nano + big_endian)
    path = write_pcap(tmp_path / "x.pcap", recs, nano=nano, big_endian=big_endian, snaplen=snaplen)
    df = assert_matches_tcpdump(path, nano)
    assert list(df.dtypes.astype(str)) == list(COLUMNS.values())
    assert list(df.columns) == list(COLUMNS)
    assert (df.index == np.arange(len(df))).all()
    assert (df["caplen"] <= snaplen).all() and (df["caplen"] <= df["wirelen"]).all()
    if snaplen == 64:
        assert (df["caplen"] < df["wirelen"]).any()  # ip_len came from the header


def test_exact_timestamps_and_fields(tmp_path: Path) -> None:
    t = T0 + 123_456_789
    seg = tcp_segment(5001, 40000, 2**32 - 1, 7, 0x18, b"hello world!")
    recs = [
        (t, ethernet(ipv4("198.18.1.11", "198.18.2.22", 6, seg, ip_id=65535), vlan=7)),
        (t + 1, ethernet(ipv4("198.18.1.11", "198.18.2.22", 17, udp_datagram(1, 2, b"abc")))),
        (t + 2, arp_frame()),
    ]
    nano = read_pcap(write_pcap(tmp_path / "n.pcap", recs, nano=True))
    micro = read_pcap(write_pcap(tmp_path / "u.pcap", recs))
    assert nano["ts_ns"].tolist() == [t, t + 1]
    assert micro["ts_ns"].tolist() == [t // 1000 * 1000] * 2  # exact integer microseconds
    r0, r1 = nano.iloc[0], nano.iloc[1]
    assert (int_to_ip(r0["src"]), int_to_ip(r0["dst"])) == ("198.18.1.11", "198.18.2.22")
    assert (r0["seq"], r0["ack"], r0["tcp_flags"], r0["ip_id"]) == (2**32 - 1, 7, 0x18, 65535)
    assert (r0["ip_hl"], r0["payload_len"], r0["ip_len"]) == (20, 12, 52)
    assert r0["payload_head"] == int.from_bytes(b"hello wo", "big")
    # 3 payload bytes, the rest of the 60-byte frame is Ethernet padding: zero-filled
    assert r1["payload_head"] == int.from_bytes(b"abc\0\0\0\0\0", "big")
    assert (r1["seq"], r1["tcp_flags"], r1["payload_len"]) == (0, 0, 3)


def test_payload_head_beyond_snaplen_is_zero(tmp_path: Path) -> None:
    seg = tcp_segment(1, 2, 100, 0, 0x18, b"ABCDEFGHIJ")
    frame = ethernet(ipv4("198.18.0.1", "198.18.0.2", 6, seg))
    df = read_pcap(write_pcap(tmp_path / "s.pcap", [(T0, frame)], snaplen=14 + 20 + 20 + 3))
    assert df["payload_head"].tolist() == [int.from_bytes(b"ABC\0\0\0\0\0", "big")]
    assert df["payload_len"].tolist() == [10]


def _fragment(packet: bytes, flags_offset: int) -> bytes:
    """The IPv4 packet with its flags and fragment offset field set (checksum not redone)."""
    return packet[:6] + struct.pack("!H", flags_offset) + packet[8:]


def test_fragments_carry_tcp_fields_on_the_first_only(tmp_path: Path) -> None:
    """A first fragment (MF set, offset 0) is read as a whole TCP packet; a later one (offset
    in either byte of the field), or one whose IP header length is below 20, has no ports,
    sequence numbers or flags and its payload is all it carries after the IP header, in
    read_pcap and in the trial analysis's scan alike."""
    from analysis.scan import scan

    seg = tcp_segment(5001, 40000, 7_000_000, 9, 0x18, b"0123456789abcdef")
    packet = ipv4("198.18.0.1", "198.18.0.2", 6, seg, ip_id=3)
    frames = [_fragment(packet, 0x2000), _fragment(packet, 0x2000 | 185), _fragment(packet, 0x1000)]
    frames.append(b"\x44" + packet[1:])  # an IP header length of 16: no TCP fields either
    path = write_pcap(tmp_path / "frag.pcap", [(T0 + i, ethernet(f)) for i, f in enumerate(frames)])
    df = read_pcap(path)
    assert df[["sport", "dport", "seq", "ack", "tcp_flags"]].values.tolist() == [
        [5001, 40000, 7_000_000, 9, 0x18],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
    ]
    assert df["payload_len"].tolist() == [16, 36, 36, 40]  # all after the IP header
    assert df["payload_head"].tolist()[0] == int.from_bytes(b"01234567", "big")
    cap = scan(path)
    assert cap.seq.tolist() == [7_000_000, 0, 0, 0] and cap.ack.tolist() == [9, 0, 0, 0]
    assert cap.tcp_flags.tolist() == [0x18, 0, 0, 0]
    assert cap.payload_len.tolist() == [16, 36, 36, 40]
    assert cap.directions["sport"][cap.direction].tolist() == [5001, 0, 0, 0]


@needs_tcpdump
def test_linux_cooked(tmp_path: Path) -> None:
    recs = [(ts, sll(frame[14:])) for ts, frame in random_capture(seed=5, vlan_share=0)]
    assert_matches_tcpdump(write_pcap(tmp_path / "sll.pcap", recs, linktype=113), nano=False)


@needs_tcpdump
@pytest.mark.parametrize("jumps", [0.02, 0.5], ids=["few-jumps", "many-jumps"])
def test_fake_headers_in_payload_and_small_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jumps: float
) -> None:
    """Payloads that look like record headers, >18 h time jumps (each forces a new candidate
    scan; many force the record-by-record walk), timestamps going back and records larger
    than the read block must not confuse the record chain."""
    rng = random.Random(9)
    recs = []
    ts = T0
    for i in range(400):
        ts += 10**9 * 3600 * 20 if rng.random() < jumps else rng.choice([1000, 1000, -5000])
        sec, usec = divmod(ts // 1000, 10**6)
        fake = struct.pack("<IIII", sec, usec, rng.randrange(20, 90), 1500) + rng.randbytes(40)
        payload = fake * rng.randrange(1, 40)
        l4 = udp_datagram(45000, 40000 + i, payload)
        recs.append((ts, ethernet(ipv4("198.18.1.1", "198.18.2.2", 17, l4, ip_id=i))))
    path = write_pcap(tmp_path / "fake.pcap", recs)
    expected = assert_matches_tcpdump(path, nano=False)
    assert expected["ip_id"].tolist() == list(range(400))
    monkeypatch.setattr(blocks, "BLOCK", 1000)  # records span several blocks
    pd.testing.assert_frame_equal(read_pcap(path), expected)


def test_caplen_above_header_snaplen(tmp_path: Path) -> None:
    recs = random_capture(seed=3)
    path = write_pcap(tmp_path / "lie.pcap", recs, snaplen=200, header_snaplen=64)
    ref = read_pcap(write_pcap(tmp_path / "ok.pcap", recs, snaplen=200))
    pd.testing.assert_frame_equal(read_pcap(path), ref)


def test_empty_capture(tmp_path: Path) -> None:
    df = read_pcap(write_pcap(tmp_path / "e.pcap", []))
    assert df.empty and dict(df.dtypes.astype(str)) == COLUMNS
    only_arp = read_pcap(write_pcap(tmp_path / "a.pcap", [(T0, arp_frame())] * 3))
    assert only_arp.empty and dict(only_arp.dtypes.astype(str)) == COLUMNS


def _valid_bytes(tmp_path: Path) -> bytes:
    return write_pcap(tmp_path / "v.pcap", random_capture(seed=1, n=20)).read_bytes()


def test_truncated_file_keeps_complete_records(tmp_path: Path) -> None:
    """A capture killed mid-write: every complete record is read, and a warning names the
    file and the offset where the incomplete record starts."""
    recs = random_capture(seed=1, n=20)
    data = _valid_bytes(tmp_path)
    whole = read_pcap(tmp_path / "v.pcap")
    last = len(data) - 16 - len(recs[-1][1][:65535])  # offset of the last record
    path = tmp_path / "cut.pcap"
    path.write_bytes(data[:-10])
    message = rf"cut\.pcap: truncated packet record at byte {last} "
    with pytest.warns(PcapTruncatedWarning, match=message):
        cut = read_pcap(path)
    head = read_pcap(write_pcap(tmp_path / "head.pcap", recs[:-1]))
    pd.testing.assert_frame_equal(cut, head)
    path.write_bytes(data + b"\1\2\3")
    with pytest.warns(
        PcapTruncatedWarning,
        match=rf"cut\.pcap: truncated record header at byte {len(data)} .*3 of 16 bytes",
    ):
        longer = read_pcap(path)
    pd.testing.assert_frame_equal(longer, whole)


def test_truncated_global_header(tmp_path: Path) -> None:
    path = tmp_path / "short.pcap"
    path.write_bytes(_valid_bytes(tmp_path)[:20])
    with pytest.raises(PcapError, match=r"short\.pcap: truncated global header"):
        read_pcap(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"hello, this is not a capture", r"not a capture file \(starts with 0x68656c6c"),
        (b"\x0a\x0d\x0d\x0a" + bytes(40), r"a pcapng file; convert it with `tcpdump -r in -w out`"),
        (b"", r"empty file \(0 bytes"),
        (b"\xd4\xc3", r"2-byte file \(0xd4c3\), too short"),
    ],
)
def test_not_a_pcap(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "junk.bin"
    path.write_bytes(content)
    with pytest.raises(PcapError, match=rf"junk\.bin: .*{message}"):
        read_pcap(path)


def test_corrupt_record_header(tmp_path: Path) -> None:
    data = bytearray(_valid_bytes(tmp_path))
    data[24 + 8 : 24 + 12] = struct.pack("<I", 10**9)  # first record's caplen
    path = tmp_path / "bad.pcap"
    path.write_bytes(bytes(data))
    with pytest.raises(PcapError, match=r"bad\.pcap: corrupt record header at byte 24"):
        read_pcap(path)


def test_unsupported_linktype(tmp_path: Path) -> None:
    path = write_pcap(tmp_path / "wifi.pcap", [], linktype=105)
    with pytest.raises(PcapError, match="unsupported link type 105"):
        read_pcap(path)


def test_ip_helpers() -> None:
    assert ip_to_int("198.18.1.11") == (198 << 24) | (18 << 16) | (1 << 8) | 11
    assert int_to_ip(ip_to_int("198.18.0.255")) == "198.18.0.255"
    assert int_to_ip(np.uint32(0xC612010B)) == "198.18.1.11"
