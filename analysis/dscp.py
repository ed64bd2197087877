"""DSCP per flow, from the captures: the IP TOS byte of every packet a generator sends (sender
to receiver), at each capture point on its path, so that a DSCP set at the source (cbr_udp's
pcap) and one rewritten on the way (role dscp_marker's nftables rules) both show, each where
it holds. Also what each marking rule counted (its nft counter, before and after the trial)."""

from __future__ import annotations

from typing import Any

import numpy as np

from analysis.captures import Captures, Seen, Want
from analysis.lazy import pd
from analysis.pcap import ip_to_int
from core.dscp import dscp_name

KEY = ["src", "dst", "sport", "dport"]


class Dscp:
    """One generator's DSCP per capture point on its path (see analysis/trial.py): per point
    and flow (5-tuple) of its packets from sender to receiver (its protocol, addresses and
    port), the packets of each DSCP."""

    def __init__(self, name: str, gen: dict[str, Any], caps: Captures) -> None:
        self.name, self.gen = name, gen
        self.positions = caps.positions(gen["path"]["hops"]) if "proto" in gen else {}
        self.counts: dict[str, dict[str, np.ndarray]] = {}

    def wants(self) -> dict[str, Want]:
        if "proto" not in self.gen or "port" not in self.gen:
            return {}
        return {point: Want() for point in self.positions}

    def ask(self, seen: Seen) -> None:
        pass

    def take(self, seen: Seen) -> None:
        gen = self.gen
        mine = seen.mask(
            proto=gen["proto"],
            src=ip_to_int(gen["src"]),
            dst=ip_to_int(gen["dst"]),
            dport=gen["port"],
        )
        d = seen.directions
        which = np.flatnonzero(mine)
        per_code = seen.dscp[which]
        flow, code = np.nonzero(per_code)
        self.counts[seen.point] = {
            **{k: d[k][which][flow] for k in KEY},
            "dscp": code.astype(np.uint8),
            "packets": per_code[flow, code].astype(np.int64),
        }

    def finish(self) -> tuple[dict[str, dict[str, int]], pd.DataFrame]:
        """{capture point: {DSCP name: packets}} in path order, and one row per capture
        point, flow (5-tuple) and DSCP with its packet count."""
        gen, seen, rows = self.gen, {}, []
        if "proto" not in gen or "port" not in gen:
            return {}, pd.DataFrame()
        for point in sorted(self.positions, key=self.positions.get):  # type: ignore[arg-type]
            counts = pd.DataFrame(self.counts[point])  # sorted as a groupby of its keys sorts
            counts = counts.sort_values([*KEY, "dscp"], kind="stable").reset_index(drop=True)
            counts.insert(0, "capture", point)
            rows.append(counts)
            per_code = counts.groupby("dscp").packets.sum()
            seen[point] = {dscp_name(int(c)): int(n) for c, n in per_code.items()}
        if not rows:
            return seen, pd.DataFrame()
        table = pd.concat(rows, ignore_index=True)
        table["dscp_name"] = [dscp_name(int(c)) for c in table.dscp]
        table.insert(0, "generator", self.name)
        table["proto"] = gen["proto"]
        return seen, table


def marking_counters(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per marking host and rule: packets and bytes counted during the trial, DSCP set."""
    out: dict[str, dict[str, Any]] = {}
    for host, rules in (record.get("marking") or {}).items():
        if "error" in rules:
            out[host] = {"error": rules["error"]}
            continue
        out[host] = {
            rule: {
                "packets": c.get("packets", 0),
                "bytes": c.get("bytes", 0),
                "dscp": dscp_name(c["dscp"]) if "dscp" in c else None,
            }
            for rule, c in rules.items()
        }
    return out
