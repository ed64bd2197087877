"""The trial record as the runner fills it in: provenance, and what the counters the trial read
before and after (marking, pacing, RIO, captures) say happened."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analysis.ipfw_samples import rio_queue_deltas
from collect.fetch import write_manifest, write_whole
from collect.pcap_count import pcap_packets
from core.dscp import counter_delta, nft_rule_counters, parse_dscp
from core.layout import TrialDir
from core.link_rules import DUMMYNET_RIO_LABEL, dummynet_fixed_point
from core.rack import PROJECT_DIR, Rack
from core.rio import counters_delta, gred_counters
from core.rio import high_dscp as rio_high_dscp
from core.rio_bpf import counters_delta as rio_bpf_counters
from core.rio_bpf import shown as rio_bpf_shown
from core.trial_record import dump_record, new_record
from trials import adaptive_marking
from trials.bpf_cc import bpf_cc_provenance
from trials.generators import TrafficGenerator
from trials.host_commands import dummynet_rio_queues
from trials.network import Egress, ResolvedNetwork
from trials.plan import Trial
from trials.spec import HostSettings


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(PROJECT_DIR), *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def started_record(
    trial: Trial,
    source: str,
    batch: str,
    rack: Rack,
    net: ResolvedNetwork,
    settings: dict[str, HostSettings],
    generators: list[TrafficGenerator],
) -> dict[str, Any]:
    """A trial's record as it starts: what it is, where it came from, what it will run."""
    exp = trial.experiment
    return new_record(
        trial=trial.name,
        id=trial.id,
        batch=batch,
        status="running",
        experiment_file=source,
        experiment_digest=exp.digest(),
        family=exp.experiment,
        overrides=trial.overrides,
        repetition=trial.repetition,
        parameters=trial.parameters(),
        git=git_state(),
        # Absolute: a batch resumed from another directory finds the rack it ran on.
        inventory=[str(Path(p).resolve()) for p in rack.inventory],
        network=net.record(),
        host_settings={
            n: s.model_dump(mode="json", exclude_none=True) for n, s in settings.items()
        },
        traffic={
            g.name: {**g.record(), "path": net.path_summary(g.spec.from_, g.spec.to)}
            for g in generators
        },
        times={"started": now_iso()},
        errors=[],
    )


def cc_implementations(
    net: ResolvedNetwork, settings: dict[str, HostSettings], facts: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per host and congestion control it was given: which implementation ran (the kernel's
    module or the BPF one of hostside/bpf_cc, with its hashes and parameters)."""
    out: dict[str, dict[str, Any]] = {}
    for node, s in settings.items():
        host = net.host_of(node)
        if s.cc and host in facts:
            out.setdefault(host, {})[s.cc] = bpf_cc_provenance(
                facts[host], s.cc, s.cc_implementation
            )
    return out


def pacing_record(trial_dir: Path, pacing: dict[str, list[str]]) -> dict[str, Any]:
    """Per pacing host and interface: its root qdisc during the trial and the packets and
    bytes that went through it (after minus before): that the flows were paced by fq."""
    out: dict[str, Any] = {}
    for host, ifaces in pacing.items():
        for iface in ifaces:
            files = [trial_dir / host / f"pacing_{iface}_{t}.json" for t in ("before", "after")]
            if not all(f.exists() for f in files):
                continue
            before, after = ((json.loads(f.read_text()) or [{}])[0] for f in files)
            out.setdefault(host, {})[iface] = {
                "qdisc": after.get("kind"),
                "packets": after.get("packets", 0) - before.get("packets", 0),
                "bytes": after.get("bytes", 0) - before.get("bytes", 0),
            }
    return out


def rio_record(
    trial_dir: Path, net: ResolvedNetwork, delay: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Per RIO egress (host:iface): its virtual queues as configured (thresholds in packets
    and in bytes, the mean packet size that converted them, w_q asked and used), which
    implementation was asked (network.links[].rio.implementation) and which ran, and what each
    VQ counted during the trial (GRED's counters, after
    minus before; or the BPF RIO's per level, rio_record_bpf). On a FreeBSD router, the
    dummynet approximation instead (rio_record_dummynet); `delay`: trial.json's delay record
    (the routers' delay_backend.json), which labels both."""
    out: dict[str, Any] = {}
    for e in net.egress:
        if e.shaping.qdisc != "rio":
            continue
        entry: dict[str, Any] = {
            "link": e.link,
            "direction": e.direction,
            "in_dscp": [parse_dscp(d) for d in e.shaping.rio.in_dscp],  # type: ignore[union-attr]
            "asked": e.shaping.rio.implementation,  # type: ignore[union-attr]
        }
        if high := rio_high_dscp(e.shaping.rio.settings()):  # type: ignore[union-attr]
            entry["high_dscp"] = high
        if net.runs_freebsd(e.host):
            backend = ((delay or {}).get(e.host) or {}).get("rio") or {}
            entry.update(rio_record_dummynet(trial_dir, net, e, backend.get(e.iface) or {}))
            out[f"{e.host}:{e.iface}"] = entry
            continue
        entry["virtual_queues"] = [vq.record() for vq in e.shaping.virtual_queues()]
        router = (delay or {}).get(e.host) or {}
        if bpf := rio_record_bpf(trial_dir / e.host, e.iface, router):
            entry.update(bpf)
            out[f"{e.host}:{e.iface}"] = entry
            continue
        entry["implementation"] = "gred"
        files = [trial_dir / e.host / f"gred_{e.iface}_{t}.json" for t in ("before", "after")]
        if all(f.exists() and f.stat().st_size for f in files):
            before, after = (gred_counters(f.read_text()) for f in files)
            entry["counters"] = {str(dp): c for dp, c in counters_delta(before, after).items()}
        else:
            entry["error"] = "no GRED counters (tc -s -j qdisc show) came back"
        out[f"{e.host}:{e.iface}"] = entry
    return out


def rio_record_bpf(host_dir: Path, iface: str, router: dict[str, Any]) -> dict[str, Any]:
    """A rio egress that ran the BPF RIO (roles/linux_router's record says so, or its loader
    showed a program there): the implementation, its source's sha256 and settings as the
    router recorded them, the program as the kernel held it after the trial (id, parameters)
    and what it counted per level in GRED's names (core/rio_bpf.counters_delta); {} for GRED."""
    shown = rio_bpf_shown(host_dir, iface)
    recorded = (router.get("rio_bpf") or {}).get(iface)
    if router.get("rio_implementation") != "bpf" and not shown["after"].get("prog_id"):
        return {}
    entry: dict[str, Any] = {"implementation": "bpf"}
    if recorded:
        entry["bpf"] = {k: recorded.get(k) for k in ("source", "source_sha256", "mode", "backlog")}
    after = shown["after"]
    if not after.get("prog_id"):
        entry["error"] = f"no BPF RIO on {iface} after the trial (trialbed_rio.py show)"
        return entry
    entry.setdefault("bpf", {}).update(prog_id=after["prog_id"], params=after.get("params"))
    if shown["before"].get("prog_id") != after["prog_id"]:
        entry["error"] = "the BPF RIO was attached again during the trial: counters from zero"
    entry["counters"] = {
        str(level): c for level, c in rio_bpf_counters(shown["before"], after).items()
    }
    return entry


def rio_record_dummynet(
    trial_dir: Path, net: ResolvedNetwork, e: Egress, backend: dict[str, Any]
) -> dict[str, Any]:
    """A rio egress of a FreeBSD router: the approximation's label (the router's record,
    `backend`: its delay_backend.json's rio entry of the interface), the virtual queues as
    configured in packets (dummynet's queues count slots: no bytes), the IN and OUT queue
    numbers, and what each queue counted during the trial (`ipfw queue show`, after minus
    before), under "0" (IN) and "1" (OUT) as GRED's VQs are."""
    queues = dummynet_rio_queues(net, e.host)[e.iface]
    vqs = e.shaping.virtual_queues()
    slots = backend.get("queue_slots") or vqs[0].limit // vqs[0].mean_packet
    entry: dict[str, Any] = {
        "approximation": backend.get("rio") or DUMMYNET_RIO_LABEL,
        "virtual_queues": [
            {
                "dp": vq.dp,
                "precedence": vq.precedence,
                "queue": queues[vq.precedence],
                "min_packets": vq.min_packets,
                "max_packets": vq.max_packets,
                "pmax": vq.pmax,
                "w_q": vq.w_q,
                "w_q_effective": dummynet_fixed_point(vq.w_q),
                "limit_packets": slots,
            }
            for vq in vqs
        ],
        "pipe": net.dummynet_pipes(e.host)[e.iface],
        "queues": queues,
    }
    listed = f"ipfw queue show {queues['in']} {queues['out']}"
    if backend.get("queues") not in (None, queues):
        entry["error"] = (
            f"the router's record numbers the queues {backend['queues']}, the runner "
            f"{queues}: no counters read"
        )
        return entry
    deltas = rio_queue_deltas(trial_dir / e.host, e.iface)
    if deltas is None:
        entry["error"] = f"no dummynet queue counters ({listed}) came back"
        return entry
    entry["counters"] = {"0": deltas["in"], "1": deltas["out"]}
    return entry


def marking_record(trial_dir: Path, net: ResolvedNetwork) -> dict[str, Any]:
    """Per marking host and rule: what its counter counted during the trial (after minus
    before) and the DSCP it sets; a host whose listings did not come back says so."""
    out: dict[str, Any] = {}
    for host in sorted(net.marking):
        files = [trial_dir / host / f"dscp_counters_{t}.json" for t in ("before", "after")]
        if not all(f.exists() and f.stat().st_size for f in files):
            out[host] = {"error": "no counters (nft -j list table) came back"}
            continue
        before, after = (nft_rule_counters(f.read_text()) for f in files)
        out[host] = counter_delta(before, after)
    return out


# Where the overhead goes: (phase, from, to) over the times a trial records.
OVERHEAD_PHASES = (
    ("configure", "started", "configured"),
    ("arm", "configured", "armed"),
    ("lead", "armed", "t0"),
    ("stop", "traffic_done", "stopped"),
    ("collect", "stopped", "collected"),
)


def _epoch(value: Any) -> float:
    return (
        float(value)
        if isinstance(value, int | float)
        else datetime.fromisoformat(value).timestamp()
    )


def overhead_phases(times: dict[str, Any]) -> dict[str, float]:
    """Seconds per phase of the overhead, for the phases the trial went through."""
    return {
        phase: round(_epoch(times[b]) - _epoch(times[a]), 2)
        for phase, a, b in OVERHEAD_PHASES
        if a in times and b in times
    }


def overhead_s(times: dict[str, Any]) -> float | None:
    """Seconds the trial spent outside its traffic and queue drain: configure, arm, start
    lead, stop, collect (what a batch pays per trial beyond the experiment itself)."""
    if "t0" not in times or "traffic_done" not in times:
        return None
    whole = datetime.fromisoformat(times["collected"]) - datetime.fromisoformat(times["started"])
    traffic = datetime.fromisoformat(times["traffic_done"]).timestamp() - times["t0"]
    return round(whole.total_seconds() - traffic, 2)


def capture_stats(trial_dir: Path, net: ResolvedNetwork) -> dict[str, dict[str, int]]:
    """tcpdump's own counters (captured, received by filter, dropped by kernel) per capture
    point, and the packets its file holds (`in_file`)."""
    out = {}
    for c in net.captures:
        log = trial_dir / c.host / f"{c.name}.tcpdump.log"
        counts = {}
        if log.exists():
            for line in log.read_text().splitlines():
                words = line.split()
                if len(words) >= 3 and words[0].isdigit():
                    counts[" ".join(words[2:]).replace(" ", "_")] = int(words[0])
        pcap = trial_dir / c.host / f"{c.name}.pcap"
        if pcap.exists():
            counts["in_file"] = pcap_packets(pcap)
        out[c.name] = counts
    return out


def truncated_captures(stats: dict[str, dict[str, int]], net: ResolvedNetwork) -> list[str]:
    """Capture points whose file holds fewer packets than tcpdump captured (a full disk), or
    that captured fewer than the kernel passed their filter and did not drop (packets still in
    the ring when tcpdump stopped)."""
    out = []
    for c in net.captures:
        counts = stats.get(c.name, {})
        if "captured" in counts and counts.get("in_file", 0) < counts["captured"]:
            out.append(
                f"capture {c.name} on {c.host}: its file holds {counts.get('in_file', 0)} of "
                f"the {counts['captured']} packets tcpdump captured (was its disk full?)"
            )
        # On lo the kernel passes each packet twice (out and in) and libpcap drops one copy.
        handed = counts.get("received_by_filter", 0) - counts.get("dropped_by_kernel", 0)
        if c.iface != "lo" and "captured" in counts and counts["captured"] < handed:
            out.append(
                f"capture {c.name} on {c.host}: tcpdump captured {counts['captured']} of the "
                f"{handed} packets its filter passed and the kernel kept (stopped before it "
                f"had read them all)"
            )
    return out


def complete(
    trial_dir: Path,
    net: ResolvedNetwork,
    generators: list[TrafficGenerator],
    record: dict[str, Any],
    pacing: dict[str, list[str]],
    nfqueue: list[str],
) -> None:
    """Once the trial's files are back: what they say goes into the record (markers, the delay
    line, the tools' own problems, capture counts, marking, pacing and RIO counters, overhead),
    and a trial whose tools or captures fell short is failed."""
    adaptive_marking.collect(trial_dir, record)
    for host in nfqueue:
        stats = trial_dir / host / "delayline_stats.json"
        if stats.exists() and host in record.get("delay", {}):
            record["delay"][host]["delayline_stats"] = json.loads(stats.read_text())
    if record["status"] in ("complete", "failed") and "t0" in record["times"]:
        # The tools' own words (a refused connection, an empty report): the cause when
        # the trial completed, what a failure did to them otherwise.
        for g in generators:
            record["errors"].extend(g.problems(trial_dir))
        if record["errors"]:
            record["status"] = "failed"
    record["capture"] = capture_stats(trial_dir, net)
    cut_short = truncated_captures(record["capture"], net)
    if cut_short:
        record["errors"].extend(cut_short)
        if record["status"] != "interrupted":  # the user's stop stays the cause
            record["status"] = "failed"
    if net.marking:
        record["marking"] = marking_record(trial_dir, net)
    if pacing:
        record["pacing"] = pacing_record(trial_dir, pacing)
    if any(e.shaping.qdisc == "rio" for e in net.egress):
        record["rio"] = rio_record(trial_dir, net, record.get("delay"))
    record["times"]["collected"] = now_iso()
    record["overhead_s"] = overhead_s(record["times"])
    record["overhead_phases_s"] = overhead_phases(record["times"])


def write_record(trial_dir: Path, record: dict[str, Any]) -> None:
    """trial.json whole or not at all (a full disk must not leave half a record behind), then
    the manifest of every file of the trial."""
    where = TrialDir(trial_dir)
    write_whole(where.record, dump_record(record))
    write_manifest(trial_dir)


def read_record_dict(trial_dir: Path) -> dict[str, Any]:
    """The trial's record as written, as a dict ({} when there is none or it is unreadable)."""
    try:
        return json.loads(TrialDir(trial_dir).record.read_text())
    except (OSError, ValueError):
        return {}


def failed_record(trial_dir: Path, trial: Trial, exc: BaseException) -> dict[str, Any]:
    """The failed trial's record as written, or (when the final one could not be written, and
    the one on disk still says it runs) its cause."""
    record = read_record_dict(trial_dir)
    if record.get("status") == "failed" and record.get("errors"):
        return record
    return {"trial": trial.name, "status": "failed", "errors": [str(exc)]}


def record_failure(trial_dir: Path, name: str, cause: str) -> None:
    """Make sure the trial's own record says failed and why (a configure error raises before
    the runner wrote anything, a collect error after it wrote 'complete')."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    record = read_record_dict(trial_dir) or {"trial": name, "errors": []}
    record["status"] = "failed"
    if cause not in record.setdefault("errors", []):
        record["errors"].append(cause)
    write_whole(TrialDir(trial_dir).record, dump_record(record))  # a full disk: the old one whole
