"""Batches: a plan run unattended into one results directory, which is the batch's whole state.

    results/<batch>/
      batch.json              the plan: experiment, --set, --only, every trial (seeded order)
      experiment.yml          the experiment file as it was when the batch began
      trials/<name>/          the current (or last) attempt of each trial
      attempts/<name>/<n>-<status>/   earlier attempts, kept: interrupted (partial) or failed
      claims/<name>.json      which worker runs the trial now (pid, host, rack, since)
      events.jsonl            one line per claim, end of a trial, failure, takeover
      workers/<rack>.log      each worker's log

A trial is done when its trial.json says complete and its manifest verifies; it is never run
again. Each rack gets one worker process; workers claim trials one at a time (an exclusive
file create), so two racks share a plan and no trial runs twice. A claim whose process is
gone (SIGKILL, reboot) is taken over: the attempt it left is moved to attempts/ as partial.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analysis.results import attempt_number, ended_attempts
from collect.fetch import (
    MANIFEST,
    CollectError,
    manifest_entries,
    pull_host,
    verify_manifest,
    write_whole,
)
from core.rack import Rack, RackError
from trials.plan import Plan, Trial, load_plan
from trials.spec import SpecError

BATCH_FILE = "batch.json"
# A batch's name names a directory on every host (and in shell commands there).
BATCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def batch_name_problem(name: str, given_as: str) -> str | None:
    """Why ``name`` cannot name a batch (``given_as`` says where it came from), or None."""
    if BATCH_NAME.fullmatch(name):
        return None
    return (
        f"{given_as}: the batch's name {name!r} may hold only letters, digits and . _ + - "
        "(not first: . + -), because it names a directory on every host"
    )


# Shared by every user of the controller (sticky and writable by all, as /tmp): scripts/setup.sh
# run as root has systemd-tmpfiles make it at each boot; TRIALBED_LOCK_DIR replaces it.
LOCK_DIR = Path("/run/trialbed/locks")


def lock_dir() -> Path:
    return Path(os.environ.get("TRIALBED_LOCK_DIR", LOCK_DIR))


def lock_dir_problem(path: Path, exc: OSError) -> str:
    return (
        f"cannot write a rack lock in {path} ({exc.strerror}): the directory where every "
        "controller user's batches and trials lock their racks. Run `make setup` once as "
        "root (it has it made at each boot, writable by all as /tmp), or set "
        "TRIALBED_LOCK_DIR to a directory every user of this controller can write"
    )


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs. A zombie does not: a batch's worker SIGKILLed with its
    parent stays one until init reaps it, which a batch started right after saw as the rack
    lock's live holder (kill(pid, 0) succeeds on a zombie)."""
    if pid <= 0:  # kill(0) would ask about our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        state = _stat_fields(pid)[0]  # field 3
    except FileNotFoundError:  # reaped since the kill, or no /proc at all
        return not Path("/proc/self").exists()
    except OSError:
        return True  # /proc hides it (hidepid): kill's answer stands
    return state not in ("Z", "X")


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat from the third on (the ones after "(comm)", which may
    hold spaces and parentheses itself); OSError when it cannot be read."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def create_new(path: Path) -> int | None:
    """A file descriptor of ``path`` created by this call, None when it exists already: who
    creates a claim or a lock file holds it."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return None


BLANK_CLAIM_S = 60  # a claim or lock file still empty after this was never written: stale
HEARTBEAT_S = 30  # a live holder touches its claim and lock files this often
SILENT_HOLDER_S = 600  # a holder on another machine whose file was not touched for this long


def boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def process_started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (/proc/<pid>/stat field 22):
    a pid reused by another process has another."""
    try:
        return int(_stat_fields(pid)[19])
    except OSError:
        return None


def this_process() -> dict[str, Any]:
    """Who holds a claim or lock: enough to tell later whether that process still runs, even
    after a reboot or once its pid is reused."""
    pid = os.getpid()
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "boot": boot_id(),
        "started": process_started(pid),
    }


class Heartbeat:
    """Touches the claim and lock files this process holds every HEARTBEAT_S: a controller
    on another machine sharing them cannot see our pid, only that the file stays fresh."""

    def __init__(self) -> None:
        self.paths: set[Path] = set()
        self.guard = threading.Lock()
        self.thread: threading.Thread | None = None

    def hold(self, path: Path) -> None:
        with self.guard:
            self.paths.add(path)
            if self.thread is None:
                self.thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
                self.thread.start()

    def drop(self, path: Path) -> None:
        with self.guard:
            self.paths.discard(path)

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            # Touched under the guard: once drop() returns, the file is not touched again (a
            # touch after the holder let go would make a released claim look alive).
            with self.guard:
                for path in self.paths:
                    with contextlib.suppress(OSError):
                        os.utime(path)


HEARTBEAT = Heartbeat()


@contextlib.contextmanager
def taking_over(path: Path) -> Iterator[None]:
    """Serialize taking over ``path`` (a claim or a rack lock of a process that is gone):
    reading the old holder, removing it and creating ours happen under one flock, so two
    workers that both found it stale cannot both take it (one would unlink the claim the
    other had just made). Creating a free one (O_EXCL) needs no lock."""
    import fcntl

    # read-only: in the shared lock directory another user's guard file is readable only
    fd = os.open(path.with_name(f".{path.name}.takeover"), os.O_RDONLY | os.O_CREAT, 0o644)
    with os.fdopen(fd) as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


def stale_holder(path: Path) -> tuple[bool, dict[str, Any]]:
    """(whether the claim or lock at ``path`` may be taken over, its holder). A file still
    blank after BLANK_CLAIM_S was never written (its writer died or found the disk full).
    Its age is read on the clock that stamped it (stamp_clock)."""
    try:
        text = path.read_text()
        stamped = path.stat().st_mtime
    except FileNotFoundError:
        return True, {}
    except OSError:
        return False, {}
    try:
        other = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        other = {}

    def silence() -> float:  # asked only where the answer depends on it (a probe file)
        return stamp_clock(path.parent) - stamped

    if not other:
        return silence() > BLANK_CLAIM_S, {}
    return not holder_alive(other, silence), other


def stamp_clock(directory: Path) -> float:
    """Now, on the clock that stamps the files of ``directory``: a file server's for a
    results directory that controllers share (NFS stamps a touch with the server's time), so
    that a file's age does not move with this controller's clock offset from the server
    (one ahead by minutes judged a live holder on another machine silent). Read from a probe
    file of this process, touched and removed; this machine's clock where none can be made."""
    try:  # a new file of a name no one could foresee (the lock directory is shared, 1777)
        fd, probe = tempfile.mkstemp(prefix=".clock.", dir=directory)
    except OSError:
        return time.time()
    try:
        os.utime(fd)  # a stamp by whoever stamps this directory's files
        return os.fstat(fd).st_mtime
    except OSError:
        return time.time()
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def holder_alive(holder: dict[str, Any], silence: Callable[[], float] = lambda: 0.0) -> bool:
    """Whether the process a lock or claim names still runs. On this machine: its pid runs,
    since the same boot, and is the same process (not a reuse of the pid). On another (a
    controller sharing the results directory): its file was touched within SILENT_HOLDER_S
    (``silence()`` is how long ago)."""
    if holder.get("host") != socket.gethostname():
        # Only a holder that beats (it records its boot) is judged by its silence, timed on
        # the clock that stamped its file (stamp_clock).
        return "boot" not in holder or silence() < SILENT_HOLDER_S
    if holder.get("boot") and holder["boot"] != boot_id():
        return False  # the machine rebooted since: a pid of before means nothing now
    pid = int(holder.get("pid", 0))
    if not pid_alive(pid):
        return False
    started = holder.get("started")
    return started is None or process_started(pid) in (None, started)


def describe(holder: dict[str, Any]) -> str:
    return (
        f"pid {holder.get('pid')} on {holder.get('host')}, batch {holder.get('batch')}, "
        f"rack {holder.get('rack')}, since {holder.get('since')}"
    )


# -- the rack lock ----------------------------------------------------------------------------


def rack_key(rack: Rack) -> str:
    """The same rack gives the same key from any checkout or inventory path: its hosts'
    management addresses."""
    ident = ",".join(sorted(f"{n}@{h.address}" for n, h in rack.hosts.items()))
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


class RackBusy(RackError):
    pass


def rack_in_use(rack: Rack) -> dict[str, Any] | None:
    """The live holder of the rack's lock (a batch or `make trial` running on it), or None."""
    path = RackLock.for_rack(rack, "", "").path
    if not path.exists():
        return None
    stale, other = stale_holder(path)
    return None if stale else other


@dataclass
class RackLock:
    """One batch (or `make trial`) per rack. The lock file names its holder; a holder that is
    gone is replaced, with a warning."""

    path: Path
    holder: dict[str, Any]
    warn: Callable[[str], None] = print

    @classmethod
    def for_rack(cls, rack: Rack, batch: str, label: str, warn: Callable[[str], None] = print):
        hosts = ", ".join(sorted(rack.hosts))
        holder = {
            **this_process(),
            "batch": batch,
            "rack": label,
            "hosts": hosts,
            "since": now_iso(),
        }
        return cls(lock_dir() / f"rack-{rack_key(rack)}.json", holder, warn)

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except PermissionError as exc:
            raise RackError(lock_dir_problem(self.path.parent, exc)) from None
        for _ in range(2):
            fd = self._create()
            if fd is None:
                with taking_over(self.path):
                    stale, other = stale_holder(self.path)
                    if not stale:
                        said = describe(other) if other else "its holder is writing it"
                        raise RackBusy(
                            f"the rack ({self.holder['hosts']}) is in use: {said} "
                            f"(lock {self.path}). Wait for it, or stop that process."
                        ) from None
                    gone = describe(other) if other else "a lock never written"
                    try:
                        with contextlib.suppress(FileNotFoundError):
                            self.path.unlink()
                    except PermissionError:  # the sticky directory: another user's file
                        raise RackBusy(
                            f"the rack's lock {self.path} is left by a process that is gone "
                            f"({gone}), and belongs to another user: remove it as that user "
                            "or root"
                        ) from None
                    self.warn(f"taking over the rack lock of a process that is gone ({gone})")
                    fd = self._create()
                if fd is None:
                    continue  # made afresh by another process meanwhile: look again
            self._write(fd)
            HEARTBEAT.hold(self.path)
            return
        raise RackBusy(f"could not take the rack lock {self.path}")

    def _create(self) -> int | None:
        try:
            return create_new(self.path)
        except PermissionError as exc:
            raise RackError(lock_dir_problem(self.path.parent, exc)) from None

    def _write(self, fd: int) -> None:
        with os.fdopen(fd, "w") as f:
            json.dump(self.holder, f)

    def release(self) -> None:
        HEARTBEAT.drop(self.path)
        with contextlib.suppress(OSError, json.JSONDecodeError):
            if json.loads(self.path.read_text()).get("pid") == self.holder["pid"]:
                self.path.unlink()

    def __enter__(self) -> RackLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# -- the batch directory ----------------------------------------------------------------------


class Batch:
    def __init__(self, path: Path):
        self.path = path
        self.meta: dict[str, Any] = json.loads((path / BATCH_FILE).read_text())

    @classmethod
    def create_or_resume(
        cls, path: Path, plan: Plan, trials: list[Trial], sets: list[str], only: list[str] | None
    ) -> tuple[Batch, bool]:
        """A new batch directory for the plan, or the existing one if it holds the same plan
        (same trial ids); anything else there is an error, not overwritten."""
        wanted = [
            {"name": t.name, "id": t.id, "duration_s": t.experiment.duration / 1e9} for t in trials
        ]
        meta_file = path / BATCH_FILE
        if meta_file.exists():
            batch = cls(path)
            have = {t["id"] for t in batch.meta["trials"]}
            if have != {t["id"] for t in wanted}:
                missing = sorted({t["name"] for t in wanted if t["id"] not in have})
                raise SpecError(
                    f"{path}: this batch holds another plan ({batch.meta['experiment']}, "
                    f"{len(have)} trials; not in it: {', '.join(missing[:5]) or '-'}"
                    f"{' ...' if len(missing) > 5 else ''}). Use the same experiment, --set and "
                    "--only as when it began, or another BATCH directory."
                )
            return batch, True
        if path.exists() and any(path.iterdir()):
            raise SpecError(f"{path}: exists and is not a batch directory (no {BATCH_FILE})")
        path.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plan.source, path / "experiment.yml")
        meta = {
            "experiment": str(plan.source),
            "sets": sets,
            "only": only or [],
            "seed": plan.base.seed,
            "created": now_iso(),
            "trials": wanted,
        }
        write_whole(meta_file, json.dumps(meta, indent=2) + "\n")
        return cls(path), False

    def plan(self) -> tuple[Plan, list[Trial]]:
        """The batch's plan, from its own copy of the experiment file."""
        plan = load_plan(self.path / "experiment.yml", self.meta["sets"])
        plan.source = Path(self.meta["experiment"])
        by_id = {t.id: t for t in plan.trials}
        trials = []
        for t in self.meta["trials"]:
            if t["id"] not in by_id:
                raise SpecError(
                    f"{self.path}: trial {t['name']} ({t['id']}) is no longer in its plan"
                )
            trials.append(by_id[t["id"]])
        return plan, trials

    @property
    def name(self) -> str:
        return self.path.name

    def trial_dir(self, name: str) -> Path:
        return self.path / "trials" / name

    def status(self, name: str) -> str:
        """complete, failed, interrupted, partial (a run that never ended) or todo."""
        record = self.trial_dir(name) / "trial.json"
        if not record.exists():
            return "partial" if self.trial_dir(name).exists() else "todo"
        status = json.loads(record.read_text()).get("status", "partial")
        return "partial" if status == "running" else status

    def done(self, name: str) -> bool:
        """Complete, with a manifest that lists its record (an empty or cut-short manifest,
        a disk that filled while it was written, is not done)."""
        if self.status(name) != "complete" or not (self.trial_dir(name) / MANIFEST).exists():
            return False
        return "trial.json" in manifest_entries(self.trial_dir(name))

    def failed_attempts(self, name: str) -> int:
        """Attempts that count against --retries: kept ones that failed or whose worker died
        (partial: a trial that kills its worker must not be run for ever), and the current
        one if it failed. Interrupted ones (the user stopped the batch) do not count."""
        return len(ended_attempts(self.path, name)) + (self.status(name) == "failed")

    def out_of_retries(self, name: str, retries: int) -> bool:
        """Not done, and never run again with this many retries."""
        return not self.done(name) and self.failed_attempts(name) > retries

    def ran_on(self, name: str) -> list[str]:
        """The inventory of the rack the trial's current attempt ran on (its record says)."""
        with contextlib.suppress(OSError, ValueError, LookupError, TypeError, AttributeError):
            return list(json.loads((self.trial_dir(name) / "trial.json").read_text())["inventory"])
        return []

    def next_attempt(self, name: str) -> int:
        """The number the trial's next attempt gets: on from the highest kept, so that a
        removed attempt cannot make the next one collide with a kept one."""
        kept = (self.path / "attempts" / name).glob("*")
        return 1 + max((attempt_number(d) for d in kept), default=0)

    def set_aside(self, name: str) -> Path | None:
        """Move the trial's last attempt to attempts/<name>/<n>-<status>/ (kept, labelled)."""
        current = self.trial_dir(name)
        if not current.exists():
            return None
        status, ran_on = self.status(name), self.ran_on(name)
        target = self.path / "attempts" / name / f"{self.next_attempt(name)}-{status}"
        target.parent.mkdir(parents=True, exist_ok=True)
        current.rename(target)
        # "pending" until the files it left on the hosts have joined it (collect_leftovers):
        # a worker stopped or killed meanwhile leaves the label, and the next one finishes it.
        label = {"status": status, "set_aside": now_iso(), "trial": name}
        label |= {"ran_on": ran_on, "leftovers": "pending"}
        write_whole(target / "ATTEMPT.json", json.dumps(label, indent=2) + "\n")
        return target

    def pending_leftovers(self, name: str) -> list[tuple[Path, list[str]]]:
        """Kept attempts of the trial whose files on the hosts were not brought back yet, with
        the inventory of the rack each ran on."""
        out = []
        for kept in sorted((self.path / "attempts" / name).glob("*"), key=attempt_number):
            with contextlib.suppress(OSError, json.JSONDecodeError):
                label = json.loads((kept / "ATTEMPT.json").read_text())
                if label.get("leftovers") == "pending":
                    out.append((kept, list(label.get("ran_on") or [])))
        return out

    def leftovers_collected(self, kept: Path) -> None:
        label = json.loads((kept / "ATTEMPT.json").read_text())
        label["leftovers"] = "collected"
        write_whole(kept / "ATTEMPT.json", json.dumps(label, indent=2) + "\n")

    def verify(self) -> dict[str, list[str]]:
        """Complete trials whose files no longer match their manifest: they run again."""
        from trials.nightly import pruned_files

        broken = {}
        pruned = pruned_files(self.path)  # retention removed them: not "changed"
        for t in self.meta["trials"]:
            if self.done(t["name"]):
                bad = verify_manifest(self.trial_dir(t["name"]))
                bad = [n for n in bad if f"trials/{t['name']}/{n}" not in pruned]
                if bad:
                    broken[t["name"]] = bad
        return broken

    def event(self, **fields: Any) -> None:
        line = json.dumps({"time": now_iso(), **fields}) + "\n"
        with (self.path / "events.jsonl").open("a") as f:
            f.write(line)

    def events(self) -> Iterator[dict[str, Any]]:
        path = self.path / "events.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    yield json.loads(line)


class Claims:
    """A trial is run by whoever creates claims/<name>.json first."""

    def __init__(self, batch: Batch, holder: dict[str, Any], warn: Callable[[str], None]):
        self.batch, self.holder, self.warn = batch, holder, warn
        self.dir = batch.path / "claims"
        self.dir.mkdir(exist_ok=True)

    def claim(self, name: str) -> bool:
        path = self.dir / f"{name}.json"
        fd = create_new(path)
        if fd is None:
            with taking_over(path):
                stale, other = stale_holder(path)
                if not stale:
                    return False  # held by a live worker, or being written right now
                said = describe(other) if other else "a claim never written"
                self.warn(f"{name}: taking over from a worker that is gone ({said})")
                self.batch.event(
                    event="takeover", trial=name, rack=self.holder["rack"], previous=other
                )
                path.unlink(missing_ok=True)
                fd = create_new(path)
                if fd is None:
                    return False  # a worker claimed it afresh meanwhile
        self._write(fd)
        HEARTBEAT.hold(path)
        return True

    def _write(self, fd: int) -> None:
        with os.fdopen(fd, "w") as f:
            json.dump({**self.holder, "since": now_iso()}, f)

    def release(self, name: str) -> None:
        HEARTBEAT.drop(self.dir / f"{name}.json")
        (self.dir / f"{name}.json").unlink(missing_ok=True)


def claim_holders(batch: Batch) -> dict[str, dict[str, Any]]:
    """trial -> the worker that has claimed it."""
    out = {}
    for path in (batch.path / "claims").glob("*.json"):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            out[path.stem] = json.loads(path.read_text())
    return out


def matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def stop_leftovers(rack: Rack, batch: str, trial: str, keep_into: Path | None = None) -> list[str]:
    """Stop daemons an earlier, killed attempt of this trial left on the rack's hosts; with
    ``keep_into`` (that attempt's kept directory), bring the files it left on each host into
    keep_into/leftovers/<host>/ (sha256-verified, as a trial's own) before they are removed
    there. A host that does not answer keeps its files; what went wrong is returned."""
    remotes = {name: f"{host.workdir}/trials/{batch}/{trial}" for name, host in rack.hosts.items()}
    commands = {}
    for name, remote in remotes.items():
        d = shlex.quote(remote)
        helper = shlex.quote(f"{rack.hosts[name].workdir}/bin/trialbed-daemon")
        commands[name] = (
            f'for p in {d}/*.pid; do [ -e "$p" ] || continue; '
            f'n=$(basename "$p" .pid); {helper} stop "$n" --dir {d} --signal INT; done; true'
        )
    with contextlib.suppress(RackError):
        rack.run_parallel(commands, check=False)
    problems = []
    for name, remote in remotes.items():
        try:
            if keep_into is not None:
                local = keep_into / "leftovers" / name
                local.mkdir(parents=True, exist_ok=True)
                if not pull_host(rack, name, remote, local) and not any(local.iterdir()):
                    local.rmdir()  # the attempt left nothing there
            rack.run(name, f"rm -rf {shlex.quote(remote)}", check=False)
        except (RackError, CollectError, OSError) as exc:
            problems.append(f"{name}: {exc}")
    return problems


def collect_leftovers(
    rack: Rack, ran_on: list[str], batch: str, trial: str, kept: Path, log: Callable[[str], None]
) -> tuple[list[str], bool]:
    """stop_leftovers on the rack the attempt ran on: this one, or another rack sharing the
    batch (whose worker died there and whose trial this rack now takes over). Returns what
    went wrong, and whether that was on this rack (where the next attempt would find it)."""
    other = None
    mine = [str(Path(p).resolve()) for p in rack.inventory]
    if ran_on and [str(Path(p).resolve()) for p in ran_on] != mine:
        try:
            other = Rack.load([Path(p) for p in ran_on])
        except RackError as exc:
            return [f"its rack ({', '.join(ran_on)}): {exc}"], False
        if rack_key(other) == rack_key(rack):
            other.close()
            other = None
    try:
        problems = stop_leftovers(other or rack, batch, trial, keep_into=kept)
    finally:
        if other is not None:
            other.close()
    for problem in problems:
        log(f"[{trial}] the earlier attempt's files on {problem}")
    return problems, other is None


# -- one worker per rack ----------------------------------------------------------------------


class TrialFailed(RuntimeError):
    pass


def run_worker(
    batch_dir: Path,
    inventory: list[Path],
    label: str,
    retries: int,
    log: Callable[[str], None] = print,
) -> int:
    """Claim and run the batch's trials on one rack until none is left; return how many
    this worker completed. The network is restored on every exit path. (The coordinator ran
    preflight for this rack before it started the worker.)"""
    from trials.runner import TrialRunner, ignore_signals, interruptible, restore

    batch = Batch(batch_dir)
    plan, trials = batch.plan()
    rack = Rack.load(inventory)
    holder = {**this_process(), "rack": label, "batch": batch.name}
    completed = 0
    try:
        with RackLock.for_rack(rack, batch.name, label, warn=log):
            runner = TrialRunner(plan, rack, batch_dir, log=log)
            claims = Claims(batch, holder, warn=log)
            try:
                with interruptible():
                    while True:
                        trial = next_trial(batch, claims, trials, retries)
                        if trial is None:
                            break
                        completed += run_one(
                            batch, claims, runner, rack, trial, label, retries, log
                        )
            finally:
                with ignore_signals():
                    restore(runner, rack, batch_dir / "ansible" / f"teardown-{label}", log)
    finally:
        rack.close()
    return completed


def next_trial(batch: Batch, claims: Claims, trials: list[Trial], retries: int) -> Trial | None:
    """The first trial in plan order that is neither done nor out of retries; a trial that
    failed waits until every untried one has run (a passing fault may have cleared by then)."""
    failures = {t.name: batch.failed_attempts(t.name) for t in trials}
    for trial in sorted(trials, key=lambda t: failures[t.name] > 0):
        if batch.done(trial.name) or failures[trial.name] > retries:
            continue
        if claims.claim(trial.name):
            # Claimed: check again (another worker may have finished it meanwhile).
            if batch.done(trial.name) or batch.failed_attempts(trial.name) > retries:
                claims.release(trial.name)
                continue
            return trial
    return None


def run_one(
    batch: Batch,
    claims: Claims,
    runner,
    rack: Rack,
    trial: Trial,
    label: str,
    retries: int,
    log: Callable[[str], None],
) -> int:
    from trials.runner import Interrupted, failed_record

    try:
        refused = earlier_attempts(batch, rack, trial.name, retries, log)
    except Interrupted:
        batch.event(event="interrupted", trial=trial.name, rack=label)
        claims.release(trial.name)
        raise
    if refused:
        log(f"[{trial.name}] failed: {refused}")
        batch.event(event="failed", trial=trial.name, rack=label, error=refused)
        claims.release(trial.name)
        return 0
    attempt = batch.next_attempt(trial.name)
    batch.event(event="start", trial=trial.name, id=trial.id, rack=label, attempt=attempt)
    started = time.monotonic()
    try:
        record = runner.run(trial)
        if record["status"] != "complete":
            raise TrialFailed("; ".join(record["errors"]) or record["status"])
    except Interrupted:
        batch.event(event="interrupted", trial=trial.name, rack=label, attempt=attempt)
        claims.release(trial.name)
        raise
    except Exception as exc:  # recorded; the batch goes on with the next trial
        # The runner's record says more than its exception when it got that far: the watch's
        # finding and the tools' own words (iperf3's "unable to connect to server").
        typed = f"{type(exc).__name__}: {exc}"
        said = failed_record(batch.path, trial, exc)["errors"]
        if said == [str(exc)]:
            said = []  # the runner wrote nothing of it: the exception is all there is
        if str(exc) not in "; ".join(said):
            record_failure(batch, trial.name, typed)
            said.append(typed)
        cause = "; ".join(said)
        log(f"[{trial.name}] failed: {cause}")
        batch.event(
            event="failed", trial=trial.name, rack=label, attempt=attempt, error=cause[-2000:]
        )
        claims.release(trial.name)
        return 0
    seconds = time.monotonic() - started
    batch.event(
        event="done", trial=trial.name, rack=label, attempt=attempt, seconds=round(seconds, 1)
    )
    claims.release(trial.name)
    return 1


def earlier_attempts(
    batch: Batch, rack: Rack, name: str, retries: int, log: Callable[[str], None]
) -> str | None:
    """Before a trial runs again: its last attempt kept (labelled), and the files every kept
    attempt left on the hosts (its worker died, a host stopped answering) brought into it and
    removed there, so that the next attempt does not collect them as its own. Returns why the
    trial must not run now, or None."""
    earlier = batch.status(name)
    if earlier != "todo":
        log(f"[{name}] earlier attempt ({earlier}) kept in {batch.set_aside(name)}")
    for kept, ran_on in batch.pending_leftovers(name):
        problems, here = collect_leftovers(rack, ran_on, batch.name, name, kept, log)
        if not problems:
            batch.leftovers_collected(kept)
        elif here:  # still on this rack's hosts, where the next attempt would write
            cause = f"the files of its attempt {kept.name} are still on {'; '.join(problems)}"
            record_failure(batch, name, cause)
            return cause
    if (attempts := batch.failed_attempts(name)) > retries:  # its worker died too often
        return (
            f"given up after {attempts} attempts (retries {retries}); the "
            f"last one's worker died mid-trial ({earlier}; kept in attempts/{name}/)"
        )
    return None


def record_failure(batch: Batch, name: str, cause: str) -> None:
    """Make sure the trial's own record says failed and why (a configure error raises before
    the runner wrote anything, a collect error after it wrote 'complete')."""
    trial_dir = batch.trial_dir(name)
    trial_dir.mkdir(parents=True, exist_ok=True)
    path = trial_dir / "trial.json"
    record = json.loads(path.read_text()) if path.exists() else {"trial": name, "errors": []}
    record["status"] = "failed"
    if cause not in record.setdefault("errors", []):
        record["errors"].append(cause)
    write_whole(path, json.dumps(record, indent=2) + "\n")  # a full disk: the old one whole


def install_parent_death_signal() -> None:
    """In a worker: SIGTERM when the coordinator dies (even by SIGKILL), so that the worker
    restores the network and labels its trial instead of running on unobserved."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# -- the coordinator --------------------------------------------------------------------------


def rack_labels(racks: list[list[Path]]) -> list[str]:
    """A short, unique name per rack: its inventory's directory (virtual, lab, a, b...)."""
    labels: list[str] = []
    for inventory in racks:
        base = inventory[0].resolve().parent.name if inventory else "virtual"
        label, n = base, 2
        while label in labels:
            label, n = f"{base}{n}", n + 1
        labels.append(label)
    return labels


@dataclass
class Progress:
    """What the batch directory says: done, failed out, running, to do."""

    done: int
    failed: int
    running: dict[str, str]  # rack -> trial
    todo: int


def progress(batch: Batch, retries: int) -> Progress:
    names = [t["name"] for t in batch.meta["trials"]]
    done = sum(batch.done(n) for n in names)
    failed = sum(batch.out_of_retries(n, retries) for n in names)
    running = {h.get("rack", "?"): n for n, h in claim_holders(batch).items()}
    return Progress(done, failed, running, len(names) - done - failed)


def spawn_workers(
    batch: Batch, racks: list[list[Path]], labels: list[str], retries: int
) -> list[tuple[str, Any]]:
    import subprocess
    import sys

    (batch.path / "workers").mkdir(exist_ok=True)
    procs = []
    for inventory, label in zip(racks, labels, strict=True):
        cmd = [sys.executable, "-m", "trials", "worker", str(batch.path), "--label", label]
        cmd += ["--retries", str(retries)]
        for inv in inventory:
            cmd += ["-i", str(inv)]
        log = (batch.path / "workers" / f"{label}.log").open("a")
        procs.append(
            (
                label,
                subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=install_parent_death_signal,
                ),
            )
        )
    return procs
