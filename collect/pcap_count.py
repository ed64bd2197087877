"""How many whole packets a capture file holds, from its record headers alone: tcpdump reports
how many it captured, and with a full disk it goes on counting what it can no longer write
(measured: "3000 packets captured" into a 64 KB file), so the two are compared after every
trial."""

from __future__ import annotations

import struct
from pathlib import Path

# pcap magic numbers (microsecond and nanosecond timestamps), in the file's byte order.
_MAGIC = {0xA1B2C3D4, 0xA1B23C4D}
GLOBAL_HEADER = 24
RECORD_HEADER = 16


def pcap_packets(path: Path) -> int:
    """Whole records in a pcap file (a record cut short at the end is not counted)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(GLOBAL_HEADER)
        if len(head) < GLOBAL_HEADER:
            return 0
        if struct.unpack("<I", head[:4])[0] in _MAGIC:
            order = "<"
        elif struct.unpack(">I", head[:4])[0] in _MAGIC:
            order = ">"
        else:
            raise ValueError(f"{path}: not a pcap file (magic {head[:4].hex()})")
        count, offset = 0, GLOBAL_HEADER
        while offset + RECORD_HEADER <= size:
            f.seek(offset + 8)
            (caplen,) = struct.unpack(order + "I", f.read(4))
            offset += RECORD_HEADER + caplen
            if offset > size:
                break
            count += 1
    return count
