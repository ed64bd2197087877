"""Issue 49's end-to-end check: three nightly-style batches of the smoke experiment on the test
rack (the third with a smaller bottleneck buffer: a planted change) land in the results
catalog; `trialbed results query` reads them; the regressions test flags the planted night
(exit 3, its OWD among the metrics changed) and nothing on the unchanged one (exit 0); the
report says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import PROJECT
from trials.nightly import CHANGE_FOUND

# long: `make test-long` (15 trials: about 6 minutes on the namespace rack).
pytestmark = [pytest.mark.rack, pytest.mark.long]

TRIALBED = Path(sys.executable).parent / "trialbed"  # make setup's console entry point
SHORT = ["--set", "duration=8s", "--set", "warmup=2s", "--set", "repetitions=5"]
PLANTED = ["--set", "network.links[downstream].buffer=15000B"]  # 60 000 B in smoke.yml


def trialbed(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(TRIALBED), *args], cwd=PROJECT, capture_output=True, text=True, check=False,
        stdin=subprocess.DEVNULL, env=env, timeout=1800,
    )  # fmt: skip


def test_three_nights_one_planted_change_found_and_nothing_else(test_rack, tmp_path):
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("TRIALBED_CATALOG", None)
    nights = tmp_path / "results" / "nightly" / "smoke"
    days = ["2026-12-01", "2026-12-02", "2026-12-03"]
    for day, planted in zip(days, ([], [], PLANTED), strict=True):
        done = trialbed(
            "batch", "experiments/smoke.yml", "--batch", str(nights / day),
            "--rack", str(test_rack.inventory), *SHORT, *planted, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    catalog = tmp_path / "results" / "catalog"
    done = trialbed(
        "results", "query", "--catalog", str(catalog), "--csv",
        "SELECT date, count(*) AS n, count(*) FILTER (WHERE status = 'complete') AS complete "
        "FROM trials WHERE experiment = 'smoke' GROUP BY date ORDER BY date", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["date,n,complete"] + [f"{d},5,5" for d in days]

    quiet = trialbed("results", "regressions", str(nights / days[1]), env=env)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "verdict: no change found" in quiet.stdout

    planted = trialbed("results", "regressions", str(nights / days[2]), env=env)
    assert planted.returncode == CHANGE_FOUND, planted.stdout + planted.stderr
    assert "verdict: CHANGED" in planted.stdout
    assert "voip.owd_median_ms" in planted.stdout, planted.stdout  # the smaller queue's delay

    done = subprocess.run(
        [sys.executable, "-m", "analysis.html_report", str(nights / days[2]), "--previous",
         "none"], cwd=PROJECT, capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    page = (nights / days[2] / "report" / "index.html").read_text()
    assert "Regressions (tested against the baseline)" in page and "Changed:" in page
