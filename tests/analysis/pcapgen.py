"""A tiny classic-pcap writer for tests: Ethernet/IPv4/TCP/UDP frames with chosen fields."""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ETH_IPV4 = 0x0800
ETH_ARP = 0x0806
ETH_IPV6 = 0x86DD
MAGIC_MICRO = 0xA1B2C3D4
MAGIC_NANO = 0xA1B23C4D

SRC_MAC = bytes.fromhex("020000000001")
DST_MAC = bytes.fromhex("020000000002")


def _addr(a: str | int) -> bytes:
    return ipaddress.IPv4Address(a).packed


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def tcp_segment(
    sport: int,
    dport: int,
    seq: int,
    ack: int = 0,
    flags: int = 0x10,
    payload: bytes = b"",
    options: bytes = b"",
    window: int = 65535,
) -> bytes:
    """A TCP header (checksum filled in by :func:`ipv4`) followed by the payload."""
    options += b"\x01" * (-len(options) % 4)  # NOP padding to a 32-bit boundary
    offset = (20 + len(options)) // 4
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, offset << 4, flags, window, 0, 0)
    return hdr + options + payload


def udp_datagram(sport: int, dport: int, payload: bytes = b"") -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def ipv4(
    src: str | int,
    dst: str | int,
    proto: int,
    l4: bytes,
    ip_id: int = 0,
    ttl: int = 64,
    options: bytes = b"",
    df: bool = True,
) -> bytes:
    """An IPv4 packet with correct header and TCP/UDP checksums."""
    s, d = _addr(src), _addr(dst)
    if proto in (6, 17):
        pseudo = s + d + struct.pack("!BBH", 0, proto, len(l4))
        pos = 16 if proto == 6 else 6
        csum = _checksum(pseudo + l4)
        if proto == 17 and csum == 0:
            csum = 0xFFFF
        l4 = l4[:pos] + struct.pack("!H", csum) + l4[pos + 2 :]
    options += b"\0" * (-len(options) % 4)
    hl = 20 + len(options)
    flags = 0x4000 if df else 0
    hdr = struct.pack(
        "!BBHHHBBH4s4s", 0x40 | hl // 4, 0, hl + len(l4), ip_id, flags, ttl, proto, 0, s, d
    )
    hdr = hdr[:10] + struct.pack("!H", _checksum(hdr + options)) + hdr[12:]
    return hdr + options + l4


def ethernet(
    payload: bytes, ethertype: int = ETH_IPV4, vlan: int | None = None, tpid: int = 0x8100
) -> bytes:
    """An Ethernet frame, padded to the 60-byte minimum, with an optional VLAN tag."""
    tag = struct.pack("!HH", tpid, vlan) if vlan is not None else b""
    frame = DST_MAC + SRC_MAC + tag + struct.pack("!H", ethertype) + payload
    return frame + b"\0" * max(0, 60 - len(frame))


def sll(payload: bytes, protocol: int = ETH_IPV4) -> bytes:
    """A Linux cooked (SLL, link type 113) header followed by the payload."""
    return struct.pack("!HHH8sH", 0, 1, 6, SRC_MAC + b"\0\0", protocol) + payload


def arp_frame() -> bytes:
    body = struct.pack(
        "!HHBBH6s4s6s4s",
        1,
        ETH_IPV4,
        6,
        4,
        1,
        SRC_MAC,
        _addr("198.18.0.1"),
        b"\0" * 6,
        _addr("198.18.0.2"),
    )
    return ethernet(body, ETH_ARP)


def ipv6_frame() -> bytes:
    body = struct.pack("!IHBB16s16s", 6 << 28, 8, 17, 64, b"\0" * 15 + b"\1", b"\0" * 15 + b"\2")
    return ethernet(body + udp_datagram(1, 2), ETH_IPV6)


@dataclass
class Record:
    ts_ns: int
    frame: bytes


def write_pcap(
    path: str | Path,
    records: Iterable[Record | tuple[int, bytes]],
    *,
    nano: bool = False,
    big_endian: bool = False,
    snaplen: int = 65535,
    linktype: int = 1,
    header_snaplen: int | None = None,
) -> Path:
    """Write a classic pcap; frames longer than ``snaplen`` are truncated (caplen < wirelen).

    ``header_snaplen`` puts a different snaplen in the global header (files that break it).
    """
    end = ">" if big_endian else "<"
    unit = 1 if nano else 1000
    magic = MAGIC_NANO if nano else MAGIC_MICRO
    hdr_snap = snaplen if header_snaplen is None else header_snaplen
    out = [struct.pack(f"{end}IHHiIII", magic, 2, 4, 0, 0, hdr_snap, linktype)]
    for rec in records:
        ts_ns, frame = (rec.ts_ns, rec.frame) if isinstance(rec, Record) else rec
        sec, frac = divmod(ts_ns, 1_000_000_000)
        cap = frame[:snaplen]
        out.append(struct.pack(f"{end}IIII", sec, frac // unit, len(cap), len(frame)) + cap)
    path = Path(path)
    path.write_bytes(b"".join(out))
    return path
