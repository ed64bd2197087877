#!/usr/bin/env python3
"""Did the rack carry each trial faithfully? One row per complete trial of the batches given:
what its records say about the emulation, not about the TCP under test (issue 51, item 2:
the high-speed WAN at 155 Mbit/s before its batch).

  late_p99_us, late_max_us   the user-space delay line's lateness (trial.json delay.<router>.
                             delayline_stats.queues[].lateness_us; worst over routers, queues)
  stalls, stalled_ms         its stalls over 2 ms (delayline_stats.stalls: count, total_us)
  nfq_drops                  packets the NFQUEUE lost (queues[].kernel.queue_dropped +
                             user_dropped)
  bn_tc, bn_cap, lost_out    the bottleneck's drops as its qdisc counted them and as the
                             captures around it show them (analysis/summary.json queues.<link>.
                             queue_drops_tc, queue_drops_capture); lost_out = cap - tc: packets
                             lost between the two captures but not in the queue
  other_q                    drops at every other shaped queue (<host>/tc_before.txt and
                             tc_after.txt of each host, the leaf qdisc of each interface)
  cap_drops                  packets the captures' kernel buffers dropped (trial.json capture.
                             <point>.dropped_by_kernel)
  share                      payload carried across the bottleneck in the steady state (after
                             warmup) as a share of its payload capacity: the generators'
                             bytes (goodput_kBps over each one's steady_window_s) over the
                             span of their windows (a late joiner's is shorter), against the
                             summary's payload_capacity_bps
  snd_cpu, rcv_cpu           CPU seconds a second of the socket senders and receivers
                             (<S>/<name>_client.json, <D>/<name>_server.json: cpu_s)
  idle, sys                  with --vmstat: the machine's idle and system CPU % (vmstat's id
                             and sy) while the trial's traffic ran (vmstat -n -t 1 beside it)

    python scripts/rack_fidelity.py results/<batch> [...] [--vmstat FILE] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.bottleneck import tc_drops
from core.layout import BatchDir
from core.units import parse_duration_ns, parse_offset_ns

COLUMNS = [
    "trial", "rack", "late_p99_us", "late_max_us", "stalls", "stalled_ms", "nfq_drops",
    "bn_tc", "bn_cap", "lost_out", "other_q", "cap_drops", "share", "snd_cpu", "rcv_cpu",
    "idle", "sys",
]  # fmt: skip


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def delay_line(record: dict[str, Any]) -> dict[str, Any]:
    """Worst lateness, stalls and NFQUEUE losses over the trial's routers and queues."""
    p99, worst, stalls, stalled_us, lost = [], [], 0, 0, 0
    for d in (record.get("delay") or {}).values():
        stats = d.get("delayline_stats") or {}
        for q in stats.get("queues") or []:
            late = q.get("lateness_us") or {}
            if late.get("count"):
                p99.append(late["p99"])
                worst.append(late["max"])
            kernel = q.get("kernel") or {}
            lost += int(kernel.get("queue_dropped") or 0) + int(kernel.get("user_dropped") or 0)
        st = stats.get("stalls") or {}
        stalls += int(st.get("count") or 0)
        stalled_us += int(st.get("total_us") or 0)
    if not p99:  # netem, or no delay: no lateness to report
        return {}
    return {
        "late_p99_us": max(p99), "late_max_us": max(worst), "stalls": stalls,
        "stalled_ms": stalled_us / 1000, "nfq_drops": lost,
    }  # fmt: skip


def other_queue_drops(trial_dir: Path, bottleneck_at: set[tuple[str, str]]) -> int:
    """Drops at every shaped queue but the bottleneck's, from each host's tc snapshots."""
    total = 0
    for before in sorted(trial_dir.glob("*/tc_before.txt")):
        after = before.with_name("tc_after.txt")
        if not after.exists():
            continue
        host, b, a = before.parent.name, before.read_text(), after.read_text()
        for iface in re.findall(r"^## (\S+)$", a, flags=re.M):
            if (host, iface) not in bottleneck_at:
                total += tc_drops(a, iface) - tc_drops(b, iface)
    return total


def steady_share(summary: dict[str, Any]) -> float | None:
    """The bytes the generators carried in their steady windows over the windows' span, as a
    share of the bottleneck's payload capacity; None when a figure is missing."""
    capacity = summary.get("payload_capacity_bps")
    gens = list((summary.get("generators") or {}).values())
    rates = [g.get("goodput_kBps") for g in gens]
    if not capacity or not gens or None in rates:
        return None
    windows = [g.get("steady_window_s") for g in gens]
    if None in windows:  # analysed before the windows were recorded: one window for all
        return sum(rates) * 8000 / capacity
    carried = sum(r * 1000 * (w[1] - w[0]) for r, w in zip(rates, windows, strict=True))
    span = max(w[1] for w in windows) - min(w[0] for w in windows)
    return carried * 8 / span / capacity if span > 0 else None


def cpu_per_s(trial_dir: Path, record: dict[str, Any], side: str) -> float | None:
    """CPU seconds a second of the socket senders' (side "client") or receivers' ("server")
    processes over the trial, from their reports."""
    spent = []
    for name, gen in record.get("traffic", {}).items():
        host = gen.get("sender" if side == "client" else "receiver")
        report = _json(trial_dir / str(host) / f"{name}_{side}.json")
        if "cpu_s" in report:  # hostside/traffic/bulk_socket.py: {"user": s, "system": s}
            spent.append(sum(report["cpu_s"].values()))
    seconds = parse_duration_ns(record["parameters"]["duration"]) / 1e9
    return sum(spent) / seconds if spent else None


def read_vmstat(path: Path) -> list[tuple[float, dict[str, int]]]:
    """`vmstat -n -t 1` lines as (epoch seconds, columns): its timestamp is local time."""
    rows, names = [], None
    for line in path.read_text().splitlines():
        words = line.split()
        if "id" in words and "us" in words:  # the column names, then the time zone's
            names = words[:-1]
            continue
        if names is None or len(words) != len(names) + 2 or not words[0].isdigit():
            continue
        when = datetime.strptime(" ".join(words[-2:]), "%Y-%m-%d %H:%M:%S").timestamp()
        rows.append((when, dict(zip(names, map(int, words[:-2]), strict=True))))
    return rows


def cpu_while(vmstat: list[tuple[float, dict[str, int]]], start: float, end: float) -> dict:
    """Mean idle and system CPU % of the vmstat lines within [start, end]."""
    inside = [cols for when, cols in vmstat if start <= when <= end]
    if not inside:
        return {}
    return {"idle": mean(c["id"] for c in inside), "sys": mean(c["sy"] for c in inside)}


def trial_row(trial_dir: Path, vmstat: list | None) -> dict[str, Any] | None:
    """The figures of one complete, analysed trial (None for any other)."""
    record = _json(trial_dir / "trial.json")
    summary = _json(trial_dir / "analysis" / "summary.json")
    if record.get("status") != "complete" or not summary:
        return None
    row: dict[str, Any] = {"trial": trial_dir.name, "rack": ",".join(record.get("inventory") or [])}
    row.update(delay_line(record))
    at, tc, cap = set(), 0, 0
    for q in (summary.get("queues") or {}).values():
        host, _, iface = str(q.get("at", "")).partition(":")
        at.add((host, iface))
        tc += q.get("queue_drops_tc") or 0
        cap += q.get("queue_drops_capture") or 0
    if at:
        row.update(bn_tc=tc, bn_cap=cap, lost_out=cap - tc)
    row["other_q"] = other_queue_drops(trial_dir, at)
    row["cap_drops"] = sum(
        int(c.get("dropped_by_kernel") or 0) for c in (record.get("capture") or {}).values()
    )
    row["share"] = steady_share(summary)
    row["snd_cpu"] = cpu_per_s(trial_dir, record, "client")
    row["rcv_cpu"] = cpu_per_s(trial_dir, record, "server")
    t0 = (record.get("times") or {}).get("t0_ns")
    if vmstat and t0:
        warmup = parse_offset_ns(record["parameters"].get("warmup") or "0s")
        end = t0 + parse_duration_ns(record["parameters"]["duration"])
        row.update(cpu_while(vmstat, (t0 + warmup) / 1e9, end / 1e9))
    return row


def rows_of(batches: list[Path], vmstat: Path | None = None) -> list[dict[str, Any]]:
    lines = read_vmstat(vmstat) if vmstat else None
    out = []
    for batch in batches:
        for t in BatchDir(batch).trial_dirs():
            row = trial_row(t.path, lines)
            if row is not None:
                out.append({"batch": batch.name, **row})
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.0f}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("batches", type=Path, nargs="+", help="results/<batch> directories")
    parser.add_argument("--vmstat", type=Path, help="`vmstat -n -t 1` output taken beside them")
    parser.add_argument("--json", action="store_true", help="one JSON object per trial")
    args = parser.parse_args(argv)
    rows = rows_of(args.batches, args.vmstat)
    if args.json:
        for r in rows:
            print(json.dumps(r, sort_keys=True))
        return 0
    shown = ["batch", *COLUMNS]
    print("\t".join(shown))
    for r in rows:
        print("\t".join(_cell(r.get(c)) for c in shown))
    if not rows:
        print("no complete, analysed trial: make report BATCH=... analyses them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
