"""A batch's trials as one table indexed by their parameters (one row per trial), and the
tables of each family present in the batch (analysis/families/<family>.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console
from rich.table import Table

from analysis.batches import batch_trials, ended_attempts
from analysis.families import FAMILIES
from analysis.lazy import pd
from analysis.workers import DATA_ERRORS, analyse_trials
from core.layout import RECORD, BatchDir
from core.trial_record import UNREADABLE, RecordError, load_record

# Columns holding lists or dicts: kept in summary.json, left out of summary.parquet.
_NESTED = (dict, list)


def analyse_batch(batch_dir: Path, files: Mapping[str, list[str]] | None = None) -> pd.DataFrame:
    """Analyse every trial that has captures (several at a time: analysis.workers; on a
    terminal, a progress bar on stderr); write summary.parquet and the batch's rows of the
    results catalog; return one row per trial.
    A trial whose record or files cannot be read is a row that says why, naming the file;
    ``files``: per trial (its directory's name), what is wrong with its files (what
    `trials report` found against each trial's manifest), said in its row."""
    rows = []
    trials = batch_trials(batch_dir)
    # (each trial's rows go into the catalog with the batch's, at the end: not one by one)
    for trial_dir, result in analyse_trials(trials, progress=Console(stderr=True), catalog=False):
        try:
            record, unreadable = load_record(trial_dir / RECORD), None
        except RecordError as exc:
            record, unreadable = {"trial": trial_dir.name, "status": UNREADABLE}, exc
        if unreadable is not None or isinstance(result, DATA_ERRORS):
            error = unreadable or f"analysis: {type(result).__name__}: {result}"
            row = {
                "trial": record["trial"],
                "status": record.get("status", "failed"),
                "family": record.get("family"),
                "error": str(error),
                **{f"factor:{k}": v for k, v in (record.get("overrides") or {}).items()},
            }
        elif isinstance(result, Exception):  # a bug, not the trial's data: stop, with its trace
            raise result
        else:
            row = result
        if (files or {}).get(trial_dir.name):
            row = {**row, "files": "; ".join(files[trial_dir.name])}  # type: ignore[index]
        rows.append(row)
    rows += given_up_rows(batch_dir, {t.name for t in trials})
    table = pd.DataFrame(rows)
    if len(table):
        table.attrs["batch"] = str(batch_dir)
        flat = table[[c for c in table if not table[c].map(lambda v: isinstance(v, _NESTED)).any()]]
        flat.to_parquet(BatchDir(batch_dir).summary_table, index=False)
    from analysis.dataset import add_batch  # pandas: not held while the captures are read

    add_batch(batch_dir)  # the batch's trials in its results' catalog, whole
    return table


def given_up_rows(batch_dir: Path, present: set[str]) -> list[dict]:
    """One row per planned trial without a record of its own (trials/<name>) whose kept
    attempts failed or died mid-trial: the batch gave it up (or has yet to run it again).
    Named from its last attempt's record, with that attempt's factors."""
    meta = BatchDir(batch_dir).meta
    rows: list[dict] = []
    try:
        planned = json.loads(meta.read_bytes()).get("trials", []) if meta.exists() else []
        names = [t["name"] for t in planned]
    except (OSError, ValueError, AttributeError, TypeError, KeyError) as exc:
        error = (
            f"{meta}: not the batch's plan ({type(exc).__name__}: {exc}); the trials it gave "
            "up on are not listed"
        )
        return [{"trial": meta.name, "status": UNREADABLE, "error": error}]
    for name in names:
        ended = ended_attempts(batch_dir, name)
        if name in present or not ended:
            continue
        record_file = ended[-1] / RECORD
        try:
            record = load_record(record_file)
        except RecordError:  # named by the attempt's own files; its factors stay unknown
            record = {}
        rows.append(
            {
                "trial": name,
                "status": "failed",
                "family": record.get("family"),
                "error": f"no current attempt: {len(ended)} failed or died mid-trial (the "
                f"last {ended[-1].name.split('-', 1)[1]}); kept in attempts/{name}/",
                **{f"factor:{k}": v for k, v in (record.get("overrides") or {}).items()},
            }
        )
    return rows


def print_batch(table: pd.DataFrame, console: Console | None = None) -> None:
    # Not on a terminal (a log, a pipe): no wrapping at 80 columns.
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    if table.empty:
        console.print("no trials")
        return
    batch_dir = Path(table.attrs["batch"])
    for family, rows in table.groupby("family", dropna=False):
        module = FAMILIES.get(family)
        good = rows[rows["error"].isna()] if "error" in rows else rows
        if "files" in good:  # files not as collected: its own figures only, named there
            good = good[good["files"].isna()]
        if module is not None and not good.empty:
            module.print_tables(batch_dir, good, console)
    for _, r in table.iterrows():
        console.print(trial_table(r))


def trial_table(r: pd.Series) -> Table:
    """One trial's figures, one per line (fits an 80-column terminal)."""
    t = Table(title=f"Trial {r.trial}: {r.status}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    if isinstance(r.get("files"), str):
        t.add_row("files", r.files)
    if isinstance(r.get("error"), str):
        t.add_row("error", r.error)
        return t
    module = FAMILIES.get(r.get("family"))
    for what, value in module.trial_rows(r) if module else []:
        t.add_row(what, value)
    for what, value in dscp_rows(r):
        t.add_row(what, value)
    return t


def dscp_rows(r: pd.Series) -> list[tuple[str, str]]:
    """The DSCP each generator's packets carried at each capture point, and what each
    marking rule counted."""
    rows = []
    for name, gen in (r.get("generators") or {}).items():
        seen = gen.get("dscp") if isinstance(gen, dict) else None
        if seen:
            at = "; ".join(
                f"{point} " + ", ".join(f"{code} {n}" for code, n in codes.items())
                for point, codes in seen.items()
            )
            rows.append((f"DSCP {name}", f"{at} (packets)"))
    marking = r.get("marking")
    for host, rules in (marking if isinstance(marking, dict) else {}).items():
        text = rules.get("error") or "; ".join(
            f"{rule} -> {c['dscp']}: {c['packets']} packets" for rule, c in rules.items()
        )
        rows.append((f"marking on {host}", text))
    return rows
