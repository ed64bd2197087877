"""The remote recorders run exactly as the runner starts them (core.hostside's commands), on
this machine: tc samples of the loopback device; tcp_probe of a loopback TCP transfer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis.tc_samples import read_tc_samples
from analysis.tcp_probe import for_flows, read_tcp_probe
from core.hostside import SOURCE, tc_sampler_command, tcp_probe_command
from tests.hostside import load

HOSTSIDE = str(SOURCE)  # the programs as the hosts get them


def start(command: str, cwd: Path) -> subprocess.Popen:
    """As core.daemons.Daemons.spawn runs it: sh -c 'exec COMMAND' in the trial directory."""
    return subprocess.Popen(["sh", "-c", "exec " + command], cwd=cwd, stderr=subprocess.PIPE)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err.decode()


def wait_for_samples(out: Path, lines: int) -> None:
    """Until the sampler has written `lines` lines, 20 s at most (on a loaded machine its
    start takes a while)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        not out.exists() or len(out.read_text().splitlines()) < lines
    ):
        time.sleep(0.1)


def test_tc_sampler_every_10_ms(tmp_path: Path) -> None:
    proc = start(tc_sampler_command(HOSTSIDE, ["lo"], out="tc_samples.jsonl"), tmp_path)
    wait_for_samples(tmp_path / "tc_samples.jsonl", 30)
    stop(proc)
    samples = read_tc_samples(tmp_path / "tc_samples.jsonl")
    end = json.loads((tmp_path / "tc_samples.jsonl").read_text().splitlines()[-1])
    assert end["end"] and end["samples"] == len(samples) and end["failed"] == 0
    assert set(samples.dev) == {"lo"} and len(samples) >= 20
    assert samples.ts_ns.diff().dropna().min() > 0
    # No drift: the time from the first sample to the last is the slots it sampled or
    # skipped (10 ms each), give or take how late a loaded machine woke it for either one.
    # (The exact grid is test_tc_sampler_keeps_a_grid's, on a virtual clock.)
    slots = (samples.ts_ns.iloc[-1] - samples.ts_ns.iloc[0]) / 10_000_000
    assert slots <= len(samples) - 1 + end["skipped"] + 2, (slots, end)


def test_tc_sampler_keeps_a_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a virtual clock, with tc answering in 3 ms (once in 25 ms): a sample's time is the
    midpoint of its tc call, the calls start on a 10 ms grid from the first, and the slots a
    call overran are skipped (counted), the next call on the grid again."""
    tc_sampler = load("recorders/tc_sampler.py")

    now = [1_800_000_000 * 10**9]
    starts: list[int] = []

    class Clock:
        @staticmethod
        def time_ns() -> int:
            return now[0]

        @staticmethod
        def monotonic() -> float:
            return now[0] / 1e9

        @staticmethod
        def sleep(seconds: float) -> None:
            assert seconds > 0
            now[0] += round(seconds * 1e9)

    class Tc:
        def __init__(self, *_args) -> None:
            pass

        def show(self) -> str:
            starts.append(now[0])
            if len(starts) > 12:
                raise tc_sampler.Stop  # as the SIGTERM handler does
            now[0] += 25_000_000 if len(starts) == 5 else 3_000_000
            return json.dumps([{"dev": "lo", "kind": "noqueue"}, {"dev": "eth9", "kind": "x"}])

        def close(self) -> None:
            pass

    out = tmp_path / "tc_samples.jsonl"
    monkeypatch.setattr(tc_sampler, "time", Clock)
    monkeypatch.setattr(tc_sampler, "BatchTc", Tc)
    monkeypatch.setattr(tc_sampler, "ForkTc", Tc)
    monkeypatch.setattr(tc_sampler, "STOP_SIGNALS", ())  # this process's handlers stay
    monkeypatch.setattr(sys, "argv", ["tc_sampler.py", "--out", str(out), "lo"])
    assert tc_sampler.main() == 0
    first = starts[0]
    slots = [0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14]  # the 5th call took slots 4 to 6
    assert starts == [first + k * 10_000_000 for k in slots]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[-1] == {"end": True, "samples": 12, "skipped": 2, "failed": 0}
    spread = [25_000_000 if k == 4 else 3_000_000 for k in slots[:12]]
    assert [x["ts_ns"] for x in lines[:-1]] == [
        s + d // 2 for s, d in zip(starts[:12], spread, strict=True)
    ]
    assert [x["spread_ns"] for x in lines[:-1]] == spread
    assert {x["dev"] for x in lines[:-1]} == {"lo"}


def test_tc_sampler_survives_overrunning_every_slot(tmp_path: Path) -> None:
    # A 1 µs grid: every tc call overruns and each wait is computed a hair from its deadline
    # (once in CI a wait came out negative and the sampler died with ValueError mid-trial).
    proc = start(
        tc_sampler_command(HOSTSIDE, ["lo"], out="tc_samples.jsonl", interval_ms=0.001), tmp_path
    )
    out = tmp_path / "tc_samples.jsonl"
    wait_for_samples(out, 100)  # sampling (its signal handlers set)
    time.sleep(1)
    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    stop(proc)
    end = out.read_text().splitlines()[-1]
    assert '"end": true' in end and '"skipped": 0' not in end


@pytest.mark.skipif(os.geteuid() != 0, reason="tracefs needs root")
def test_tcp_probe_records_a_loopback_transfer(tmp_path: Path) -> None:
    cmd = tcp_probe_command(HOSTSIDE, ["127.0.0.1"], out="tcp_probe.txt", tag="test trial/1")
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
