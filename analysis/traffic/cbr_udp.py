"""cbr_udp: one-way delay and loss of every packet through the bottleneck, from the capture
points before and after it (one clock), judged apart where the delay path stalled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from analysis.captures import Captures, Seen, Want, bottleneck_hop, pair_key
from analysis.lazy import pd
from analysis.match import match_times
from analysis.metrics import MAX_FRAME_BYTES, owd_upper_bound_ns, summarize_owd, with_owd
from analysis.pcap import ip_to_int
from analysis.stalls import STALL_NS, crossed_a_stall, stall_windows
from core.units import parse_buffer

MATCH_MARGIN_NS = 10**9  # matching window beyond the physical bound (router stalls)


def owd_bound_ns(gen: dict[str, Any]) -> int | None:
    """The physical upper bound of the path's one-way delay (None without a bottleneck)."""
    b = gen["path"].get("bottleneck") or {}
    if not b:
        return None
    return owd_upper_bound_ns(
        one_way_delay_ns=gen["path"]["one_way_delay_ns"],
        buffer_bytes=parse_buffer(b["buffer"]).in_bytes(MAX_FRAME_BYTES),
        rate_bps=b["rate_bps"],
    )


def max_transit_ns(gen: dict[str, Any]) -> int:
    """The longest a packet may take and still be matched: the physical bound plus 1 s."""
    bound = owd_bound_ns(gen)
    return (gen["path"]["one_way_delay_ns"] if bound is None else bound) + MATCH_MARGIN_NS


class Analysis:
    """One cbr_udp generator's analysis, capture by capture (see analysis/trial.py): its
    packets before the bottleneck (every read_pcap column: the owd table's) and after it,
    matched once both are read."""

    def __init__(
        self, trial_dir: Path, record: dict, name: str, gen: dict[str, Any], caps: Captures
    ) -> None:
        self.record, self.name, self.gen = record, name, gen
        hops, hop = gen["path"]["hops"], bottleneck_hop(gen)
        self.before, self.after = caps.before(hops, hop), caps.after(hops, hop)
        self.out: dict[str, Any] = {
            "type": "cbr_udp",
            "capture_before": self.before,
            "capture_after": self.after,
        }
        self.skipped = None
        if not (self.before and self.after):
            self.skipped = "no capture point on both sides of the bottleneck"
        elif caps.clock(self.before) != caps.clock(self.after):
            self.skipped = f"capture points {self.before} and {self.after} have different clocks"
        self.pair = pair_key(gen["src"], gen["dst"])

    def wants(self) -> dict[str, Want]:
        if self.skipped:
            return {}
        return {
            self.before: Want(matched={self.pair}, detailed={self.pair}),
            self.after: Want(matched={self.pair}),
        }

    def _mine(self, seen: Seen) -> np.ndarray:
        src, dst = ip_to_int(self.gen["src"]), ip_to_int(self.gen["dst"])
        return seen.mask(proto=17, src=src, dst=dst, dport=self.gen["port"])

    def ask(self, seen: Seen) -> None:
        pass

    def take(self, seen: Seen) -> None:
        mine = self._mine(seen)
        if not seen.directions["matched"][mine].all():
            raise ValueError(f"{self.name}: its packets at {seen.point} were not kept matched")
        kept = seen.matched_of(mine)
        if seen.point == self.before:  # its rows: those of its directions, in file order
            self.first = seen.packets(mine)
            self.first_hash = seen.cap.matched["key_hash"][kept]
        if seen.point == self.after:
            self.second_ts = seen.cap.ts_ns[seen.matched_rows[kept]]
            self.second_hash = seen.cap.matched["key_hash"][kept]
            self.second_end = seen.end_ns if len(seen.cap) else None

    def finish(self) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
        out, gen = self.out, self.gen
        if self.skipped:
            out["owd_skipped"] = self.skipped
            return out, {}
        first = pd.DataFrame(self.first, copy=False)
        ts_out = np.full(len(first), -1, dtype=np.int64)
        if len(first) and len(self.second_ts):
            ts_out = match_times(
                self.first_hash, first["ts_ns"].to_numpy(np.int64), self.second_hash,
                self.second_ts, max_delay_ns=max_transit_ns(gen),
            )  # fmt: skip
        end_ns = self.second_end
        if end_ns is None:  # one_way_delay's default: the last packet after, else before
            last = self.second_ts if len(self.second_ts) else first["ts_ns"].to_numpy()
            end_ns = int(last.max()) if len(last) else 0
        matched = first.assign(ts_out_ns=ts_out, forwarded=ts_out >= 0)
        owd = with_owd(matched, max_delay_ns=max_transit_ns(gen), end_ns=end_ns)
        b_host = (gen["path"].get("bottleneck") or {}).get("host")
        stats = ((self.record.get("delay") or {}).get(b_host) or {}).get("delayline_stats") or {}
        all_stats = summarize_owd(owd)
        if "stalls" in stats:
            out.update(judge_stalls(owd, stall_windows(stats), "delay line"))
        else:  # netem (or no delay): analysis.trial reads the lost service from the packets
            out.update(judge_stalls(owd, np.empty((0, 2), dtype=np.int64), None))
        one_way_ms = gen["path"]["one_way_delay_ns"] / 1e6
        dscp = np.unique(first.tos.to_numpy() >> 2)
        out.update(
            udp_packets=all_stats["packets"],
            udp_lost=all_stats["lost"],
            **{f"owd_{k}": v for k, v in all_stats.items() if k.endswith("_ms")},
            owd_bound_ms=None if owd_bound_ns(gen) is None else owd_bound_ns(gen) / 1e6,
            owd_min_excess_ms=(
                all_stats["min_ms"] - one_way_ms
                if np.isfinite(all_stats["min_ms"])
                else float("nan")
            ),
            delayline_lateness_us={
                q.get("label", str(i)): q.get("lateness_us")
                for i, q in enumerate(stats.get("queues", []))
            },
            dscp_seen=[int(v) for v in dscp],
        )
        return out, {"owd": owd.assign(generator=self.name)}


def judge_stalls(owd: pd.DataFrame, windows: np.ndarray, source: str | None) -> dict[str, Any]:
    """Flag (in place, `delay_path_stalled`) the packets in transit through the router while
    its delay line recorded a stall (`windows`), and what the summary says of them: how many,
    the stalls' count and length, the max OWD of the others."""
    owd["delay_path_stalled"] = crossed_a_stall(
        owd.ts_ns.to_numpy(), owd.ts_out_ns.to_numpy(), windows
    )
    return {
        **unstalled(owd, source),
        "router_stalls": len(windows),
        "router_stalled_ms": float((windows[:, 1] - windows[:, 0]).sum() / 1e6),
    }


def judge_lost_service(
    owd: pd.DataFrame, lost_ns: np.ndarray, stalls_from: str | None
) -> dict[str, Any]:
    """Keep (in place, `lost_service_ns`) how much later than its rate the bottleneck served
    each packet (analysis.stalls.lost_service_ns) and summarize it. The packets that left
    more than STALL_NS later than the link's rate allows are judged apart
    (`delay_path_stalled`): alone where the router recorded no stalls of its own
    (`stalls_from` None), else beside those in transit during one. A delay line records its
    own late wake-ups only, not the shaper's (HTB runs in softirqs) nor its own late releases
    below its threshold; a packet that left that late did not see the emulated link either."""
    owd["lost_service_ns"] = lost_ns
    served = lost_ns[~owd.lost.to_numpy()] / 1e6
    pct = np.percentile(served, [50, 99]) if len(served) else [np.nan, np.nan]
    out = {
        "udp_lost_service_median_ms": float(pct[0]),
        "udp_lost_service_p99_ms": float(pct[1]),
        "udp_lost_service_max_ms": float(served.max()) if len(served) else float("nan"),
        "udp_served_late": int((served > STALL_NS / 1e6).sum()),
    }
    late = lost_ns > STALL_NS
    if stalls_from is None:
        owd["delay_path_stalled"] = late
        out.update(unstalled(owd, "lost service"), router_stalls=None, router_stalled_ms=None)
    elif late.any():
        owd["delay_path_stalled"] = owd.delay_path_stalled.to_numpy() | late
        out.update(unstalled(owd, f"{stalls_from} and lost service"))
    return out


def unstalled(owd: pd.DataFrame, source: str | None) -> dict[str, Any]:
    return {
        "udp_delay_path_stalled": int(owd.delay_path_stalled.sum()),
        "router_stalls_from": source,
        "owd_max_ms_unstalled": summarize_owd(owd[~owd.delay_path_stalled])["max_ms"],
    }
