"""Run `tcptrace -n -l` and read its per-connection, per-direction counters (a reference the
project's TCP metrics must agree with exactly)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd

_HOST = re.compile(r"^\s+host \w+:\s+([\d.]+):(\d+)$")
_STAT = re.compile(r"^\s+([a-zA-Z /0-9]+?):\s+(\d+)\s+.*?([a-zA-Z /0-9]+?):\s+(\d+)")
FIELDS = {
    "unique bytes sent": "bytes",
    "actual data pkts": "data_packets",
    "rexmt data pkts": "retransmitted_packets",
    "rexmt data bytes": "retransmitted_bytes",
}


def tcptrace(path: Path) -> pd.DataFrame:
    """One row per connection direction that sent data: src, dst (dotted quads), sport,
    dport and the FIELDS counters."""
    text = subprocess.run(
        ["tcptrace", "-n", "-l", str(path)], capture_output=True, text=True, check=True
    ).stdout
    rows: list[dict] = []
    ends: list[tuple[str, int]] = []
    stats: dict[str, tuple[int, int]] = {}

    def flush() -> None:
        if len(ends) == 2 and stats:
            for k, (a, b) in enumerate(((0, 1), (1, 0))):
                row = {"src": ends[a][0], "dst": ends[b][0], "sport": ends[a][1]}
                row["dport"] = ends[b][1]
                row |= {name: stats[key][k] for key, name in FIELDS.items()}
                if row["data_packets"]:
                    rows.append(row)

    for line in text.splitlines():
        if line.startswith("TCP connection ") and line.rstrip().endswith(":"):
            flush()
            ends, stats = [], {}
        elif m := _HOST.match(line):
            ends.append((m[1], int(m[2])))
        elif (m := _STAT.match(line)) and m[1].strip() in FIELDS:
            stats[m[1].strip()] = (int(m[2]), int(m[4]))
    flush()
    return pd.DataFrame(rows, columns=["src", "dst", "sport", "dport", *FIELDS.values()])
