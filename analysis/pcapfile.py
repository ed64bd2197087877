"""The classic pcap file format: its global header (byte order, timestamp resolution, snap
length, link type and where IPv4 starts in a frame of that type), and the errors and warnings
a damaged or foreign file gives, each naming the file, the offset and what is allowed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from analysis.records import GLOBAL_HDR, MAX_CAPLEN, REC_HDR

__all__ = [
    "LINKTYPES",
    "Format",
    "PcapError",
    "PcapTruncatedWarning",
    "read_global_header",
    "truncated",
]

_MAGICS = {  # first four bytes -> (byte order, ns per fractional unit)
    b"\xd4\xc3\xb2\xa1": ("<", 1000),
    b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"

# link type -> (IP offset, offset of a 16-bit ethertype or None for raw IP)
LINKTYPES: dict[int, tuple[int, int | None]] = {
    1: (14, 12),  # Ethernet (VLAN tags handled separately)
    113: (16, 14),  # Linux cooked (SLL)
    276: (20, 0),  # Linux cooked v2 (SLL2)
    101: (0, None),  # raw IP
    228: (0, None),  # raw IPv4
}


class PcapError(ValueError):
    """A file that is not a readable classic pcap; the message names the file and the problem."""


class PcapTruncatedWarning(UserWarning):
    """The file ends inside a record (tcpdump killed mid-write): the complete records before
    it were read; the message names the file and the offset of the incomplete record."""


@dataclass
class Format:
    path: str
    endian: str
    frac_ns: int
    snaplen: int
    linktype: int


def truncated(name: str, offset: int, left: int, caplen: int) -> PcapTruncatedWarning:
    kept = "; the complete records before it were read"
    if left < REC_HDR:
        return PcapTruncatedWarning(
            f"{name}: truncated record header at byte {offset} "
            f"({left} of {REC_HDR} bytes present){kept}"
        )
    return PcapTruncatedWarning(
        f"{name}: truncated packet record at byte {offset} "
        f"(record header says {caplen} bytes, {left - REC_HDR} remain){kept}"
    )


_ALLOWED = (
    "expected a classic pcap file (magic a1b2c3d4 or a1b23c4d, either byte order), "
    "as tcpdump -w writes"
)


def _what_it_is(head: bytes) -> str:
    """What the first bytes say the file is, for a message."""
    if not head:
        return "empty file (0 bytes; the capture wrote nothing, not even the pcap header)"
    if head[:4] == _PCAPNG_MAGIC:
        return "a pcapng file; convert it with `tcpdump -r in -w out`"
    shown = head[:8]
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in shown)
    if len(head) < 4:
        return f"{len(head)}-byte file (0x{shown.hex()}), too short for a pcap header"
    return f"not a capture file (starts with 0x{shown.hex()}, {text!r})"


def read_global_header(f: BinaryIO, name: str) -> Format:
    head = f.read(GLOBAL_HDR)
    if len(head) < 4 or head[:4] not in _MAGICS:
        raise PcapError(f"{name}: {_what_it_is(head)}; {_ALLOWED}")
    if len(head) < GLOBAL_HDR:
        raise PcapError(f"{name}: truncated global header ({len(head)} of {GLOBAL_HDR} bytes)")
    endian, frac_ns = _MAGICS[head[:4]]
    snaplen, network = np.frombuffer(head, dtype=f"{endian}u4", count=2, offset=16)
    linktype = int(network) & 0x03FFFFFF  # upper bits carry FCS info
    if linktype not in LINKTYPES:
        raise PcapError(
            f"{name}: unsupported link type {linktype} "
            f"(supported: {', '.join(map(str, sorted(LINKTYPES)))})"
        )
    snap = int(snaplen) if 0 < snaplen <= MAX_CAPLEN else MAX_CAPLEN
    return Format(name, endian, frac_ns, snap, linktype)
