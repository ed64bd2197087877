"""What a batch's numbers depend on, from its trials' records (trial.json): the code (git commit
and dirty flag), the kernels and tool versions of every host, the implementation of every
congestion control and queue, the delay backend of every router and its measured error, and
the captures' own losses; as the report's section, and as data (``rack``: a reproduction
record's provenance.json)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.batches import batch_trials
from analysis.dataset import queue_implementation
from analysis.html_report.page import Page
from core.layout import RECORD
from core.trial_record import RecordError, load_record

__all__ = ["fingerprint", "named", "rack", "records", "sections"]


def named(batch_dir: Path, trial: str, several: bool) -> str:
    """A trial's name in a report: <batch>/<trial> when the report has several batches."""
    return f"{batch_dir.name}/{trial}" if several else trial


def _listed(batches: Path | list[Path]) -> list[Path]:
    return batches if isinstance(batches, list) else [batches]


def records(batches: Path | list[Path]) -> dict[str, dict[str, Any]]:
    """trial name -> its trial.json, of one batch; of several: <batch>/<trial> -> it. A
    record that cannot be read is left out (the report's trial list names it)."""
    batches = _listed(batches)
    out = {}
    for batch_dir in batches:
        for t in batch_trials(batch_dir):
            try:
                record = load_record(t / RECORD)
            except RecordError:
                continue
            out[named(batch_dir, record.get("trial", t.name), len(batches) > 1)] = record
    return out


def _by_value(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """value -> sorted names having it."""
    out: dict[str, set[str]] = defaultdict(set)
    for name, value in pairs:
        out[value].add(name)
    return {v: sorted(n) for v, n in sorted(out.items())}


def fingerprint(recs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """One line per thing a batch's results depend on (commit, kernel per host, tool per
    host, delay backend per router): compared between two batches."""
    out: dict[str, set[str]] = defaultdict(set)
    for r in recs.values():
        git = r.get("git") or {}
        out["git commit"].add(f"{git.get('commit')}{' (dirty)' if git.get('dirty') else ''}")
        for host, facts in (r.get("hosts") or {}).items():
            out[f"{host} kernel"].add(str(facts.get("kernel")))
            for tool, version in (facts.get("tools") or {}).items():
                out[f"{host} {tool}"].add(str(version))
        for host, d in (r.get("delay") or {}).items():
            out[f"{host} delay backend"].add(str(d.get("backend")))
    return {k: ", ".join(sorted(v)) for k, v in sorted(out.items())}


def sections(page: Page, batches: Path | list[Path], trials: pd.DataFrame) -> None:
    recs = records(batches)
    page.section("Provenance")
    if not recs:
        page.note("No trial record (trial.json) in this batch.")
        return
    _code(page, recs)
    _kernels(page, recs)
    _tools(page, recs)
    _implementations(page, recs)
    _delay(page, recs, trials)
    _captures(page, recs)
    for batch_dir in _listed(batches):
        experiment = batch_dir / "experiment.yml"
        if experiment.exists():
            page.details(
                f"The experiment file as the batch {batch_dir.name} ran it (experiment.yml)",
                experiment.read_text(),
            )


def code_table(recs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """The git commit and dirty flag of the controller, with the trials that ran each."""
    rows = defaultdict(list)
    for name, r in recs.items():
        git = r.get("git") or {}
        rows[(git.get("commit") or "unknown", bool(git.get("dirty")))].append(name)
    return pd.DataFrame(
        [
            {"commit": c, "dirty": d, "trials": len(n), "names": ", ".join(sorted(n))}
            for (c, d), n in sorted(rows.items())
        ],
        columns=["commit", "dirty", "trials", "names"],
    )


def _code(page: Page, recs: dict[str, dict[str, Any]]) -> None:
    table = code_table(recs)
    page.heading("Code")
    if len(table) > 1:
        page.warn("The trials of this batch ran different code (several commits or dirty states).")
    if table.dirty.any():
        page.note(
            "Dirty: the working tree had uncommitted changes when the trial ran; the commit "
            "alone does not reproduce it."
        )
    page.table(table, "Git commit of the controller per trial", csv="provenance_git.csv")


def kernel_table(recs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """The kernel release of every host, with how many trials ran on each."""
    pairs = defaultdict(list)
    for name, r in recs.items():
        for host, facts in (r.get("hosts") or {}).items():
            pairs[host].append((name, str(facts.get("kernel"))))
    rows = []
    for host in sorted(pairs):
        for kernel, names in _by_value(pairs[host]).items():
            rows.append({"host": host, "kernel": kernel, "trials": len(names)})
    return pd.DataFrame(rows, columns=["host", "kernel", "trials"])


def _kernels(page: Page, recs: dict[str, dict[str, Any]]) -> None:
    table = kernel_table(recs)
    page.heading("Kernels")
    if table.empty:
        page.note("The trial records hold no host facts (kernel, tools).")
        return
    page.table(table, "Kernel release per host", csv="provenance_kernels.csv")


def tool_table(recs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Every tool's version, the hosts that reported it and the number of trials."""
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    trials_with: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name, r in recs.items():
        for host, facts in (r.get("hosts") or {}).items():
            for tool, version in (facts.get("tools") or {}).items():
                seen[(tool, str(version))].add(host)
                trials_with[(tool, str(version))].add(name)
    rows = [
        {"tool": t, "version": v, "hosts": ", ".join(sorted(h)), "trials": len(trials_with[(t, v)])}
        for (t, v), h in sorted(seen.items())
    ]
    return pd.DataFrame(rows, columns=["tool", "version", "hosts", "trials"])


def _tools(page: Page, recs: dict[str, dict[str, Any]]) -> None:
    table = tool_table(recs)
    if table.empty:
        return
    page.heading("Tool versions")
    page.table(table, "Tool versions (hosts reporting each)", csv="provenance_tools.csv")


def cc_table(recs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Which implementation of each congestion control ran (the kernel's module, or a BPF one
    with its source's and object's sha256), with its parameters, hosts and trials."""
    seen: dict[tuple, tuple[set[str], set[str]]] = {}
    for name, r in recs.items():
        for host, per_cc in (r.get("cc_implementation") or {}).items():
            for cc, d in per_cc.items():
                key = (
                    cc,
                    str(d.get("implementation")),
                    d.get("kernel") or "",
                    d.get("source_sha256") or "",
                    d.get("object_sha256") or "",
                    json.dumps(d.get("params") or {}, sort_keys=True),
                )
                hosts, names = seen.setdefault(key, (set(), set()))
                hosts.add(host)
                names.add(name)
    cols = ["cc", "implementation", "kernel", "source_sha256", "object_sha256", "params"]
    rows = [
        {**dict(zip(cols, key, strict=True)), "hosts": ", ".join(sorted(h)), "trials": len(n)}
        for key, (h, n) in sorted(seen.items())
    ]
    return pd.DataFrame(rows, columns=[*cols, "hosts", "trials"])


def queue_table(recs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Every shaped egress: its link, router, queue and what implemented it (tc's qdisc or
    dummynet), rate, buffer and delay, with the number of trials that had it."""
    seen: dict[tuple, set[str]] = defaultdict(set)
    for name, r in recs.items():
        for e in (r.get("network") or {}).get("egress") or []:
            key = tuple(
                str(e.get(k) or "")
                for k in ("link", "host", "iface", "qdisc", "rate", "buffer", "delay")
            )
            seen[(*key, queue_implementation(e, r.get("delay") or {}))].add(name)
    cols = ["link", "host", "iface", "qdisc", "rate", "buffer", "delay", "implementation"]
    rows = [{**dict(zip(cols, k, strict=True)), "trials": len(n)} for k, n in sorted(seen.items())]
    return pd.DataFrame(rows, columns=[*cols, "trials"])


def _implementations(page: Page, recs: dict[str, dict[str, Any]]) -> None:
    cc, queues = cc_table(recs), queue_table(recs)
    if cc.empty and queues.empty:
        return
    page.heading("Congestion controls and queues")
    if not cc.empty:
        page.table(
            cc,
            "Implementation of each congestion control (the kernel's module, or a BPF one "
            "with its source's and object's sha256) and its parameters",
            csv="provenance_cc.csv",
        )
    if not queues.empty:
        page.table(
            queues, "Shaped egress queues and their implementation", csv="provenance_queues.csv"
        )


def delay_table(recs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Per router: its delay backend, where it delays, the delay line's lateness (worst over
    the trials and queues; none for netem) and its stalls over 2 ms."""
    rows = []
    for host in sorted({h for r in recs.values() for h in (r.get("delay") or {})}):
        backends: set[str] = set()
        positions: set[str] = set()
        late_mean: list[float] = []
        late_p99: list[float] = []
        late_max: list[float] = []
        stalls = stalled_us = 0
        for r in recs.values():
            d = (r.get("delay") or {}).get(host)
            if not d:
                continue
            backends.add(str(d.get("backend")))
            positions.add(str(d.get("position")))
            stats = d.get("delayline_stats") or {}
            for q in stats.get("queues") or []:
                lat = q.get("lateness_us") or {}
                if lat.get("count"):
                    late_mean.append(lat["mean"])
                    late_p99.append(lat["p99"])
                    late_max.append(lat["max"])
            st = stats.get("stalls") or {}
            stalls += int(st.get("count") or 0)
            stalled_us += int(st.get("total_us") or 0)
        rows.append(
            {
                "router": host,
                "backend": ", ".join(sorted(backends)),
                "where": "; ".join(sorted(positions)),
                "lateness_mean_us": max(late_mean) if late_mean else None,
                "lateness_p99_us": max(late_p99) if late_p99 else None,
                "lateness_max_us": max(late_max) if late_max else None,
                "stalls": stalls if late_mean else None,
                "stalled_ms": stalled_us / 1000 if late_mean else None,
            }
        )
    return pd.DataFrame(rows)


def _delay(page: Page, recs: dict[str, dict[str, Any]], trials: pd.DataFrame) -> None:
    page.heading("Delay emulation and its measured error")
    table = delay_table(recs)
    if table.empty:
        page.note("The trial records name no delay backend (no router delayed traffic).")
    else:
        page.table(
            table,
            "Delay backend per router; lateness of the user-space delay line (worst over the "
            "batch's trials and queues; – for netem, which reports none), router stalls > 2 ms",
            csv="provenance_delay.csv",
            digits={"lateness_mean_us": 0, "lateness_p99_us": 0, "lateness_max_us": 0},
        )
    excess = pd.to_numeric(trials.get("owd_min_excess_ms", pd.Series(dtype=float)), "coerce")
    excess = excess.dropna()
    if len(excess):
        page.text(
            "End-to-end check of the added delay: the smallest UDP one-way delay minus RTT/2 "
            f"(serialization and the delay's own error) is {np.min(excess):.2f} ms at least, "
            f"{np.median(excess):.2f} ms median, {np.max(excess):.2f} ms at most over "
            f"{len(excess)} trial(s)."
        )


def capture_table(recs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Every capture of every trial: packets captured and dropped by the kernel."""
    rows = []
    for name, r in recs.items():
        for point, c in (r.get("capture") or {}).items():
            rows.append(
                {
                    "trial": name,
                    "capture": point,
                    "captured": c.get("captured"),
                    "dropped_by_kernel": c.get("dropped_by_kernel"),
                }
            )
    return pd.DataFrame(rows, columns=["trial", "capture", "captured", "dropped_by_kernel"])


def _captures(page: Page, recs: dict[str, dict[str, Any]]) -> None:
    table = capture_table(recs)
    if table.empty:
        return
    lost = table[table.dropped_by_kernel.fillna(0) > 0]
    page.heading("Captures")
    if lost.empty:
        page.text(
            f"No capture lost a packet (kernel drop counters of {len(table)} captures over "
            f"{table.trial.nunique()} trials are all zero)."
        )
    else:
        page.warn(
            f"{len(lost)} capture(s) lost packets in the kernel: their trials' figures are "
            "computed from incomplete captures."
        )
        page.table(lost, "Captures with kernel drops", csv="provenance_capture_drops.csv")


def _rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    """A table's rows as JSON values (a missing value: null)."""
    return [
        {
            k: (None if v is None or (isinstance(v, float) and np.isnan(v)) else v)
            for k, v in r.items()
        }
        for r in json.loads(table.to_json(orient="records"))
    ]


def rack(recs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the trial records say the batch ran on, as JSON values: the code, the trials' first
    start and last stop, every host's kernel and tools, each congestion control's and queue's
    implementation, the delay backend and its lateness, captures that lost packets."""
    times = [r.get("times") or {} for r in recs.values()]
    started = sorted(str(t["started"]) for t in times if t.get("started"))
    stopped = sorted(str(t["stopped"]) for t in times if t.get("stopped"))
    code = code_table(recs)
    code["names"] = code.names.str.split(", ")
    cc = cc_table(recs)
    cc["params"] = cc.params.map(json.loads)
    for col in ("kernel", "source_sha256", "object_sha256"):  # "" only to sort by: none
        cc[col] = [v or None for v in cc[col]]
    captures = capture_table(recs)
    lost = captures[captures.dropped_by_kernel.fillna(0) > 0]
    return {
        "trials": len(recs),
        "experiment_files": sorted({str(r.get("experiment_file")) for r in recs.values()}),
        "first_started": started[0] if started else None,
        "last_stopped": stopped[-1] if stopped else None,
        "code": _rows(code),
        "kernels": _rows(kernel_table(recs)),
        "tools": _rows(tool_table(recs)),
        "congestion_controls": _rows(cc),
        "queues": _rows(queue_table(recs)),
        "delay": _rows(delay_table(recs)),
        "captures": {"count": len(captures), "with_kernel_drops": _rows(lost)},
        "inventories": sorted({str(p) for r in recs.values() for p in r.get("inventory") or []}),
    }
