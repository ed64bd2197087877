"""`trialbed record BATCH... RECORD`: the reproduction record (analysis/reproduction.py) of one
batch or several (a family's experiment files run as batches of their own) written into RECORD
(docs/reproductions/<family>), what `make record` runs. Each batch's plan is rebuilt from its
own batch.json and experiment.yml, so trials that never ran have their factors and repetition
in summary.csv too."""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from core.layout import PROJECT_DIR, BatchDir

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `record` subcommand on the command line's subparsers."""
    record = sub.add_parser(
        "record",
        help="write the reproduction record of one or more batches: their report, summary.csv, "
        "provenance, README",
        description=__doc__,
    )
    record.add_argument(
        "batches",
        type=Path,
        nargs="+",
        metavar="BATCH",
        help="a batch directory (results/<batch>); several: one record of all of them",
    )
    record.add_argument(
        "record",
        type=Path,
        metavar="RECORD",
        help="the record's directory (docs/reproductions/<family>)",
    )
    return record


def _command(batches: list[Path], record: Path) -> str:
    """The `make record` call that writes the record again (several batches: one quoted word,
    as make takes them)."""
    shown = " ".join(_shown(b) for b in batches)
    batch = shown if len(batches) == 1 else f'"{shown}"'
    return f"make record BATCH={batch} RECORD={_shown(record)}"


def _shown(path: Path) -> str:
    """A path as the README's command gives it: relative to the checkout when inside it."""
    whole = path.resolve()
    return str(whole.relative_to(PROJECT_DIR)) if whole.is_relative_to(PROJECT_DIR) else str(whole)


def planned_trials(batch_dir: Path, err: Console) -> list | None:
    """The batch's plan as analysis.reproduction.Planned (None: no batch.json, a `make trial`
    batch, or a plan that no longer validates; then its names only, said on ``err``)."""
    from analysis.reproduction import Planned
    from trials.batch import Batch
    from trials.spec import SpecError

    layout = BatchDir(batch_dir)
    if not layout.meta.exists():
        return None
    try:
        batch = Batch(batch_dir)
        names = [t["name"] for t in batch.meta["trials"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        err.print(f"[yellow]note:[/yellow] {escape(f'{layout.meta}: not read ({exc})')}")
        return None
    try:
        _, trials = batch.plan()
    except (SpecError, OSError, ValueError, KeyError) as exc:
        never = [n for n in names if not layout.trial(n).record.exists()]
        if never:  # only their rows miss what the plan would say
            err.print(
                f"[yellow]note:[/yellow] {escape(str(exc))}; {len(never)} trial(s) without a "
                "record are listed by name only",
                highlight=False,
            )
        return None
    return [Planned(t.name, t.repetition, dict(t.overrides)) for t in trials]


def run(args: argparse.Namespace, err: Console) -> int:
    """0 written, 2 a path that is not a batch or cannot take the record (said on ``err``)."""
    from analysis.batches import NotABatch
    from analysis.reproduction import SUMMARY, RecordPathError, check_paths, write_record
    from trials.record import git_state

    batches: list[Path] = args.batches
    try:
        check_paths(batches[0], args.record, more=batches[1:])
        planned = {b: planned_trials(b, err) for b in batches}
        out = write_record(
            batches[0], args.record, more=batches[1:], planned=planned,
            command=_command(batches, args.record), code=git_state(),
        )  # fmt: skip
    except (NotABatch, RecordPathError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    with (out / SUMMARY).open(newline="") as f:
        rows = list(csv.DictReader(f))
    counts = Counter(r["status"] for r in rows)
    said = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    of = f" of {len(batches)} batches" if len(batches) > 1 else ""
    err.print(
        f"record: {out}/ ({len(rows)} planned trials{of} in {SUMMARY}: {said})", highlight=False
    )
    unanalysed = [r for r in rows if (r["note"] or "").startswith("not analysed")]
    if unanalysed:  # the record reads the batches only: analysing is the report's
        names = [f"{r['batch']}/{r['trial']}" if "batch" in r else r["trial"] for r in unanalysed]
        named = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
        holding = {r.get("batch") for r in unanalysed}  # None: the one batch
        reports = "; ".join(
            f"make report BATCH={b}" for b in batches if len(batches) == 1 or b.name in holding
        )
        text = (
            f"{len(unanalysed)} complete trial(s) have no analysis and no numbers in the record "
            f"({named}): {reports} analyses them; then make record again"
        )
        err.print(f"[yellow]note:[/yellow] {escape(text)}", highlight=False)
    return 0
