"""The results layout: every path inside a results directory, a batch and a trial.

One module knows where things are, so that a file name is written once:

    results/<batch>/                    BatchDir
      batch.json                        the plan (trials/batch.py writes it)
      experiment.yml                    the experiment file as the batch began
      summary.parquet                   one row per trial (the batch's report)
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
"""

from __future__ import annotations

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
BATCH_SUMMARY_TABLE = "summary.parquet"


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
        return self.path / "trials"

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


def new_batch_path(results: Path, experiment_file: Path) -> Path:
    """results/<UTC time>-<experiment file's stem>: a batch begun now."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return results / f"{stamp}-{experiment_file.stem}"


def remote_trial_dir(workdir: str, batch: str, trial: str) -> str:
    """Where a trial's files live on a rack host until they are collected."""
    return f"{workdir}/trials/{batch}/{trial}"
