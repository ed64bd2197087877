"""Results API: batches as tidy pandas tables.

    import analysis
    trials = analysis.load("results/20261122T061959Z-startup_lswan")     # one row per trial
    trials = analysis.load(["results/night-1", "results/night-2"])       # several batches
    trials = analysis.load("results")     # every batch under a results directory, at any depth
    flows = analysis.load_table("results", "flows")   # per-flow rows of every trial

One row per trial: ``batch``, ``trial``, ``dir`` (where its files are), ``id``, ``status``
(complete / interrupted / failed; ``unreadable`` with ``errors`` naming the file when its
trial.json cannot be read), ``family``, ``repetition``, git commit and dirty flag,
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

from analysis.batches import (
    NotABatch,
    _PathLike,
    attempt_number,
    batch_trials,
    ended_attempts,
    summary_file,
    trial_dir,
    trial_dirs,
)
from analysis.columns import flatten, summary_metrics
from core.layout import RECORD, TrialDir
from core.trial_record import UNREADABLE, RecordError, load_record

__all__ = [
    "NotABatch",
    "attempt_number",
    "batch_trials",
    "ended_attempts",
    "load",
    "load_table",
    "summary_file",
    "trial_dir",
    "trial_dirs",
]


def _row(batch: Path, trial_dir: Path) -> dict[str, Any]:
    try:
        record = load_record(trial_dir / RECORD)
    except RecordError as exc:  # a row that says so, naming the file; the others load as ever
        return {
            "batch": batch.name,
            "trial": trial_dir.name,
            "dir": str(trial_dir),
            "status": UNREADABLE,
            "errors": str(exc),
            "analysed": False,
        }
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
    flatten(record.get("parameters") or {}, "", params)
    row.update({f"param:{k}": v for k, v in params.items()})
    row.update({f"factor:{k}": v for k, v in (record.get("overrides") or {}).items()})
    summary_path = summary_file(trial_dir)
    if summary_path.exists():
        row.update(summary_metrics(json.loads(summary_path.read_text())))
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
    rows = [_row(batch, trial) for batch, trial in found]
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    first = ["batch", "trial", "dir", "id", "status", "family", "repetition", "analysed"]
    return table[first + [c for c in table.columns if c not in first]]


def load_table(paths: _PathLike | Iterable[_PathLike], kind: str) -> pd.DataFrame:
    """analysis/<kind>.parquet (flows, owd, queue, cwnd, ...) of every trial of the batches,
    concatenated, with ``batch`` and ``trial`` columns first."""
    parts = []
    for batch, trial in trial_dirs(paths):
        f = TrialDir(trial).table(kind)
        if f.exists():
            part = pd.read_parquet(f)
            part.insert(0, "trial", trial.name)
            part.insert(0, "batch", batch.name)
            parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
