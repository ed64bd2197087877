"""One trial's captures -> per-generator metrics (dispatched on the generator's type) and the
queue of every bottleneck; written as parquet and summary.json beside the captures.

Everything here is computed from packets, never from a tool's own report (iperf3's JSON only
says which connections carry data). It reads trial.json and the captures; it does not import
the runner.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.batches import summary_file
from analysis.captures import Captures, bottleneck_hop
from analysis.dscp import dscp_per_flow, marking_counters
from analysis.families import FAMILIES
from analysis.gred_lockout import gred_lockout
from analysis.ipfw_samples import (
    pipe_drops,
    read_ipfw_samples,
    rio_queue_deltas,
    with_rio_queues,
)
from analysis.match import match_packets
from analysis.metrics import queue_full_events, undecided
from analysis.pcap import addresses_as_strings, ip_to_int
from analysis.queue import crossing, queue_occupancy, queue_summary
from analysis.stalls import lost_service_ns
from analysis.tc_samples import LEAF_KINDS, compare_with_samples, leaf_samples, read_tc_samples
from analysis.traffic import ANALYSES
from analysis.traffic.cbr_udp import judge_lost_service, max_transit_ns
from core.units import parse_duration_ns, parse_offset_ns

TC_SAMPLES = "tc_samples.jsonl"  # collect/remote/tc_sampler.py's output in the router's dir
IPFW_SAMPLES = "ipfw_samples.jsonl"  # collect/remote/ipfw_sampler.py's, on a FreeBSD router

QUEUE_WINDOW_NS = 60 * 10**9  # queue-full events are counted over 60 s mid-trial


def tc_drops(tc_text: str, iface: str) -> int:
    """The drop counter of the leaf qdisc (LEAF_KINDS: drop-tail or an AQM) on `iface` from a
    `tc -s qdisc show` snapshot."""
    block = tc_text.split(f"## {iface}\n", 1)[-1].split("## ", 1)[0]
    for kind, dropped in re.findall(
        r"qdisc (\S+) .*?\n Sent \d+ bytes \d+ pkt \(dropped (\d+)", block
    ):
        if kind in LEAF_KINDS:
            return int(dropped)
    return 0


def egress(record: dict[str, Any], host: str, iface: str) -> dict[str, Any]:
    """What the trial configured on an egress interface ({} if nothing)."""
    for e in record["network"].get("egress", []):
        if e.get("host") == host and e.get("iface") == iface:
            return e
    return {}


def link_delay_ns(record: dict[str, Any], host: str, iface: str) -> int:
    """The delay configured on an egress interface (applied ahead of its shaper's queue)."""
    return parse_offset_ns(egress(record, host, iface).get("delay") or "0s")


def queue_samples(host_dir: Path) -> pd.DataFrame | None:
    """A router's samples of its queues during the trial, in read_tc_samples' columns: `tc -s`
    (Linux) or `ipfw pipe show` (a FreeBSD router's dummynet pipes; `ipfw queue show` of a rio
    link's two queues); None when it has none."""
    if (host_dir / TC_SAMPLES).exists():
        return read_tc_samples(host_dir / TC_SAMPLES)
    if (host_dir / IPFW_SAMPLES).exists():
        return read_ipfw_samples(host_dir / IPFW_SAMPLES)
    return None


def queue_drops_counted(host_dir: Path, iface: str) -> int | None:
    """Drops the router itself counted at `iface`'s queue during the trial (its snapshots after
    minus before: the leaf qdisc, or the dummynet pipe; for rio on a FreeBSD router its IN and
    OUT queues, which hold the packets instead of the pipe); None without snapshots."""
    if (rio := rio_queue_deltas(host_dir, iface)) is not None:
        return rio["in"]["drops"] + rio["out"]["drops"]
    for kind, drops in (("tc", tc_drops), ("ipfw", pipe_drops)):
        before, after = host_dir / f"{kind}_before.txt", host_dir / f"{kind}_after.txt"
        if before.exists() and after.exists():
            return drops(after.read_text(), iface) - drops(before.read_text(), iface)
    return None


def tc_cross_check(
    queue: pd.DataFrame, samples: pd.DataFrame, iface: str
) -> tuple[dict, pd.DataFrame]:
    """The reconstructed queue against the router's samples of the bottleneck's leaf qdisc (or
    dummynet pipe; a FreeBSD rio link's two queues summed, each one's in columns of its own:
    analysis.ipfw_samples.with_rio_queues), over the samples taken while the captures saw the
    queue's traffic."""
    leaf = leaf_samples(samples, iface)
    cmp = with_rio_queues(compare_with_samples(queue, leaf), samples, iface)
    if len(queue):
        cmp = cmp[(cmp.ts_ns >= queue.ts_ns.iloc[0]) & (cmp.ts_ns <= queue.ts_ns.iloc[-1])]
    if cmp.empty:
        return {"tc_samples": 0}, cmp
    diff = cmp.diff_packets.abs()
    return {
        "tc_samples": len(cmp),
        "tc_sample_spread_ms": float(cmp.spread_ns.median() / 1e6),
        "tc_diff_packets_median": float(diff.median()),
        "tc_diff_packets_p99": float(diff.quantile(0.99)),
        "tc_diff_packets_max": int(diff.max()),
        "tc_drops": int(cmp.tc_drops.iloc[-1]),
        "capture_drops_same_span": int(cmp.drops.iloc[-1]),
    }, cmp


def bottleneck_queue(
    trial_dir: Path, record: dict[str, Any], link: str, caps: Captures
) -> tuple[dict[str, Any], dict[str, pd.DataFrame]] | None:
    """Drops, queue-full events and the occupancy over time of a bottleneck: every packet of
    the generators whose path crosses it, seen before it and (forwarded) after it, in the
    captures nearest to either side (one clock); checked against `tc -s` samples if the
    router recorded them."""
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

    def crossing_at(names: set[str]) -> pd.DataFrame:
        frames = [crossing(caps.packets(n), pairs) for n in sorted(names)]
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)

    arriving, departing = crossing_at(before), crossing_at(after)
    matched = match_packets(arriving, departing, max_delay_ns=transit)
    end_ns = int(max(caps.packets(n).ts_ns.max() for n in after)) if len(departing) else 0
    del arriving, departing  # (matched holds what is needed of them; each is a copy)
    # Packets still in transit when the capture after the router stopped are not drops.
    unknown = undecided(
        matched.ts_ns.to_numpy(), matched.forwarded.to_numpy(), max_delay_ns=transit, end_ns=end_ns
    )
    judged = matched[~unknown] if unknown.any() else matched
    del matched
    host, iface = bottleneck["host"], bottleneck["iface"]
    qdisc = bottleneck.get("qdisc") or "droptail"
    queue = queue_occupancy(
        judged, delay_ns=link_delay_ns(record, host, iface), max_delay_ns=transit, end_ns=end_ns
    )
    t0 = record["times"]["t0_ns"]
    duration = parse_duration_ns(record["parameters"]["duration"])
    run_end = t0 + duration
    if record.get("status") != "complete" and end_ns:
        run_end = max(t0, min(run_end, end_ns))  # stopped early: only what ran is judged
    mid = t0 + (run_end - t0) // 2
    window = (max(t0, mid - QUEUE_WINDOW_NS // 2), min(run_end, mid + QUEUE_WINDOW_NS // 2))
    full = queue_full_events(judged, start_ns=window[0], end_ns=window[1])
    host_dir = trial_dir / host
    drops_tc = queue_drops_counted(host_dir, iface)
    queue["link"] = link  # in place: the queue's events are the largest table of a trial
    tables = {"queue": queue}
    check: dict[str, Any] = {}
    samples = queue_samples(host_dir)
    if samples is not None:
        check, cmp = tc_cross_check(queue, samples, iface)
        tables["queue_tc"] = cmp.assign(link=link)
    return {
        "link": link,
        "at": f"{host}:{iface}",
        "captures_before": sorted(before),
        "captures_after": sorted(after),
        "queue_drops_capture": int((~judged.forwarded).sum()),
        "queue_undecided_at_end": int(unknown.sum()),
        "queue_drops_tc": drops_tc,
        # Runs of drops: the queue full where it is drop-tail; an AQM drops before it is full,
        # so there they are its drop runs (the name says which: queue_drop_runs_are).
        "queue_qdisc": qdisc,
        "queue_drop_runs_are": "queue-full events"
        if qdisc == "droptail"
        else f"{qdisc} drop runs (early drops, not a full queue)",
        "queue_full_events": full["events"],
        "queue_full_events_per_min": full["events_per_minute"],
        "queue_window_s": (window[1] - window[0]) / 1e9,
        # Capture to capture across the router (its queue, its link's delay, an edge
        # marker's time), mean over the packets forwarded in the window (seed 004's delay).
        "transit_mean_ms_in_window": transit_ms(judged, window, "mean"),
        "transit_min_ms_in_window": transit_ms(judged, window, "min"),
        # The least over the whole trial: the queue is empty at its start at least (a queue
        # that never drains in the window, e.g. RIO's IN min 160 at 3 Mbit/s, held 770 ms
        # there). Seed 004's delay is normalized by it.
        "transit_min_ms": transit_ms(judged, (0, 2**63 - 1), "min"),
        **{
            f"queue_{k}_in_window": v
            for k, v in queue_summary(queue, start_ns=window[0], end_ns=window[1]).items()
        },
        **check,
    }, tables


def transit_ms(matched: pd.DataFrame, window: tuple[int, int], how: str) -> float | None:
    """`how` (mean, min) of the capture-to-capture transit of the packets forwarded in the
    window, in ms."""
    inside = matched[matched.forwarded & (matched.ts_ns >= window[0]) & (matched.ts_ns < window[1])]
    if inside.empty:
        return None
    return float((inside.ts_out_ns - inside.ts_ns).agg(how) / 1e6)


def rio_lockout(trial_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Per RIO queue ("host:iface"), the time its IN queue was locked out during the trial
    (analysis.gred_lockout), from the router's tc samples."""
    t0 = record.get("times", {}).get("t0_ns")
    if not t0:
        return {}
    end = t0 + parse_duration_ns(record["parameters"]["duration"])
    out = {}
    for where in record.get("rio") or {}:
        host, iface = where.split(":", 1)
        samples = trial_dir / host / TC_SAMPLES
        found = gred_lockout(samples, iface, t0, end) if samples.exists() else None
        if found:
            out[where] = found
    return out


def lost_service(
    record: dict[str, Any],
    generators: dict[str, Any],
    owd_frames: list[pd.DataFrame],
    queue_events: dict[str, pd.DataFrame],
) -> None:
    """How late each UDP generator's bottleneck served its packets against its rate, read from
    the packets (analysis.stalls.lost_service_ns): the emulated link's fidelity, in each such
    generator's summary and OWD table. The packets that left over 2 ms late are judged apart,
    beside those in transit during a stall the router recorded (its user-space delay line;
    netem records none).
    Only for a FIFO queue (drop-tail): it assumes packets leave in the order they entered."""
    for name, gen in record["traffic"].items():
        b = gen["path"].get("bottleneck") or {}
        summary = generators[name]
        if gen["type"] != "cbr_udp" or "udp_packets" not in summary:
            continue
        if b.get("link") not in queue_events:
            continue
        if egress(record, b["host"], b["iface"]).get("qdisc", "droptail") != "droptail":
            continue
        (owd,) = [f for f in owd_frames if len(f) and f["generator"].iloc[0] == name]
        lost = lost_service_ns(
            queue_events[b["link"]],
            owd.ts_ns.to_numpy(),
            owd.ts_out_ns.to_numpy(),
            link_delay_ns(record, b["host"], b["iface"]),
            b["rate_bps"],
        )
        summary.update(judge_lost_service(owd, lost, summary.get("router_stalls_from")))


def analyse_trial(trial_dir: Path) -> dict[str, Any]:
    """Analyse the trial into ``analysis/`` (its tables and summary.json). The tables are
    written into a directory beside it that replaces it only once the summary is written: a
    run that fails keeps the earlier analysis whole (tables and summary of one run), and
    tables the current code no longer writes do not stay beside new ones."""
    record = json.loads((trial_dir / "trial.json").read_text())
    final = trial_dir / "analysis"
    out_dir = trial_dir / ".analysis.new"
    shutil.rmtree(out_dir, ignore_errors=True)  # a run that died half-way
    out_dir.mkdir()
    try:
        summary = _analyse_into(trial_dir, record, out_dir)
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    old = trial_dir / ".analysis.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    out_dir.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return summary


def _analyse_into(trial_dir: Path, record: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    caps = Captures(trial_dir, record)
    generators: dict[str, Any] = {}
    frames: dict[str, list[pd.DataFrame]] = {}
    queues: dict[str, Any] = {}
    queue_events: dict[str, pd.DataFrame] = {}
    for name, gen in record["traffic"].items():
        summary, tables = ANALYSES[gen["type"]](trial_dir, record, name, gen, caps)
        generators[name] = summary
        for kind, frame in tables.items():
            frames.setdefault(kind, []).append(frame)
        summary["dscp"], per_flow = dscp_per_flow(caps, name, gen)
        if len(per_flow):
            frames.setdefault("dscp", []).append(per_flow)
    links = {(g["path"].get("bottleneck") or {}).get("link") for g in record["traffic"].values()}
    for link in sorted(n for n in links if n):
        result = bottleneck_queue(trial_dir, record, link, caps)
        if result is not None:
            queues[link], tables = result
            queue_events[link] = tables["queue"]
            for kind, frame in tables.items():
                frames.setdefault(kind, []).append(frame)
    lost_service(record, generators, frames.get("owd", []), queue_events)
    del caps, queue_events  # the captures' packets are read: not held while tables are written
    lockout = rio_lockout(trial_dir, record)
    while frames:  # each kind's parts go once its table is written
        kind, parts = frames.popitem()
        table = addresses_as_strings(pd.concat(parts, ignore_index=True))
        del parts
        table.to_parquet(out_dir / f"{kind}.parquet", index=False)
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
        **({"marking": marking_counters(record)} if record.get("marking") else {}),
        **({"rio_lockout": lockout} if lockout else {}),
    }
    family = FAMILIES.get(record.get("family"))
    if family is not None:
        summary.update(family.trial_summary(record, summary))
    (out_dir / summary_file(trial_dir).name).write_text(
        json.dumps(summary, indent=2, default=float) + "\n"
    )
    return summary
