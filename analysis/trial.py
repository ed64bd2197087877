"""One trial's captures -> per-flow goodput, retransmissions, UDP one-way delay and loss,
queue drops and queue-full events; written as parquet beside the captures.

Everything here is computed from packets (the router's two capture points, one clock),
never from iperf3's own report: iperf3's JSON only says which connections carry data.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.match import match_packets
from analysis.metrics import (
    one_way_delay,
    queue_full_events,
    summarize_owd,
    tcp_goodput,
    tcp_retransmissions,
)
from analysis.pcap import int_to_ip, ip_to_int, read_pcap
from trials.units import parse_bytes, parse_duration_ns, parse_rate

QUEUE_WINDOW_NS = 60 * 10**9  # queue-full events are counted over 60 s mid-trial


def data_ports(client_json: Path) -> set[int]:
    """Local ports of iperf3's data connections (its control connection carries no bulk data)."""
    report = json.loads(client_json.read_text())
    return {c["local_port"] for c in report.get("start", {}).get("connected", [])}


def tc_drops(tc_text: str, iface: str) -> int:
    """The bfifo leaf's drop counter on `iface` from a `tc -s qdisc show` snapshot."""
    block = tc_text.split(f"## {iface}\n", 1)[-1].split("## ", 1)[0]
    match = re.search(r"qdisc bfifo .*?\n Sent \d+ bytes \d+ pkt \(dropped (\d+)", block)
    return int(match[1]) if match else 0


def stall_windows(delayline_stats: dict[str, Any]) -> np.ndarray:
    """Disjoint, sorted [start_ns, end_ns] intervals in which the router's delay line was not
    run (it wakes every millisecond and records every wake-up later than its threshold)."""
    events = delayline_stats.get("stalls", {}).get("events", [])
    if not events:
        return np.empty((0, 2), dtype=np.int64)
    ev = np.array(events, dtype=np.int64)
    windows = np.column_stack([ev[:, 0] - ev[:, 1] * 1000, ev[:, 0]])
    windows = windows[np.argsort(windows[:, 0])]
    # Merge overlapping windows so that their ends are sorted too.
    merged_end = np.maximum.accumulate(windows[:, 1])
    new = np.r_[True, windows[1:, 0] > merged_end[:-1]]
    group = np.cumsum(new) - 1
    starts = windows[new, 0]
    ends = np.zeros(len(starts), dtype=np.int64)
    np.maximum.at(ends, group, windows[:, 1])
    return np.column_stack([starts, ends])


def crossed_a_stall(ts_in: np.ndarray, ts_out: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """True where the router transit [ts_in, ts_out] overlaps a stall window: the packet was in
    the delay line or the queue while the router was not run, so it did not see the emulated
    link (a stalled HTB does not catch up afterwards). Lost packets (ts_out -1) are not flagged."""
    if not len(windows):
        return np.zeros(len(ts_in), dtype=bool)
    i = np.searchsorted(windows[:, 1], ts_in)  # first window ending at or after ts_in
    inside = i < len(windows)
    starts = windows[np.minimum(i, len(windows) - 1), 0]
    return inside & (starts <= ts_out) & (ts_out >= 0)


def analyse_trial(trial_dir: Path) -> dict[str, Any]:
    record = json.loads((trial_dir / "trial.json").read_text())
    p, topo = record["parameters"], record["topology"]
    roles, addr = p["hosts"], topo["addresses"]
    router_dir = trial_dir / topo["router"]
    t0 = record["times"]["t0_ns"]
    duration = parse_duration_ns(p["duration"])
    warmup = parse_duration_ns(p["warmup"])
    rate = parse_rate(p["rate"])
    buffer = parse_bytes(p["buffer"])
    # A packet can take at most the full queue plus the one-way delay to cross the router.
    max_delay_ns = int((buffer * 8 / rate + p["rtt_ms"] / 2000 + 1.0) * 1e9)

    before = read_pcap(router_dir / "bottleneck_in.pcap")
    after = read_pcap(router_dir / "bottleneck_out.pcap")
    ip = {
        role: ip_to_int(addr[roles[role]])
        for role in ("tcp_sender", "tcp_receiver", "udp_sender", "udp_receiver")
    }

    # TCP: goodput from the receiver's ACKs seen just after the router; retransmissions from
    # the sender's packets seen just before it.
    ports = data_ports(trial_dir / roles["tcp_sender"] / "iperf3_client.json")
    pair = {ip["tcp_sender"], ip["tcp_receiver"]}

    def tcp_of(frame: pd.DataFrame) -> pd.DataFrame:
        tcp = frame[(frame.proto == 6) & frame.src.isin(pair) & frame.dst.isin(pair)]
        return tcp[tcp.sport.isin(ports) | tcp.dport.isin(ports)]

    steady = tcp_goodput(tcp_of(after), start_ns=t0 + warmup, end_ns=t0 + duration)
    lifetime = tcp_goodput(tcp_of(after))
    retrans = tcp_retransmissions(tcp_of(before))
    key = ["src", "dst", "sport", "dport"]
    flows = (
        steady.rename(
            columns={
                "bytes": "steady_bytes",
                "seconds": "steady_seconds",
                "goodput_bps": "steady_goodput_bps",
            }
        )
        .merge(
            lifetime.rename(
                columns={
                    "bytes": "lifetime_bytes",
                    "seconds": "lifetime_seconds",
                    "goodput_bps": "lifetime_goodput_bps",
                }
            ),
            on=key,
            how="outer",
        )
        .merge(retrans, on=key, how="left")
    )

    # UDP one-way delay through the router, packet by packet.
    def udp_of(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[
            (frame.proto == 17)
            & (frame.src == ip["udp_sender"])
            & (frame.dst == ip["udp_receiver"])
            & (frame.dport == p["udp"]["port"])
        ]

    owd = one_way_delay(
        udp_of(before),
        udp_of(after),
        max_delay_ns=max_delay_ns,
        end_ns=int(after.ts_ns.max()) if len(after) else None,
    )

    # Queue: every packet entering the bottleneck towards the receivers, forwarded or dropped.
    towards = {ip["tcp_receiver"], ip["udp_receiver"]}
    matched = match_packets(
        before[before.dst.isin(towards)], after[after.dst.isin(towards)], max_delay_ns=max_delay_ns
    )
    mid = t0 + duration // 2
    window = (max(t0, mid - QUEUE_WINDOW_NS // 2), min(t0 + duration, mid + QUEUE_WINDOW_NS // 2))
    queue = queue_full_events(matched, start_ns=window[0], end_ns=window[1])
    egress = topo["egress"]
    drops_tc = tc_drops((router_dir / "tc_after.txt").read_text(), egress) - tc_drops(
        (router_dir / "tc_before.txt").read_text(), egress
    )

    out_dir = trial_dir / "analysis"
    out_dir.mkdir(exist_ok=True)
    named = flows.assign(src=flows.src.map(int_to_ip), dst=flows.dst.map(int_to_ip))
    named.to_parquet(out_dir / "flows.parquet", index=False)

    delay = record.get("delay", {})
    line_stats = delay.get("delayline_stats") or {}
    windows = stall_windows(line_stats)
    owd["delay_path_stalled"] = crossed_a_stall(
        owd.ts_ns.to_numpy(), owd.ts_out_ns.to_numpy(), windows
    )
    owd.to_parquet(out_dir / "udp_owd.parquet", index=False)
    owd_stats = summarize_owd(owd)
    unstalled = summarize_owd(owd[~owd.delay_path_stalled])
    one_way_ms = p["rtt_ms"] / 2
    summary = {
        "trial": record["trial"],
        "status": record["status"],
        "cc": p["cc"],
        "rtt_ms": p["rtt_ms"],
        "flows": p["flows"],
        "repetition": p["repetition"],
        "tcp_flows_seen": len(flows),
        "goodput_kBps": float(flows.steady_goodput_bps.sum() / 8000),
        "goodput_kBps_lifetime": float(flows.lifetime_goodput_bps.sum() / 8000),
        "flow_goodput_kBps": [float(v) for v in flows.steady_goodput_bps / 8000],
        "retransmitted_packets": int(flows.retransmitted_packets.fillna(0).sum()),
        "udp_packets": owd_stats["packets"],
        "udp_lost": owd_stats["lost"],
        "owd_min_ms": owd_stats["min_ms"],
        "owd_median_ms": owd_stats["median_ms"],
        "owd_mean_ms": owd_stats["mean_ms"],
        "owd_std_ms": owd_stats["std_ms"],
        "owd_p99_ms": owd_stats["p99_ms"],
        "owd_max_ms": owd_stats["max_ms"],
        "udp_delay_path_stalled": int(owd.delay_path_stalled.sum()),
        "router_stalls": len(windows),
        "router_stalled_ms": float((windows[:, 1] - windows[:, 0]).sum() / 1e6),
        "owd_max_ms_unstalled": unstalled["max_ms"],
        "queue_drops_capture": int((~matched.forwarded).sum()),
        "queue_drops_tc": int(drops_tc),
        "queue_full_events": queue["events"],
        "queue_full_events_per_min": queue["events_per_minute"],
        "queue_window_s": (window[1] - window[0]) / 1e9,
        "delay_backend": delay.get("backend"),
        "owd_min_excess_ms": (
            owd_stats["min_ms"] - one_way_ms if np.isfinite(owd_stats["min_ms"]) else float("nan")
        ),
        "delayline_lateness_us": {
            q.get("label", str(i)): q.get("lateness_us")
            for i, q in enumerate(line_stats.get("queues", []))
        },
        "capture_drops": {
            k: v.get("dropped_by_kernel", 0) for k, v in record.get("capture", {}).items()
        },
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    return summary
