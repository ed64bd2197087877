"""Where a batch's trials and a trial's analysis are: batch and trial directories, attempts,
the summary file, as the analysis finds them. Paths only, all from core.layout (the one owner
of the results layout); it reads no trial and imports nothing of the analysis."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.layout import CATALOG, BatchDir, TrialDir, attempt_number, ended_attempts

__all__ = [
    "NotABatch",
    "attempt_number",
    "batch_trials",
    "ended_attempts",
    "find_batches",
    "summary_file",
    "trial_dir",
    "trial_dirs",
]

_PathLike = str | Path


class NotABatch(FileNotFoundError):
    """A path given as a batch is not one: the message names it and the batches under it."""


def _batches_in(p: Path) -> list[Path]:
    """The batch directories (each with a trials/ folder) under ``p`` at any depth (a batch's
    own folders are not looked into, nor hidden ones), by path: results/<batch> and
    results/nightly/<name>/<date> alike."""
    found = []
    for c in sorted(p.iterdir()):
        if not c.is_dir() or c.name.startswith("."):
            continue
        if BatchDir(c).is_batch():
            found.append(c)
        elif c.name != CATALOG:  # the results catalog holds no batch
            found.extend(_batches_in(c))
    return found


def _refuse(p: Path) -> NotABatch:
    if not p.exists():
        return NotABatch(f"{p}: no such batch directory")
    if not p.is_dir():
        return NotABatch(f"{p}: not a batch directory (a file)")
    under = [b.relative_to(p).as_posix() for b in _batches_in(p)]
    if under:
        shown = ", ".join(under[:5]) + (f" and {len(under) - 5} more" if len(under) > 5 else "")
        return NotABatch(f"{p}: not a batch directory (no trials/ in it); batches in it: {shown}")
    return NotABatch(f"{p}: not a batch directory (no trials/ in it, nor a batch under it)")


def batch_trials(batch_dir: _PathLike) -> list[Path]:
    """The trial directories of one batch (each with a trial.json), in name order; a path
    that is not a batch (no trials/ in it) is refused with :class:`NotABatch`."""
    p = Path(batch_dir)
    if not BatchDir(p).is_batch():
        raise _refuse(p)
    return [t.path for t in BatchDir(p).trial_dirs()]


def summary_file(trial_dir: Path) -> Path:
    """Where analysis/trial.py writes a trial's summary: it exists once the trial is
    analysed."""
    return TrialDir(trial_dir).summary


def find_batches(paths: _PathLike | Iterable[_PathLike]) -> list[Path]:
    """Batch directories (those with a trials/ folder), in the order given; a directory that
    is not a batch stands for the batches under it at any depth (e.g. results/)."""
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if BatchDir(p).is_batch():
            out.append(p)
        elif p.is_dir():
            out.extend(_batches_in(p))
        else:
            raise _refuse(p)
    return out


def trial_dirs(paths: _PathLike | Iterable[_PathLike]) -> list[tuple[Path, Path]]:
    """(batch dir, trial dir) of every trial with a trial.json."""
    return [(batch, t) for batch in find_batches(paths) for t in batch_trials(batch)]


def trial_dir(batch_dir: Path, row: Any) -> Path:
    """Where a trial's files are: the ``dir`` of a :func:`load` row (batches may be several),
    else ``<batch_dir>/trials/<trial>``; ``row`` is a row or a trial name."""
    if isinstance(row, str):
        return BatchDir(batch_dir).trial(row).path
    where = row.get("dir")
    return Path(where) if isinstance(where, str) else BatchDir(batch_dir).trial(row["trial"]).path
