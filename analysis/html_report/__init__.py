"""A batch's report as one self-contained HTML page (figures embedded) with its tables as CSV
and figures as PNG beside it: `make report BATCH=results/<batch> [PREVIOUS=results/<other>]`
writes results/<batch>/report/index.html.

The page: an overview of the trials (failed and interrupted ones named and left out of every
number), the family's tables and figures (one module per family, as in analysis/families),
this batch against the previous one, every trial's status and headline metrics, and the
provenance (commit, kernels, tools, delay backend and its measured error).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pandas as pd

from analysis.batches import batch_trials, ended_attempts, summary_file
from analysis.dataset import add_batch
from analysis.html_report import (
    collateral_damage,
    compare,
    diffserv,
    eft,
    provenance,
    regressions,
    startup,
)
from analysis.html_report.page import Page
from analysis.html_report.trends import sections as trend_sections
from analysis.regressions import NIGHTS, judge
from analysis.results import load
from analysis.trends import trends
from core.layout import RECORD, BatchDir, catalog_dir
from core.trial_record import UNREADABLE
from core.units import parse_duration_ns

__all__ = ["AUTO", "FAMILIES", "write_report"]

FAMILIES: dict[str, ModuleType] = {
    "collateral_damage": collateral_damage,
    "diffserv": diffserv,
    "eft": eft,
    "startup": startup,
}
AUTO = "auto"  # previous batch: the one before this batch in its directory
FILE_LIST = ".report-files"  # the files a report wrote into its directory


def write_report(
    batch_dir: str | Path,
    out_dir: str | Path | None = None,
    previous: str | Path | None = AUTO,
    *,
    reanalyse: bool = False,
    more: Sequence[str | Path] = (),
    nights: int = NIGHTS,
    baseline: str | Path | None = None,
    standalone: bool = False,
) -> Path:
    """Write the report of ``batch_dir`` into ``out_dir`` (default: <batch>/report) and return
    the page's path. ``previous``: a batch to compare with, AUTO for the previous batch of the
    same experiment in the same directory, None for no comparison. Trials without analysis
    are analysed first; with ``reanalyse`` every trial is (from its captures). ``more``:
    further batches whose trials join this one's in every table and figure (e.g. a family's
    experiment files run as batches of their own: one frontier per marker in one figure);
    then ``out_dir`` is required, trials are named <batch>/<trial>, and no previous batch is
    compared. The regressions section tests the batch against the last ``nights`` batches of
    its experiment in the results catalog, or against ``baseline`` (analysis.regressions).
    ``standalone``: the batch (and ``more``) alone, as a reproduction record holds it
    (analysis/reproduction): it reads the batches and writes nothing into them or their
    catalog: no trial is analysed (those without analysis are named), no previous batch is
    compared, no regressions or trends, no time of writing; the same batches give the same
    page."""
    batches = [Path(batch_dir), *(Path(b) for b in more)]
    for b in batches:
        batch_trials(b)  # refuses a path that is not a batch before anything is written
    several = len(batches) > 1
    if several and out_dir is None:
        raise ValueError(
            f"{len(batches)} batches: say where their report goes (--out DIR; make report OUT=DIR)"
        )
    batch_dir = batches[0]
    out = Path(out_dir) if out_dir else batch_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    # Drawn beside it, moved in once whole: a report that fails leaves the last one as it was.
    staging = Path(tempfile.mkdtemp(prefix=".report-", dir=out.parent))
    try:
        judged = {"nights": nights, "baseline": baseline}
        index = _write_report(
            batches, batch_dir, staging, None if standalone else previous, reanalyse, several,
            None if standalone else judged,
        )  # fmt: skip
        _move_in(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / index.name


def _move_in(staging: Path, out: Path) -> None:
    """The new report's files into ``out``: what the last report wrote there and this one did
    not (a figure no longer drawn) goes; files it did not write (the user's) stay."""
    listed = out / FILE_LIST
    new = set(staging.joinpath(FILE_LIST).read_text().split())
    if listed.exists():
        for name in set(listed.read_text().split()) - new:
            (out / Path(name).name).unlink(missing_ok=True)
    for path in staging.iterdir():
        path.replace(out / path.name)


def _write_report(
    batches: list[Path],
    batch_dir: Path,
    out: Path,
    previous,
    reanalyse: bool,
    several: bool,
    judged: dict | None,
) -> Path:
    """The report into ``out``; ``judged`` None: standalone (see write_report)."""
    listed = out / FILE_LIST
    failures = {}
    standalone = judged is None
    for b in [] if standalone else batches:
        for trial, error in analyse(b, every=reanalyse).items():
            failures[provenance.named(b, trial, several)] = error
    trials = load(batches)
    if several and len(trials):
        trials["trial"] = trials.batch + "/" + trials.trial
    before_dir, before = None, None
    if not several:
        before_dir = compare.previous_batch(batch_dir) if previous == AUTO else previous
        before_dir = Path(before_dir) if before_dir else None
        before = load(before_dir) if before_dir else None

    meta = _batches_meta(batches)
    page = Page(f"Report: {' + '.join(b.name for b in batches)}", out)
    subtitle = (
        f"{', '.join(str(b) for b in batches)} — experiment {meta.get('experiment', '?')}"
        + (f" (set {', '.join(meta['sets'])})" if meta.get("sets") else "")
        + ("" if standalone else f" — generated {datetime.now(UTC).isoformat(timespec='seconds')}")
    )
    overview(page, batch_dir, trials, meta)
    status = dict(zip(trials.trial, trials.status, strict=True)) if len(trials) else {}
    for trial, error in failures.items():
        text = f"Trial {trial} ({status.get(trial)}): its analysis failed: {error}."
        (page.warn if status.get(trial) == "complete" else page.note)(text)
    unreadable = trials[trials.status == UNREADABLE] if len(trials) else trials
    for row in unreadable.itertuples():
        page.warn(f"Trial {row.trial}: left out of every table and figure: {row.errors}.")
    trials = trials.drop(unreadable.index)
    if not trials.empty:
        for family, rows in trials.groupby("family", dropna=False):
            module = FAMILIES.get(family)
            if module is None:
                page.section(f"Family {family}")
                page.note(
                    f"No report module for the family {family!r}: only the trial list and the "
                    "provenance below."
                )
                continue
            module.sections(page, batch_dir, rows)
        if several and not standalone:
            page.section("This batch vs the previous batch")
            page.note(
                f"A report of {len(batches)} batches together: no comparison with a previous "
                "batch (make a report of each batch alone for that)."
            )
        elif judged is not None:
            compare.sections(page, batch_dir, trials, before_dir, before, FAMILIES)
            over_nights(page, batch_dir, trials, judged)
        trial_list(page, batches, trials)
    provenance.sections(page, batches, trials)
    index = page.write(subtitle)
    listed.write_text("\n".join([*page.files, index.name]) + "\n")
    return index


def unreadable_records(batches: list[Path]) -> list[str]:
    """Why each trial record of the batches that cannot be read is left out of the report."""
    trials = load(batches)
    if trials.empty:
        return []
    return list(trials[trials.status == UNREADABLE].errors)


def over_nights(page: Page, batch_dir: Path, trials: pd.DataFrame, judged: dict) -> None:
    """The batch in the results catalog, tested against its baseline (regressions), and its
    experiment's nights up to it as series (trends; the families' key metrics first)."""
    add_batch(batch_dir)  # the catalog has the batch as analysed now
    verdict = judge(batch_dir, **judged)
    regressions.sections(page, verdict)
    if not verdict.experiment:
        return
    families = trials.family.dropna().unique()
    key = [m for f in families for m in getattr(FAMILIES.get(f), "METRICS", {})]
    series = trends(
        verdict.experiment,
        catalog_dir(batch_dir),
        until=verdict.batch,
        key=key,
        nights=judged["nights"],
    )
    trend_sections(page, series)


def analyse(batch_dir: Path, *, every: bool = False) -> dict[str, str]:
    """Analyse the trials without analysis (every trial with ``every``) from their captures,
    several at a time (analysis.workers); returns the trials whose analysis failed, with the
    error (a broken trial does not stop the report of the others). On a terminal, a progress
    bar on stderr."""
    from rich.console import Console

    from analysis.workers import analyse_trials

    todo = [t for t in batch_trials(batch_dir) if every or not summary_file(t).exists()]
    return {
        trial_dir.name: f"{type(result).__name__}: {result}"
        for trial_dir, result in analyse_trials(todo, progress=Console(stderr=True))
        if isinstance(result, Exception)
    }


def _batch_meta(batch_dir: Path) -> dict:
    f = BatchDir(batch_dir).meta
    return json.loads(f.read_text()) if f.exists() else {}


def _batches_meta(batches: list[Path]) -> dict:
    """batch.json of one batch; of several: their experiments and --set values joined, and
    their planned trials named <batch>/<trial>."""
    metas = []
    for b in batches:
        meta = _batch_meta(b)
        if "experiment" not in meta:  # a batch of `make trial`: no batch.json
            records = provenance.records(b)
            first = next(iter(records.values()), {})
            meta["experiment"] = first.get("experiment_file") or first.get("family") or "?"
        for t in meta.get("trials", []):  # a trial given up has them and no trials/<name>
            t["ended_attempts"] = len(ended_attempts(b, t["name"]))
        metas.append(meta)
    if len(metas) == 1:
        return metas[0]
    sets = [s for m in metas for s in m.get("sets") or []]
    return {
        "experiment": ", ".join(str(m["experiment"]) for m in metas),
        "sets": list(dict.fromkeys(sets)),
        "trials": [
            {**t, "name": provenance.named(b, t["name"], several=True)}
            for b, m in zip(batches, metas, strict=True)
            for t in m.get("trials", [])
        ],
    }


def excluded(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials the tables leave out: not complete, or without analysis."""
    return trials[(trials.status != "complete") | ~trials.analysed.astype(bool)]


def overview(page: Page, batch_dir: Path, trials: pd.DataFrame, meta: dict) -> None:
    page.section("Overview")
    planned = [t["name"] for t in meta.get("trials", [])]
    present = set(trials.trial) if not trials.empty else set()
    kept = {t["name"]: t.get("ended_attempts", 0) for t in meta.get("trials", [])}
    given_up = [n for n in planned if n not in present and kept[n]]
    not_run = [n for n in planned if n not in present and not kept[n]]
    if given_up:  # its worker kept dying: attempts kept, no current record
        page.warn(
            f"{len(given_up)} of the {len(planned)} planned trials have no current attempt, "
            "only ones that failed or whose worker died mid-trial: the batch gave them up (or "
            "has yet to run them again); their files are in attempts/ (listed under 'Earlier "
            "attempts' below): "
            + ", ".join(f"{n} ({kept[n]} attempt{'s' * (kept[n] != 1)})" for n in given_up)
            + "."
        )
    if trials.empty:
        page.warn("This batch has no trial record (trials/*/trial.json): nothing to report.")
        return
    counts = trials.status.fillna("unknown").value_counts()
    lines = [f"{n} {s}" for s, n in counts.items()]
    page.text(f"{len(trials)} trial(s): " + ", ".join(lines) + ".")
    if not_run:
        page.warn(
            f"{len(not_run)} of the {len(planned)} planned trials have not run (the batch is "
            f"unfinished, or they are still running): {', '.join(not_run)}."
        )
    if "repetition" in trials and trials.repetition.notna().any():
        reps = int(trials.repetition.max())
        page.text(f"Repetitions per combination: up to {reps}.")
        if reps == 1:
            page.note(
                "One repetition per combination: means are single runs and there is no σ "
                "(run-to-run spread) in the tables, nor in the comparison with another batch."
            )
    out = excluded(trials)
    if len(out):
        page.warn(
            "Left out of every table and figure (listed in 'Trials' below): "
            + "; ".join(
                f"{r.trial} ({r.status}{'' if r.analysed else ', not analysed'}"
                f"{': ' + r.errors if isinstance(r.get('errors'), str) else ''})"
                for _, r in out.iterrows()
            )
        )


def trial_list(page: Page, batches: list[Path], trials: pd.DataFrame) -> None:
    page.section("Trials")
    metrics: dict[str, str] = {}
    digits: dict[str, int] = {"owd_median_ms": 1, "goodput_kBps": 1}
    for family in trials.family.dropna().unique():
        metrics.update(getattr(FAMILIES.get(family), "METRICS", {}))
        digits.update(getattr(FAMILIES.get(family), "DIGITS", {}))
    factors = [c for c in trials.columns if c.startswith("factor:")]
    cols = ["trial", "status", "repetition", *factors, "analysed"]
    cols += [m for m in metrics if m in trials]
    table = trials[cols].rename(columns={f: f.removeprefix("factor:") for f in factors})
    table.insert(2, "in tables", ~trials.index.isin(excluded(trials).index))
    table["errors"] = trials.get("errors")
    page.table(
        table,
        "Every trial: status, whether the tables use it, headline metrics "
        "(failed and interrupted trials highlighted)",
        csv="trials.csv",
        digits=digits,
        row_class=lambda r: None if r["in tables"] else "bad",
        labels=metrics,
    )
    timing(page, batches)
    attempts = []
    several = len(batches) > 1
    for batch_dir in batches:
        for f in BatchDir(batch_dir).attempt_labels():
            a = json.loads(f.read_text())
            record = f.parent / RECORD
            errors = json.loads(record.read_text()).get("errors") if record.exists() else None
            name = a.get("trial", f.parent.parent.name)
            attempts.append(
                {
                    "trial": provenance.named(batch_dir, name, several),
                    "attempt": f.parent.name,
                    "status": a.get("status"),
                    "set aside": a.get("set_aside"),
                    "errors": "; ".join(errors or []) or None,
                }
            )
    if attempts:
        page.text(
            "Earlier attempts kept beside the batch (attempts/): partial files of runs that "
            "did not complete; never used in the tables."
        )
        page.table(pd.DataFrame(attempts), "Earlier attempts", csv="attempts.csv")


def _seconds(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def configured_by(configure: dict) -> str:
    """How the runner brought the rack to a trial's configuration (trial.json "configure"):
    the playbook (and which tags), the hosts' congestion control switch, the routers' shaping
    switch, or nothing (the previous trial's configuration was the same)."""
    if configure.get("skipped"):
        return f"kept ({configure.get('same_as') or 'same as before'})"
    ways = []
    if "recap" in configure:
        tags = configure.get("tags")
        ways.append(f"playbook ({tags if isinstance(tags, str) else ', '.join(tags or [])})")
    if configure.get("cc_switched"):
        hosts = len(configure["cc_switched"])
        ways.append(f"cc switch ({hosts} host{'s' if hosts > 1 else ''})")
    if configure.get("shaping_switched"):
        ways.append(f"shaping switch ({', '.join(sorted(configure['shaping_switched']))})")
    return " + ".join(ways) or "?"


def timing(page: Page, batches: list[Path]) -> None:
    """Wall time per trial (started to stopped), the part outside the traffic, and the
    runner's own overhead figure where it recorded one (overhead_s: outside traffic and
    queue drain; configure, arm, stop, collect)."""
    rows = []
    for name, r in provenance.records(batches).items():
        times = r.get("times") or {}
        wall = _seconds(times.get("started"), times.get("stopped"))
        try:
            traffic = parse_duration_ns((r.get("parameters") or {}).get("duration")) / 1e9
        except (TypeError, ValueError):
            traffic = None
        rows.append(
            {
                "trial": name,
                "status": r.get("status"),
                "wall_s": wall,
                "traffic_s": traffic,
                "outside_traffic_s": wall - traffic if wall is not None and traffic else None,
                "overhead_s": r.get("overhead_s"),
                "configured_by": configured_by(r.get("configure") or {}),
                # configure, arm, lead, stop, collect (runs from this session on)
                **{f"{k}_s": v for k, v in (r.get("overhead_phases_s") or {}).items()},
            }
        )
    table = pd.DataFrame(rows)
    if table.empty or not table.wall_s.sum() > 0:
        return
    total = table.wall_s.sum()
    outside = table.outside_traffic_s.sum()
    page.text(
        f"Time: {total / 60:.1f} min of trials, {outside / 60:.1f} min of it outside the "
        f"traffic ({100 * outside / total:.0f} %)."
    )
    overhead = pd.to_numeric(table.overhead_s, errors="coerce").dropna()
    if len(overhead):
        page.text(
            f"Overhead recorded by the runner (outside traffic and queue drain): median "
            f"{overhead.median():.1f} s, at most {overhead.max():.1f} s per trial over "
            f"{len(overhead)} trial(s); the target is at most 9 s (5 % of a 3-minute trial)."
            + "".join(
                f" {phase}: median {table[f'{phase}_s'].median():.1f} s."
                for phase in ("configure", "arm", "lead", "stop", "collect")
                if f"{phase}_s" in table
            )
        )
    else:
        table = table.drop(columns="overhead_s")
    page.table(
        table,
        "Time per trial (s): wall clock from start to stop, outside the traffic, and the "
        "runner's overhead",
        csv="trial_times.csv",
        digits={
            "wall_s": 1,
            "traffic_s": 0,
            "outside_traffic_s": 1,
            "overhead_s": 1,
            **{f"{p}_s": 1 for p in ("configure", "arm", "lead", "stop", "collect")},
        },
    )
