"""Results API: batches as tidy pandas tables.

    import analysis
    trials = analysis.load("results/20261122T061959Z-startup_lswan")     # one row per trial
    trials = analysis.load(["results/night-1", "results/night-2"])       # several batches
    trials = analysis.load("results")          # every batch under a results directory
    flows = analysis.load_table("results", "flows")   # per-flow rows of every trial

One row per trial: ``batch``, ``trial``, ``dir`` (where its files are), ``id``, ``status``
(complete / interrupted / failed), ``family``, ``repetition``, git commit and dirty flag,
start time, every experiment parameter as ``param:<path>`` (e.g.
``param:network.links[bottleneck].rate``, ``param:duration``), the factors the matrix varied
as ``factor:<key>``, and every scalar metric of the trial's analysis (analysis/summary.json)
as ``<generator>.<metric>``, ``queue[<link>].<metric>`` or the family's own name. Lists of
numbers (per-flow values) appear as JSON text; the per-flow and per-packet rows are in the
per-trial parquet tables, which ``load_table`` concatenates with ``batch`` and ``trial``
columns.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = [
    "NotABatch",
    "batch_trials",
    "load",
    "load_table",
    "summary_file",
    "trial_dir",
    "trial_dirs",
]

_PathLike = str | Path


class NotABatch(FileNotFoundError):
    """A path given as a batch is not one: the message names it and the batches under it."""


def _batches_in(p: Path) -> list[Path]:
    """The batch directories (each with a trials/ folder) directly under ``p``, by name."""
    return sorted(c for c in p.iterdir() if (c / "trials").is_dir())


def _refuse(p: Path) -> NotABatch:
    if not p.exists():
        return NotABatch(f"{p}: no such batch directory")
    if not p.is_dir():
        return NotABatch(f"{p}: not a batch directory (a file)")
    under = [b.name for b in _batches_in(p)]
    if under:
        shown = ", ".join(under[:5]) + (f" and {len(under) - 5} more" if len(under) > 5 else "")
        return NotABatch(f"{p}: not a batch directory (no trials/ in it); batches in it: {shown}")
    return NotABatch(f"{p}: not a batch directory (no trials/ in it, nor a batch under it)")


def batch_trials(batch_dir: _PathLike) -> list[Path]:
    """The trial directories of one batch (each with a trial.json), in name order; a path
    that is not a batch (no trials/ in it) is refused with :class:`NotABatch`."""
    p = Path(batch_dir)
    if not (p / "trials").is_dir():
        raise _refuse(p)
    return [t.parent for t in sorted((p / "trials").glob("*/trial.json"))]


def attempt_number(attempt_dir: Path) -> int:
    """The n of attempts/<trial>/<n>-<status> (0 for anything else)."""
    head = attempt_dir.name.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def ended_attempts(batch_dir: Path, trial: str) -> list[Path]:
    """The trial's kept attempts that failed or whose worker died (attempts/<trial>/<n>-failed,
    <n>-partial), in attempt order: what counts against a batch's --retries."""
    kept = (batch_dir / "attempts" / trial).glob("*-*")
    ended = [d for d in kept if d.name.endswith(("-failed", "-partial"))]
    return sorted(ended, key=attempt_number)


def summary_file(trial_dir: Path) -> Path:
    """Where analysis/trial.py writes a trial's summary: it exists once the trial is
    analysed."""
    return trial_dir / "analysis" / "summary.json"


def _batches(paths: _PathLike | Iterable[_PathLike]) -> list[Path]:
    """Batch directories (those with a trials/ folder), in the order given; a directory that
    is not a batch stands for the batches directly under it (e.g. results/)."""
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if (p / "trials").is_dir():
            out.append(p)
        elif p.is_dir():
            out.extend(_batches_in(p))
        else:
            raise _refuse(p)
    return out


def trial_dirs(paths: _PathLike | Iterable[_PathLike]) -> list[tuple[Path, Path]]:
    """(batch dir, trial dir) of every trial with a trial.json."""
    return [(batch, t) for batch in _batches(paths) for t in batch_trials(batch)]


def trial_dir(batch_dir: Path, row: Any) -> Path:
    """Where a trial's files are: the ``dir`` of a :func:`load` row (batches may be several),
    else ``<batch_dir>/trials/<trial>``; ``row`` is a row or a trial name."""
    if isinstance(row, str):
        return batch_dir / "trials" / row
    where = row.get("dir")
    return Path(where) if isinstance(where, str) else batch_dir / "trials" / row["trial"]


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    """Scalars under dotted paths; lists of named dicts as [name]; other lists left out."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list):
        if value and all(isinstance(v, dict) and v.get("name") for v in value):
            for v in value:
                rest = {k: x for k, x in v.items() if k != "name"}
                _flatten(rest, f"{prefix}[{v['name']}]", out)
        elif not value or all(not isinstance(v, dict | list) for v in value):
            out[prefix] = json.dumps(value) if value else None
    else:
        out[prefix] = value


def _row(batch: Path, trial_dir: Path) -> dict[str, Any]:
    record = json.loads((trial_dir / "trial.json").read_text())
    row: dict[str, Any] = {
        "batch": batch.name,
        "trial": record.get("trial", trial_dir.name),
        "dir": str(trial_dir),
        "id": record.get("id"),
        "status": record.get("status"),
        "family": record.get("family"),
        "repetition": record.get("repetition"),
        "commit": (record.get("git") or {}).get("commit"),
        "dirty": (record.get("git") or {}).get("dirty"),
        "started": record.get("times", {}).get("started"),
        "t0_ns": record.get("times", {}).get("t0_ns"),
        "errors": "; ".join(record.get("errors") or []) or None,
    }
    params: dict[str, Any] = {}
    _flatten(record.get("parameters") or {}, "", params)
    row.update({f"param:{k}": v for k, v in params.items()})
    row.update({f"factor:{k}": v for k, v in (record.get("overrides") or {}).items()})
    summary_path = summary_file(trial_dir)
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        metrics: dict[str, Any] = {}
        for name, gen in (summary.pop("generators", None) or {}).items():
            _flatten(gen, name, metrics)
        for link, queue in (summary.pop("queues", None) or {}).items():
            _flatten(
                {k.removeprefix("queue_"): v for k, v in queue.items()}, f"queue[{link}]", metrics
            )
        for key in ("trial", "id", "status", "family", "repetition"):
            summary.pop(key, None)
        _flatten({k: v for k, v in summary.items() if not k.startswith("factor:")}, "", metrics)
        row.update(metrics)
        row["analysed"] = True
    else:
        row["analysed"] = False
    return row


def load(paths: _PathLike | Iterable[_PathLike], *, analyse: bool = False) -> pd.DataFrame:
    """One row per trial of the given batches (see the module docstring). With ``analyse``,
    trials without analysis/summary.json are analysed first (their captures are read)."""
    found = trial_dirs(paths)
    if analyse:
        from analysis.workers import DATA_ERRORS, analyse_trials

        todo = [t for _, t in found if not summary_file(t).exists()]
        for _, result in analyse_trials(todo):  # several at a time
            if isinstance(result, Exception) and not isinstance(result, DATA_ERRORS):
                raise result  # (a trial whose data fails: its row says analysed=False)
    rows = [_row(batch, trial_dir) for batch, trial_dir in found]
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    first = ["batch", "trial", "dir", "id", "status", "family", "repetition", "analysed"]
    return table[first + [c for c in table.columns if c not in first]]


def load_table(paths: _PathLike | Iterable[_PathLike], kind: str) -> pd.DataFrame:
    """analysis/<kind>.parquet (flows, owd, queue, cwnd, ...) of every trial of the batches,
    concatenated, with ``batch`` and ``trial`` columns first."""
    parts = []
    for batch, trial_dir in trial_dirs(paths):
        f = trial_dir / "analysis" / f"{kind}.parquet"
        if f.exists():
            part = pd.read_parquet(f)
            part.insert(0, "trial", trial_dir.name)
            part.insert(0, "batch", batch.name)
            parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
