"""One trial's captures -> per-generator metrics (dispatched on the generator's type) and the
queue of every bottleneck; written as parquet and summary.json beside the captures.

Everything here is computed from packets, never from a tool's own report (iperf3's JSON only
says which connections carry data). It reads trial.json and the captures; it does not import
the runner. Each capture is read once (analysis/scan.py) and one at a time: every analysis
(each generator's, its DSCP, each bottleneck's queue) says first what it needs of which
capture (analysis.captures.Want), then takes it while that capture is held.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from analysis.batches import summary_file
from analysis.bottleneck import (
    TC_SAMPLES,
    Bottleneck,
    egress,
    link_delay_ns,
    queue_drops_counted,
    tc_drops,
)
from analysis.captures import Captures, Seen, Want
from analysis.dscp import Dscp, marking_counters
from analysis.families import FAMILIES
from analysis.gred_lockout import gred_lockout
from analysis.resources import cpus, give_memory_back
from analysis.scan import scan
from analysis.tables import Tables
from analysis.traffic import ANALYSES
from analysis.traffic.bulk_tcp import share_first_syn
from analysis.traffic.cbr_udp import judge_lost_service
from core.layout import RECORD
from core.link_rules import DEFAULT_QDISC, qdisc_of
from core.trial_record import load_record
from core.units import parse_duration_ns

__all__ = ["analyse_trial", "queue_drops_counted", "tc_drops"]


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


def _endpoints(record: dict[str, Any], kind: str) -> int:
    """How many addresses the generators of a type send from (or to), at most."""
    gens = [g for g in record["traffic"].values() if g["type"] == kind]
    return max(len({g["src"] for g in gens}), len({g["dst"] for g in gens}), 1)


def _fifo_udp(record: dict[str, Any], link: str) -> bool:
    """Whether a cbr_udp generator crosses ``link`` at a drop-tail queue (the lost service
    is read of its departures)."""
    for gen in record["traffic"].values():
        b = gen["path"].get("bottleneck") or {}
        if gen["type"] != "cbr_udp" or b.get("link") != link:
            continue
        if qdisc_of(egress(record, b["host"], b["iface"])) == DEFAULT_QDISC:
            return True
    return False


def lost_service(
    record: dict[str, Any], generators: dict[str, Any], tables: Tables, queues: dict
) -> None:
    """How late each UDP generator's bottleneck served its packets against its rate, read from
    the packets (analysis.stalls.lost_service_ns): the emulated link's fidelity, in each such
    generator's summary and OWD table. The packets that left over 2 ms late are judged apart,
    beside those in transit during a stall the router recorded (its user-space delay line;
    netem records none).
    Only for a FIFO queue (drop-tail): it assumes packets leave in the order they entered."""
    owd_frames = tables.parts.get("owd", [])
    for name, gen in record["traffic"].items():
        b = gen["path"].get("bottleneck") or {}
        summary = generators[name]
        if gen["type"] != "cbr_udp" or "udp_packets" not in summary:
            continue
        if b.get("link") not in queues:
            continue
        if qdisc_of(egress(record, b["host"], b["iface"])) != DEFAULT_QDISC:
            continue
        (owd,) = [f for f in owd_frames if len(f) and f["generator"].iloc[0] == name]
        lost = queues[b["link"]].lost_service(
            owd.ts_ns.to_numpy(),
            owd.ts_out_ns.to_numpy(),
            link_delay_ns(record, b["host"], b["iface"]),
            b["rate_bps"],
        )
        summary.update(judge_lost_service(owd, lost, summary.get("router_stalls_from")))


def analyse_trial(trial_dir: Path, catalog: bool = True) -> dict[str, Any]:
    """Analyse the trial into ``analysis/`` (its tables and summary.json). The tables are
    written into a directory beside it that replaces it only once the summary is written: a
    run that fails keeps the earlier analysis whole (tables and summary of one run), and
    tables the current code no longer writes do not stay beside new ones. ``catalog``: its
    rows put into its batch's files of the results catalog (False: the caller writes the
    whole batch's once its trials are analysed)."""
    record = load_record(trial_dir / RECORD)
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
    if catalog:
        from analysis.dataset import add_trial  # pandas: only once the captures are read

        add_trial(trial_dir)  # the trial's rows in its results' catalog (none outside a batch)
    return summary


def _read_captures(caps: Captures, record: dict[str, Any], analyses: list) -> None:
    """Each capture some analysis wants, read once, one at a time, shown to the analyses that
    want it; in path order (a queue's packets are matched as soon as the capture after it is
    read: its ``settle`` step, once that capture's packets are let go)."""
    wants: dict[str, Want] = {}
    for a in analyses:
        for point, want in a.wants().items():
            wants.setdefault(point, Want()).add(want)
    first: dict[str, int] = {}  # each capture's earliest position on a generator's path
    for gen in record["traffic"].values():
        for name, pos in caps.positions(gen["path"]["hops"]).items():
            first[name] = min(first.get(name, pos), pos)
    listed = list(caps.sites)
    for point in sorted(wants, key=lambda p: (first.get(p, len(listed)), listed.index(p))):
        w = wants[point]
        cap = scan(
            caps.path(point),
            matched=sorted(w.matched) if w.matched else None,
            detailed=sorted(w.detailed) if w.detailed else None,
        )
        seen = Seen(point, cap, w.times)
        mine = [a for a in analyses if point in a.wants()]
        for a in mine:
            a.ask(seen)
        seen.run_acks()
        for a in mine:
            a.take(seen)
        del seen
        cap.release()
        del cap
        for a in mine:
            if hasattr(a, "settle"):
                a.settle(point)


class _Ahead:
    """The generators' finish, each with the next ones' cwnd read meanwhile (their tcp_probe
    recordings parsed in threads of their own, as many at once as the compiled passes may
    use CPUs: the parsing lets the other threads run)."""

    def __init__(self, analyses: dict[str, Any]) -> None:
        self.analyses = analyses
        self.order = [n for n, a in analyses.items() if hasattr(a, "cwnd_job")]
        self.running: dict[str, Future] = {}
        self.started = 0  # how many of ``order`` were given their chance to start

    def __enter__(self) -> _Ahead:
        depth = cpus()
        self.pool = ThreadPoolExecutor(depth, thread_name_prefix="cwnd")
        for _ in range(depth):
            self._start_next()
        return self

    def __exit__(self, *_exc) -> None:
        self.pool.shutdown(cancel_futures=True)

    def _start_next(self) -> None:
        if self.started < len(self.order):
            name = self.order[self.started]
            self.started += 1
            job = self.analyses[name].cwnd_job()
            if job is not None:
                self.running[name] = self.pool.submit(job)

    def finish(self, name: str):
        if name in self.order:
            self._start_next()
        analysis = self.analyses.pop(name)
        if name in self.running:
            return analysis.finish(cwnd=self.running.pop(name))
        return analysis.finish()


def _analyse_into(trial_dir: Path, record: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    caps = Captures(trial_dir, record)
    traffic = record["traffic"]
    per_generator = {
        name: ANALYSES[gen["type"]](trial_dir, record, name, gen, caps)
        for name, gen in traffic.items()
    }
    dscp = {name: Dscp(name, gen, caps) for name, gen in traffic.items()}
    links = {(g["path"].get("bottleneck") or {}).get("link") for g in traffic.values()}
    queues = {
        link: Bottleneck(trial_dir, record, link, caps) for link in sorted(n for n in links if n)
    }
    _read_captures(caps, record, [*per_generator.values(), *dscp.values(), *queues.values()])
    give_memory_back()  # what reading them took and let go
    share_first_syn(per_generator.values())  # the startup table's origin, across captures
    tables = Tables(out_dir)
    try:
        summaries = {}  # the queues first: their matched packets go before the rest is read
        for link, queue in queues.items():
            if queue.ok:
                summaries[link] = queue.finish(tables, _fifo_udp(record, link))
                give_memory_back()  # what the tables' pieces took: not held on
        generators: dict[str, Any] = {}
        senders = _endpoints(record, "bulk_tcp")  # cwnd's addresses: its parts go out at once
        with _Ahead(per_generator) as ahead:
            for name in traffic:
                summary, parts = ahead.finish(name)
                generators[name] = summary
                for kind, frame in parts.items():
                    tables.add(kind, frame, senders if kind == "cwnd" else None)
                del parts
                give_memory_back()
                summary["dscp"], per_flow = dscp.pop(name).finish()
                if len(per_flow):
                    tables.add("dscp", per_flow)
        lost_service(record, generators, tables, {k: queues[k] for k in summaries})
        del queues  # their departures: not held while the tables are written
        lockout = rio_lockout(trial_dir, record)
        tables.write()
    finally:
        tables.close()
    summary = {
        "trial": record["trial"],
        "id": record.get("id"),
        "status": record["status"],
        "family": record.get("family"),
        "repetition": record.get("repetition"),
        **{f"factor:{k}": v for k, v in (record.get("overrides") or {}).items()},
        "generators": generators,
        "queues": summaries,
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
