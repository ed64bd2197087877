"""Helpers of the reader's tests: what two scans must share, record offsets, resident pages,
and small captures of many flows, of request-response connections, with records moved."""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np

from analysis.scan import Capture

from .pcapgen import ethernet, ipv4, tcp_segment, write_pcap

T0 = 1_763_700_000_000_000_000
PACKET_COLUMNS = ("direction", "ts_ns", "payload_len", "tcp_flags", "tos", "seq", "ack")


def assert_same_scan(got: Capture, ref: Capture) -> None:
    """Every column, direction and group of two scans equal."""
    for c in PACKET_COLUMNS:
        assert np.array_equal(getattr(got, c), getattr(ref, c)), c
        assert getattr(got, c).dtype == getattr(ref, c).dtype, c
    assert list(got.directions) == list(ref.directions)
    for c in ref.directions:
        assert np.array_equal(got.directions[c], ref.directions[c]), c
    assert got.in_order == ref.in_order
    for group in ("matched", "detailed"):
        mine, theirs = getattr(got, group), getattr(ref, group)
        assert (mine is None) == (theirs is None), group
        for c in theirs or {}:
            assert np.array_equal(mine[c], theirs[c]), (group, c)


def record_offsets(data: bytes) -> list[int]:
    offsets, pos = [], 24
    while pos + 16 <= len(data):
        offsets.append(pos)
        pos += 16 + int.from_bytes(data[pos + 8 : pos + 12], "little")
    return offsets


def resident_bytes(column: np.ndarray, length: int | None = None) -> int:
    """Resident bytes of the pages from ``column``'s first byte over ``length`` bytes (its
    own by default), by mincore(2)."""
    page = mmap.PAGESIZE
    at = column.__array_interface__["data"][0]
    start = at - at % page
    length = column.nbytes if length is None else length
    pages = -(-(at + length - start) // page)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) * page


def flows_capture(path: Path, flows) -> Path:
    """One TCP data packet per entry of ``flows`` (flow numbers), a microsecond apart; flow i
    is a direction of its own (its source address and port)."""
    records = [
        (
            T0 + j * 1000,
            ethernet(
                ipv4(
                    f"198.18.{i // 60_000}.1", "198.19.0.1", 6,
                    tcp_segment(1024 + i % 60_000, 5001, 7 * j, 0, 0x18, b"x" * 9),
                )
            ),
        )
        for j, i in enumerate(flows)
    ]  # fmt: skip
    return write_pcap(path, records)


def shuffled(path: Path, out: Path, seed: int) -> Path:
    """A copy of the capture with some records moved (timestamps out of file order)."""
    data = path.read_bytes()
    records, pos = [], 24
    while pos < len(data):
        caplen = int.from_bytes(data[pos + 8 : pos + 12], "little")
        records.append(data[pos : pos + 16 + caplen])
        pos += 16 + caplen
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(records) - 50, size=len(records) // 20, replace=False):
        j = i + int(rng.integers(1, 50))
        records[i], records[j] = records[j], records[i]
    out.write_bytes(data[:24] + b"".join(records))
    return out


def conversations(path: Path, seed: int, connections: int) -> Path:
    """Request-response TCP connections, interleaved: both ends send data, each data packet
    ACKing what its end has received (several in a row with one ack, or the ack moving on);
    pure ACKs, a few data packets without the ACK flag, sequence numbers that wrap, a FIN
    each way."""
    rng = np.random.default_rng(seed)
    records = []
    for c in range(connections):
        ends = (("198.18.0.1", 40_000 + c), ("198.19.0.1", 5001))
        nxt = [int(rng.integers(2**32 - 50_000, 2**32)), int(rng.integers(2**32))]
        sends = []  # (side, flags, payload bytes)
        for _ in range(int(rng.integers(20, 60))):
            side = int(rng.integers(2))
            for _ in range(int(rng.integers(1, 5))):
                flags = 0x08 if rng.random() < 0.05 else 0x18
                sends.append((side, flags, int(rng.choice([1, 100, 1448]))))
            if rng.random() < 0.5:
                sends.append((1 - side, 0x10, 0))
        sends += [(0, 0x11, 0), (1, 0x11, 0)]
        ts = T0 + c * 7_000
        for side, flags, size in sends:
            ts += int(rng.integers(1, 500)) * 1000
            (src, sport), (dst, dport) = ends[side], ends[1 - side]
            acked = nxt[1 - side] % 2**32  # everything the other end sent has arrived
            seg = tcp_segment(sport, dport, nxt[side] % 2**32, acked, flags, b"x" * size)
            records.append((ts, ethernet(ipv4(src, dst, 6, seg))))
            nxt[side] += size + (flags & 0x01)
    records.sort(key=lambda r: r[0])
    return write_pcap(path, records)
