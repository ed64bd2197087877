"""A reproduction record: what one batch, or several (a family's experiment files run as
batches of their own), measured, in a directory meant to be committed
(docs/reproductions/<family>/, `make record`). It holds

    README.md          the batches, the commits, the command that writes the record again
    summary.csv        one row per planned trial: its keys (or the experiment's factors),
                       repetition, status and the family's metrics from its analysis summary;
                       of several batches, a first column `batch` names each row's
    provenance.json    the rack as the trial records describe it (html_report.provenance.rack)
    report/            the batches' report, standalone (index.html, its tables and figures)

It reads the batches and writes nothing into them: trials without analysis are named, not
analysed. The same batches and code give the same files (rows in key order, no time of
writing).
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
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
    "record_rows",
    "summary_rows",
    "write_record",
]

README, SUMMARY, PROVENANCE, REPORT = "README.md", "summary.csv", "provenance.json", "report"
FILES = (README, SUMMARY, PROVENANCE, REPORT)
FILE_LIST = ".record-files"  # marks a record's directory: the files it writes there
NOT_RUN = "not run"  # the status of a planned trial without a directory or attempt
GIVEN_UP = "failed"  # no current attempt, only kept ones that failed or died


class RecordPathError(ValueError):
    """The record's directory cannot take a record, or the batches cannot share one: the
    message names the path and why."""


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
    keys, metrics, rows = _batch_rows(Path(batch_dir), planned)
    return ["trial", *keys, "repetition", "status", *metrics, "note"], rows


def record_rows(
    batches: Sequence[Path], plans: Sequence[Iterable[Planned] | None]
) -> tuple[list[str], list[dict[str, Any]]]:
    """summary.csv's columns and rows of the batches, ``plans`` each one's plan (None: its
    batch.json's names). One batch: as summary_rows. Several: a first column `batch` (the
    directory's name, as the report names its trials <batch>/<trial>), each batch's rows in
    its own key order, the batches in the order given; the keys and metrics of all of them
    (a column one batch lacks is empty in its rows)."""
    if len(batches) == 1:
        return summary_rows(batches[0], plans[0])
    parts = [_batch_rows(b, p) for b, p in zip(batches, plans, strict=True)]
    keys = list(dict.fromkeys(k for got, _, _ in parts for k in got))
    metrics = list(dict.fromkeys(m for _, got, _ in parts for m in got))
    columns = ["batch", "trial", *keys, "repetition", "status", *metrics, "note"]
    rows = []
    for b, (_, _, of_batch) in zip(batches, parts, strict=True):
        for row in of_batch:
            named = {"batch": b.name, **row}
            rows.append({c: named.get(c) for c in columns})
    return columns, rows


def _batch_rows(
    batch_dir: Path, planned: Iterable[Planned] | None
) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """One batch's keys (or factors), metric columns and rows in key order (summary_rows)."""
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
    head = [*(keys or factors), "repetition", "status"]
    columns = ["trial", *head, *metrics, "note"]
    rows.sort(key=lambda r: (*(_natural(r[c]) for c in head), r["trial"]))
    return keys or factors, list(metrics), [{c: r.get(c) for c in columns} for r in rows]


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


def check_paths(batch_dir: Path, record_dir: Path, *, more: Sequence[Path] = ()) -> None:
    """NotABatch when ``batch_dir`` or one of ``more`` is not a batch, RecordPathError when two
    batches have one name or ``record_dir`` cannot take their record (a file, inside a batch,
    or a directory of other files)."""
    batches = [Path(batch_dir), *map(Path, more)]
    for batch in batches:
        batch_trials(batch)
    seen: dict[str, Path] = {}
    for batch in batches:  # the record tells their trials apart by the batch's name
        if batch.name in seen:
            raise RecordPathError(
                f"{batch}: named as the batch {seen[batch.name]} is; a record of several "
                "batches names each row and trial by its batch's directory name"
            )
        seen[batch.name] = batch
    for batch in batches:
        if record_dir.resolve().is_relative_to(batch.resolve()):
            raise RecordPathError(f"{record_dir}: inside the batch {batch}; a record reads it only")
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
    more: Sequence[str | Path] = (),
    planned: Iterable[Planned] | Mapping[str | Path, Iterable[Planned] | None] | None = None,
    command: str | None = None,
    code: dict[str, Any] | None = None,
) -> Path:
    """Write the record of ``batch_dir`` and the batches ``more`` into ``record_dir`` and return
    it. ``planned``: the batch's plan, or each batch's by its directory as given (a mapping;
    a batch it lacks, or None: batch.json's names); ``command``: what writes the record again,
    and ``code``: the git commit and dirty flag of the code writing it, both said in its
    README. Files an earlier record wrote there are replaced (report/ whole); others stay."""
    batches, record_dir = [Path(batch_dir), *map(Path, more)], Path(record_dir)
    check_paths(batches[0], record_dir, more=batches[1:])
    plans = _plans(batches, planned)
    record_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".record-", dir=record_dir.parent))
    try:
        columns, rows = record_rows(batches, plans)
        (staging / SUMMARY).write_text(summary_csv(columns, rows))
        recs = provenance.records(batches)
        rack = provenance.rack(recs)
        (staging / PROVENANCE).write_text(json.dumps(rack, indent=1, sort_keys=True) + "\n")
        write_report(batches[0], staging / REPORT, more=batches[1:], standalone=True)
        text = readme(batches, columns, rows, rack, command=command, code=code)
        (staging / README).write_text(text)
        (staging / FILE_LIST).write_text("\n".join(FILES) + "\n")
        _move_in(staging, record_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return record_dir


def _plans(
    batches: list[Path],
    planned: Iterable[Planned] | Mapping[str | Path, Iterable[Planned] | None] | None,
) -> list[Iterable[Planned] | None]:
    """Each batch's plan from write_record's ``planned``."""
    if isinstance(planned, Mapping):
        by_batch = {Path(b): p for b, p in planned.items()}
        return [by_batch.get(b) for b in batches]
    if planned is not None and len(batches) > 1:  # whose plan would it be?
        raise TypeError("planned: of several batches, a mapping of each batch to its plan")
    return [planned, *[None] * (len(batches) - 1)]


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
    batches: list[Path],
    columns: list[str],
    rows: list[dict[str, Any]],
    rack: dict[str, Any],
    *,
    command: str | None,
    code: dict[str, Any] | None,
) -> str:
    """README.md of a record: which batches, which code, the command, what each file holds."""
    families = sorted({r.get("family") for r in provenance.records(batches).values()} - {None})
    titles = [getattr(PAGES.get(f), "TITLE", f) for f in families]
    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r["status"])] = counts.get(str(r["status"]), 0) + 1
    ran = [
        f"`{c['commit']}`{' (dirty: uncommitted changes)' if c['dirty'] else ''}, "
        f"{c['trials']} trial(s)"
        for c in rack["code"]
    ]
    times = f"from {rack['first_started']} to {rack['last_stopped']}."
    lines = [f"# Reproduction record: {', '.join(titles) or 'no trial record'}", ""]
    if len(batches) == 1:
        lines += [f"The batch {_described(batches[0])}.", f"Its trials ran {times}"]
    else:
        lines += [
            f"The {len(batches)} batches (`batch` in {SUMMARY}; the report names their trials "
            "`<batch>/<trial>`):",
            "",
            *(f"- {_described(b)}" for b in batches),
            "",
            f"Their trials ran {times}",
        ]
    lines += [
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
        source = "the batch" if len(batches) == 1 else "the batches"
        lines += ["", f"Written again, from {source}, by:", "", f"    {command}"]
    whose, each = ("batch's", "") if len(batches) == 1 else ("batches' one", " of every batch")
    lines += [
        "",
        "| file | what it holds |",
        "|---|---|",
        f"| `{REPORT}/index.html` | the {whose} report, self-contained (tables, figures, the "
        "paper's published values labelled beside ours, every trial, provenance); its tables "
        "as CSV and figures as PNG beside it |",
        f"| `{SUMMARY}` | one row per planned trial{each}: "
        f"{', '.join(f'`{c}`' for c in columns)}; "
        "metrics of complete trials only, as each one's analysis/summary.json holds them |",
        f"| `{PROVENANCE}` | what the trial records say of the rack: commits, kernels, tools, "
        "congestion control and queue implementations, delay backend and its lateness, capture "
        "losses |",
        "",
    ]
    return "\n".join(lines)


def _described(batch_dir: Path) -> str:
    """A batch as its record's README names it: its directory, experiment file (batch.json's,
    else its trial records'), --set and --only values, and when it began."""
    meta = _meta(batch_dir)
    files = sorted({str(r.get("experiment_file")) for r in provenance.records(batch_dir).values()})
    experiment = meta.get("experiment") or ", ".join(files) or "?"
    sets = " ".join(f"`{s}`" for s in meta.get("sets") or [])
    only = " ".join(f"`{s}`" for s in meta.get("only") or [])
    return (
        f"`{batch_dir.name}` (`{batch_dir}`): experiment `{experiment}`"
        + (f", set {sets}" if sets else "")
        + (f", only {only}" if only else "")
        + (f"; begun {meta['created']}" if meta.get("created") else "")
    )
