"""Batches on the virtual rack: a failing trial retried and recorded, resume after the controller
is SIGKILLed, the rack lock, and one plan shared by two racks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from collect.fetch import verify_manifest
from core.rack import Rack
from tests.e2e.conftest import PROJECT, built_rack
from tests.e2e.test_collateral_damage import EXPERIMENT
from trials.locks import lock_dir, rack_key

pytestmark = pytest.mark.rack

SHORT = ["--set", "duration=6s", "--set", "warmup=1s"]


def batch_cmd(exp: Path, batch: Path, *racks: Path, reps: int = 3) -> list[str]:
    cmd = [sys.executable, "-m", "trials", "batch", str(exp), "--batch", str(batch), *SHORT]
    cmd += ["--set", f"repetitions={reps}", "--retries", "1"]
    for rack in racks:
        cmd += ["--rack", str(rack)]
    return cmd


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )


def events(batch: Path) -> list[dict]:
    path = batch / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(predicate, what: str, timeout: float = 180, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the batch ended before {what}: {out[-2000:]} {err[-2000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def trial_status(batch: Path) -> dict[str, str]:
    out = {}
    for record in (batch / "trials").glob("*/trial.json"):
        out[record.parent.name] = json.loads(record.read_text())["status"]
    return out


@pytest.fixture
def experiment(tmp_path) -> Path:
    path = tmp_path / "cd.yml"
    path.write_text(EXPERIMENT)
    return path


# Takes C's iperf3 port. An earlier test's iperf3 server may have left connections in
# TIME_WAIT on it for up to 60 s (measured: EADDRINUSE once in a full run): bind until it may.
BIND_5201 = """
import errno, socket, time
s = socket.socket()
for _ in range(90):
    try:
        s.bind(("198.18.2.13", 5201))
        break
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        time.sleep(1)
else:
    raise SystemExit("198.18.2.13:5201 stayed in use for 90 s")
print("bound", flush=True)
time.sleep(600)
"""


def test_a_failed_and_a_sigkilled_trial_each_run_again_once(test_rack, experiment, tmp_path):
    """The TCP receiver's port is taken during the first trial (iperf3 cannot listen): it fails
    with iperf3's own error and the batch goes on. Controller and worker are SIGKILLed
    together (as a crash or reboot would) while the second trial sends. The batch run again
    retries the failed trial, runs the killed one anew, keeps both attempts labelled, and
    runs nothing twice."""
    batch = tmp_path / "batch"
    cmd = batch_cmd(experiment, batch, test_rack.inventory, reps=2)
    blocker = subprocess.Popen(
        ["ip", "netns", "exec", f"{test_rack.prefix}C", sys.executable, "-c", BIND_5201],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert blocker.stdout.readline().strip() == "bound"
        proc = subprocess.Popen(
            cmd, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        wait_for(lambda: any(e["event"] == "failed" for e in events(batch)), "a failure", proc=proc)
    finally:
        blocker.kill()
        blocker.wait()
        blocker.stdout.close()
    wait_for(lambda: sum(e["event"] == "start" for e in events(batch)) == 2, "trial 2", proc=proc)
    (failure,) = [e for e in events(batch) if e["event"] == "failed"]
    killed = [e for e in events(batch) if e["event"] == "start"][-1]["trial"]
    assert killed != failure["trial"]  # the other trial runs before the retry
    rack = Rack.load([test_rack.inventory])
    remote = {
        h: f"{rack.host(h).workdir}/trials/{batch.name}/{killed}" for h in rack.hosts
    }  # fmt: skip
    # In the traffic phase: captures, iperf3 and tcpreplay run on the hosts.
    sender_pid = f"{remote['A']}/tcp_client.pid"
    wait_for(
        lambda: rack.run("A", f"test -s {sender_pid} && echo y", check=False), "traffic", proc=proc
    )
    time.sleep(1)
    pids = {
        h: rack.run(h, f"cat {d}/*.pid 2>/dev/null | cut -d' ' -f1", check=False).split()
        for h, d in remote.items()
    }
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()  # reaps it and closes its pipes
    assert sum(len(p) for p in pids.values()) >= 2, pids  # daemons were running when killed

    again = run(cmd)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "taking over the rack lock of a process that is gone" in " ".join(again.stderr.split())
    status = trial_status(batch)
    assert status == {"r1": "complete", "r2": "complete"}, status
    done = Counter(e["trial"] for e in events(batch) if e["event"] == "done")
    assert done == Counter({"r1": 1, "r2": 1}), done
    assert [e["trial"] for e in events(batch) if e["event"] == "failed"] == [failure["trial"]]
    assert any(e["event"] == "takeover" and e["trial"] == killed for e in events(batch))
    for name in status:
        assert verify_manifest(batch / "trials" / name) == []
    # iperf3's own words: the client was refused, the server could not listen.
    assert "iperf3 client on A: unable to connect to server" in failure["error"]
    assert "iperf3 server on C left" in failure["error"]
    (kept,) = (batch / "attempts" / failure["trial"]).iterdir()
    assert kept.name == "1-failed"
    record = json.loads((kept / "trial.json").read_text())
    assert record["status"] == "failed" and any("iperf3" in e for e in record["errors"])
    # The killed attempt is kept, labelled as partial; its daemons were stopped.
    (partial,) = (batch / "attempts" / killed).iterdir()
    assert partial.name == "1-partial"
    assert json.loads((partial / "ATTEMPT.json").read_text())["status"] == "partial"
    # What it wrote on the hosts before the kill came back with it (its captures), and is
    # gone from the hosts.
    leftovers = sorted(f"{p.parent.name}/{p.name}" for p in (partial / "leftovers").glob("*/*"))
    print(f"killed attempt's files brought back: {leftovers}")
    assert "R/bottleneck_in.pcap" in leftovers, leftovers
    rack_files = {h: rack.run(h, f"ls {d} 2>/dev/null", check=False) for h, d in remote.items()}
    assert not any(rack_files.values()), rack_files
    for pid in (p for ps in pids.values() for p in ps):
        assert not Path(f"/proc/{pid}").exists(), f"daemon {pid} of the killed trial still runs"
    rack.close()

    # Once more: nothing is left to run and nothing runs again.
    third = run(cmd)
    assert third.returncode == 0, third.stderr[-2000:]
    assert Counter(e["trial"] for e in events(batch) if e["event"] == "done") == done


def test_a_rack_in_use_is_refused_naming_the_holder(test_rack, experiment, tmp_path):
    rack = Rack.load([test_rack.inventory])
    lock = lock_dir() / f"rack-{rack_key(rack)}.json"
    rack.close()
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = {
        "pid": os.getpid(), "host": socket.gethostname(), "batch": "nightly-x", "rack": "virtual",
        "hosts": "A, B", "since": "2026-11-22T02:00:00+00:00",
    }  # fmt: skip
    lock.write_text(json.dumps(holder))
    try:
        done = run(batch_cmd(experiment, tmp_path / "batch", test_rack.inventory, reps=1))
    finally:
        lock.unlink()
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert f"pid {os.getpid()} on {socket.gethostname()}, batch nightly-x" in message
    assert "since 2026-11-22T02:00:00+00:00" in message
    assert not (tmp_path / "batch" / "trials").exists()


@pytest.fixture(scope="module")
def second_rack(tmp_path_factory):
    yield from built_rack(tmp_path_factory, "dumbbell", "tu-", 5)


def test_two_racks_share_one_plan(test_rack, second_rack, experiment, tmp_path):
    batch = tmp_path / "batch"
    started = time.monotonic()
    done = run(batch_cmd(experiment, batch, test_rack.inventory, second_rack.inventory, reps=2))
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finished = [e for e in events(batch) if e["event"] == "done"]
    assert Counter(e["trial"] for e in finished) == Counter({"r1": 1, "r2": 1})
    # Each rack claims a trial as it starts: one each, at the same time.
    per_rack = Counter(e["rack"] for e in finished)
    assert sorted(per_rack.values()) == [1, 1], per_rack
    assert all(s == "complete" for s in trial_status(batch).values())
    # Both ran at once: the later of the two started before the earlier one was done.
    started_at = {e["trial"]: e["time"] for e in events(batch) if e["event"] == "start"}
    done_at = {e["trial"]: e["time"] for e in finished}
    at = datetime.fromisoformat
    assert at(max(started_at.values())) < at(min(done_at.values())), (started_at, done_at)
    busy = sum(e["seconds"] for e in finished)
    print(f"two racks: {busy:.0f} s of trials in {wall:.0f} s wall ({busy / wall:.2f}x)")
