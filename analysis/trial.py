"""One trial's captures -> per-generator metrics (dispatched on the generator's type) and the
queue of every bottleneck; written as parquet and summary.json beside the captures.

Everything here is computed from packets, never from a tool's own report (iperf3's JSON only
says which connections carry data). It reads trial.json and the captures; it does not import
the runner.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.captures import Captures, bottleneck_hop
from analysis.families import FAMILIES
from analysis.match import match_packets
from analysis.metrics import queue_full_events
from analysis.pcap import ip_to_int
from analysis.traffic import ANALYSES
from analysis.traffic.cbr_udp import max_transit_ns
from core.units import parse_duration_ns

QUEUE_WINDOW_NS = 60 * 10**9  # queue-full events are counted over 60 s mid-trial


def tc_drops(tc_text: str, iface: str) -> int:
    """The drop-tail leaf's drop counter on `iface` from a `tc -s qdisc show` snapshot."""
    block = tc_text.split(f"## {iface}\n", 1)[-1].split("## ", 1)[0]
    match = re.search(r"qdisc [bp]fifo .*?\n Sent \d+ bytes \d+ pkt \(dropped (\d+)", block)
    return int(match[1]) if match else 0


def bottleneck_queue(
    trial_dir: Path, record: dict[str, Any], link: str, caps: Captures
) -> dict[str, Any] | None:
    """Drops and queue-full events at a bottleneck: every packet of the generators whose
    path crosses it, seen before it and (forwarded) after it, in the captures nearest to
    either side (one clock)."""
    before, after, pairs, bottleneck, transit = set(), set(), set(), None, 0
    for gen in record["traffic"].values():
        b = gen["path"].get("bottleneck")
        if not b or b["link"] != link:
            continue
        hops, hop = gen["path"]["hops"], bottleneck_hop(gen)
        first, second = caps.before(hops, hop), caps.after(hops, hop)
        if not (first and second) or caps.clock(first) != caps.clock(second):
            return None
        before.add(first)
        after.add(second)
        pairs.add((ip_to_int(gen["src"]), ip_to_int(gen["dst"])))
        bottleneck, transit = b, max(transit, max_transit_ns(gen))
    if bottleneck is None:
        return None

    def crossing(names: set[str]) -> pd.DataFrame:
        frame = pd.concat([caps.packets(n) for n in sorted(names)], ignore_index=True)
        keys = pd.MultiIndex.from_arrays([frame.src, frame.dst])
        return frame[keys.isin(list(pairs))]

    matched = match_packets(crossing(before), crossing(after), max_delay_ns=transit)
    t0 = record["times"]["t0_ns"]
    duration = parse_duration_ns(record["parameters"]["duration"])
    mid = t0 + duration // 2
    window = (max(t0, mid - QUEUE_WINDOW_NS // 2), min(t0 + duration, mid + QUEUE_WINDOW_NS // 2))
    queue = queue_full_events(matched, start_ns=window[0], end_ns=window[1])
    host_dir = trial_dir / bottleneck["host"]
    drops_tc = None
    if (host_dir / "tc_after.txt").exists() and (host_dir / "tc_before.txt").exists():
        iface = bottleneck["iface"]
        drops_tc = tc_drops((host_dir / "tc_after.txt").read_text(), iface) - tc_drops(
            (host_dir / "tc_before.txt").read_text(), iface
        )
    return {
        "link": link,
        "at": f"{bottleneck['host']}:{bottleneck['iface']}",
        "captures_before": sorted(before),
        "captures_after": sorted(after),
        "queue_drops_capture": int((~matched.forwarded).sum()),
        "queue_drops_tc": drops_tc,
        "queue_full_events": queue["events"],
        "queue_full_events_per_min": queue["events_per_minute"],
        "queue_window_s": (window[1] - window[0]) / 1e9,
    }


def analyse_trial(trial_dir: Path) -> dict[str, Any]:
    record = json.loads((trial_dir / "trial.json").read_text())
    caps = Captures(trial_dir, record)
    out_dir = trial_dir / "analysis"
    out_dir.mkdir(exist_ok=True)
    generators: dict[str, Any] = {}
    frames: dict[str, list[pd.DataFrame]] = {}
    queues: dict[str, Any] = {}
    for name, gen in record["traffic"].items():
        summary, tables = ANALYSES[gen["type"]](trial_dir, record, name, gen, caps)
        generators[name] = summary
        for kind, frame in tables.items():
            frames.setdefault(kind, []).append(frame)
    links = {(g["path"].get("bottleneck") or {}).get("link") for g in record["traffic"].values()}
    for link in sorted(n for n in links if n):
        queue = bottleneck_queue(trial_dir, record, link, caps)
        if queue is not None:
            queues[link] = queue
    for kind, parts in frames.items():
        pd.concat(parts, ignore_index=True).to_parquet(out_dir / f"{kind}.parquet", index=False)
    summary = {
        "trial": record["trial"],
        "id": record.get("id"),
        "status": record["status"],
        "family": record.get("family"),
        "repetition": record.get("repetition"),
        **{f"factor:{k}": v for k, v in (record.get("overrides") or {}).items()},
        "generators": generators,
        "queues": queues,
        "capture_drops": {
            k: v.get("dropped_by_kernel", 0) for k, v in record.get("capture", {}).items()
        },
    }
    family = FAMILIES.get(record.get("family"))
    if family is not None:
        summary.update(family.trial_summary(record, summary))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    return summary
