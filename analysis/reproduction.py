"""A reproduction record: what one batch measured, in a directory meant to be committed
(docs/reproductions/<family>/, `make record`). It holds

    README.md          the batch, the commits, the command that writes the record again
    summary.csv        one row per planned trial: its keys (or the experiment's factors),
                       repetition, status and the family's metrics from its analysis summary
    provenance.json    the rack as the trial records describe it (html_report.provenance.rack)
    report/            the batch's report, standalone (index.html, its tables and figures)

It reads the batch and writes nothing into it: trials without analysis are named, not
analysed. The same batch and code give the same files (rows in key order, no time of writing).
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.batches import attempt_number, batch_trials, ended_attempts
from analysis.families import FAMILIES
from analysis.html_report import FAMILIES as PAGES
from analysis.html_report import provenance, write_report
from core.layout import ATTEMPT_LABEL, RECORD, BatchDir
from core.trial_record import UNREADABLE, RecordError, load_record

__all__ = [
    "FILES",
    "Planned",
    "RecordPathError",
    "check_paths",
    "summary_rows",
    "write_record",
]

README, SUMMARY, PROVENANCE, REPORT = "README.md", "summary.csv", "provenance.json", "report"
FILES = (README, SUMMARY, PROVENANCE, REPORT)
FILE_LIST = ".record-files"  # marks a record's directory: the files it writes there
NOT_RUN = "not run"  # the status of a planned trial without a directory or attempt
GIVEN_UP = "failed"  # no current attempt, only kept ones that failed or died


class RecordPathError(ValueError):
    """The record's directory cannot take a record: the message names it and why."""


@dataclass(frozen=True)
class Planned:
    """A trial of the batch's plan (the trials layer rebuilds it from batch.json)."""

    name: str
    repetition: int | None = None
    overrides: dict[str, Any] | None = None  # the factors' levels; None: unknown


def _read(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        return load_record(path), None
    except RecordError as exc:
        return None, str(exc)


def _trial(batch_dir: Path, name: str) -> dict[str, Any]:
    """What the batch holds of one planned trial: status, a note, the record that says its
    keys (the current one, else its last kept attempt's) and its analysis summary."""
    current = BatchDir(batch_dir).trial(name)
    if current.record.exists():
        record, error = _read(current.record)
        if record is None:
            return {"status": UNREADABLE, "note": error, "record": None, "summary": None}
        status = str(record.get("status"))
        summary, note = None, "; ".join(record.get("errors") or []) or None
        where = current.summary.relative_to(batch_dir)
        if status == "complete" and current.summary.exists():
            try:
                summary = json.loads(current.summary.read_text())
            except (OSError, ValueError) as exc:
                note = f"{where}: unreadable ({exc})"
        elif status == "complete":
            note = f"not analysed (no {where})"
        return {"status": status, "note": note, "record": record, "summary": summary}
    ended = ended_attempts(batch_dir, name)
    if ended:
        record, _ = _read(ended[-1] / RECORD)
        label = ended[-1] / ATTEMPT_LABEL
        note = (
            f"no current attempt: {len(ended)} failed or died mid-trial (the last "
            f"{ended[-1].name.split('-', 1)[-1]}); kept in attempts/{name}/"
        )
        if not label.exists():
            note += f" ({label.name} missing)"
        return {"status": GIVEN_UP, "note": note, "record": record, "summary": None}
    kept = sorted(BatchDir(batch_dir).attempts(name).glob("*-*"), key=attempt_number)
    if kept:  # only attempts the user stopped: the batch runs it again when resumed
        record, _ = _read(kept[-1] / RECORD)
        note = f"no current attempt: {len(kept)} interrupted; kept in attempts/{name}/"
        return {"status": "interrupted", "note": note, "record": record, "summary": None}
    if current.path.exists():
        note = f"{current.path.relative_to(batch_dir)} has no {RECORD} (a run that never ended)"
        return {"status": "partial", "note": note, "record": None, "summary": None}
    return {"status": NOT_RUN, "note": None, "record": None, "summary": None}


def _planned(batch_dir: Path, planned: Iterable[Planned] | None) -> list[Planned]:
    """The planned trials (given, else batch.json's names), then any trial directory with a
    record the plan does not name (a `make trial` batch has no batch.json)."""
    if planned is None:
        listed = _meta(batch_dir).get("trials") or []
        planned = [Planned(t["name"]) for t in listed if isinstance(t, dict) and "name" in t]
    out = list(planned)
    known = {p.name for p in out}
    out += [Planned(t.name) for t in batch_trials(batch_dir) if t.name not in known]
    return out


def _natural(value: Any) -> tuple:
    """A sort key putting numbers in numeric order, texts with numbers in natural order
    (10mbit before 100mbit), missing values last."""
    if value is None or (isinstance(value, float) and value != value):
        return (2,)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value))
    parts = re.split(r"(\d+(?:\.\d+)?)", str(value))
    return (1, tuple((0, float(p)) if i % 2 else (1, p) for i, p in enumerate(parts)))


def summary_rows(
    batch_dir: str | Path, planned: Iterable[Planned] | None = None
) -> tuple[list[str], list[dict[str, Any]]]:
    """summary.csv's columns and rows: one row per planned trial, in the order of its keys
    (the family's RECORD_KEYS, else the experiment's factors), repetition and name. A key
    comes from the trial's analysis summary, else its record (also a failed trial's or its
    last attempt's), else a repetition of the same factors that has one; metrics
    (RECORD_METRICS) only of complete trials, as their summary holds them."""
    batch_dir = Path(batch_dir)
    batch_trials(batch_dir)  # refuses a path that is not a batch
    trials = [(p, _trial(batch_dir, p.name)) for p in _planned(batch_dir, planned)]
    families = sorted({str(t["record"].get("family")) for _, t in trials if t["record"]})
    module = FAMILIES.get(families[0]) if len(families) == 1 else None
    keys = list(getattr(module, "RECORD_KEYS", ()))
    metrics = dict(getattr(module, "RECORD_METRICS", {}))
    if not metrics:  # a family without a record's columns: its report's headline metrics
        metrics = {m: m for f in families for m in getattr(PAGES.get(f), "METRICS", {})}
    rows: list[dict[str, Any]] = []
    by_cell: dict[str, dict[str, Any]] = {}  # the factors' levels -> keys a record gave
    for p, t in trials:
        record, summary = t["record"] or {}, t["summary"] or {}
        overrides = p.overrides if p.overrides is not None else record.get("overrides")
        row: dict[str, Any] = {"trial": p.name, "_factors": overrides}
        if keys:
            row.update(_keys(module, keys, record, summary))
            if overrides is not None and all(row[k] is not None for k in keys):
                by_cell.setdefault(_cell_of(overrides), {k: row[k] for k in keys})
        rep = record.get("repetition")
        row["repetition"] = rep if rep is not None else p.repetition
        row["status"] = t["status"]
        row.update({col: summary.get(key) for col, key in metrics.items()})
        row["note"] = t["note"]
        rows.append(row)
    factors = list(dict.fromkeys(k for r in rows for k in r["_factors"] or {}))
    for row in rows:
        levels = row.pop("_factors")
        if keys and levels is not None:  # no record: its keys as another repetition's record
            got = by_cell.get(_cell_of(levels), {})
            row.update({k: got.get(k) for k in keys if row[k] is None})
        elif not keys:
            row.update({f: (levels or {}).get(f) for f in factors})
    head = ["trial", *(keys or factors), "repetition", "status"]
    columns = [*head, *metrics, "note"]
    rows.sort(key=lambda r: (*(_natural(r[c]) for c in head[1:]), r["trial"]))
    return columns, [{c: r.get(c) for c in columns} for r in rows]


def _cell_of(overrides: dict[str, Any]) -> str:
    """The factors' levels as one text: the repetitions of a cell of the matrix share it."""
    return json.dumps(overrides, sort_keys=True)


def _keys(module: Any, keys: list[str], record: dict, summary: dict) -> dict[str, Any]:
    if all(summary.get(k) is not None for k in keys):
        return {k: summary[k] for k in keys}
    try:
        found = module.record_keys(record) if record else {}
    except (KeyError, StopIteration, TypeError):  # a record cut short before its traffic
        found = {}
    return {k: found.get(k) for k in keys}


def _cell(value: Any) -> str:
    """A CSV field: empty for a missing value; numbers as Python writes them back exactly."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def summary_csv(columns: list[str], rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_cell(r[c]) for c in columns] for r in rows)
    return out.getvalue()


def check_paths(batch_dir: Path, record_dir: Path) -> None:
    """NotABatch when ``batch_dir`` is not a batch, RecordPathError when ``record_dir`` cannot
    take its record (a file, inside the batch, or a directory of other files)."""
    batch_trials(batch_dir)
    if record_dir.resolve().is_relative_to(batch_dir.resolve()):
        raise RecordPathError(f"{record_dir}: inside the batch {batch_dir}; a record reads it only")
    if record_dir.exists() and not record_dir.is_dir():
        raise RecordPathError(
            f"{record_dir}: not a directory (a file); RECORD= names the directory the record "
            "is written into (e.g. docs/reproductions/<family>)"
        )
    if record_dir.is_dir() and not (record_dir / FILE_LIST).exists():
        others = sorted(p.name for p in record_dir.iterdir())
        if others:
            raise RecordPathError(
                f"{record_dir}: holds files that no record wrote ({', '.join(others[:5])}"
                f"{' ...' if len(others) > 5 else ''}; no {FILE_LIST}); give a new or empty "
                "directory, or the directory of an earlier record"
            )


def write_record(
    batch_dir: str | Path,
    record_dir: str | Path,
    *,
    planned: Iterable[Planned] | None = None,
    command: str | None = None,
    code: dict[str, Any] | None = None,
) -> Path:
    """Write the record of ``batch_dir`` into ``record_dir`` and return it. ``planned``: the
    batch's plan (else batch.json's names); ``command``: what writes the record again, and
    ``code``: the git commit and dirty flag of the code writing it, both said in its README.
    Files an earlier record wrote there are replaced (report/ whole); others stay."""
    batch_dir, record_dir = Path(batch_dir), Path(record_dir)
    check_paths(batch_dir, record_dir)
    record_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".record-", dir=record_dir.parent))
    try:
        columns, rows = summary_rows(batch_dir, planned)
        (staging / SUMMARY).write_text(summary_csv(columns, rows))
        recs = provenance.records(batch_dir)
        rack = provenance.rack(recs)
        (staging / PROVENANCE).write_text(json.dumps(rack, indent=1, sort_keys=True) + "\n")
        write_report(batch_dir, staging / REPORT, standalone=True)
        text = readme(batch_dir, columns, rows, rack, command=command, code=code)
        (staging / README).write_text(text)
        (staging / FILE_LIST).write_text("\n".join(FILES) + "\n")
        _move_in(staging, record_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return record_dir


def _move_in(staging: Path, record_dir: Path) -> None:
    record_dir.mkdir(exist_ok=True)
    for path in sorted(staging.iterdir()):
        target = record_dir / path.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        path.replace(target)


def _meta(batch_dir: Path) -> dict[str, Any]:
    """batch.json (empty: none, or not the batch's plan; the report names that)."""
    try:
        meta = json.loads(BatchDir(batch_dir).meta.read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def readme(
    batch_dir: Path,
    columns: list[str],
    rows: list[dict[str, Any]],
    rack: dict[str, Any],
    *,
    command: str | None,
    code: dict[str, Any] | None,
) -> str:
    """README.md of a record: which batch, which code, the command, what each file holds."""
    meta = _meta(batch_dir)
    families = sorted({r.get("family") for r in provenance.records(batch_dir).values()} - {None})
    titles = [getattr(PAGES.get(f), "TITLE", f) for f in families]
    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r["status"])] = counts.get(str(r["status"]), 0) + 1
    ran = [
        f"`{c['commit']}`{' (dirty: uncommitted changes)' if c['dirty'] else ''}, "
        f"{c['trials']} trial(s)"
        for c in rack["code"]
    ]
    experiment = meta.get("experiment") or ", ".join(rack["experiment_files"]) or "?"
    sets = " ".join(f"`{s}`" for s in meta.get("sets") or [])
    only = " ".join(f"`{s}`" for s in meta.get("only") or [])
    lines = [
        f"# Reproduction record: {', '.join(titles) or 'no trial record'}",
        "",
        f"The batch `{batch_dir.name}` (`{batch_dir}`): experiment `{experiment}`"
        + (f", set {sets}" if sets else "")
        + (f", only {only}" if only else "")
        + (f"; begun {meta['created']}" if meta.get("created") else "")
        + ".",
        f"Its trials ran from {rack['first_started']} to {rack['last_stopped']}.",
        "",
        "Planned trials: "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f" ({len(rows)} in all).",
        "",
        "Code the trials ran: " + ("; ".join(ran) or "unknown") + ".",
    ]
    if code:
        dirty = " (dirty: uncommitted changes)" if code.get("dirty") else ""
        lines.append(f"Code that wrote this record: `{code.get('commit')}`{dirty}.")
    if command:
        lines += ["", "Written again, from the batch, by:", "", f"    {command}"]
    lines += [
        "",
        "| file | what it holds |",
        "|---|---|",
        f"| `{REPORT}/index.html` | the batch's report, self-contained (tables, figures, the "
        "paper's published values labelled beside ours, every trial, provenance); its tables "
        "as CSV and figures as PNG beside it |",
        f"| `{SUMMARY}` | one row per planned trial: {', '.join(f'`{c}`' for c in columns)}; "
        "metrics of complete trials only, as each one's analysis/summary.json holds them |",
        f"| `{PROVENANCE}` | what the trial records say of the rack: commits, kernels, tools, "
        "congestion control and queue implementations, delay backend and its lateness, capture "
        "losses |",
        "",
    ]
    return "\n".join(lines)
