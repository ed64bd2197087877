"""Reader for classic pcap files: one DataFrame row per IPv4 packet (``read_pcap``).

The records are walked in one compiled pass (analysis/pcapscan.py: numba, cached on disk)
over blocks of the file read into one reused buffer; only the requested columns are kept.
"""

from __future__ import annotations

import ipaddress
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from analysis import pcapscan

if TYPE_CHECKING:  # pandas is imported where a frame is made: read_columns does not need it
    import pandas as pd

__all__ = [
    "COLUMNS",
    "PcapError",
    "PcapTruncatedWarning",
    "addresses_as_strings",
    "int_to_ip",
    "ip_strings",
    "ip_to_int",
    "read_columns",
    "read_pcap",
]

COLUMNS: dict[str, str] = {
    "ts_ns": "int64",
    "caplen": "uint32",
    "wirelen": "uint32",
    "src": "uint32",
    "dst": "uint32",
    "proto": "uint8",
    "tos": "uint8",
    "ip_len": "uint16",
    "ip_id": "uint16",
    "ip_hl": "uint8",
    "sport": "uint16",
    "dport": "uint16",
    "seq": "uint32",
    "ack": "uint32",
    "tcp_flags": "uint8",
    "payload_len": "int32",
    "payload_head": "uint64",
}

# Not a read_pcap column: analysis.match.key_hash of the packet, computed while reading.
KEY_HASH = {"key_hash": "uint64"}
BLOCK_BYTES = pcapscan.BLOCK_BYTES
MAX_CAPLEN = 262144  # libpcap rejects records larger than this: a corrupt header, not a packet
_REC_HDR = 16
_GLOBAL_HDR = 24

_MAGICS = {  # first four bytes -> (byte order, ns per fractional unit)
    b"\xd4\xc3\xb2\xa1": ("<", 1000),
    b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"

# link type -> (IP offset, offset of a 16-bit ethertype or None for raw IP)
_LINKTYPES: dict[int, tuple[int, int | None]] = {
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


def ip_to_int(addr: str) -> int:
    """Dotted quad -> the integer stored in the ``src``/``dst`` columns."""
    return int(ipaddress.IPv4Address(addr))


def int_to_ip(value: int) -> str:
    """Inverse of :func:`ip_to_int`."""
    return str(ipaddress.IPv4Address(int(value)))


def ip_strings(values) -> pd.Categorical:
    """Addresses (integers as in the ``src``/``dst`` columns, or dotted quads) -> a
    categorical of dotted-quad strings: the form of addresses in every stored table (parquet
    stores it as dictionary-encoded strings; one conversion per distinct address)."""
    import pandas as pd

    values = np.asarray(values)
    codes, uniq = pd.factorize(values)
    names = [v if isinstance(v, str) else int_to_ip(v) for v in uniq]
    return pd.Categorical.from_codes(codes, categories=pd.Index(names, dtype="str"))


def addresses_as_strings(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its ``src``/``dst`` columns (if any) as :func:`ip_strings` makes them."""
    import pandas as pd

    cols = {
        c: ip_strings(frame[c].to_numpy())
        for c in ("src", "dst")
        if c in frame.columns and not isinstance(frame[c].dtype, pd.CategoricalDtype)
    }
    return frame.assign(**cols) if cols else frame


def empty_frame() -> pd.DataFrame:
    """A zero-row frame with the columns and dtypes of :func:`read_pcap`."""
    import pandas as pd

    return pd.DataFrame({k: np.empty(0, dtype=v) for k, v in COLUMNS.items()})


@dataclass
class _Format:
    path: str
    endian: str
    frac_ns: int
    snaplen: int
    linktype: int


def read_pcap(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a classic pcap file; one row per IPv4 packet in file order (see ``COLUMNS``).

    Non-IPv4 frames and frames too short to hold a 20-byte IPv4 header are skipped.
    A file that ends inside a record (a capture killed mid-write) gives its complete records
    and a PcapTruncatedWarning naming the file and the offset. Raises PcapError for empty,
    pcapng or other non-pcap files, unsupported link types and corrupt record headers.
    """
    import pandas as pd

    return pd.DataFrame(read_columns(path, COLUMNS), copy=False)


def read_columns(
    path: str | os.PathLike[str], columns: list[str] | tuple[str, ...] | dict[str, str]
) -> dict[str, np.ndarray]:
    """Some columns of :func:`read_pcap` (and ``key_hash``, analysis.match.key_hash of each
    packet) as numpy arrays, without building a DataFrame: what a whole-trial analysis
    needs of a capture of millions of packets, at a fraction of the memory."""
    name = os.fspath(path)
    with open(name, "rb") as f:
        fmt = _read_global_header(f, name)
    ip_offset, ethertype_offset = _LINKTYPES[fmt.linktype]
    cols, stop, code, caplen, size = pcapscan.scan(
        name,
        list(columns),
        {**COLUMNS, **KEY_HASH},
        little=fmt.endian == "<",
        frac_ns=fmt.frac_ns,
        ip_offset=ip_offset,
        ethertype_offset=ethertype_offset,
        vlan=fmt.linktype == 1,
        block_bytes=BLOCK_BYTES,
    )
    if code == 2:
        raise PcapError(
            f"{name}: corrupt record header at byte {stop} "
            f"(caplen {caplen} > {MAX_CAPLEN}; file damaged or not written sequentially)"
        )
    if code == 1:
        warnings.warn(_truncated(name, stop, size - stop, caplen), stacklevel=3)
    return cols


def _truncated(name: str, offset: int, left: int, caplen: int) -> PcapTruncatedWarning:
    kept = "; the complete records before it were read"
    if left < _REC_HDR:
        return PcapTruncatedWarning(
            f"{name}: truncated record header at byte {offset} "
            f"({left} of {_REC_HDR} bytes present){kept}"
        )
    return PcapTruncatedWarning(
        f"{name}: truncated packet record at byte {offset} "
        f"(record header says {caplen} bytes, {left - _REC_HDR} remain){kept}"
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


def _read_global_header(f: BinaryIO, name: str) -> _Format:
    head = f.read(_GLOBAL_HDR)
    if len(head) < 4 or head[:4] not in _MAGICS:
        raise PcapError(f"{name}: {_what_it_is(head)}; {_ALLOWED}")
    if len(head) < _GLOBAL_HDR:
        raise PcapError(f"{name}: truncated global header ({len(head)} of {_GLOBAL_HDR} bytes)")
    endian, frac_ns = _MAGICS[head[:4]]
    snaplen, network = np.frombuffer(head, dtype=f"{endian}u4", count=2, offset=16)
    linktype = int(network) & 0x03FFFFFF  # upper bits carry FCS info
    if linktype not in _LINKTYPES:
        raise PcapError(
            f"{name}: unsupported link type {linktype} "
            f"(supported: {', '.join(map(str, sorted(_LINKTYPES)))})"
        )
    snap = int(snaplen) if 0 < snaplen <= MAX_CAPLEN else MAX_CAPLEN
    return _Format(name, endian, frac_ns, snap, linktype)
