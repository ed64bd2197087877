#!/usr/bin/env python3
"""Where does a trial's one-way delay beyond the link model come from? (issue 7: the VM rack's
drop-tail p99 above its bound.)

For the bottleneck of a dumbbell trial (captures before and after the router, one clock), every
packet towards the receivers is matched between the two captures. A packet that arrived at A
and left at D spent `delay` in the delay stage (netem / the delay line) and then waited in the
rate-limited queue from E = A + delay. Its time in the queue splits exactly into

  queue term   = bytes that left the router in (E, D] x 8 / rate: what a faithful server
                 sends while the packet waits (at most the buffer plus the packet itself, unless
                 the packet entered the queue late, i.e. the delay stage held it too long);
  lost service = (D - E) - queue term: time the server did not send while the packet waited
                 (the shaper, or the whole machine, stalled).

It prints the UDP packets above the model's bound with both terms, the largest service gaps
(a packet waiting, nothing leaving for longer than one frame's serialization), and totals.

    python scripts/owd_excess.py results/<batch>/trials/<trial> [--top 15]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.match import match_packets
from analysis.pcap import ip_to_int, read_pcap
from core.link_rules import FULL_FRAME_BYTES


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trial", type=Path, nargs="?")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", action="store_true", help="print the totals as JSON only")
    parser.add_argument(
        "--gaps-json", action="store_true", help="print [departure ns, gap ms] of gaps > 20 ms"
    )
    parser.add_argument(
        "--pcaps",
        nargs=2,
        type=Path,
        metavar=("BEFORE", "AFTER"),
        help="captures of a run outside the runner (then give the link below)",
    )
    parser.add_argument("--rate-bps", type=float, default=1e6)
    parser.add_argument("--delay-ms", type=float, default=25.0)
    parser.add_argument("--buffer-bytes", type=int, default=60000)
    parser.add_argument("--udp-dst", default="198.18.2.14")
    args = parser.parse_args()
    if args.pcaps:
        rate, delay, buffer_bytes = args.rate_bps, int(args.delay_ms * 1e6), args.buffer_bytes
        udp_dst, name, t0 = args.udp_dst, str(args.pcaps[0].parent), None
        before, after = read_pcap(args.pcaps[0]), read_pcap(args.pcaps[1])
    else:
        record = json.loads((args.trial / "trial.json").read_text())
        udp = next(g for g in record["traffic"].values() if g.get("type") == "cbr_udp")
        b = udp["path"]["bottleneck"]
        rate, delay = float(b["rate_bps"]), int(udp["path"]["one_way_delay_ns"])
        buffer_bytes = int(str(b["buffer"]).rstrip("B"))
        udp_dst, name, t0 = udp["dst"], record["trial"], record["times"]["t0_ns"]
        before = read_pcap(args.trial / b["host"] / "bottleneck_in.pcap")
        after = read_pcap(args.trial / b["host"] / "bottleneck_out.pcap")
    # Everything going to the receivers' side (the UDP sink's and the TCP receiver's subnet).
    net = ip_to_int(udp_dst) & 0xFFFFFF00
    towards = lambda f: f[(f.dst & 0xFFFFFF00) == net]  # noqa: E731
    m = match_packets(towards(before), towards(after), max_delay_ns=delay + 3 * 10**9)
    fwd = m[m.forwarded].sort_values("ts_out_ns")
    a = fwd.ts_ns.to_numpy(np.int64)
    d = fwd.ts_out_ns.to_numpy(np.int64)
    size = fwd.wirelen.to_numpy(np.int64)
    tx = size * 8e9 / rate  # serialization of each frame at the shaped rate, ns
    e = a + delay
    # Bytes departed up to each departure (for "bytes that left in (E, D]").
    cum = np.cumsum(size)
    out_times = d

    def departed_by(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(out_times, t, side="right")
        return np.where(i > 0, cum[np.maximum(i - 1, 0)], 0)

    # The capture after the router sees a packet when the shaper releases it, i.e. when the
    # previous frame's serialization time has passed: the frames that left in (E, D) were ahead
    # of it, plus what was left of the one in service at E.
    queue_ns = (departed_by(d - 1) - departed_by(e)) * 8e9 / rate
    j = np.searchsorted(out_times, e, side="right") - 1
    residual = np.where(j >= 0, np.maximum(0, d[np.maximum(j, 0)] + tx[np.maximum(j, 0)] - e), 0)
    queue_ns = queue_ns + residual
    lost_ns = (d - e) - queue_ns
    # Service gaps: a departure later than the previous one + that one's serialization while
    # this packet was already waiting (E before the previous departure).
    prev = np.r_[d[0], d[:-1]]
    prev_tx = np.r_[tx[0], tx[:-1]]
    waiting = e < prev
    gap = d - np.maximum(prev + prev_tx, e)
    is_udp = (fwd.proto.to_numpy() == 17) & (fwd.dst.to_numpy() == ip_to_int(udp_dst))
    owd = (d - a) / 1e6
    bound = (delay + (buffer_bytes + FULL_FRAME_BYTES) * 8e9 / rate + 2e6) / 1e6
    over = is_udp & (owd > bound)
    t0 = int(a[0]) if t0 is None else t0
    busy = np.where(waiting, gap, 0)
    totals = {
        "trial": name,
        "rate_bps": rate,
        "delay_ms": delay / 1e6,
        "bound_ms": round(bound, 2),
        "udp_packets": int(is_udp.sum()),
        "udp_owd_p99_ms": round(float(np.percentile(owd[is_udp], 99)), 2),
        "udp_owd_max_ms": round(float(owd[is_udp].max()), 2),
        "udp_over_bound": int(over.sum()),
        "udp_queue_term_max_ms": round(float(queue_ns[is_udp].max() / 1e6), 2),
        "queue_term_model_max_ms": round((buffer_bytes + FULL_FRAME_BYTES) * 8e3 / rate, 2),
        "udp_lost_service_p99_ms": round(float(np.percentile(lost_ns[is_udp], 99) / 1e6), 2),
        "udp_lost_service_max_ms": round(float(lost_ns[is_udp].max() / 1e6), 2),
        "service_gaps_over_5ms": int((busy > 5e6).sum()),
        "service_gaps_over_20ms": int((busy > 20e6).sum()),
        "service_gap_max_ms": round(float(busy.max() / 1e6), 2),
        "service_lost_total_ms": round(float(busy[busy > 0].sum() / 1e6), 1),
        "busy_departures": int(waiting.sum()),
    }
    if args.gaps_json:
        big = np.flatnonzero(busy > 20e6)
        print(json.dumps([[int(d[i]), round(float(busy[i]) / 1e6, 1)] for i in big]))
        return 0
    if args.json:
        print(json.dumps(totals))
        return 0
    print(json.dumps(totals, indent=1))
    print(f"\nUDP packets above the bound ({bound:.1f} ms): t-T0 s, OWD, queue term, lost service")
    idx = np.flatnonzero(over)
    for i in idx[np.argsort(-owd[idx])][: args.top]:
        print(
            f"  {(a[i] - t0) / 1e9:7.3f}  {owd[i]:7.1f}  {queue_ns[i] / 1e6:7.1f}  "
            f"{lost_ns[i] / 1e6:7.1f}"
        )
    print("\nlargest service gaps while a packet waited: t-T0 s (departure), gap ms")
    for i in np.argsort(-busy)[: args.top]:
        print(f"  {(d[i] - t0) / 1e9:7.3f}  {busy[i] / 1e6:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
