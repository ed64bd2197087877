"""cbr_udp: one-way delay and loss of every packet through the bottleneck, from the capture
points before and after it (one clock), judged apart where the delay path stalled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.captures import Captures, bottleneck_hop
from analysis.metrics import MAX_FRAME_BYTES, one_way_delay, owd_upper_bound_ns, summarize_owd
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


def own_packets(frame: pd.DataFrame, gen: dict[str, Any]) -> pd.DataFrame:
    return frame[
        (frame.proto == 17)
        & (frame.src == ip_to_int(gen["src"]))
        & (frame.dst == ip_to_int(gen["dst"]))
        & (frame.dport == gen["port"])
    ]


def analyse(
    trial_dir: Path, record: dict[str, Any], name: str, gen: dict[str, Any], caps: Captures
) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    hops, hop = gen["path"]["hops"], bottleneck_hop(gen)
    before, after = caps.before(hops, hop), caps.after(hops, hop)
    out: dict[str, Any] = {"type": "cbr_udp", "capture_before": before, "capture_after": after}
    if not (before and after):
        out["owd_skipped"] = "no capture point on both sides of the bottleneck"
        return out, {}
    if caps.clock(before) != caps.clock(after):
        out["owd_skipped"] = f"capture points {before} and {after} have different clocks"
        return out, {}
    first, second = caps.packets(before), caps.packets(after)
    owd = one_way_delay(
        own_packets(first, gen),
        own_packets(second, gen),
        max_delay_ns=max_transit_ns(gen),
        end_ns=int(second.ts_ns.max()) if len(second) else None,
    )
    b_host = (gen["path"].get("bottleneck") or {}).get("host")
    stats = ((record.get("delay") or {}).get(b_host) or {}).get("delayline_stats") or {}
    all_stats = summarize_owd(owd)
    if "stalls" in stats:
        out.update(judge_stalls(owd, stall_windows(stats), "delay line"))
    else:  # netem (or no delay): analysis.trial reads the lost service from the packets
        out.update(judge_stalls(owd, np.empty((0, 2), dtype=np.int64), None))
    one_way_ms = gen["path"]["one_way_delay_ns"] / 1e6
    dscp = np.unique(own_packets(first, gen).tos.to_numpy() >> 2)
    out.update(
        udp_packets=all_stats["packets"],
        udp_lost=all_stats["lost"],
        **{f"owd_{k}": v for k, v in all_stats.items() if k.endswith("_ms")},
        owd_bound_ms=None if owd_bound_ns(gen) is None else owd_bound_ns(gen) / 1e6,
        owd_min_excess_ms=(
            all_stats["min_ms"] - one_way_ms if np.isfinite(all_stats["min_ms"]) else float("nan")
        ),
        delayline_lateness_us={
            q.get("label", str(i)): q.get("lateness_us")
            for i, q in enumerate(stats.get("queues", []))
        },
        dscp_seen=[int(v) for v in dscp],
    )
    return out, {"owd": owd.assign(generator=name)}


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
