"""The results layout: every path inside a results directory, a batch and a trial.

One module knows where things are, so that a file name is written once:

    results/<batch>/                    BatchDir
      batch.json                        the plan (trials/batch.py writes it)
      experiment.yml                    the experiment file as the batch began
      summary.parquet                   one row per trial (the batch's report)
      report.txt                        a nightly batch's tables and regressions' verdict
      events.jsonl, claims/, workers/   batch bookkeeping
      ansible/                          restore (teardown) logs
      report/                           the HTML report
      trials/<trial>/                   TrialDir: the current (or last) attempt
        trial.json                      the trial record (core.trial_record)
        MANIFEST.sha256                 sha256 of every file of the trial
        ansible/                        configure's variables and log
        <host>/                         what came back from each host (captures, samples)
        analysis/summary.json           the analysis' summary; analysis/<table>.parquet
      attempts/<trial>/<n>-<status>/    earlier attempts, kept (ATTEMPT.json labels them)

The same trial on a rack host lives in ``<workdir>/trials/<batch>/<trial>``.

Every batch under one results directory also lands in its catalog (analysis/dataset.py writes
it, analysis/query.py reads it with DuckDB), a hive-partitioned parquet dataset:

    results/catalog/                    CatalogDir ($TRIALBED_CATALOG: elsewhere)
      trials.parquet/experiment=<stem>/date=<YYYY-MM-DD>/<batch key>.parquet   a row per trial
      flows.parquet/experiment=<stem>/date=<YYYY-MM-DD>/<batch key>.parquet    a row per flow
      trends/<experiment>/index.html    the experiment's nights as series (make trends)
      .lock                             held while a batch's file is rewritten
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

# What a results directory written by this code looks like; 1 is every directory written
# before the layout had an owner (its trial.json has no format_version).
FORMAT_VERSION = 2

RECORD = "trial.json"
MANIFEST = "MANIFEST.sha256"
BATCH_META = "batch.json"
EXPERIMENT_COPY = "experiment.yml"
ATTEMPT_LABEL = "ATTEMPT.json"
SUMMARY = "summary.json"
PRUNED_FILE = "PRUNED.json"  # <batch>/PRUNED.json: the files retention removed
BATCH_SUMMARY_TABLE = "summary.parquet"
VALIDATION_TABLE = "validation.txt"  # <batch>/validation.txt: validate-htcp's or -rio's verdicts
# This checkout, and its results directory (make trial, batch and nightly write under it).
PROJECT_DIR = Path(__file__).resolve().parent.parent
RESULTS_DIR = PROJECT_DIR / "results"
RESULTS_NAME = RESULTS_DIR.name
TRIALS = "trials"  # <batch>/trials/<trial>
CATALOG = "catalog"
CATALOG_ENV = "TRIALBED_CATALOG"  # a catalog elsewhere than <results>/catalog
# The catalog's tables (DuckDB views of the same names): one row per trial, one per flow.
CATALOG_TABLES = ("trials", "flows")


@dataclass(frozen=True)
class TrialDir:
    """One trial's directory on the controller."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def record(self) -> Path:
        return self.path / RECORD

    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST

    @property
    def ansible(self) -> Path:
        return self.path / "ansible"

    @property
    def analysis(self) -> Path:
        return self.path / "analysis"

    @property
    def summary(self) -> Path:
        """Exists once the trial is analysed."""
        return self.analysis / SUMMARY

    def table(self, kind: str) -> Path:
        """analysis/<kind>.parquet: flows, owd, queue, cwnd, ..."""
        return self.analysis / f"{kind}.parquet"

    def host(self, host: str) -> Path:
        """What came back from one host: its captures, samples and logs."""
        return self.path / host


@dataclass(frozen=True)
class BatchDir:
    """One batch's directory on the controller."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def meta(self) -> Path:
        return self.path / BATCH_META

    @property
    def experiment(self) -> Path:
        return self.path / EXPERIMENT_COPY

    @property
    def trials(self) -> Path:
        return self.path / TRIALS

    def trial(self, name: str) -> TrialDir:
        return TrialDir(self.trials / name)

    def trial_dirs(self) -> list[TrialDir]:
        """Every trial directory with a record, in name order."""
        return [TrialDir(r.parent) for r in sorted(self.trials.glob(f"*/{RECORD}"))]

    def attempts(self, name: str) -> Path:
        return self.path / "attempts" / name

    def attempt_labels(self) -> list[Path]:
        """attempts/<trial>/<n>-<status>/ATTEMPT.json of every kept attempt, by path."""
        return sorted((self.path / "attempts").glob(f"*/*/{ATTEMPT_LABEL}"))

    @property
    def claims(self) -> Path:
        return self.path / "claims"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def workers(self) -> Path:
        return self.path / "workers"

    def worker_log(self, label: str) -> Path:
        return self.workers / f"{label}.log"

    @property
    def ansible(self) -> Path:
        return self.path / "ansible"

    @property
    def report(self) -> Path:
        return self.path / "report"

    @property
    def summary_table(self) -> Path:
        return self.path / BATCH_SUMMARY_TABLE

    @property
    def report_text(self) -> Path:
        """The nightly run's text report: the batch's tables and the regressions' verdict."""
        return self.path / "report.txt"

    def is_batch(self) -> bool:
        return self.trials.is_dir()


def attempt_number(attempt_dir: Path) -> int:
    """The n of attempts/<trial>/<n>-<status> (0 for anything else)."""
    head = attempt_dir.name.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def ended_attempts(batch_dir: Path, trial: str) -> list[Path]:
    """The trial's kept attempts that failed or whose worker died (attempts/<trial>/<n>-failed,
    <n>-partial), in attempt order: what counts against a batch's --retries."""
    kept = BatchDir(batch_dir).attempts(trial).glob("*-*")
    ended = [d for d in kept if d.name.endswith(("-failed", "-partial"))]
    return sorted(ended, key=attempt_number)


STAMP = "%Y%m%dT%H%M%SZ"  # a batch's name begins with the UTC time it began
NIGHT = "%Y-%m-%d"  # a nightly batch's name: its day (results/nightly/<name>/<day>)


def new_batch_path(results: Path, experiment_file: Path) -> Path:
    """results/<UTC time>-<experiment file's stem>: a batch begun now."""
    stamp = datetime.now(UTC).strftime(STAMP)
    return results / f"{stamp}-{experiment_file.stem}"


def date_in_name(name: str) -> str | None:
    """The day (YYYY-MM-DD) a batch's name gives: a nightly batch's, or the stamp a batch
    name begins with; None when it gives none."""
    for fmt, head in ((NIGHT, name), (STAMP, name.split("-", 1)[0])):
        try:
            return datetime.strptime(head, fmt).strftime(NIGHT)
        except ValueError:
            continue
    return None


def remote_trial_dir(workdir: str, batch: str, trial: str) -> str:
    """Where a trial's files live on a rack host until they are collected."""
    return f"{workdir}/trials/{batch}/{trial}"


@dataclass(frozen=True)
class CatalogDir:
    """The results catalog: each table a hive-partitioned parquet dataset, one file per batch
    in its experiment's and date's partition (see the module docstring)."""

    path: Path

    def table(self, table: str) -> Path:
        if table not in CATALOG_TABLES:
            raise ValueError(f"catalog table {table!r}: the tables are {', '.join(CATALOG_TABLES)}")
        return self.path / f"{table}.parquet"

    def part(self, table: str, experiment: str, date: str, batch_key: str) -> Path:
        """The file of one batch's rows of ``table``."""
        where = self.table(table) / f"experiment={partition_value(experiment)}" / f"date={date}"
        return where / f"{batch_key}.parquet"

    def files(self, table: str, batch_key: str = "*") -> list[Path]:
        """Every file of ``table`` (of one batch: ``batch_key``), by path."""
        return sorted(self.table(table).glob(f"experiment=*/date=*/{batch_key}.parquet"))

    def pattern(self, table: str) -> str:
        """The glob DuckDB reads ``table`` from."""
        return str(self.table(table) / "experiment=*" / "date=*" / "*.parquet")

    @property
    def lock(self) -> Path:
        return self.path / ".lock"

    def trends(self, experiment: str) -> Path:
        """Where `trialbed results trends` (make trends) writes an experiment's page."""
        return self.path / "trends" / partition_value(experiment)


def partition_value(text: str) -> str:
    """A value as a hive partition's directory name holds it: letters, digits, '.', '_', '-'
    kept, anything else (a '/', '=', a space) as '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"


def results_root(batch_dir: Path) -> Path:
    """The results directory a batch belongs to: its nearest ancestor named like this
    checkout's (results/<batch>, results/nightly/<name>/<date>), else its parent."""
    batch_dir = Path(batch_dir).resolve()
    for parent in batch_dir.parents:
        if parent.name == RESULTS_NAME:
            return parent
    return batch_dir.parent


def batch_key(batch_dir: Path) -> tuple[str, str]:
    """(the batch's name in the catalog: its path below its results directory, the key its
    catalog files are named by: that path made a file name, with a digest that keeps two
    such names apart)."""
    batch_dir = Path(batch_dir).resolve()
    name = batch_dir.relative_to(results_root(batch_dir)).as_posix()
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return name, f"{partition_value(name.replace('/', '~'))}-{digest}"


def catalog_dir(batch_dir: Path | None = None) -> CatalogDir:
    """The catalog a batch's rows go to ($TRIALBED_CATALOG, else <its results directory>/
    catalog); without a batch, this checkout's (results/catalog)."""
    if os.environ.get(CATALOG_ENV):
        return CatalogDir(Path(os.environ[CATALOG_ENV]))
    root = results_root(batch_dir) if batch_dir is not None else RESULTS_DIR
    return CatalogDir(root / CATALOG)


def batch_of_trial(trial_dir: Path) -> Path | None:
    """The batch a trial directory (<batch>/trials/<trial>) is the current attempt of; None
    for anything else (a kept attempt, a directory outside a batch)."""
    trial_dir = Path(trial_dir)
    return trial_dir.parent.parent if trial_dir.parent.name == TRIALS else None


def pruned_files(batch: Path) -> set[str]:
    """The files retention removed from the batch (paths relative to it)."""
    note = batch / PRUNED_FILE
    return set(json.loads(note.read_text()).get("removed", [])) if note.exists() else set()


def sha256_file(path: Path) -> str:
    """The file's sha256, as MANIFEST.sha256 (sha256sum) lists it."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
