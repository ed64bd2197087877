"""Who holds a rack or a batch's trial: lock and claim files naming their holder (pid, host,
boot, start time) with a heartbeat, so that a holder that died is recognised and taken over.

A rack is locked by whatever runs trials on it (`trials run`, a batch's worker); the lock
directory is shared by every user of the controller.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.rack import Rack, RackError

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
