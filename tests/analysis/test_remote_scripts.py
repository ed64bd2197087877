"""The remote recorders run exactly as the runner starts them (collect.remote's commands), on
this machine: tc samples of the loopback device; tcp_probe of a loopback TCP transfer."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis.tc_samples import read_tc_samples
from analysis.tcp_probe import for_flows, read_tcp_probe
from collect.remote import tc_sampler_command, tcp_probe_command


def start(command: str, cwd: Path) -> subprocess.Popen:
    """As core.daemons.Daemons.spawn runs it: sh -c 'exec COMMAND' in the trial directory."""
    return subprocess.Popen(["sh", "-c", "exec " + command], cwd=cwd, stderr=subprocess.PIPE)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err.decode()


def test_tc_sampler_every_10_ms(tmp_path: Path) -> None:
    proc = start(tc_sampler_command(["lo"], out="tc_samples.jsonl"), tmp_path)
    out = tmp_path / "tc_samples.jsonl"
    # Until it has written a few dozen samples (on a loaded machine, start-up takes a while).
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        not out.exists() or len(out.read_text().splitlines()) < 30
    ):
        time.sleep(0.1)
    stop(proc)
    samples = read_tc_samples(tmp_path / "tc_samples.jsonl")
    last = (tmp_path / "tc_samples.jsonl").read_text().splitlines()[-1]
    assert '"end": true' in last
    assert set(samples.dev) == {"lo"} and len(samples) >= 20  # 50 slots, some skipped
    gaps = samples.ts_ns.diff().dropna()
    off_grid = gaps % 10_000_000
    off_grid = off_grid.where(off_grid < 5_000_000, 10_000_000 - off_grid)
    assert gaps.min() > 0 and off_grid.median() < 2_000_000  # on the 10 ms grid


def test_tc_sampler_survives_overrunning_every_slot(tmp_path: Path) -> None:
    # A 1 µs grid: every tc call overruns and each wait is computed a hair from its deadline
    # (once in CI a wait came out negative and the sampler died with ValueError mid-trial).
    proc = start(tc_sampler_command(["lo"], out="tc_samples.jsonl", interval_ms=0.001), tmp_path)
    time.sleep(3)
    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    stop(proc)
    end = (tmp_path / "tc_samples.jsonl").read_text().splitlines()[-1]
    assert '"end": true' in end and '"skipped": 0' not in end


@pytest.mark.skipif(os.geteuid() != 0, reason="tracefs needs root")
def test_tcp_probe_records_a_loopback_transfer(tmp_path: Path) -> None:
    cmd = tcp_probe_command(["127.0.0.1"], out="tcp_probe.txt", tag="test trial/1")
    proc = start(cmd, tmp_path)
    assert proc.stderr is not None
    assert proc.stderr.readline().startswith(b"recording tcp_probe")  # what the runner waits for
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def sink() -> None:
        conn, _ = server.accept()
        while conn.recv(1 << 16):
            pass
        conn.close()

    reader = threading.Thread(target=sink)
    reader.start()
    client = socket.create_connection(("127.0.0.1", port))
    sport = client.getsockname()[1]
    for _ in range(200):
        client.sendall(bytes(64_000))
    client.close()
    reader.join()
    server.close()
    time.sleep(0.2)
    stop(proc)
    text = (tmp_path / "tcp_probe.txt").read_text()
    assert text.startswith("# trialbed-tcp-probe ") and "# end " in text
    assert not [d for d in os.listdir("/sys/kernel/tracing/instances") if f"-{proc.pid}" in d]
    events = read_tcp_probe(tmp_path / "tcp_probe.txt")
    flow = pd.DataFrame({"src": ["127.0.0.1"], "dst": ["127.0.0.1"], "sport": [sport]})
    mine = for_flows(events, flow.assign(dport=port))
    assert len(mine) > 10 and (mine.snd_cwnd >= 1).all()
    assert abs(mine.ts_ns.iloc[0] - time.time_ns()) < 60 * 10**9  # realtime clock
