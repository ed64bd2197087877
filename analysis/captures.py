"""A trial's capture points on each generator's path, and each capture as the analyses see it
while it is read.

A path is the list of (host, egress interface) hops from trial.json. A capture on a hop's
egress interface sees packets after that hop's queue; a capture on the interface where a
host receives them sees packets before its queue. `before(b)` / `after(b)` find the capture
points nearest to either side of hop b's queue (the bottleneck's).

A trial's analysis reads each capture once (analysis/scan.py) and holds one at a time: every
analysis says beforehand what it needs of which capture (``Want``), sees the capture while it
is held (``Seen``: its packets by direction, its TCP flows through the kernels, DSCP counts,
small frames of a few directions) and keeps only its own results.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from analysis.pcap import COLUMNS, ip_to_int
from analysis.scan import Capture, rows_of
from analysis.startup import Flows
from analysis.tcpflows import TcpPackets

__all__ = ["Captures", "Seen", "Want", "bottleneck_hop", "pair_key"]


def pair_key(src: str, dst: str) -> int:
    """A (src, dst) pair as the scan takes it: src << 32 | dst."""
    return ip_to_int(src) << 32 | ip_to_int(dst)


@dataclass
class Want:
    """What analyses need of one capture: the pairs whose packets are matched with another
    capture's (key hash, IP length) and those whose every read_pcap column is kept; times at
    which its TCP flows' state is taken (see analysis.tcpflows.data_pass)."""

    matched: set[int] = field(default_factory=set)
    detailed: set[int] = field(default_factory=set)
    times: set[int] = field(default_factory=set)

    def add(self, other: Want) -> None:
        self.matched |= other.matched
        self.detailed |= other.detailed
        self.times |= other.times


class Captures:
    def __init__(self, trial_dir: Path, record: dict[str, Any]):
        self.dir = trial_dir
        self.sites: dict[str, dict[str, Any]] = record["network"]["captures"]
        self.interfaces: dict[str, dict[str, str]] = record["network"]["interfaces"]

    def path(self, name: str) -> Path:
        return self.dir / self.sites[name]["host"] / f"{name}.pcap"

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


class Seen:
    """One capture while the analyses look at it (``point``: its name): its scan, and what
    several of them read, computed once: the packet rows of its matched directions, its TCP
    flows (the data pass, and the ACK pass over every analysis's queries), its packets per
    direction and DSCP."""

    def __init__(self, point: str, cap: Capture, times=()) -> None:
        self.point, self.cap = point, cap
        self.times = np.asarray(sorted(times), np.int64)
        self._flows: Flows | None = None
        self._matched_rows: np.ndarray | None = None
        self._dscp: np.ndarray | None = None
        self._largest: dict[str, np.ndarray] | None = None

    @property
    def directions(self) -> dict[str, np.ndarray]:
        return self.cap.directions

    def mask(self, *, proto=None, src=None, dst=None, sport=None, dport=None) -> np.ndarray:
        """A bool per direction: those whose fields are among the given values (a value or a
        collection of them; None: any)."""
        d = self.cap.directions
        keep = np.ones(len(d["src"]), bool)
        for name, want in (
            ("proto", proto), ("src", src), ("dst", dst), ("sport", sport), ("dport", dport)
        ):  # fmt: skip
            if want is not None:
                values = [want] if np.isscalar(want) else list(want)
                keep &= np.isin(d[name], np.asarray(values, np.int64))
        return keep

    def rows(self, directions: np.ndarray) -> np.ndarray:
        """The packet rows (file order) of the directions marked True."""
        return rows_of(self.cap, directions)

    @property
    def matched_rows(self) -> np.ndarray:
        """The packet row of each matched row."""
        if self._matched_rows is None:
            self._matched_rows = self.rows(self.cap.directions["matched"])
        return self._matched_rows

    def matched_of(self, directions: np.ndarray) -> np.ndarray:
        """The matched rows (indices into cap.matched) of the directions marked True."""
        return np.flatnonzero(directions[self.cap.matched["direction"]])

    @property
    def flows(self) -> Flows:
        """Every TCP flow of the capture through the kernels (the data pass on first use)."""
        if self._flows is None:
            self._flows = Flows.of(TcpPackets.of_capture(self.cap), self.end_ns, times=self.times)
        return self._flows

    def run_acks(self) -> None:
        """The ACK pass, once every analysis has added its queries."""
        if self._flows is not None and self._flows.queries.answers is None:
            self._flows.acks()

    @property
    def end_ns(self) -> int:
        """The capture's latest time, -1 without packets (read_pcap's max ts)."""
        return self.cap.end_ns if len(self.cap) else -1

    def last_ns(self, directions: np.ndarray) -> int | None:
        """The latest time of the packets of the directions marked True (None: none)."""
        last = self.cap.directions["last_ns"][directions]
        return int(last.max()) if len(last) else None

    @property
    def largest(self) -> dict[str, np.ndarray]:
        """Per matched direction: its largest payload ("payload_len", 0 without payload), and
        of its first packet carrying that much the row ("row") and IP length ("ip_len")."""
        if self._largest is None:
            m = len(self.cap.directions["src"])
            out = {"payload_len": np.zeros(m, np.int64), "row": np.full(m, -1, np.int64)}
            out["ip_len"] = np.zeros(m, np.int64)
            matched = self.cap.matched
            _largest(
                matched["direction"], self.matched_rows, self.cap.payload_len, matched["ip_len"],
                out["payload_len"], out["row"], out["ip_len"],
            )  # fmt: skip
            self._largest = out
        return self._largest

    @property
    def dscp(self) -> np.ndarray:
        """Packets per direction and DSCP (a row per direction, 64 columns)."""
        if self._dscp is None:
            self._dscp = np.zeros((len(self.cap.directions["src"]), 64), np.int64)
            _count_dscp(self.cap.direction, self.cap.tos, self._dscp)
        return self._dscp

    def packets(self, directions: np.ndarray) -> dict[str, np.ndarray]:
        """read_pcap's columns of the packets of the directions marked True (file order): those
        a scan keeps of every packet (caplen, wirelen, ip_len, ip_id, ip_hl and payload_head
        left out unless those directions are all detailed; payload_len 0 where read_pcap's
        is below 0)."""
        rows = self.rows(directions)
        detailed = self.cap.detailed is not None and self.directions["detailed"][directions].all()
        return self.columns(rows, detailed=bool(detailed))

    def columns(self, rows: np.ndarray, detailed: bool = False) -> dict[str, np.ndarray]:
        """read_pcap's columns of some packet rows, in its order (the DETAILED ones too, when
        every row is of a detailed direction)."""
        cap, d = self.cap, self.cap.directions
        ids = cap.direction[rows]
        out = {
            "ts_ns": cap.ts_ns[rows],
            "src": d["src"][ids],
            "dst": d["dst"][ids],
            "proto": d["proto"][ids],
            "tos": cap.tos[rows],
            "sport": d["sport"][ids],
            "dport": d["dport"][ids],
            "seq": cap.seq[rows],
            "ack": cap.ack[rows],
            "tcp_flags": cap.tcp_flags[rows],
            "payload_len": cap.payload_len[rows].astype(np.int32),
        }
        if detailed:
            which = np.searchsorted(self.rows(d["detailed"]), rows)
            out.update({k: v[which] for k, v in cap.detailed.items()})
        return {c: out[c] for c in COLUMNS if c in out}


@njit(cache=True, nogil=True)
def _largest(direction, rows, plen, ip_len, most, first, length):
    for k in range(len(direction)):
        d, p = direction[k], plen[rows[k]]
        if p > most[d]:
            most[d], first[d], length[d] = p, rows[k], ip_len[k]


@njit(cache=True, nogil=True)
def _count_dscp(direction, tos, counts):
    for i in range(len(direction)):
        counts[direction[i], tos[i] >> 2] += 1
