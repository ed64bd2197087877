"""Nightly batches: make nightly-install puts a real schedule in place (a systemd timer where
systemd runs, else cron), the schedule fires and runs the batch into a dated directory with
its report, nightly-status lists it, the retention rule removes old captures only, and
nightly-remove takes the schedule away."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.e2e.conftest import PROJECT
from tests.e2e.test_collateral_damage import EXPERIMENT
from trials import nightly

pytestmark = pytest.mark.rack


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", *args], cwd=PROJECT, capture_output=True, text=True, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_bad_time_of_day_is_refused():
    done = make("nightly-install", "EXPERIMENT=experiments/smoke.yml", "AT=25:00")
    assert done.returncode != 0
    assert "AT='25:00'" in done.stderr and "HH:MM" in done.stderr
    assert not nightly.installed() or all("smoke" not in p.name for p in nightly.installed())


@pytest.fixture
def scheduled_experiment(tmp_path):
    """An experiment file of its own, so that its nightly directory is the test's."""
    path = PROJECT / ".state" / f"nightly-test-{os.getpid()}.yml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(EXPERIMENT)
    made = [d for d in (nightly.NIGHTLY_DIR, nightly.NIGHTLY_DIR.parent) if not d.exists()]
    yield path
    make("nightly-remove", f"EXPERIMENT={path}")
    shutil.rmtree(nightly.NIGHTLY_DIR / path.stem, ignore_errors=True)
    path.unlink(missing_ok=True)
    for directory in made:  # results/nightly (and results/) when the test made them, if empty
        with contextlib.suppress(OSError):
            directory.rmdir()


def test_the_schedule_fires_runs_the_batch_and_is_removed(test_rack, scheduled_experiment):
    cron_pidfile = Path("/run/crond.pid")
    cron_pid = cron_pidfile.read_text().strip() if cron_pidfile.exists() else ""
    cron_was_running = bool(cron_pid) and Path(f"/proc/{cron_pid}").exists()
    # The first minute that begins at least 30 s from now: time for make nightly-install (a
    # few seconds, its make setup finding the venv current) and for cron, which reads a
    # changed crontab as each minute begins, to see the entry before that minute.
    at = (datetime.now() + timedelta(seconds=90)).replace(second=0, microsecond=0)
    extra = f'RACKS={test_rack.inventory} SET="duration=6s warmup=1s"'
    done = make(
        "nightly-install", f"EXPERIMENT={scheduled_experiment}", f"AT={at:%H:%M}",
        "KEEP_CAPTURES=7", f"NIGHTLY_VARS={extra}",
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        (entry,) = [p for p in nightly.installed() if scheduled_experiment.stem in p.name]
        assert f"{at:%H:%M}" in done.stdout or f"{at.minute} {at.hour}" in entry.read_text()

        # the day the batch is dated by is the UTC day it fires on (midnight may come between)
        batch = nightly.dated_batch(scheduled_experiment, at.astimezone(UTC))
        report = batch / "report.txt"
        # A cold checkout's first scheduled run took 175-425 s here (CI runs 1.3-1.9x longer)
        deadline = time.monotonic() + 600
        log = nightly.NIGHTLY_DIR / scheduled_experiment.stem / "nightly.log"
        while not report.exists():
            assert time.monotonic() < deadline, (
                f"the schedule did not finish the batch within 600 s: {log} ends with:\n"
                + ("\n".join(log.read_text(errors="replace").splitlines()[-40:])
                   if log.exists() else "(no log: the schedule never ran)")
            )  # fmt: skip
            time.sleep(2)
        time.sleep(2)  # the report is written in one go; retention follows
        (trial,) = (batch / "trials").iterdir()
        assert json.loads((trial / "trial.json").read_text())["status"] == "complete"
        assert "Table 1" in report.read_text()
        page = batch / "report" / "index.html"
        deadline = time.monotonic() + 60
        while not page.exists() and time.monotonic() < deadline:
            time.sleep(1)
        assert "Table 1" in page.read_text()

        status = make("nightly-status")
        assert status.returncode == 0
        assert scheduled_experiment.stem in status.stdout and batch.name in status.stdout

        # Retention: a batch older than KEEP_CAPTURES days loses its captures, not its tables.
        old_day = datetime.now(UTC) - timedelta(days=8)
        old = nightly.dated_batch(scheduled_experiment, old_day)
        shutil.copytree(batch, old)
        pcaps = list(old.rglob("*.pcap"))
        assert pcaps
        pruned = nightly.prune(scheduled_experiment, 7)
        assert pruned == [old]
        assert not any(p.exists() for p in pcaps)
        assert (old / "summary.parquet").exists() and (old / "PRUNED.json").exists()
        assert list(batch.rglob("*.pcap")), "today's captures were removed"
    finally:
        removed = make("nightly-remove", f"EXPERIMENT={scheduled_experiment}")
        assert removed.returncode == 0
        if not cron_was_running and cron_pidfile.exists():
            os.kill(int(cron_pidfile.read_text().strip()), 15)  # the cron this test started
    assert not [p for p in nightly.installed() if scheduled_experiment.stem in p.name]
