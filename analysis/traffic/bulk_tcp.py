"""bulk_tcp: goodput (receiver's in-order ACKs after the bottleneck), retransmissions and
startup dynamics (sender side of the bottleneck), all from captures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.captures import Captures, bottleneck_hop
from analysis.metrics import tcp_goodput, tcp_retransmissions
from analysis.pcap import int_to_ip, ip_to_int
from analysis.siftr import read_siftr
from analysis.startup import delivered_by, loss_events, loss_summary, slow_start_exit
from analysis.tcp_probe import congestion_events, for_flows, read_tcp_probe
from core.link_rules import ETHERNET_HEADER
from core.units import parse_duration_ns, parse_offset_ns

CUTOFFS_S = (1, 5, 10, 20, 30)
DEFAULT_RTO_MIN_NS = 200_000_000  # Linux TCP_RTO_MIN
KEY = ["src", "dst", "sport", "dport"]
TCP_PROBE = "tcp_probe.txt"  # hostside/recorders/tcp_probe.py's output in the sender's dir
SIFTR_LOG = "siftr.log"  # a FreeBSD sender's SIFTR log (net.inet.siftr.logfile) in its dir


def data_ports(client_json: Path) -> set[int] | None:
    """Local ports of iperf3's data connections (its control connection carries no bulk data);
    None when iperf3 left no report (it writes it at its end: a killed one leaves none)."""
    try:
        report = json.loads(client_json.read_text())
    except ValueError:
        return None
    return {c["local_port"] for c in report.get("start", {}).get("connected", [])}


def own_packets(frame: pd.DataFrame, gen: dict[str, Any], ports: set[int] | None) -> pd.DataFrame:
    pair = {ip_to_int(gen["src"]), ip_to_int(gen["dst"])}
    tcp = frame[(frame.proto == 6) & frame.src.isin(pair) & frame.dst.isin(pair)]
    if ports:
        return tcp[tcp.sport.isin(ports) | tcp.dport.isin(ports)]
    return tcp[(tcp.sport == gen["port"]) | (tcp.dport == gen["port"])]


def payload_capacity_bps(data: pd.DataFrame, rate_bps: int) -> float:
    """What the bottleneck can carry as TCP payload: its rate times payload / frame of a
    full-size segment seen in the capture (the shaper counts Ethernet frames)."""
    full = data[data.payload_len == data.payload_len.max()]
    if full.empty:
        return float("nan")
    row = full.iloc[0]
    return rate_bps * int(row.payload_len) / (int(row.ip_len) + ETHERNET_HEADER)


def analyse(
    trial_dir: Path, record: dict[str, Any], name: str, gen: dict[str, Any], caps: Captures
) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    hops, hop = gen["path"]["hops"], bottleneck_hop(gen)
    before, after = caps.before(hops, hop), caps.after(hops, hop)
    client = trial_dir / gen["client_json"]
    ports = data_ports(client) if client.exists() else None
    t0 = record["times"]["t0_ns"]
    start, end = t0 + gen["start_ns"], t0 + gen["start_ns"] + gen["duration_ns"]
    warmup = parse_offset_ns(record["parameters"]["warmup"])
    out: dict[str, Any] = {"type": "bulk_tcp", "capture_before": before, "capture_after": after}
    flows = pd.DataFrame(columns=KEY)
    if after:
        pk = own_packets(caps.packets(after), gen, ports)
        if record.get("status") != "complete" and len(pk):
            # Stopped early (interrupted, failed): the window ends where its packets end.
            end = min(end, int(pk.ts_ns.max()))
            out["window_cut_at_s"] = (end - t0) / 1e9
        steady_ok = end > start + warmup
        steady = tcp_goodput(pk, start_ns=start + warmup, end_ns=end)
        if not steady_ok:  # it never reached its steady state: no steady figures at all
            steady = steady.assign(bytes=0, seconds=0.0, goodput_bps=np.nan)
        lifetime = tcp_goodput(pk)
        flows = steady.rename(
            columns={
                "bytes": "steady_bytes",
                "seconds": "steady_seconds",
                "goodput_bps": "steady_goodput_bps",
            }
        ).merge(
            lifetime.rename(
                columns={
                    "bytes": "lifetime_bytes",
                    "seconds": "lifetime_seconds",
                    "goodput_bps": "lifetime_goodput_bps",
                }
            ),
            on=KEY,
            how="outer",
        )
        out.update(
            flows_seen=len(flows),
            goodput_kBps=float(flows.steady_goodput_bps.sum() / 8000) if steady_ok else None,
            steady_window_s=[(start + warmup - t0) / 1e9, (end - t0) / 1e9] if steady_ok else None,
            goodput_kBps_lifetime=float(flows.lifetime_goodput_bps.sum() / 8000),
            flow_goodput_kBps=[float(v) for v in flows.steady_goodput_bps / 8000],
        )
    if before:
        pk = own_packets(caps.packets(before), gen, ports)
        retrans = tcp_retransmissions(pk)
        flows = flows.merge(retrans, on=KEY, how="outer") if len(flows.columns) > 4 else retrans
        configured = record.get("host_settings", {}).get(gen["from"], {}).get("rto_min")
        rto_min = parse_duration_ns(configured) if configured else DEFAULT_RTO_MIN_NS
        losses = loss_summary(pk, rto_threshold_ns=rto_min)
        events = loss_events(pk, rto_threshold_ns=rto_min)
        exits = slow_start_exit(pk)
        cutoffs = [int(c * 1e9) for c in CUTOFFS_S]
        delivered = delivered_by(pk, cutoffs)
        flows = flows.merge(
            losses[[*KEY, "start_ns", "timeouts", "timeout_idle_ns", "fast_retransmits"]],
            on=KEY,
            how="left",
        ).merge(exits[[*KEY, "exit_ns"]], on=KEY, how="left")
        wide = delivered.pivot_table(
            index=KEY, columns="cutoff_ns", values="bytes", aggfunc="first"
        )
        covered = delivered.groupby("cutoff_ns").covered.all()
        wide.columns = [f"delivered_{c // 10**9}s" for c in wide.columns]
        flows = flows.merge(wide.reset_index(), on=KEY, how="left")
        data = pk[(pk.payload_len > 0) & (pk.src == ip_to_int(gen["src"]))]
        rate = (gen["path"].get("bottleneck") or {}).get("rate_bps")
        out.update(
            retransmitted_packets=int(retrans.retransmitted_packets.sum()),
            timeouts=int(losses.timeouts.sum()),
            timeout_idle_ms=[float(v) / 1e6 for v in events[events.kind == "timeout"].idle_ns],
            fast_retransmits=int(losses.fast_retransmits.sum()),
            slow_start_exit_s=[None if np.isnan(v) else float(v) / 1e9 for v in exits.exit_ns],
            start_offsets_s=[float(v - t0) / 1e9 for v in losses.start_ns],
            delivered_bytes={
                f"{c // 10**9}s": int(delivered[delivered.cutoff_ns == c].bytes.sum())
                for c in cutoffs
                if covered.get(c, False)
            },
            # Since T0 rather than since each flow's SYN: what the aggregate is judged by.
            delivered_since_t0={
                f"{c // 10**9}s": int(
                    tcp_goodput(pk[pk.ts_ns <= t0 + c], start_ns=t0, end_ns=t0 + c).bytes.sum()
                )
                for c in cutoffs
                if c <= parse_duration_ns(record["parameters"]["duration"])
            },
            payload_capacity_bps=payload_capacity_bps(data, rate) if rate else None,
        )
    tables = {"flows": flows.assign(generator=name)}
    sender_dir = trial_dir / gen.get("sender", gen["from"])
    # Linux senders record tcp:tcp_probe; FreeBSD senders a SIFTR log (the same table).
    probe = next(
        (p for p in (sender_dir / TCP_PROBE, sender_dir / SIFTR_LOG) if p.exists()),
        sender_dir / TCP_PROBE,
    )
    if probe.exists() and len(flows):
        cwnd, epochs = sender_state(probe, flows, gen)
        tables["cwnd"] = cwnd.assign(generator=name)
        out.update(
            cwnd_events=len(cwnd),
            congestion_epochs=[int((epochs.sport == p).sum()) for p in flows.sport],
        )
    return out, tables


def sender_state(
    probe: Path, flows: pd.DataFrame, gen: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """cwnd/ssthresh/srtt of this generator's data flows from the sender's tcp_probe recording
    (its sockets only: src is the sender), and the congestion epochs (ssthresh reductions)."""
    data = flows[flows.src == ip_to_int(gen["src"])][KEY]
    wanted = data.assign(src=[int_to_ip(v) for v in data.src], dst=[int_to_ip(v) for v in data.dst])
    events = read_siftr(probe) if probe.name == SIFTR_LOG else read_tcp_probe(probe)
    cwnd = for_flows(events, wanted)
    return cwnd, congestion_events(cwnd)
