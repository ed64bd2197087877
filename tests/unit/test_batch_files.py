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
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.layout import BATCH_META, BatchDir
from tests.as_user import run_as
from trials import batch_worker, locks
from trials.batch import Batch, Claims
from trials.batch_worker import stop_leftovers
from trials.locks import stale_holder
from trials.record import record_failure


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
    fake = SimpleNamespace(path=tmp_path, layout=BatchDir(tmp_path), event=lambda **kw: None)
    a, b = (Claims(fake, holder(r), warn=lambda m: None) for r in "AB")
    got: dict[str, bool] = {}
    b_done = threading.Event()
    real = locks.holder_alive
    hooked = []

    def alive(h, *rest):
        if threading.current_thread().name == "A" and not hooked:
            hooked.append(1)
            worker_b = threading.Thread(target=lambda: (got.update(B=b.claim("t1")), b_done.set()))
            worker_b.name = "B"
            worker_b.start()
            b_done.wait(0.5)  # B runs in A's gap, or waits for A's takeover to end
        return real(h, *rest)

    monkeypatch.setattr(locks, "holder_alive", alive)
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
    fake = SimpleNamespace(path=tmp_path, layout=BatchDir(tmp_path), event=lambda **kw: None)
    claims = Claims(fake, holder("A"), print)
    assert not claims.claim("t1")  # maybe being written right now
    old = time.time() - locks.BLANK_CLAIM_S - 1
    os.utime(path, (old, old))
    assert claims.claim("t1")
    assert json.loads(path.read_text())["rack"] == "A"


def make_batch(tmp_path: Path) -> Batch:
    """A batch directory with one trial, t1 (its files made by each test)."""
    path = tmp_path / "batch"
    (path / "trials").mkdir(parents=True)
    (path / BATCH_META).write_text(json.dumps({"trials": [{"name": "t1", "id": "x"}]}))
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
        record_failure(batch.trial_dir("t1"), "t1", "collect: disk full")
    monkeypatch.undo()
    assert record.read_text() == whole
    assert [p.name for p in record.parent.iterdir()] == ["trial.json"]
    record_failure(batch.trial_dir("t1"), "t1", "collect: disk full")
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
        self.hosts = {"A": SimpleNamespace(workdir=str(workdir), address=str(workdir))}
        self.inventory = [workdir / "hosts.yml"]
        self.codes: list[int] = []
        self.closed = False

    def close(self) -> None:
        self.closed = True

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
    (batch / BATCH_META).write_text(json.dumps({"trials": [{"name": "t1", "id": "x"}]}))
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
    from trials import commands
    from trials.locks import RackLock

    inventory = Path(__file__).resolve().parents[2] / "inventory/lab.example/hosts.yml"
    monkeypatch.setattr(
        commands, "DEFAULT_INVENTORY", inventory
    )  # stands in for the rack that is up
    monkeypatch.setattr(commands.rack_kind, "running_kind", lambda inv: "namespaces")
    monkeypatch.setenv("TRIALBED_LOCK_DIR", str(tmp_path))

    def no_playbook(*args, **kwargs):  # a guard that let it through must not build a rack
        raise AssertionError(f"a playbook would run: {args}")

    monkeypatch.setattr(commands, "run_playbook", no_playbook)
    assert cli.main(["rack-guard"]) == 0  # nobody holds it
    lock = RackLock.for_rack(Rack.load([inventory]), "night-1", "rack")
    lock.acquire()
    try:
        assert cli.main(["rack-guard"]) == 3  # in use (2: could not tell)
        said = " ".join(capsys.readouterr().err.split())
        assert f"the virtual rack is in use (pid {os.getpid()}" in said and "batch night-1" in said
        assert "make rack-down would take it down" in said
        # the role itself, as a user runs it by hand: stopped before it takes anything down
        # (a prefix and state of its own: had it gone on, it had nothing real to remove)
        project = Path(__file__).resolve().parents[2]
        copy = tmp_path / "hosts.yml"
        copy.write_text(inventory.read_text())
        variables = {
            "virtual_rack_state": "absent",
            "virtual_rack_namespace_prefix": "tbg-",
            "virtual_rack_inventory_file": str(copy),
            "virtual_rack_state_dir": str(tmp_path / "state"),
            "virtual_rack_owner_dir": str(tmp_path / "owners"),
        }
        done = subprocess.run(
            [str(project / ".venv/bin/ansible-playbook"), "playbooks/rack.yml"]
            + [a for k, v in variables.items() for a in ("-e", f"{k}={v}")],
            cwd=project, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        said = " ".join(done.stdout.split())
        assert done.returncode == 2, said[-2000:]  # ansible-playbook's: a task failed
        assert f"the virtual rack is in use (pid {os.getpid()}" in said
        assert "rack.yml with virtual_rack_state=absent would take it down, with its" in said
        assert "changed=0" in said and copy.exists()
        with pytest.raises(
            commands.RackBusy, match="bringing up the chain2 rack would take it down"
        ):
            commands.ensure_virtual_rack("chain2")
    finally:
        lock.release()
    assert cli.main(["rack-guard"]) == 0


def test_a_holder_on_another_machine_is_alive_while_its_heartbeat_lasts(tmp_path, monkeypatch):
    """A controller sharing the results directory from another machine: its pid means nothing
    here, so its claim is alive while touched, stale once silent for SILENT_HOLDER_S."""
    path = tmp_path / "claims" / "t1.json"
    path.parent.mkdir()
    far = {**holder("far"), "host": "another-controller"}
    path.write_text(json.dumps(far))  # written by a version without the heartbeat
    silent = time.time() - locks.SILENT_HOLDER_S - 1
    os.utime(path, (silent, silent))
    assert stale_holder(path)[0] is False  # it cannot be judged by a silence it never broke
    path.write_text(json.dumps({**far, "boot": "f" * 32}))
    assert stale_holder(path)[0] is False
    os.utime(path, (silent, silent))
    assert stale_holder(path)[0] is True
    # What keeps a live holder's file fresh: the heartbeat touches what it holds, only that.
    monkeypatch.setattr(locks, "HEARTBEAT_S", 0.05)
    beat = locks.Heartbeat()
    other = tmp_path / "claims" / "t2.json"
    other.write_text("{}")
    os.utime(other, (silent, silent))
    beat.hold(path)
    deadline = time.time() + 5
    while stale_holder(path)[0] and time.time() < deadline:
        time.sleep(0.05)
    assert stale_holder(path)[0] is False
    assert other.stat().st_mtime == pytest.approx(silent)
    beat.drop(path)
    os.utime(path, (silent, silent))
    time.sleep(0.3)
    assert stale_holder(path)[0] is True


def test_a_holders_silence_is_timed_by_the_clock_that_stamps_its_file(tmp_path, monkeypatch):
    """A controller whose clock runs an hour ahead of the file server that stamps the shared
    results directory (here: time.time() ahead of the kernel's stamps) still sees a holder on
    another machine that touched its file just now as alive, and a blank claim of a second ago
    as being written; one silent for SILENT_HOLDER_S by the stamps is stale. Nothing of the
    clock probe stays behind."""
    path = tmp_path / "claims" / "t1.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**holder("far"), "host": "another-controller", "boot": "f" * 32}))
    blank = tmp_path / "claims" / "t2.json"
    blank.write_text("")
    real = time.time
    monkeypatch.setattr(locks.time, "time", lambda: real() + 3600)
    assert stale_holder(path)[0] is False
    assert stale_holder(blank)[0] is False
    silent = real() - locks.SILENT_HOLDER_S - 1
    os.utime(path, (silent, silent))
    assert stale_holder(path)[0] is True
    assert sorted(p.name for p in path.parent.iterdir()) == ["t1.json", "t2.json"]


def test_a_zombie_holds_nothing():
    """A worker killed with its batch is a zombie until init reaps it: not a live holder."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        me = {**locks.this_process(), "pid": child.pid,
              "started": locks.process_started(child.pid)}  # fmt: skip
        assert locks.holder_alive(me)
        child.kill()
        deadline = time.time() + 5  # killed, not reaped (no wait yet): a zombie
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.time() < deadline
            time.sleep(0.01)
        assert not locks.holder_alive(me)
    finally:
        child.kill()
        child.wait()


def test_a_holder_from_before_a_reboot_or_a_reused_pid_is_gone(tmp_path):
    """The controller rebooted (another boot id) or its pid now belongs to another process
    (another start time): the claim is stale, although a process with that pid runs."""
    me = locks.this_process()
    assert me["boot"] and me["started"] is not None
    assert locks.holder_alive(me)
    assert not locks.holder_alive({**me, "boot": "0" * 32})
    assert not locks.holder_alive({**me, "started": me["started"] - 1})
    assert not locks.holder_alive({**me, "pid": 0})  # kill(0) asks about a group
    assert not locks.holder_alive({**me, "pid": dead_pid()})


class FakeRunner:
    def __init__(self, rack: LocalRack, batch: Batch) -> None:
        self.ran: list[str] = []
        self.rack, self.batch = rack, batch

    def trial_dir(self, trial):
        return self.batch.trial_dir(trial.name)

    def run(self, trial):
        self.ran.append(trial.name)
        return {"status": "complete", "errors": []}


def run_t1(batch: Batch, rack: LocalRack, retries: int = 2) -> tuple[int, FakeRunner]:
    """Worker A claims t1 and runs it (run_one): what it returned, and what the runner ran."""
    claims = Claims(batch, holder("A"), warn=print)
    assert claims.claim("t1")
    runner = FakeRunner(rack, batch)
    trial = SimpleNamespace(name="t1", id="x")
    return batch_worker.run_one(batch, claims, runner, trial, "A", retries, print), runner


def attempt_left(batch: Batch, status: str, rack: LocalRack) -> None:
    """trials/t1 as an attempt with ``status`` left it, run on ``rack``."""
    batch.trial_dir("t1").mkdir()
    record = {"trial": "t1", "status": status, "inventory": [str(p) for p in rack.inventory]}
    (batch.trial_dir("t1") / "trial.json").write_text(json.dumps(record))


@pytest.mark.parametrize("retries, runs", [(2, False), (3, True)])
def test_a_trial_whose_worker_keeps_dying_counts_against_retries(tmp_path, retries, runs):
    """Each attempt of t1 killed its worker (left partial); it was run for ever before."""
    batch = make_batch(tmp_path)
    rack = LocalRack(tmp_path / "work")
    for _ in range(2):
        attempt_left(batch, "running", rack)
        batch.set_aside("t1")
    attempt_left(batch, "running", rack)  # the third, found when its worker was gone
    got, runner = run_t1(batch, rack, retries)
    assert runner.ran == (["t1"] if runs else [])
    assert got == int(runs)
    assert not (batch.path / "claims/t1.json").exists()
    assert batch.failed_attempts("t1") == 3
    if not runs:
        last = list(batch.events())[-1]
        assert last["event"] == "failed" and "given up after 3 attempts" in last["error"]
        assert batch_worker.progress(batch, retries).failed == 1
        claims = Claims(batch, holder("A"), warn=print)
        assert batch_worker.next_trial(batch, claims, [SimpleNamespace(name="t1")], retries) is None


def test_a_failed_attempts_files_left_on_a_host_do_not_reach_the_next_attempt(tmp_path):
    """A host stopped answering during t1, so its files stayed there; once it answers again,
    they join that failed attempt's kept directory and are gone from the host before the
    retry writes into the same directory there."""
    batch = make_batch(tmp_path)
    rack = LocalRack(tmp_path / "work")
    left = tmp_path / "work" / "trials" / batch.name / "t1"
    left.mkdir(parents=True)
    (left / "R.pcap").write_bytes(b"from the failed attempt")
    attempt_left(batch, "failed", rack)
    got, runner = run_t1(batch, rack, 2)
    assert got == 1
    kept = batch.path / "attempts" / "t1" / "1-failed"
    assert (kept / "leftovers/A/R.pcap").read_bytes() == b"from the failed attempt"
    assert not left.exists() and runner.ran == ["t1"]


@pytest.mark.parametrize("name", ["my batch", "-x", ".hidden", "a;b", "ünï"])
def test_a_batch_name_a_host_shell_could_misread_is_refused_before_any_rack(tmp_path, name):
    project = Path(__file__).resolve().parents[2]
    args = [
        "batch",
        "experiments/smoke.yml",
        "--batch",
        str(tmp_path / name),
        "--rack",
        str(tmp_path / "no-such-inventory"),
    ]
    done = subprocess.run(
        [str(project / ".venv/bin/python"), "-m", "trials", *args],
        capture_output=True, text=True, cwd=project, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr
    assert f"BATCH={tmp_path / name}: the batch's name {name!r} may hold only letters" in said
    assert not (tmp_path / name).exists()


def test_a_partial_attempt_of_another_rack_brings_its_files_from_that_rack(tmp_path, monkeypatch):
    """Rack B's worker died in t1; rack A takes t1 over. B's files for t1 are on B's hosts:
    they are fetched from there (B's inventory, from the attempt's record), not looked for on A."""
    batch = make_batch(tmp_path)
    rack_a, rack_b = LocalRack(tmp_path / "a"), LocalRack(tmp_path / "b")
    left = tmp_path / "b" / "trials" / batch.name / "t1"
    left.mkdir(parents=True)
    (left / "tcp_probe.txt").write_bytes(b"B's recording")
    attempt_left(batch, "running", rack_b)
    loaded = []
    monkeypatch.setattr(batch_worker.Rack, "load", lambda inv: loaded.append(inv) or rack_b)
    got, runner = run_t1(batch, rack_a, 2)
    assert got == 1
    assert loaded == [rack_b.inventory] and rack_b.closed
    kept = batch.path / "attempts" / "t1" / "1-partial"
    assert (kept / "leftovers/A/tcp_probe.txt").read_bytes() == b"B's recording"
    assert not left.exists() and runner.ran == ["t1"]


def test_an_experiment_file_whose_name_makes_a_bad_batch_name_is_refused(tmp_path):
    project = Path(__file__).resolve().parents[2]
    odd = tmp_path / "my smoke.yml"
    shutil.copyfile(project / "experiments/smoke.yml", odd)
    done = subprocess.run(
        [str(project / ".venv/bin/python"), "-m", "trials", "check", str(odd)],
        capture_output=True, text=True, cwd=project, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr
    assert f"{odd} (its name makes the batch's): the batch's name" in said
    assert "rename the file, or give the batch a name (BATCH=results/NAME)" in said


def test_a_collection_cut_short_is_finished_before_the_trial_runs_again(tmp_path):
    """The worker was stopped while it brought an earlier attempt's files back (the attempt
    was already set aside, so t1 reads as "todo"): the next one finishes that first; before,
    the retry's own collection took those files as its own."""
    batch = make_batch(tmp_path)
    rack = LocalRack(tmp_path / "work")
    attempt_left(batch, "running", rack)
    kept = batch.set_aside("t1")
    assert batch.status("t1") == "todo" and batch.pending_leftovers("t1") == [
        (kept, [str(p) for p in rack.inventory])
    ]
    left = tmp_path / "work" / "trials" / batch.name / "t1"
    left.mkdir(parents=True)
    (left / "R.pcap").write_bytes(b"not yet brought back")
    got, runner = run_t1(batch, rack, 2)
    assert got == 1
    assert (kept / "leftovers/A/R.pcap").read_bytes() == b"not yet brought back"
    assert not left.exists() and runner.ran == ["t1"] and batch.pending_leftovers("t1") == []
    assert json.loads((kept / "ATTEMPT.json").read_text())["leftovers"] == "collected"


class SilentHostRack(LocalRack):
    def run(self, host, command, check=True, timeout=None):
        raise batch_worker.RackError(f"{host} does not answer")


def test_files_that_cannot_be_brought_back_keep_the_trial_from_running(tmp_path):
    """The host that kept the failed attempt's files does not answer: running again would
    write beside them; the trial fails, saying so, and the attempt stays pending."""
    batch = make_batch(tmp_path)
    rack = SilentHostRack(tmp_path / "work")
    attempt_left(batch, "failed", rack)
    got, runner = run_t1(batch, rack, 2)
    assert got == 0
    assert runner.ran == [] and not (batch.path / "claims/t1.json").exists()
    record = json.loads((batch.trial_dir("t1") / "trial.json").read_text())
    assert record["status"] == "failed"
    assert "the files of its attempt 1-failed are still on A: A does not answer" in record["errors"]
    assert len(batch.pending_leftovers("t1")) == 1 and batch.failed_attempts("t1") == 2


LOCK_AS_NOBODY = """
import sys
from pathlib import Path
from core.rack import Rack, RackError
from trials.locks import RackLock
rack = Rack.load([Path(sys.argv[1])])
become_the_user()  # nobody from here on: the modules and the inventory are read
lock = RackLock.for_rack(rack, "night-1", "rack")
try:
    lock.acquire()
except RackError as exc:
    print(exc)
else:
    print("held")
    lock.release()
"""


@pytest.fixture
def open_tmp():
    """A directory other users may enter (tmp_path's parents are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="trialbed-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.mark.changes_user
@pytest.mark.skipif(os.geteuid() != 0, reason="switches to the user nobody")
def test_a_controller_user_who_cannot_write_the_lock_directory_is_told_what_to_do(open_tmp):
    """A batch run by a user other than root: a lock directory it cannot write gives what to
    do (it was a PermissionError traceback); a stale lock of another user in the shared,
    sticky directory is named, not taken; a directory writable by all takes its lock."""
    inventory = Path(__file__).resolve().parents[2] / "inventory/lab.example/hosts.yml"
    root_only = open_tmp / "root_only"
    root_only.mkdir(mode=0o755)
    shared = open_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o1777)

    def as_nobody(lock_dir: Path) -> str:
        env = {**os.environ, "TRIALBED_LOCK_DIR": str(lock_dir), "HOME": "/tmp"}
        done = run_as("nobody", LOCK_AS_NOBODY, str(inventory), cwd=open_tmp, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    said = as_nobody(root_only)
    assert said.startswith(f"cannot write a rack lock in {root_only} (Permission denied)")
    assert "Run `make setup` once as root" in said and "TRIALBED_LOCK_DIR" in said
    assert as_nobody(shared) == "held"
    assert list(shared.iterdir()) == []  # released
    from core.rack import Rack
    from trials.locks import RackLock

    lock = RackLock.for_rack(Rack.load([inventory]), "night-0", "rack")
    lock.path = shared / lock.path.name
    lock.path.write_text(json.dumps({**holder("rack"), "pid": dead_pid()}))  # root's, gone
    guard = lock.path.with_name(f".{lock.path.name}.takeover")
    guard.write_text("")  # root's guard of an earlier takeover, 0644: nobody can only read it
    guard.chmod(0o644)
    said = as_nobody(shared)
    assert said.startswith(f"the rack's lock {lock.path} is left by a process that is gone")
    assert said.endswith("belongs to another user: remove it as that user or root")
    assert lock.path.exists()


def test_a_batch_resumed_with_parameters_that_resolve_otherwise_says_why(tmp_path, monkeypatch):
    """The same trials whose parameters now resolve otherwise (here the file edited, as a
    changed default of the code would): the refusal names the commit the batch began with."""
    from trials import batch as batch_module
    from trials.plan import load_plan
    from trials.spec import SpecError

    project = Path(__file__).resolve().parents[2]
    source = tmp_path / "smoke.yml"
    source.write_text((project / "experiments" / "smoke.yml").read_text())
    plan = load_plan(source, ["repetitions=2"])
    path = tmp_path / "results" / "smoke"
    monkeypatch.setattr(batch_module, "git_state", lambda: {"commit": "a" * 40, "dirty": False})
    Batch.create_or_resume(path, plan, plan.trials, ["repetitions=2"], None)
    assert json.loads(BatchDir(path).meta.read_text())["code"] == "a" * 40
    again = load_plan(source, ["repetitions=2"])
    Batch.create_or_resume(path, again, again.trials, ["repetitions=2"], None)  # resumes

    source.write_text(source.read_text().replace("warmup: 5s", "warmup: 6s"))
    edited = load_plan(source, ["repetitions=2"])
    assert [t.name for t in edited.trials] == [t.name for t in plan.trials]
    monkeypatch.setattr(batch_module, "git_state", lambda: {"commit": "b" * 40, "dirty": False})
    with pytest.raises(SpecError) as exc:
        Batch.create_or_resume(path, edited, edited.trials, ["repetitions=2"], None)
    said = str(exc.value)
    assert "this batch holds another plan" in said and "not in it: r1, r2" in said
    assert "The same trials' parameters resolve otherwise now" in said
    assert f"the batch began with commit {'a' * 12}, this is {'b' * 12}" in said
    assert f"git worktree add ../at-aaaaaaa {'a' * 12}" in said

    more = load_plan(source, ["repetitions=3"])  # other trials: no word of the parameters
    with pytest.raises(SpecError) as exc:
        Batch.create_or_resume(path, more, more.trials, ["repetitions=3"], None)
    assert "resolve otherwise" not in str(exc.value)
