"""A results directory written before the layout had an owner (format version 1) still loads,
renders, and analyses to the numbers the code of its day wrote (tests/data/results_v1)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import analysis
from core.layout import FORMAT_VERSION, BatchDir
from core.trial_record import read_record

PROJECT = Path(__file__).resolve().parents[2]
FIXTURE = PROJECT / "tests/data/results_v1/20261206T195014Z-smoke"


@pytest.fixture
def old_batch(tmp_path: Path) -> BatchDir:
    """A copy of the fixture (a report writes into its batch)."""
    return BatchDir(Path(shutil.copytree(FIXTURE, tmp_path / FIXTURE.name)))


def scalars(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if isinstance(v, int | float | str | bool)}


def test_its_trial_record_reads_as_format_version_1():
    record = read_record(BatchDir(FIXTURE).trial("r1").record)
    assert record.format_version == 1 < FORMAT_VERSION
    assert record.status == "complete" and record.trial == "r1"
    assert record.times["t0_ns"] > 0 and record.network and record.traffic


def test_analysis_loads_it():
    table = analysis.load(FIXTURE)
    assert list(table["trial"]) == ["r1"]
    row = table.iloc[0]
    stored = json.loads(BatchDir(FIXTURE).trial("r1").summary.read_text())
    assert row["status"] == "complete"
    goodput = [c for c in table.columns if c.endswith("goodput_kBps")]
    assert goodput, list(table.columns)
    assert any(math.isclose(row[c], stored["goodput_kBps"]) for c in goodput)


def test_trials_report_renders_it_with_the_numbers_its_day_wrote(old_batch: BatchDir):
    """`trials report` analyses the captures again: every scalar of the summary is the one
    the old code computed from the same packets."""
    before = scalars(json.loads(old_batch.trial("r1").summary.read_text()))
    done = subprocess.run(
        [sys.executable, "-m", "trials", "report", str(old_batch.path)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "r1" in done.stdout + done.stderr
    after = scalars(json.loads(old_batch.trial("r1").summary.read_text()))
    differ = {
        k: (before[k], after.get(k))
        for k in before
        if not (
            after.get(k) == before[k]
            or (isinstance(before[k], float) and math.isclose(before[k], after.get(k, math.nan)))
        )
    }
    assert not differ, differ
    assert old_batch.summary_table.exists()


def test_make_report_renders_its_html_report(old_batch: BatchDir):
    done = subprocess.run(
        [sys.executable, "-m", "analysis.html_report", str(old_batch.path)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    page = (old_batch.report / "index.html").read_text()
    assert "r1" in page and "collateral" in page.lower()
