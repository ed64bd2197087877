"""A trial's capture points placed on each generator's path, read lazily.

A path is the list of (host, egress interface) hops from trial.json. A capture on a hop's
egress interface sees packets after that hop's queue; a capture on the interface where a
host receives them sees packets before its queue. `before(b)` / `after(b)` find the capture
points nearest to either side of hop b's queue (the bottleneck's).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.pcap import read_pcap


class Captures:
    def __init__(self, trial_dir: Path, record: dict[str, Any]):
        self.dir = trial_dir
        self.sites: dict[str, dict[str, Any]] = record["network"]["captures"]
        self.interfaces: dict[str, dict[str, str]] = record["network"]["interfaces"]
        # Read once each. A plain dict, not functools.cache on a bound method: that is a
        # reference cycle, which kept every frame until the cyclic collector ran (a process
        # analysing trials one after another grew by hundreds of MB per trial).
        self._frames: dict[str, pd.DataFrame] = {}

    def packets(self, name: str) -> pd.DataFrame:
        if name not in self._frames:
            site = self.sites[name]
            self._frames[name] = read_pcap(self.dir / site["host"] / f"{name}.pcap")
        return self._frames[name]

    def clock(self, name: str) -> str:
        return self.sites[name]["clock"]

    def _ingress(self, prev: tuple[str, str], host: str) -> str | None:
        """The interface of `host` on the subnet that hop `prev` sends into."""
        net = ipaddress.IPv4Interface(self.interfaces[prev[0]][prev[1]]).network
        for iface, cidr in self.interfaces[host].items():
            if ipaddress.IPv4Interface(cidr).network == net:
                return iface
        return None

    def positions(self, hops: list[str]) -> dict[str, int]:
        """Capture point -> position on the path: 2k+1 after hop k's queue, 2k before it."""
        path = [tuple(h.split(":", 1)) for h in hops]
        where: dict[tuple[str, str], int] = {}
        for k, (host, iface) in enumerate(path):
            where[(host, iface)] = 2 * k + 1
            if k:
                ingress = self._ingress(path[k - 1], host)
                if ingress:
                    where[(host, ingress)] = 2 * k
        return {
            name: where[(s["host"], s["iface"])]
            for name, s in self.sites.items()
            if (s["host"], s["iface"]) in where
        }

    def before(self, hops: list[str], hop: int) -> str | None:
        """The capture point nearest before hop `hop`'s queue (None if there is none)."""
        pos = {n: p for n, p in self.positions(hops).items() if p <= 2 * hop}
        return max(pos, key=pos.get) if pos else None  # type: ignore[arg-type]

    def after(self, hops: list[str], hop: int) -> str | None:
        pos = {n: p for n, p in self.positions(hops).items() if p >= 2 * hop + 1}
        return min(pos, key=pos.get) if pos else None  # type: ignore[arg-type]


def bottleneck_hop(gen: dict[str, Any]) -> int:
    """Index of the path's bottleneck hop (the slowest shaped one), or the last hop."""
    path = gen["path"]
    b = path.get("bottleneck")
    if b:
        return path["hops"].index(f"{b['host']}:{b['iface']}")
    return len(path["hops"]) - 1
