"""Trials analysed side by side in worker processes: a batch's analysis (after the batch, for
its report, or again with ``trials report``) uses the controller's cores. Each trial is one
worker's job from its captures to the tables and summary.json written beside them, so the
results are those of analysing the trials one after the other.

How many workers: ``TRIALBED_ANALYSIS_JOBS`` if set (1: in this process, one trial after
the other); else one per CPU this process may run on, as many as the available memory holds
at ``MEMORY_PER_JOB`` each, and never more than there are trials.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "DATA_ERRORS",
    "JOBS_ENV",
    "MEMORY_PER_JOB",
    "WorkerLost",
    "analyse_trials",
    "analysis_jobs",
    "jobs_setting",
]

JOBS_ENV = "TRIALBED_ANALYSIS_JOBS"
# Set when a seed-001 high-speed WAN trial's analysis (8 Reno pairs at 155 Mbit/s; 756 MB of
# captures, 744 MB of tcp_probe text) peaked at 1.35 GB (2026-11-27), before captures were
# read a capture and a block at a time; a trial's peak now stays below its largest capture
# (tests/analysis/test_memory.py).
MEMORY_PER_JOB = 2 << 30


def jobs_setting() -> int | None:
    """TRIALBED_ANALYSIS_JOBS as a number of workers, None when it is not set; ValueError
    naming it and what it takes otherwise."""
    wanted = os.environ.get(JOBS_ENV, "").strip()
    if not wanted:
        return None
    try:
        jobs = int(wanted)
    except ValueError:
        raise ValueError(
            f"{JOBS_ENV}={wanted!r}: expected a whole number of worker processes (>= 1)"
        ) from None
    if jobs < 1:
        raise ValueError(f"{JOBS_ENV}={wanted!r}: expected at least 1 worker process")
    return jobs


def analysis_jobs(trials: int) -> int:
    """Worker processes for analysing ``trials`` trials (see the module docstring)."""
    jobs = jobs_setting()
    if jobs is None:
        jobs = min(len(os.sched_getaffinity(0)), max(_available_memory() // MEMORY_PER_JOB, 1))
    return max(min(jobs, trials), 1)


def _available_memory() -> int:
    """MemAvailable of /proc/meminfo in bytes (one job's worth if it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return MEMORY_PER_JOB


class WorkerLost(RuntimeError):
    """A worker process ended without an answer (killed: out of memory, a signal)."""


# What a trial's own files (missing, truncated, inconsistent) or a lost worker make its
# analysis raise: the trial is reported as not analysed and the others go on. Any other
# exception is a bug, raised with its trace.
DATA_ERRORS = (OSError, ValueError, KeyError, WorkerLost)


def analyse_trials(
    trial_dirs: Iterable[Path],
    *,
    jobs: int | None = None,
    progress: Console | None = None,
    catalog: bool = True,
) -> Iterator[tuple[Path, dict[str, Any] | Exception]]:
    """(trial dir, its summary) for each trial, in the order given, or (trial dir, the
    exception its analysis raised; from a worker, its traceback is the cause): one trial's
    failure does not stop the others, and the caller decides what it means. ``jobs``:
    worker processes (default: analysis_jobs). ``progress``: a console that shows how many
    trials are analysed, and the time left, while they are (on a terminal only).
    ``catalog``: each trial's rows put into the results catalog as it is analysed (False: the
    caller writes the batch's, as analysis.report.analyse_batch does)."""
    dirs = list(trial_dirs)
    jobs = analysis_jobs(len(dirs)) if jobs is None else max(min(jobs, len(dirs)), 1)
    if progress is None or not progress.is_terminal or not dirs:
        yield from _analysed(dirs, jobs, catalog)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    what = f"analysing trials, {jobs} at a time" if jobs > 1 else "analysing trials"
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Bar(
        *columns, TimeRemainingColumn(), TextColumn("{task.fields[last]}"), console=progress
    ) as bar:
        task = bar.add_task(what, total=len(dirs), last="")
        started = time.monotonic()
        for trial_dir, result in _analysed(dirs, jobs, catalog):
            failed = " (failed)" if isinstance(result, Exception) else ""
            took = time.monotonic() - started
            bar.update(task, advance=1, last=f"{trial_dir.name}{failed}, {took:.0f} s in all")
            yield trial_dir, result


def _analyse_one(trial_dir: Path, catalog: bool = True) -> dict[str, Any]:
    """analyse_trial, and the memory it freed handed back (in this process or a worker)."""
    from analysis.resources import give_memory_back
    from analysis.trial import analyse_trial

    try:
        return analyse_trial(trial_dir, catalog)
    finally:
        give_memory_back()


def _analysed(
    dirs: list[Path], jobs: int, catalog: bool
) -> Iterator[tuple[Path, dict[str, Any] | Exception]]:
    if jobs == 1:
        for trial_dir in dirs:
            try:
                yield trial_dir, _analyse_one(trial_dir, catalog)
            except Exception as exc:  # yielded, not raised: the caller sorts the causes
                yield trial_dir, exc
        return
    pool = _pool(jobs)
    try:
        with _main_left_alone():  # the workers start here, as the jobs are submitted
            futures = [pool.submit(_analyse_one, trial_dir, catalog) for trial_dir in dirs]
        for trial_dir, future in zip(dirs, futures, strict=True):
            exc = future.exception()
            if isinstance(exc, BrokenProcessPool):
                exc = WorkerLost(
                    f"an analysis worker process died ({exc}); out of memory? "
                    f"{JOBS_ENV}=1 analyses one trial at a time"
                )
            yield trial_dir, future.result() if exc is None else exc
    finally:  # the caller stopped early (an error it raises, Ctrl-C): no new trial starts
        pool.shutdown(cancel_futures=True)


def _pool(jobs: int) -> ProcessPoolExecutor:
    """``jobs`` worker processes, each started from a clean process (forkserver, not a fork
    of this one's threads) and told it shares the CPUs with the others."""
    context = multiprocessing.get_context("forkserver")
    return ProcessPoolExecutor(jobs, mp_context=context, initializer=_share_cpus, initargs=(jobs,))


def _share_cpus(jobs: int) -> None:
    from analysis.resources import share_cpus

    share_cpus(jobs)


@contextmanager
def _main_left_alone() -> Iterator[None]:
    """Workers started meanwhile do not run this process's main module again. They need
    analysis.trial only; multiprocessing would import the main script (or ``-m`` module) in
    each one, and a script that analyses at its top level, without ``if __name__ ==
    "__main__"`` (a user's few lines, as results.load's docstring shows), would start its
    own workers there and every trial would come back lost."""
    main = sys.modules.get("__main__")
    saved = {k: v for k, v in vars(main).items() if k in ("__file__", "__spec__")} if main else {}
    if not saved:
        yield
        return
    main.__spec__ = None  # neither by name nor by path: spawn.get_preparation_data
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)
