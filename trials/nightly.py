"""Nightly batches: a schedule (a systemd timer where systemd runs, else a cron entry) that
runs `make nightly-run`, i.e. the experiment's batch into results/nightly/<name>/<date>/, its
report, and the retention rule (captures of batches older than N days are removed, their
tables kept)."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from core.layout import (
    NIGHT,
    PROJECT_DIR,
    PRUNED_FILE,
    RESULTS_DIR,
    BatchDir,
    TrialDir,
)
from trials.spec import SpecError

UNIT_DIR = Path("/etc/systemd/system")
CRON_DIR = Path("/etc/cron.d")
# The schedule's command, as a shell script: cron reads % as a line end and systemd expands %,
# $ and backslashes in ExecStart=, and a SET of the nightly run may hold any of them
# (traffic[web1].load=20%). The schedule runs `/bin/sh <script>`, a path with none of them.
SCRIPT_DIR = Path("/etc/trialbed/nightly")
NIGHTLY_DIR = RESULTS_DIR / "nightly"
# The nightly run's exit status (and `results regressions`'s) when the batch ran and the test
# found a metric changed against the baseline (0: ran, nothing changed; 1: trials failed or
# did not run; 2: bad input). A timer's or CI's alert keys on it.
CHANGE_FOUND = 3
# Files a batch keeps after retention: its record, tables and report; never the packets.
CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".stream")


def schedule_name(experiment: Path) -> str:
    return "trialbed-nightly-" + re.sub(r"[^A-Za-z0-9_-]", "-", experiment.stem)


def script_of(schedule: str) -> Path:
    """The script a schedule (its name, or its cron entry's or timer's file name) runs."""
    return SCRIPT_DIR / f"{schedule.removesuffix('.timer')}.sh"


def parse_at(at: str) -> tuple[int, int]:
    m = re.fullmatch(r"([01]?\d|2[0-3]):([0-5]\d)", at)
    if not m:
        raise SpecError(f"AT={at!r}: a time of day is HH:MM (00:00 to 23:59), e.g. AT=02:00")
    return int(m[1]), int(m[2])


def uses_systemd() -> bool:
    return Path("/run/systemd/system").is_dir()


@dataclass
class Schedule:
    experiment: Path
    at: str
    keep_captures_days: int
    extra: str = ""  # further make variables (SET=..., ONLY=..., RACKS=...)

    @property
    def name(self) -> str:
        return schedule_name(self.experiment)

    def command(self) -> str:
        make = [
            "make", "-C", str(PROJECT_DIR), "nightly-run",
            f"EXPERIMENT={self.experiment}", f"KEEP_CAPTURES={self.keep_captures_days}",
        ]  # fmt: skip
        words = shlex.join(make)
        return f"{words} {self.extra}".strip()

    def log_file(self) -> Path:
        return NIGHTLY_DIR / self.experiment.stem / "nightly.log"

    def script_file(self) -> Path:
        return script_of(self.name)

    def install(self) -> list[Path]:
        """Write the script, and write (and enable) the timer or cron entry that runs it;
        return the files written."""
        hour, minute = parse_at(self.at)
        systemd = uses_systemd()
        if not systemd:
            ensure_cron()  # first: a failed install leaves no script behind
        self.log_file().parent.mkdir(parents=True, exist_ok=True)
        script = self.script_file()
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(
            f"#!/bin/sh\n# trialbed nightly batch (make nightly-install); make nightly-remove "
            f"removes it\nexec {self.command()} >> {shlex.quote(str(self.log_file()))} 2>&1\n"
        )
        script.chmod(0o755)
        if systemd:
            service = UNIT_DIR / f"{self.name}.service"
            timer = UNIT_DIR / f"{self.name}.timer"
            service.write_text(
                "[Unit]\nDescription=trialbed nightly batch of "
                f"{self.experiment}\n\n[Service]\nType=oneshot\nExecStart=/bin/sh {script}\n"
            )
            timer.write_text(
                f"[Unit]\nDescription=trialbed nightly batch of {self.experiment} at {self.at}\n\n"
                f"[Timer]\nOnCalendar=*-*-* {hour:02d}:{minute:02d}:00\nPersistent=true\n\n"
                "[Install]\nWantedBy=timers.target\n"
            )
            subprocess.run(["systemctl", "daemon-reload"], check=True)
            subprocess.run(["systemctl", "enable", "--now", timer.name], check=True)
            return [script, service, timer]
        entry = CRON_DIR / self.name
        entry.write_text(
            "# trialbed nightly batch (make nightly-install); remove with make nightly-remove\n"
            "SHELL=/bin/sh\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
            f"{minute} {hour} * * * root /bin/sh {script}\n"
        )
        entry.chmod(0o644)
        return [script, entry]


def ensure_cron() -> None:
    """cron from Debian's package, running (no systemd here to start it)."""
    if not shutil.which("cron"):
        subprocess.run(["apt-get", "install", "-y", "-q", "cron"], check=True)
    pidfile = Path("/run/crond.pid")
    pid = pidfile.read_text().strip() if pidfile.exists() else ""
    if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
        subprocess.run(["cron"], check=True)  # daemonizes itself, writes /run/crond.pid


def scheduled_command(schedule: Path) -> str:
    """What an installed schedule runs: its script's command line, or (a schedule installed
    before the scripts) the command written in the schedule itself."""
    script = script_of(schedule.name)
    try:
        return script.read_text().strip().splitlines()[-1].removeprefix("exec ")
    except (OSError, IndexError):
        own = schedule.with_suffix(".service") if schedule.suffix == ".timer" else schedule
        try:
            lines = own.read_text().strip().splitlines()
        except OSError:
            return f"? (neither {script} nor {own} can be read)"
        line = next((x for x in lines if x.startswith("ExecStart=")), lines[-1] if lines else "")
        return f"{line} (no script: an earlier install; install it again to quote SET safely)"


def installed() -> list[Path]:
    files = sorted(CRON_DIR.glob("trialbed-nightly-*")) if CRON_DIR.is_dir() else []
    if UNIT_DIR.is_dir():
        files += sorted(UNIT_DIR.glob("trialbed-nightly-*.timer"))
    return files


def remove(experiment: Path | None) -> list[Path]:
    """Remove the schedule of one experiment, or every trialbed schedule."""
    removed = []
    for path in installed():
        stem = path.name.removesuffix(".timer")
        if experiment is not None and stem != schedule_name(experiment):
            continue
        if path.suffix == ".timer":
            subprocess.run(["systemctl", "disable", "--now", path.name], check=False)
            path.with_suffix(".service").unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        script_of(stem).unlink(missing_ok=True)
        removed.append(path)
    if removed and uses_systemd():
        subprocess.run(["systemctl", "daemon-reload"], check=False)
    for directory in (SCRIPT_DIR, SCRIPT_DIR.parent):  # /etc/trialbed/nightly, once empty
        with contextlib.suppress(OSError):
            directory.rmdir()
    return removed


def dated_batch(experiment: Path, day: datetime | None = None) -> Path:
    day = day or datetime.now(UTC)
    return NIGHTLY_DIR / experiment.stem / day.strftime(NIGHT)


def prune(experiment: Path, keep_days: int, today: datetime | None = None) -> list[Path]:
    """Remove the captures of this experiment's nightly batches older than keep_days (at
    least 1), their tables, records and reports kept. Only the captures of trials whose
    analysis was written go (a trial never analysed keeps them: they are all there is of
    it), and never in the newest batch. Each pruned batch lists what went in PRUNED.json,
    which Batch.verify reads: a resumed batch does not run its pruned trials again."""
    if keep_days < 1:
        raise ValueError(f"keep the captures at least 1 day, not {keep_days}")
    today = today or datetime.now(UTC)
    pruned = []
    batches = sorted((NIGHTLY_DIR / experiment.stem).glob("????-??-??"))
    for batch in batches[:-1]:
        day = datetime.strptime(batch.name, NIGHT).replace(tzinfo=UTC)
        if today - day <= timedelta(days=keep_days):
            continue
        files, kept = [], 0
        for trial in sorted(BatchDir(batch).trials.glob("*")):
            captures = [p for p in trial.rglob("*") if p.is_file() and p.suffix in CAPTURE_SUFFIXES]
            if TrialDir(trial).summary.exists():
                files += captures
            else:
                kept += len(captures)
        if not files:
            continue
        freed = sum(p.stat().st_size for p in files)
        for p in files:
            p.unlink()
        note_path = batch / PRUNED_FILE
        earlier = json.loads(note_path.read_text()) if note_path.exists() else {}
        removed = sorted({*earlier.get("removed", []), *(str(p.relative_to(batch)) for p in files)})
        note = {
            "pruned": today.isoformat(timespec="seconds"),
            "keep_captures_days": keep_days,
            "removed_files": len(removed),
            "freed_bytes": freed + earlier.get("freed_bytes", 0),
            "kept_not_analysed": kept,
            "note": "captures removed by the retention rule (listed in removed; the manifests "
            "still name them); tables (summary.parquet, analysis/) are intact; captures of "
            "trials never analysed are kept",
            "removed": removed,
        }
        note_path.write_text(json.dumps(note, indent=2) + "\n")
        pruned.append(batch)
    return pruned


def last_runs(limit: int = 10) -> list[dict]:
    """The most recent nightly batches of every experiment, newest first."""
    runs = []
    for batch in NIGHTLY_DIR.glob("*/????-??-??"):
        meta = BatchDir(batch).meta
        if not meta.exists():
            continue
        trials = json.loads(meta.read_text())["trials"]
        status = {}
        for t in trials:
            record = BatchDir(batch).trial(t["name"]).record
            s = json.loads(record.read_text()).get("status") if record.exists() else "not run"
            status[s] = status.get(s, 0) + 1
        runs.append(
            {
                "experiment": batch.parent.name,
                "date": batch.name,
                "batch": str(batch),
                "trials": len(trials),
                "status": status,
                "pruned": (batch / PRUNED_FILE).exists(),
            }
        )
    runs.sort(key=lambda r: (r["date"], r["experiment"]), reverse=True)
    return runs[:limit]
