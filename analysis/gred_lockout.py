"""Time a RIO queue spent locked out, from the `tc -s` samples of its GRED qdisc.

Locked out: the IN virtual queue's average is at or above its max threshold (every IN packet
arriving is dropped) while the physical queue is empty (the link idles). Linux GRED ends its
idle period at the first arrival and does not start it again when it drops that packet into
an empty queue, so from then on its average decays per arriving packet (by w_q each), not
with the time the link stood idle, as ns-2's RED (the seed-004 paper's) does. After a burst
that lifted the average past max, a Reno flow in timeout sends few packets, and the lock
lasts seconds: measured on the VM rack, 15 s of a 20 s trial at 1.5 Mbit/s under NM.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from analysis.tc_samples import sample_records

__all__ = ["gred_lockout"]


def gred_lockout(samples: Path, dev: str, start_ns: int, end_ns: int) -> dict[str, Any] | None:
    """Seconds (total and longest stretch) between start_ns and end_ns during which `dev`'s
    GRED had its IN queue (VQ 0) average, with the VQs of better priority in RIO mode, at or
    above VQ 0's max while its backlog was zero; None without GRED samples of `dev`."""
    points: list[tuple[int, bool]] = []
    for rec in sample_records(samples):
        if rec.get("dev") != dev:
            continue
        gred = next((q for q in rec["qdiscs"] if q.get("kind") == "gred"), None)
        if gred is None:
            continue
        opts = gred.get("options", {})
        vqs = {vq["vq"]: vq for vq in opts.get("vqs", [])}
        if 0 not in vqs:
            continue
        avg = vqs[0]["qave"]
        if opts.get("grio"):
            avg += sum(v["qave"] for v in vqs.values() if v["prio"] < vqs[0]["prio"])
        points.append((rec["ts_ns"], avg >= vqs[0]["max"] and gred.get("backlog", 0) == 0))
    if not points:
        return None
    total = longest = run = 0
    for (t, locked), (t_next, _) in itertools.pairwise(points):
        span = max(0, min(t_next, end_ns) - max(t, start_ns))
        if locked and span:
            run += span
            total += span
            longest = max(longest, run)
        elif not locked:
            run = 0
    return {"locked_s": total / 1e9, "longest_s": longest / 1e9, "samples": len(points)}
