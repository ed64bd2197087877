"""Experiment files written for a test, and the error a bad one gets (shared by the schema
tests: test_spec*, test_marking, test_rio)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trials.plan import load_plan
from trials.spec import SpecError

PROJECT = Path(__file__).resolve().parents[2]

# A chain2 experiment with every kind of element the schema tests change one at a time.
GOOD = """\
experiment: startup
topology: chain2
network:
  links:
    - {name: bottleneck, between: [R1, R2], rate: 1.5mbit, buffer: 20pkt, delay: 50ms}
    - {name: access1, between: [S1, R1], rate: 10mbit, buffer: 100pkt, forward: {delay: 0s}}
traffic:
  - {type: bulk_tcp, name: first, from: S1, to: D1, cc: reno}
  - {type: bulk_tcp, name: late, from: S2, to: D2, cc: reno, start: 15s}
  - {type: cbr_udp, from: S2, to: D2, dscp: af11}
capture:
  points:
    - {name: before, link: access1, at: R1}
    - {name: r2_core, node: R2, interface: core}
hosts:
  senders: {initcwnd: 10, rto_min: 200ms, tcp_no_metrics_save: 1, rcvbuf: 128kB}
duration: 30s
factors:
  hosts.senders.initcwnd: [1, 3, 10]
  traffic[late].start: [0s, 15s]
repetitions: 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str, sets: tuple[str, ...] = ()) -> str:
    """The message loading `text` fails with, on one line; it must name the file."""
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as exc:
        load_plan(path, sets)
    message = " ".join(str(exc.value).split())
    assert str(path) in message  # every message names the file
    return message


def check(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m trials check` of ``text`` written as tmp_path/exp.yml (touches no host)."""
    return subprocess.run(
        [sys.executable, "-m", "trials", "check", str(write(tmp_path, text)), *args],
        capture_output=True, text=True, cwd=PROJECT, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
