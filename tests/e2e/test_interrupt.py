"""Ctrl-C in the middle of a trial: the network is restored, nothing captured is lost."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from analysis.trial import analyse_trial
from collect.fetch import verify_manifest
from core.rack import Rack
from core.units import parse_offset_ns
from tests.e2e.conftest import PREFIX, start_trials, wait_for_daemon

pytestmark = pytest.mark.rack

EXPERIMENT = """\
experiment: collateral_damage
network:
  links:
    - {name: downstream, from: R, to: C, rate: 1mbit, buffer: 60000B, delay: 50ms}
    - {name: upstream, from: R, to: A, rate: 1mbit, buffer: 60000B, delay: 50ms}
traffic:
  - {type: bulk_tcp, name: tcp, from: A, to: C, flows: 2}
  - {type: cbr_udp, name: voip, from: B, to: D}
capture:
  points:
    - {name: bottleneck_in, link: upstream, at: R}
    - {name: bottleneck_out, link: downstream, at: R}
hosts:
  all: {cc: reno}
duration: 60s
warmup: 5s
"""


def namespace_commands(host: str) -> set[str]:
    pids = subprocess.run(
        ["ip", "netns", "pids", PREFIX + host], capture_output=True, text=True, check=True
    ).stdout.split()
    names = set()
    for pid in pids:
        with contextlib.suppress(OSError):  # ended meanwhile
            names.add(Path(f"/proc/{pid}/comm").read_text().strip())
    return names


def test_ctrl_c_mid_trial_restores_the_network_and_keeps_the_captures(test_rack, tmp_path):
    exp_file = tmp_path / "interrupt.yml"
    exp_file.write_text(EXPERIMENT)
    results = tmp_path / "results"
    proc = start_trials(str(exp_file), inventory=test_rack.inventory, results=results)
    # Wait until the TCP sender is launched, then let traffic flow for a few seconds.
    wait_for_daemon(proc, test_rack, "A", "tcp_client")
    time.sleep(8)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "interrupted" in err

    (trial_dir,) = results.glob("*/trials/*")
    record = json.loads((trial_dir / "trial.json").read_text())
    assert record["status"] == "interrupted", record["errors"]
    # Its queues drained before the captures stopped: they read every packet their filter passed.
    assert not [e for e in record["errors"] if "capture" in e], record["errors"]
    assert (trial_dir / "R" / "bottleneck_in.pcap").stat().st_size > 100_000
    assert verify_manifest(trial_dir) == []
    # Its metrics cover only the time it ran, and say so.
    stale = trial_dir / "analysis" / "table_of_older_code.parquet"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"PAR1")
    tcp = analyse_trial(trial_dir)["generators"]["tcp"]
    assert not stale.exists()  # the analysis directory is the new run's whole
    assert (trial_dir / "analysis" / "summary.json").exists()
    stopped_at = tcp["window_cut_at_s"]
    assert 4 <= stopped_at < 20, stopped_at  # stopped ~8 s after launch, T0 = launch + 2 s
    gen = record["traffic"]["tcp"]
    steady_from_s = (gen["start_ns"] + parse_offset_ns(record["parameters"]["warmup"])) / 1e9
    if stopped_at > steady_from_s:  # its steady window began: it ends where the trial stopped
        assert tcp["goodput_kBps"] is not None and tcp["steady_window_s"][1] == stopped_at
    else:  # stopped in the warm-up: no steady figures at all
        assert tcp["goodput_kBps"] is None and tcp["steady_window_s"] is None, tcp

    rack = Rack.load([test_rack.inventory])
    try:
        assert "htb" not in rack.run("R", "tc qdisc show")
        assert "TRIALBED_DELAY" not in rack.run("R", "iptables -t mangle -S")
    finally:
        rack.close()
    for host in "ABCDR":
        assert namespace_commands(host) <= {"sshd"}, host
