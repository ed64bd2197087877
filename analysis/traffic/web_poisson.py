"""web_poisson: flow completion time of every web-like flow, from the captures.

FCT (seed 004): from the SYN to the last data byte. The SYN is taken where it enters the
bottleneck (the capture point before it, else after it); the end is the moment the capture
after the bottleneck has seen every byte of the flow (each segment's first appearance there:
a segment lost at the bottleneck counts when its retransmission passes). A connection is a
SYN's (source port, ISN): ports are reused in long trials. The client's flow list
(<sender>/<name>_flows.jsonl) gives each connection its group and scheduled size.

Receiver turnaround: at the capture after the bottleneck, each SYN to the first SYN-ACK that
answers it. It covers the links to the receiver and back, the receiver's kernel and the
reverse queue at that capture, which only ACKs cross in seed 004: above its least value it is
delay the rack adds outside the queues the experiment models (a loaded VM's softirq backlog:
0.1-2.2 s measured when the trial's watch took the VM's CPUs), so it is reported as the trial's
own check of the rack.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from analysis.captures import Captures, Seen, Want, bottleneck_hop
from analysis.lazy import pd
from analysis.pcap import ip_to_int
from core.units import parse_offset_ns

SYN, ACK = 0x02, 0x10
SEQ_MOD = 1 << 32
# The paper's FCT figures: 1-, 18- and 190-packet flows (groups 1-8, 14 and 15).
PACKET_CLASSES = {1: range(1, 9), 18: range(14, 15), 190: range(15, 16)}
FLOW_COLUMNS = [
    "sport",
    "isn",
    "syn_ns",
    "syn_rtt_ns",
    "last_byte_ns",
    "bytes_seen",
    "data_packets",
    "fct_ns",
]


def read_flow_list(path: Path) -> pd.DataFrame:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    cols = ["flow", "group", "bytes", "sport", "sched_ns", "connect_ns", "status"]
    return pd.DataFrame(rows, columns=cols)


def _syns(frame: pd.DataFrame, src: int, dst: int, port: int) -> pd.DataFrame:
    syn = frame[
        (frame.proto == 6)
        & (frame.src == src)
        & (frame.dst == dst)
        & (frame.dport == port)
        & ((frame.tcp_flags & (SYN | ACK)) == SYN)
    ]
    # A retransmitted SYN keeps its ISN: the connection starts at the first one.
    first = syn.groupby(["sport", "seq"], as_index=False).ts_ns.min()
    return first.rename(columns={"seq": "isn", "ts_ns": "syn_ns"}).sort_values("syn_ns")


def _handshake_rtt(frame: pd.DataFrame, syns: pd.DataFrame, src: int, dst: int, port: int):
    """SYN to the first SYN-ACK answering it (ack = ISN + 1), at one capture point."""
    sa = frame[
        (frame.proto == 6)
        & (frame.src == dst)
        & (frame.dst == src)
        & (frame.sport == port)
        & ((frame.tcp_flags & (SYN | ACK)) == (SYN | ACK))
    ]
    sa = sa.assign(isn=(sa.ack.astype(np.int64) - 1) % SEQ_MOD, sport=sa.dport)
    first = sa.groupby(["sport", "isn"], as_index=False).ts_ns.min().astype({"ts_ns": "Int64"})
    merged = syns.merge(first, on=["sport", "isn"], how="left")
    return (merged.ts_ns - merged.syn_ns).array


def receiver_turnaround(frame: pd.DataFrame, *, src: str, dst: str, port: int) -> np.ndarray:
    """Nanoseconds from each SYN to the first SYN-ACK answering it, both seen at one capture
    point after the bottleneck; connections with no SYN-ACK seen are left out."""
    s, d = ip_to_int(src), ip_to_int(dst)
    turn = pd.Series(_handshake_rtt(frame, _syns(frame, s, d, port), s, d, port))
    return turn.dropna().to_numpy(dtype=np.int64)


def turnaround_summary(turn_ns: np.ndarray) -> dict[str, float | int]:
    """Least turnaround, and the median, p99 and largest excess over it (ms)."""
    if not len(turn_ns):
        return {"receiver_turnaround_handshakes": 0}
    ms = turn_ns / 1e6
    least = float(ms.min())
    p50, p99 = (float(v) for v in np.percentile(ms - least, [50, 99]))
    return {
        "receiver_turnaround_handshakes": len(ms),
        "receiver_turnaround_ms_min": least,
        "receiver_turnaround_excess_ms_median": p50,
        "receiver_turnaround_excess_ms_p99": p99,
        "receiver_turnaround_excess_ms_max": float(ms.max() - least),
    }


def flow_completion(
    syn_frame: pd.DataFrame, end_frame: pd.DataFrame, *, src: str, dst: str, port: int
) -> pd.DataFrame:
    """One row per connection from src to dst:port whose SYN syn_frame saw: FLOW_COLUMNS.
    Times in ns; fct_ns = last_byte_ns - syn_ns (NaN while no data byte was seen)."""
    s, d = ip_to_int(src), ip_to_int(dst)
    syns = _syns(syn_frame, s, d, port)
    syns = syns.assign(syn_rtt_ns=_handshake_rtt(syn_frame, syns, s, d, port))
    # Data packets go to the connection whose SYN (seen at the end capture) came last before.
    end_syns = _syns(end_frame, s, d, port)
    data = end_frame[
        (end_frame.proto == 6)
        & (end_frame.src == s)
        & (end_frame.dst == d)
        & (end_frame.dport == port)
        & (end_frame.payload_len > 0)
    ][["ts_ns", "sport", "seq", "payload_len"]].sort_values("ts_ns")
    data = pd.merge_asof(
        data,
        end_syns[["syn_ns", "sport", "isn"]].rename(columns={"syn_ns": "ts_ns"}),
        on="ts_ns",
        by="sport",
        direction="backward",
    ).dropna(subset=["isn"])
    rel = (data.seq.astype(np.int64) - data.isn.astype(np.int64) - 1) % SEQ_MOD
    data = data.assign(rel=rel, end=rel + data.payload_len, isn=data.isn.astype(np.int64))
    first_seen = data.groupby(["sport", "isn", "rel"], as_index=False).agg(
        ts_ns=("ts_ns", "min"), end=("end", "max")
    )
    per_flow = first_seen.groupby(["sport", "isn"], as_index=False).agg(
        last_byte_ns=("ts_ns", "max"), bytes_seen=("end", "max")
    )
    per_flow = per_flow.astype({"last_byte_ns": "Int64"})  # stays exact through the merge
    packets = data.groupby(["sport", "isn"]).size().rename("data_packets").reset_index()
    flows = syns.merge(per_flow, on=["sport", "isn"], how="left").merge(
        packets, on=["sport", "isn"], how="left"
    )
    # Nanosecond times stay integers (float64 loses the last digits at 1.8e18): where one
    # can be missing (no data seen, no SYN-ACK) it is a nullable integer.
    flows = flows.assign(
        fct_ns=flows.last_byte_ns - flows.syn_ns,
        data_packets=flows.data_packets.fillna(0).astype(np.int64),
        bytes_seen=flows.bytes_seen.fillna(0).astype(np.int64),
    )
    return flows[FLOW_COLUMNS]


def attach_schedule(flows: pd.DataFrame, listed: pd.DataFrame) -> pd.DataFrame:
    """Group, scheduled bytes and flow id from the client's list: the listed connection of
    the same source port opened last before the SYN (within 1 s)."""
    listed = listed.dropna(subset=["sport", "connect_ns"]).astype(
        {"sport": np.int64, "connect_ns": np.int64}
    )
    left = flows.astype({"sport": np.int64}).sort_values("syn_ns")
    merged = pd.merge_asof(
        left,
        listed[["sport", "connect_ns", "sched_ns", "flow", "group", "bytes", "status"]].sort_values(
            "connect_ns"
        ),
        left_on="syn_ns",
        right_on="connect_ns",
        by="sport",
        direction="backward",
        tolerance=10**9,
    )
    merged = merged.astype(
        {c: "Int64" for c in ("connect_ns", "sched_ns", "flow", "group", "bytes")}
    )
    backlogged = (merged.flow == -1).fillna(False).astype(bool)
    complete = (merged.bytes_seen >= merged.bytes).fillna(False).astype(bool) & ~backlogged
    return merged.assign(backlogged=backlogged, complete=complete)


def fct_summary(flows: pd.DataFrame) -> dict[str, Any]:
    web = flows[~flows.backlogged & flows.group.notna()]
    done = web[web.complete]
    out: dict[str, Any] = {}
    for packets, groups in PACKET_CLASSES.items():
        sel = done[done.group.isin(list(groups))].fct_ns / 1e6
        out[f"fct_{packets}pkt_flows"] = len(sel)
        out[f"fct_{packets}pkt_mean_ms"] = float(sel.mean()) if len(sel) else None
        out[f"fct_{packets}pkt_median_ms"] = float(sel.median()) if len(sel) else None
    by_group = done.groupby("group").fct_ns
    out["fct_mean_ms_by_group"] = {int(g): float(v / 1e6) for g, v in by_group.mean().items()}
    return out


class Analysis:
    """One web_poisson generator's analysis (see analysis/trial.py): its packets at the
    capture points it reads, as small frames, then the flows' completion."""

    def __init__(
        self, trial_dir: Path, record: dict, name: str, gen: dict[str, Any], caps: Captures
    ) -> None:
        self.trial_dir, self.record, self.name, self.gen = trial_dir, record, name, gen
        hops, hop = gen["path"]["hops"], bottleneck_hop(gen)
        self.before, self.after = caps.before(hops, hop), caps.after(hops, hop)
        self.end_point = self.after or self.before
        self.syn_point = self.end_point
        if self.before and self.end_point and caps.clock(self.before) == caps.clock(self.end_point):
            self.syn_point = self.before
        self.frames: dict[str, dict[str, np.ndarray]] = {}  # read_pcap's columns

    def wants(self) -> dict[str, Want]:
        if self.end_point is None:
            return {}
        return {self.syn_point: Want(), self.end_point: Want()}

    def ask(self, seen: Seen) -> None:
        pass

    def take(self, seen: Seen) -> None:
        """Its client's TCP packets to the port, and the server's back."""
        client, port = ip_to_int(self.gen["src"]), self.gen["port"]
        to_server = seen.mask(proto=6, src=client, dport=port)
        back = seen.mask(proto=6, dst=client, sport=port)
        self.frames[seen.point] = seen.packets(to_server | back)

    def finish(self) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
        gen, record, after = self.gen, self.record, self.after
        out: dict[str, Any] = {
            "type": "web_poisson", "capture_before": self.before, "capture_after": after
        }  # fmt: skip
        end_point, syn_point = self.end_point, self.syn_point
        if end_point is None:
            out["fct_skipped"] = "no capture point on the generator's path"
            return out, {}
        frames = {k: pd.DataFrame(v, copy=False) for k, v in self.frames.items()}
        flows = flow_completion(
            frames[syn_point],
            frames[end_point],
            src=gen["src"],
            dst=gen["dst"],
            port=gen["port"],
        )
        end = frames[end_point]
        data = end[
            (end.proto == 6)
            & (end.src == ip_to_int(gen["src"]))
            & (end.dport == gen["port"])
            & (end.payload_len > 0)
        ]
        codes, counts = np.unique((data.tos.to_numpy() >> 2).astype(np.int64), return_counts=True)
        # Payload that crossed the bottleneck in the steady window (seed 004's goodput axis);
        # retransmitted bytes count once, at their first crossing.
        t0 = record["times"]["t0_ns"]
        steady_start = t0 + parse_offset_ns(record["parameters"].get("warmup") or 0)
        steady_end = t0 + gen["start_ns"] + gen["duration_ns"]
        steady = data[(data.ts_ns >= steady_start) & (data.ts_ns < steady_end)]
        steady = steady.drop_duplicates(["sport", "seq"])
        listed_path = self.trial_dir / gen["flows_file"]
        listed = read_flow_list(listed_path) if listed_path.exists() else read_flow_list_empty()
        flows = attach_schedule(flows, listed)
        web = flows[~flows.backlogged]
        rtt = flows.syn_rtt_ns.dropna() / 1e6
        if after:
            turn = receiver_turnaround(end, src=gen["src"], dst=gen["dst"], port=gen["port"])
            out.update(receiver_turnaround_capture=after, **turnaround_summary(turn))
        out.update(
            syn_capture=syn_point,
            end_capture=end_point,
            flows_scheduled=gen["flows_scheduled"],
            flows_started=int((listed.flow >= 0).sum()),
            flows_seen=len(web),
            flows_complete=int(web.complete.sum()),
            flows_unmatched=int(web.group.isna().sum()),
            backlogged_bytes=int(flows[flows.backlogged].bytes_seen.sum()),
            # DSCP of the data packets after the bottleneck (what markers wrote and RIO kept)
            dscp_data_packets={int(d): int(n) for d, n in zip(codes, counts, strict=True)},
            steady_payload_bytes=int(steady.payload_len.astype(np.int64).sum()),
            steady_window_s=max(0, steady_end - steady_start) / 1e9,
            syn_rtt_ms_min=float(rtt.min()) if len(rtt) else None,
            syn_rtt_ms_median=float(rtt.median()) if len(rtt) else None,
            **fct_summary(flows),
        )
        return out, {"web_flows": flows.assign(generator=self.name)}


def read_flow_list_empty() -> pd.DataFrame:
    return pd.DataFrame(
        columns=["flow", "group", "bytes", "sport", "sched_ns", "connect_ns", "status"]
    )
