"""`trials report` on a results directory some of whose files are missing, cut short or
replaced by another file (a copy of tests/data/results_v1, one trial per kind of damage): each
damaged trial is named with the file and what is wrong with it, the intact one is reported
with the numbers its day wrote, no traceback, and the exit code says something was wrong."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from collect.fetch import write_manifest

PROJECT = Path(__file__).resolve().parents[2]
FIXTURE = PROJECT / "tests/data/results_v1/20261206T195014Z-smoke"
FOREIGN = b"\x89PNG\r\n\x1a\n" + bytes(range(256))  # another file: an image


def cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def foreign(path: Path) -> None:
    path.write_bytes(FOREIGN)


# trial -> (its file, what is done to it, what the report says of it)
DAMAGE: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "record_cut": ("trial.json", cut, "trial.json: not JSON (Unterminated string"),
    "record_foreign": ("trial.json", foreign, "trial.json: not UTF-8 text (byte 0)"),
    "record_list": ("trial.json", lambda p: p.write_text("[1]"), "trial.json: holds a JSON list"),
    "record_missing": ("trial.json", Path.unlink, "trial.json: missing; the trial is not analysed"),
    "pcap_cut": ("R/bottleneck_in.pcap", cut, "R/bottleneck_in.pcap: not the file collected"),
    "pcap_foreign": ("R/bottleneck_in.pcap", foreign, "R/bottleneck_in.pcap: not a capture file"),
    "snapshot_missing": ("R/tc_after.txt", Path.unlink, "R/tc_after.txt: missing (listed"),
    "samples_foreign": ("R/tc_samples.jsonl", foreign, "R/tc_samples.jsonl: not UTF-8 text"),
    "probe_foreign": ("A/tcp_probe.txt", foreign, "A/tcp_probe.txt: not the file collected"),
    "snapshot_foreign": ("R/tc_before.txt", foreign, "R/tc_before.txt: not UTF-8 text"),
    "manifest_foreign": ("MANIFEST.sha256", foreign, "MANIFEST.sha256: not a manifest (not text"),
}  # fmt: skip


@pytest.fixture(scope="module")
def reported(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    batch = tmp_path_factory.mktemp("results") / FIXTURE.name
    shutil.copytree(FIXTURE, batch)
    trials = batch / "trials"
    (trials / "r1").rename(trials / "intact")
    for name, (file, damage, _) in {"intact": ("", None, ""), **DAMAGE}.items():
        trial = trials / name
        if name != "intact":
            shutil.copytree(trials / "intact", trial)
        record = json.loads((trial / "trial.json").read_text())
        (trial / "trial.json").write_text(json.dumps({**record, "trial": name}))
        (trial / "MANIFEST.sha256").unlink()
        write_manifest(trial)  # as collected: then damaged
        if damage is not None:
            damage(trial / file)
    done = subprocess.run(
        [sys.executable, "-m", "trials", "report", str(batch)],
        cwd=PROJECT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "2000"},
    )  # fmt: skip
    return batch, done


def said_of(output: str, trial: str) -> str:
    """The report's table of one trial (what follows its title, up to the next one)."""
    parts = re.split(r"\n\s*Trial (\S+): ", output)
    return next((body for name, body in zip(parts[1::2], parts[2::2], strict=True)
                 if name == trial), "")  # fmt: skip


def test_every_damaged_file_is_named_and_the_rest_is_reported(reported):
    batch, done = reported
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output[-3000:]
    assert done.returncode == 1, output[-3000:]
    for trial, (file, _, said) in DAMAGE.items():
        path = str(batch / "trials" / trial / file).removesuffix(file)
        where = said_of(output, trial) or output  # no record: said before the tables
        lines = [line for line in where.splitlines() if path in line and said in line]
        assert lines, f"{trial}: {said!r} not said of {path}:\n{where[:3000]}"
    assert "record(s) unreadable; each is named in its trial above" in output


def test_the_intact_trial_is_reported_with_the_numbers_its_day_wrote(reported):
    _, done = reported
    table = said_of(done.stdout + done.stderr, "intact")
    assert table.startswith("complete") and "files" not in table and "error" not in table
    stored = json.loads((FIXTURE / "trials/r1/analysis/summary.json").read_text())
    assert f"{stored['goodput_kBps']:.1f} KB/s" in table, table
