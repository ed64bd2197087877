"""DSCP per flow, from the captures: the IP TOS byte of every packet a generator sends (sender
to receiver), at each capture point on its path, so that a DSCP set at the source (cbr_udp's
pcap) and one rewritten on the way (role dscp_marker's nftables rules) both show, each where
it holds. Also what each marking rule counted (its nft counter, before and after the trial)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis.captures import Captures
from analysis.pcap import ip_to_int
from core.dscp import dscp_name

KEY = ["src", "dst", "sport", "dport"]


def own_forward_packets(frame: pd.DataFrame, gen: dict[str, Any]) -> pd.DataFrame:
    """The generator's packets from sender to receiver: its protocol, addresses and port."""
    return frame[
        (frame.proto == gen["proto"])
        & (frame.src == ip_to_int(gen["src"]))
        & (frame.dst == ip_to_int(gen["dst"]))
        & (frame.dport == gen["port"])
    ]


def dscp_per_flow(
    caps: Captures, name: str, gen: dict[str, Any]
) -> tuple[dict[str, dict[str, int]], pd.DataFrame]:
    """{capture point: {DSCP name: packets}} in path order, and one row per capture point,
    flow (5-tuple) and DSCP with its packet count."""
    if "proto" not in gen or "port" not in gen:
        return {}, pd.DataFrame()
    positions = caps.positions(gen["path"]["hops"])
    seen: dict[str, dict[str, int]] = {}
    rows = []
    for point in sorted(positions, key=positions.get):  # type: ignore[arg-type]
        own = own_forward_packets(caps.packets(point), gen)
        counts = (
            own.assign(dscp=own.tos.to_numpy() >> 2)
            .groupby([*KEY, "dscp"], observed=True)
            .size()
            .rename("packets")
            .reset_index()
        )
        counts.insert(0, "capture", point)
        rows.append(counts)
        per_code = counts.groupby("dscp").packets.sum()
        seen[point] = {dscp_name(int(c)): int(n) for c, n in per_code.items()}
    if not rows:
        return seen, pd.DataFrame()
    table = pd.concat(rows, ignore_index=True)
    table["dscp_name"] = [dscp_name(int(c)) for c in table.dscp]
    table.insert(0, "generator", name)
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
