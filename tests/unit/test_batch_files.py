"""A batch's own files under races and faults (trials/batch.py), without a rack: claims and
rack locks taken over once, blank claims, attempt numbers, failure records on a full disk,
manifests cut short, and the leftover clean-up's paths."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from trials import batch as batch_mod
from trials.batch import Batch, Claims, record_failure, stop_leftovers


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def holder(rack: str) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "batch": "b", "rack": rack}


def stale_claim(tmp_path: Path, name: str = "t1") -> Path:
    path = tmp_path / "claims" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**holder("gone"), "pid": dead_pid()}))
    return path


def test_two_workers_taking_over_one_stale_claim_get_it_once(tmp_path, monkeypatch):
    """Worker B tries to take over while A is between reading the stale claim and making its
    own (the gap in which, before, B's fresh claim was unlinked by A: both ran the trial)."""
    path = stale_claim(tmp_path)
    fake = SimpleNamespace(path=tmp_path, event=lambda **kw: None)
    a, b = (Claims(fake, holder(r), warn=lambda m: None) for r in "AB")
    got: dict[str, bool] = {}
    b_done = threading.Event()
    real = batch_mod.holder_alive
    hooked = []

    def alive(h):
        if threading.current_thread().name == "A" and not hooked:
            hooked.append(1)
            worker_b = threading.Thread(target=lambda: (got.update(B=b.claim("t1")), b_done.set()))
            worker_b.name = "B"
            worker_b.start()
            b_done.wait(0.5)  # B runs in A's gap, or waits for A's takeover to end
        return real(h)

    monkeypatch.setattr(batch_mod, "holder_alive", alive)
    worker_a = threading.Thread(target=lambda: got.update(A=a.claim("t1")), name="A")
    worker_a.start()
    worker_a.join(10)
    assert b_done.wait(10)
    assert sorted(got.values()) == [False, True], got
    winner = next(k for k, v in got.items() if v)
    assert json.loads(path.read_text())["rack"] == winner


def test_a_blank_claim_is_taken_over_only_once_it_is_old(tmp_path):
    path = tmp_path / "claims" / "t1.json"
    path.parent.mkdir(parents=True)
    path.write_text("")  # its writer died between creating and writing it
    claims = Claims(SimpleNamespace(path=tmp_path, event=lambda **kw: None), holder("A"), print)
    assert not claims.claim("t1")  # maybe being written right now
    old = time.time() - batch_mod.BLANK_CLAIM_S - 1
    os.utime(path, (old, old))
    assert claims.claim("t1")
    assert json.loads(path.read_text())["rack"] == "A"


def make_batch(tmp_path: Path) -> Batch:
    """A batch directory with one trial, t1 (its files made by each test)."""
    path = tmp_path / "batch"
    (path / "trials").mkdir(parents=True)
    (path / batch_mod.BATCH_FILE).write_text(json.dumps({"trials": [{"name": "t1", "id": "x"}]}))
    return Batch(path)


def test_attempt_numbers_go_on_from_the_highest(tmp_path):
    batch = make_batch(tmp_path)
    for status in ("interrupted", "failed"):
        batch.trial_dir("t1").mkdir()
        (batch.trial_dir("t1") / "trial.json").write_text(json.dumps({"status": status}))
        batch.set_aside("t1")
    attempts = batch.path / "attempts" / "t1"
    assert sorted(p.name for p in attempts.iterdir()) == ["1-interrupted", "2-failed"]
    shutil.rmtree(attempts / "1-interrupted")  # the user removed the first one
    batch.trial_dir("t1").mkdir()
    (batch.trial_dir("t1") / "trial.json").write_text(json.dumps({"status": "failed"}))
    assert batch.set_aside("t1").name == "3-failed"  # it was 2 before: the kept 2-failed's


def test_a_full_disk_leaves_the_trial_record_whole(tmp_path, monkeypatch):
    batch = make_batch(tmp_path)
    record = batch.trial_dir("t1") / "trial.json"
    record.parent.mkdir()
    whole = json.dumps({"trial": "t1", "status": "complete", "errors": [], "x": "y" * 4000})
    record.write_text(whole)
    real = Path.write_text

    def disk_full(self, text, *args, **kwargs):
        real(self, text[: len(text) // 3], *args, **kwargs)  # what fitted
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(OSError, match="No space"):
        record_failure(batch, "t1", "collect: disk full")
    monkeypatch.undo()
    assert record.read_text() == whole
    assert [p.name for p in record.parent.iterdir()] == ["trial.json"]
    record_failure(batch, "t1", "collect: disk full")
    assert json.loads(record.read_text())["errors"] == ["collect: disk full"]


def test_a_manifest_that_does_not_list_the_record_is_not_done(tmp_path):
    batch = make_batch(tmp_path)
    trial = batch.trial_dir("t1")
    trial.mkdir()
    (trial / "trial.json").write_text(json.dumps({"status": "complete"}))
    (trial / "MANIFEST.sha256").write_text("")  # cut short
    assert not batch.done("t1")
    (trial / "MANIFEST.sha256").write_text(f"{'0' * 64}  trial.json\n")
    assert batch.done("t1")


class LocalRack:
    """One host, "A", that is this machine: commands run in sh, files copied (what
    stop_leftovers and pull_host ask of a rack)."""

    def __init__(self, workdir: Path) -> None:
        self.hosts = {"A": SimpleNamespace(workdir=str(workdir))}
        self.codes: list[int] = []

    def run(self, host, command, check=True, timeout=None):
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
        self.codes.append(done.returncode)
        return done.stdout

    def run_parallel(self, commands, check=True):
        return {h: self.run(h, c) for h, c in commands.items()}

    def get(self, host, remote, local):
        shutil.copyfile(remote, local)


def test_leftovers_of_a_killed_attempt_are_kept_then_removed_and_nothing_else(tmp_path):
    work = tmp_path / "work dir"
    leftover = work / "trials" / "my batch" / "t1"
    leftover.mkdir(parents=True)
    (leftover / "p.pcap").write_bytes(b"captured before the controller died")
    bystander = tmp_path / "work"  # what an unquoted path would have cut it to
    bystander.mkdir()
    (bystander / "keep").write_text("x")
    kept = tmp_path / "attempts" / "t1" / "1-partial"
    kept.mkdir(parents=True)
    rack = LocalRack(work)
    assert stop_leftovers(rack, "my batch", "t1", keep_into=kept) == []  # type: ignore[arg-type]
    assert not leftover.exists() and (bystander / "keep").exists()
    assert (kept / "leftovers/A/p.pcap").read_bytes() == b"captured before the controller died"
    assert stop_leftovers(rack, "my batch", "t1", keep_into=kept) == []  # type: ignore[arg-type]
    assert [p.name for p in (kept / "leftovers/A").iterdir()] == ["p.pcap"]  # nothing more


def nightly_batch(root: Path, day: str, analysed: bool) -> Path:
    """A dated nightly batch with one complete trial t1, its capture in its manifest."""
    from collect.fetch import write_manifest

    batch = root / "exp" / day
    trial = batch / "trials" / "t1"
    (trial / "R").mkdir(parents=True)
    (batch / batch_mod.BATCH_FILE).write_text(json.dumps({"trials": [{"name": "t1", "id": "x"}]}))
    (trial / "R" / "p.pcap").write_bytes(b"\xd4\xc3\xb2\xa1" + bytes(100))
    (trial / "trial.json").write_text(json.dumps({"status": "complete"}))
    if analysed:
        (trial / "analysis").mkdir()
        (trial / "analysis" / "summary.json").write_text("{}")
    write_manifest(trial)
    return batch


def test_retention_prunes_only_analysed_trials_of_older_batches(tmp_path, monkeypatch):
    from trials import nightly

    monkeypatch.setattr(nightly, "NIGHTLY_DIR", tmp_path)
    today = nightly.datetime(2026, 11, 28, tzinfo=nightly.UTC)
    old = nightly_batch(tmp_path, "2026-11-01", analysed=True)
    never_analysed = nightly_batch(tmp_path, "2026-11-02", analysed=False)
    newest = nightly_batch(tmp_path, "2026-11-03", analysed=True)  # tonight's failed to run
    with pytest.raises(ValueError, match="at least 1 day"):
        nightly.prune(Path("exp.yml"), 0, today)
    assert nightly.prune(Path("exp.yml"), 14, today) == [old]
    assert not (old / "trials/t1/R/p.pcap").exists()
    assert (old / "trials/t1/analysis/summary.json").exists()
    note = json.loads((old / "PRUNED.json").read_text())
    assert note["removed"] == ["trials/t1/R/p.pcap"]
    assert (never_analysed / "trials/t1/R/p.pcap").exists()  # all there is of that trial
    assert (newest / "trials/t1/R/p.pcap").exists()  # the newest batch is never pruned
    # resumed, the pruned batch runs nothing again: its removed captures are not "changed"
    assert Batch(old).done("t1") and Batch(old).verify() == {}
    (old / "trials/t1/trial.json").write_text(json.dumps({"status": "complete", "x": 1}))
    assert Batch(old).verify() == {"t1": ["trial.json"]}  # a changed file still counts


def test_a_rack_in_use_is_not_taken_down_or_replaced(tmp_path, monkeypatch, capsys):
    """make rack-down / rack-up of another topology (and a `trials run` that would replace the
    rack) while a batch holds the rack's lock: refused, naming the holder, before Ansible."""
    import trials.__main__ as cli
    from core.rack import Rack
    from trials.batch import RackLock

    inventory = Path(__file__).resolve().parents[2] / "inventory/lab.example/hosts.yml"
    monkeypatch.setattr(cli, "DEFAULT_INVENTORY", inventory)  # stands in for the rack that is up
    monkeypatch.setattr(cli.rack_kind, "running_kind", lambda inv: "namespaces")
    monkeypatch.setenv("TRIALBED_LOCK_DIR", str(tmp_path))

    def no_playbook(*args, **kwargs):  # a guard that let it through must not build a rack
        raise AssertionError(f"a playbook would run: {args}")

    monkeypatch.setattr(cli, "run_playbook", no_playbook)
    assert cli.main(["rack-guard", "down"]) == 0  # nobody holds it
    lock = RackLock.for_rack(Rack.load([inventory]), "night-1", "rack")
    lock.acquire()
    try:
        assert cli.main(["rack-guard", "down"]) == 2
        said = " ".join(capsys.readouterr().err.split())
        assert f"the virtual rack is in use (pid {os.getpid()}" in said and "batch night-1" in said
        assert "make rack-down would take it down" in said
        assert cli.main(["rack-guard", "up", "--topology", "chain2"]) == 2
        with pytest.raises(cli.RackBusy, match="bringing up the chain2 rack would take it down"):
            cli.ensure_virtual_rack("chain2")
    finally:
        lock.release()
    assert cli.main(["rack-guard", "down"]) == 0
