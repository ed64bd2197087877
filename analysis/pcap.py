"""Classic pcap files as tables: ``read_pcap`` gives one DataFrame row per IPv4 packet (its
columns: ``COLUMNS``), ``read_columns`` some of those columns as arrays, both read by the one
reader (analysis/scan.py, every packet detailed); and addresses between their integer and
dotted forms.
"""

from __future__ import annotations

import ipaddress
import os
from typing import TYPE_CHECKING

import numpy as np

from analysis.match import KEY_COLUMNS, key_hashes
from analysis.pcapfile import PcapError, PcapTruncatedWarning
from analysis.scan import ALL, scan

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
KEY_HASH = "key_hash"  # not a read_pcap column: analysis.match.key_hash of the packet
_ENDS = ("src", "dst", "proto", "sport", "dport")  # a direction's: the scan's table holds them


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
    packet) as numpy arrays, without building a DataFrame."""
    unknown = set(columns) - set(COLUMNS) - {KEY_HASH}
    if unknown:
        raise ValueError(f"columns {sorted(unknown)}: not among {[*COLUMNS, KEY_HASH]}")
    cap = scan(path, detailed=ALL)
    packet = {c: getattr(cap, c) for c in ("ts_ns", "tos", "seq", "ack", "tcp_flags")}
    ends = {
        c: cap.directions[c][cap.direction] for c in _ENDS if c in columns or KEY_HASH in columns
    }
    out = {**packet, **cap.detailed, **ends}
    if KEY_HASH in columns:
        out[KEY_HASH] = key_hashes(*(out[c] for c in KEY_COLUMNS))
    return {c: out[c] for c in columns}
