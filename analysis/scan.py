"""The one reader of captures: ``scan`` reads a classic pcap file once, in blocks (never the
whole file in memory), and keeps per IPv4 packet only what the analysis reads, in narrow
columns, with each packet's direction found while reading (analysis/recordpass.py; two halves
at once where the file is large: analysis/halves.py). Everything that reads packets
(the trial analysis, read_pcap, the bench) reads them through it.

Memory: 21 bytes a packet (PACKET columns, 8-bit directions), 11 more for a matched packet
and 28 for a detailed one, in arrays of their own mappings (analysis/resources.py): only the
rows written are resident, and the pages past them are given back when the scan ends.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np
from numba import njit

from analysis.directions import keys_of, reverse_of
from analysis.halves import Columns, read_whole, split_point
from analysis.pcapfile import LINKTYPES, PcapError, read_global_header, truncated
from analysis.recordpass import DETAILED, MATCHED, PACKET
from analysis.records import GLOBAL_HDR, MAX_CAPLEN, REC_HDR
from analysis.resources import alloc, cpus, fit

__all__ = ["ALL", "Capture", "rows_of", "scan"]

ALL = "all"  # detailed=ALL: every packet's DETAILED columns (read_pcap)
_SPLIT_MIN = 32 << 20  # bytes from which a capture is read as two halves, each in a thread


@dataclass
class Capture:
    """One pass over a capture (:func:`scan`): per IPv4 packet, in file order, its row in
    ``directions`` (``direction``) and the other PACKET columns (read_pcap's names and
    values, but payload_len is 0 where read_pcap's is negative); ``matched`` and ``detailed``:
    the MATCHED and DETAILED columns of the packets of those directions, in file order (the
    rows: :func:`rows_of`), or None when the scan kept none.

    ``directions``: src, dst, sport, dport, proto, ``first`` (its first packet's row),
    ``first_data`` (its first TCP packet with payload, -1 if none), ``last_ns`` (its latest
    time), ``reverse`` (the opposite direction's row, -1 if none), ``matched`` and
    ``detailed`` (whether its packets are), in order of appearance. ``in_order``: timestamps
    never go back."""

    path: str
    direction: np.ndarray
    ts_ns: np.ndarray
    payload_len: np.ndarray
    tcp_flags: np.ndarray
    tos: np.ndarray
    seq: np.ndarray
    ack: np.ndarray
    directions: dict[str, np.ndarray]
    in_order: bool
    matched: dict[str, np.ndarray] | None = None
    detailed: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.ts_ns)

    @property
    def end_ns(self) -> int:
        """The latest time of any packet (0 without packets)."""
        last = self.directions["last_ns"]
        return int(last.max()) if len(last) else 0

    def release(self) -> None:
        """Let the PACKET columns go (the matched and detailed ones stay)."""
        for name in PACKET:
            setattr(self, name, getattr(self, name)[:0])


def rows_of(cap: Capture, directions: np.ndarray) -> np.ndarray:
    """The rows (file order) of the packets of the directions marked True in ``directions``
    (a bool per direction): e.g. directions["matched"] gives the rows of ``cap.matched``."""
    out = alloc(len(cap.direction), np.int32 if len(cap.direction) < 2**31 else np.int64)
    return fit(out, _marked_rows(cap.direction, np.asarray(directions, np.bool_), out))


@njit(cache=True, nogil=True)
def _marked_rows(direction, marked, out):
    """The rows whose direction is marked, written to the front of ``out``; their count. Every
    row is written where the next kept one goes, and the count advances for the kept ones: a
    branch per row was three times slower (mispredicted: data packets and ACKs alternate)."""
    kept = 0
    for i in range(len(direction)):
        out[kept] = i
        kept += marked[direction[i]]
    return kept


def _pairs(pairs) -> np.ndarray:
    return np.unique(np.asarray([] if pairs is None else list(pairs), np.uint64))


def scan(
    path: str | os.PathLike[str],
    *,
    matched=None,
    detailed=None,
    threads: int | None = None,
) -> Capture:
    """One compiled pass over the classic pcap file ``path`` (its size when reading began): see
    :class:`Capture`. ``matched``, ``detailed``: (src, dst) pairs as src << 32 | dst whose
    packets get the MATCHED and DETAILED columns (``detailed=ALL``: every packet).
    ``threads``: 2 (the default where the process may run on two CPUs) reads a capture of
    _SPLIT_MIN bytes or more as two halves at once.

    A file that ends inside a record (a capture killed mid-write) gives its complete records
    and a PcapTruncatedWarning naming the file and the offset. Raises PcapError for empty,
    pcapng or other non-pcap files, unsupported link types and corrupt record headers."""
    name = os.fspath(path)
    with open(name, "rb") as f:
        fmt = read_global_header(f, name)
    ip_offset, et_offset = LINKTYPES[fmt.linktype]
    size = os.path.getsize(name)
    cap = max((size - GLOBAL_HDR) // REC_HDR, 0) + 2  # a packet per 16 B at most; +1: halves
    packet = [alloc(cap, t) for t in PACKET.values()]
    every = isinstance(detailed, str) and detailed == ALL
    kinds = {**MATCHED, "direction": packet[0].dtype}  # the direction column's type
    cols = Columns(
        packet,
        [alloc(cap if matched is not None else 0, t) for t in kinds.values()],
        [alloc(cap if detailed is not None else 0, t) for t in DETAILED.values()],
    )
    args = (fmt.endian == "<", fmt.frac_ns, ip_offset, -1 if et_offset is None else et_offset)
    args = (*args, fmt.linktype == 1, every, _pairs(matched), _pairs(None if every else detailed))
    threads = cpus() if threads is None else threads
    split, expected = (
        split_point(name, fmt, size) if threads > 1 and size >= _SPLIT_MIN else (-1, 0)
    )
    whole = read_whole(name, args, cols, size, cap, split, expected)
    if whole.code in (1, 2):  # whole.tail: the record the reading stopped at, at byte base
        caplen = int.from_bytes(whole.tail[8:12].tobytes(), "little" if args[0] else "big")
        if whole.code == 2:
            raise PcapError(
                f"{name}: corrupt record header at byte {whole.base} "
                f"(caplen {caplen} > {MAX_CAPLEN}; file damaged or not written sequentially)"
            )
        warnings.warn(truncated(name, whole.base, size - whole.base, caplen), stacklevel=2)
    m = whole.m
    directions = {
        **keys_of(whole.keys1[:m], whole.keys2[:m]),
        "first": whole.first[:m].copy(),
        "first_data": whole.first_data[:m].copy(),
        "last_ns": whole.last_ns[:m].copy(),
        "reverse": reverse_of(whole.table, whole.keys1, whole.keys2, m),
        "matched": whole.matched[:m].copy(),
        "detailed": whole.detailed[:m].copy(),
    }
    kept = [fit(c, whole.n) for c in cols.packet]
    groups = {}
    for key, group, names, rows in (
        ("matched", cols.matched, MATCHED, whole.k),
        ("detailed", cols.detailed, DETAILED, whole.j),
    ):
        keep = matched if key == "matched" else detailed
        groups[key] = (
            None if keep is None else {c: fit(a, rows) for c, a in zip(names, group, strict=True)}
        )
    return Capture(
        name, *kept, directions, bool(whole.in_order), groups["matched"], groups["detailed"]
    )
