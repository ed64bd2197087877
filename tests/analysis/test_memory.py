"""The trial analysis holds less than the largest capture it reads: a fresh process doing what
`trials report` does, on a generated trial of millions of packets (a capture of 600 MB), its
peak resident memory measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .trialgen import write_trial

ROOT = Path(__file__).resolve().parents[2]
PACKETS = 6_000_000  # the budget: ~270 MB and ~0.4 byte a byte of the largest capture
# What `trials report BATCH` runs, then the process's peak RSS: VmHWM of its own address
# space (getrusage's ru_maxrss keeps the high-water mark of the process it was forked from).
REPORT = """
import sys
from pathlib import Path
from analysis.report import analyse_batch, print_batch
print_batch(analyse_batch(Path(sys.argv[1])))
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
print("peak", int(status["VmHWM"].split()[0]) * 1024)
"""


def test_a_trials_analysis_holds_less_than_its_largest_capture(tmp_path: Path) -> None:
    """Reading one capture at a time in blocks, holding a few bytes of each packet and
    writing the queue's events a piece at a time, the report of a trial whose captures hold
    6 M packets each peaks below the size of the largest (and it analysed the trial: its
    numbers are the generator's)."""
    batch = tmp_path / "batch"
    trial = write_trial(batch / "trials" / "t1", packets=PACKETS, probe_every=4)
    largest = max(p.stat().st_size for p in trial.captures)
    assert largest > 500e6
    done = subprocess.run(
        [sys.executable, "-c", REPORT, str(batch)], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
    )  # fmt: skip
    peak = int(done.stdout.split("peak ")[-1])
    assert peak < largest, f"peak RSS {peak / 1e6:.0f} MB, largest capture {largest / 1e6:.0f} MB"
    summary = json.loads((trial.dir / "analysis" / "summary.json").read_text())
    udp = summary["generators"]["voip"]
    assert (udp["udp_packets"], udp["udp_lost"]) == (trial.truth.udp_sent, trial.truth.udp_lost)
    assert summary["queues"]["downstream"]["queue_drops_capture"] == trial.queue_drops
