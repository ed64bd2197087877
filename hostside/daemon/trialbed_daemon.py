#!/usr/bin/env python3
"""Start, stop, signal and inspect the detached processes of a rack host (captures, servers,
senders, the delay line): one helper for all of them, used by the trial runner over SSH and
by the roles' handlers.

Each daemon NAME lives in a directory DIR: DIR/NAME.pid holds its pid and kernel start time
(so that a recycled pid is never taken for it), DIR/NAME.log its output.

  trialbed-daemon start NAME [--dir DIR] [--at EPOCH] [--ready TEXT] [--if-stopped] -- CMD...
  trialbed-daemon restart NAME [--dir DIR] [--ready TEXT] -- CMD...
  trialbed-daemon stop NAME[:SIG]... [--dir DIR] [--signal SIG] [--timeout S] [--drain NAME]...
  trialbed-daemon stop-under ROOT [--signal SIG] [--timeout S]
  trialbed-daemon status NAME [--dir DIR]
  trialbed-daemon check NAME... [--dir DIR]
  trialbed-daemon signal NAME SIG [--dir DIR] [--wait-file FILE]
  trialbed-daemon wait-log NAME TEXT [--dir DIR] [--timeout S]

`stop` with several names signals them all (each NAME:SIG with its own signal, else --signal)
before it waits for any: a host's daemons end in one round trip and one wait. Each `--drain`
NAME is a tcpdump: first it is asked for its counters (SIGUSR1; SIGINFO on FreeBSD) until it
has read every packet its filter passed and the kernel kept, or reads no more (up to
--timeout), because on SIGINT it writes out what it has read and drops what is still in the
ring (seen on a loaded VM: 6453 of 6455 packets). One still reading at the timeout is named
on stderr; it is stopped all the same.

`stop-under` stops every daemon with a pid file anywhere below ROOT (teardown after a runner
that died: whatever its trials left running), printing "DIR/NAME stopped-now|stopped" each.

`check` is the trial's watch, one round trip per host: a JSON object with the free bytes of
DIR's file system and, per NAME, its state (running; ended: started and gone without a stop;
absent: no pid file) and, when it ended, its log's last lines; `cpu_s` is what the check
itself cost the host (interpreter start included), which paces the watch.

Prints one word (started, running, restarted, stopped-now, stopped) so that Ansible can tell
a change from none; exits non-zero with the log's last lines when a daemon does not come up
(2 on a usage error). Python 3 standard library only: it runs on every rack host (Linux or
FreeBSD). It imports only what the action needs and parses its own arguments: under the VM
rack's emulated CPU, argparse, re and json took most of each call's start (about 0.5 s of a
1 s start in a busy guest), and a trial calls it a few dozen times.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import SimpleNamespace  # loaded already: signal's enum imports it


class DaemonError(Exception):
    pass


class UsageError(DaemonError):
    pass


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), '' where /proc lacks it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    # Field 22; the command name (field 2) may hold spaces and parentheses.
    return stat.rsplit(")", 1)[1].split()[19]


class Daemon:
    def __init__(self, name: str, directory: str):
        if "/" in name or not name:
            raise DaemonError(f"daemon name {name!r}: a plain file name is required")
        self.name = name
        self.dir = os.path.abspath(directory)
        self.pidfile = os.path.join(self.dir, f"{name}.pid")
        self.logfile = os.path.join(self.dir, f"{name}.log")

    def pid(self) -> int | None:
        """The daemon's pid if it is alive and is the process that was started."""
        try:
            with open(self.pidfile) as f:
                fields = f.read().split()
        except OSError:
            return None
        if not fields:
            return None
        pid = int(fields[0])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        if len(fields) > 1 and fields[1] and start_time(pid) != fields[1]:
            return None  # the pid now belongs to another process
        if start_time(pid) and state(pid) == "Z":
            return None  # ended; its parent has not reaped it yet
        return pid

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.logfile)
        except OSError:
            return 0

    def log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.logfile, errors="replace") as f:
                return "".join(f.readlines()[-lines:]).rstrip()
        except OSError:
            return "(no log)"

    def start(self, command: list[str], at: float | None, append: bool) -> int:
        if not command:
            raise DaemonError("start: no command after --")
        os.makedirs(self.dir, exist_ok=True)
        read_fd, write_fd = os.pipe()  # the child reports a failed exec through it
        pid = os.fork()
        if pid == 0:  # the daemon
            try:
                os.close(read_fd)
                os.setsid()
                # The signals the runner stops daemons with take their default action: a
                # helper started from a background job inherits SIGINT ignored (sh does that),
                # and a Python daemon started so would never see KeyboardInterrupt.
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGUSR1):
                    signal.signal(sig, signal.SIG_DFL)
                os.chdir(self.dir)
                mode = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
                log = os.open(self.logfile, mode, 0o644)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.set_inheritable(write_fd, False)
                os.set_blocking(write_fd, True)
                if at is not None:
                    time.sleep(max(0.0, at - time.time()))
                os.execvp(command[0], command)
            except BaseException as e:  # the child must never return into this code
                try:
                    os.write(write_fd, f"{command[0]}: {e}".encode())
                finally:
                    os._exit(127)
        os.close(write_fd)
        with open(self.pidfile + ".tmp", "w") as f:
            f.write(f"{pid} {start_time(pid)}\n")
        os.replace(self.pidfile + ".tmp", self.pidfile)
        if at is None:
            # exec closes the pipe (close-on-exec); an error message arrives instead if it failed.
            failure = os.read(read_fd, 4096).decode(errors="replace")
            os.close(read_fd)
            if failure:
                remove(self.pidfile)
                raise DaemonError(f"{self.name} did not start: {failure}")
        else:
            os.close(read_fd)
        return pid

    def wait_log(self, text: str, timeout: float, offset: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with open(self.logfile, "rb") as f:
                    f.seek(offset)
                    if text.encode() in f.read():
                        return
            except OSError:
                pass
            if self.pid() is None:
                remove(self.pidfile)
                raise DaemonError(
                    f"{self.name} ended before {text!r} appeared in {self.logfile}:\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                raise DaemonError(
                    f"{self.name}: {text!r} not in {self.logfile} after {timeout:g} s:\n"
                    + self.log_tail()
                )
            time.sleep(0.05)

    def stop(self, sig: int, timeout: float) -> bool:
        """Signal the daemon, wait for it to end, then kill it. True if it was running."""
        return stop_all([(self, sig)], timeout)[0]


def stop_all(daemons: list[tuple[Daemon, int]], timeout: float) -> list[bool]:
    """Signal every daemon, then wait for them together; kill those still alive after
    `timeout`. Per daemon: True if it was running."""
    pids = []
    for daemon, sig in daemons:
        pid = daemon.pid()
        if pid is not None:
            os.kill(pid, sig)
        pids.append(pid)
    deadline = time.monotonic() + timeout
    while any(d.pid() is not None for d, _ in daemons) and time.monotonic() < deadline:
        time.sleep(0.02)
    for i, (daemon, _) in enumerate(daemons):
        pid = pids[i]
        if pid is not None and daemon.pid() is not None:
            os.kill(pid, signal.SIGKILL)
            while daemon.pid() is not None:
                time.sleep(0.02)
        remove(daemon.pidfile)
    return [pid is not None for pid in pids]


# tcpdump prints its counters on this signal, and goes on capturing.
INFO_SIGNAL = getattr(signal, "SIGINFO", signal.SIGUSR1)
SAME_FOR_S = 0.2  # a capture whose counters stay this long reads no more (see drain_captures)
# "tcpdump: 6453 packets captured, 6455 packets received by filter, 0 packets dropped by kernel"
COUNTERS = (
    rb"(\d+) packets? captured, (\d+) packets? received by filter, (\d+) packets? dropped by kernel"
)


def drain_captures(captures: list[Daemon], timeout: float) -> dict[str, int]:
    """Ask each running tcpdump for its counters until it has captured every packet its filter
    passed and the kernel did not drop, or its answers have said the same for SAME_FOR_S (it
    reads nothing more: on lo, for one, the kernel counts each packet twice); give up after
    `timeout`. One request at a time: a slow tcpdump answers a pile of them at once, alike.
    And alike for a while, not twice: one taken off the CPU between two answers reads nothing
    in between. The ones still reading at the end, with how many packets they had not read at
    their last answer."""
    import re

    counters_said = re.compile(COUNTERS)
    offsets = {d: d.log_size() for d in captures if d.pid() is not None}
    last: dict[Daemon, tuple[int, ...]] = {}
    since: dict[Daemon, float] = {}  # when its last answer's counters were first said
    asked: set[Daemon] = set()  # a new request only once the last one is answered
    deadline = time.monotonic() + timeout
    while offsets and time.monotonic() < deadline:
        for daemon in list(offsets):
            pid = daemon.pid()
            if pid is None:
                del offsets[daemon]
            elif daemon not in asked:
                os.kill(pid, INFO_SIGNAL)
                asked.add(daemon)
        time.sleep(0.05)
        for daemon, offset in list(offsets.items()):
            try:
                with open(daemon.logfile, "rb") as f:
                    f.seek(offset)
                    answers = counters_said.findall(f.read())
            except OSError:
                answers = []
            if not answers:
                continue  # not answered yet
            counters = tuple(map(int, answers[-1]))
            captured, received, dropped = counters
            offsets[daemon] = daemon.log_size()
            asked.discard(daemon)
            now = time.monotonic()
            if last.get(daemon) != counters:
                last[daemon], since[daemon] = counters, now
            if captured >= received - dropped or now - since[daemon] >= SAME_FOR_S:
                del offsets[daemon]
    return {d.name: (last[d][1] - last[d][2] - last[d][0]) if d in last else -1 for d in offsets}


def check(daemons: list[Daemon], directory: str) -> dict:
    """What the trial's watch needs of a host: free space where its files go, and which of
    its daemons ended on their own (their pid file stays until a stop removes it)."""
    fs = os.statvfs(directory)
    out: dict = {"free_bytes": fs.f_bavail * fs.f_frsize, "daemons": {}}
    for daemon in daemons:
        if daemon.pid() is not None:
            out["daemons"][daemon.name] = {"state": "running"}
        elif os.path.exists(daemon.pidfile):
            out["daemons"][daemon.name] = {"state": "ended", "log": daemon.log_tail(3)}
        else:
            out["daemons"][daemon.name] = {"state": "absent"}
    return out


def state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def remove(path: str) -> None:
    try:  # noqa: SIM105 (contextlib would be one more import per call)
        os.unlink(path)
    except FileNotFoundError:
        pass


def signal_number(name: str) -> int:
    name = name.upper()
    if name.isdigit():
        return int(name)
    try:
        return int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))
    except AttributeError:
        raise DaemonError(f"unknown signal {name!r} (e.g. TERM, INT, USR1)") from None


# Each action's options (kind: a value, a number, a flag, or a value that may repeat) and its
# positional arguments ("NAME..." takes one or more).
_COMMON = {"--dir": "value", "--timeout": "number"}
_STARTING = {**_COMMON, "--at": "number", "--ready": "value", "--append-log": "flag"}
OPTIONS = {
    "start": {**_STARTING, "--if-stopped": "flag"},
    "restart": _STARTING,
    "stop": {**_COMMON, "--signal": "value", "--drain": "list"},
    "stop-under": {**_COMMON, "--signal": "value"},
    "status": _COMMON,
    "check": _COMMON,
    "signal": {**_COMMON, "--wait-file": "value"},
    "wait-log": _COMMON,
}
POSITIONAL = {
    "start": ("NAME",),
    "restart": ("NAME",),
    "stop": ("NAME...",),
    "stop-under": ("ROOT",),
    "status": ("NAME",),
    "check": ("NAME...",),
    "signal": ("NAME", "SIG"),
    "wait-log": ("NAME", "TEXT"),
}
DEFAULTS = {"dir": ".", "timeout": 5.0, "at": None, "ready": None, "append_log": False,
            "if_stopped": False, "signal": "TERM", "wait_file": None}  # fmt: skip


def usage(action: str) -> str:
    words = [*POSITIONAL[action], *(f"[{o}]" for o in OPTIONS[action])]
    return f"usage: trialbed-daemon {action} {' '.join(words)}" + (
        " -- CMD..." if action in ("start", "restart") else ""
    )


def parse_args(argv: list[str]) -> SimpleNamespace:
    """argv (without the command after --) as the action's arguments: the action, its
    positional ones (name: one, or a list for NAME...; root, sig, text) and every option
    (dashes as underscores); UsageError naming the action, the word and what is allowed
    otherwise. --opt VALUE and --opt=VALUE both work."""
    if not argv:
        raise UsageError(f"an action is required (allowed: {', '.join(OPTIONS)}; --help)")
    if argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0)
    action, words = argv[0], argv[1:]
    if action not in OPTIONS:
        raise UsageError(f"unknown action {action!r} (allowed: {', '.join(OPTIONS)})")
    options = OPTIONS[action]
    values: dict = {**DEFAULTS, "action": action, "drain": []}
    positional: list[str] = []
    while words:
        word = words.pop(0)
        if word in ("-h", "--help"):
            print(usage(action))
            raise SystemExit(0)
        if not word.startswith("--"):
            positional.append(word)
            continue
        key, has_value, value = word.partition("=")
        kind = options.get(key)
        if kind is None:
            raise UsageError(f"{action}: unknown option {key} (allowed: {', '.join(options)})")
        dest = key[2:].replace("-", "_")
        if kind == "flag":
            if has_value:
                raise UsageError(f"{action}: {key} takes no value")
            values[dest] = True
            continue
        if not has_value:
            if not words or words[0].startswith("--"):
                raise UsageError(f"{action}: {key} needs a value")
            value = words.pop(0)
        if kind == "number":
            try:
                values[dest] = float(value)
            except ValueError:
                raise UsageError(f"{action}: {key} {value!r}: a number is required") from None
        elif kind == "list":
            values[dest].append(value)
        else:
            values[dest] = value
    names = POSITIONAL[action]
    if names[-1].endswith("..."):
        if not positional:
            raise UsageError(
                f"{action}: at least one {names[-1][:-3]} is required; {usage(action)}"
            )
        values[names[-1][:-3].lower()] = positional
    elif len(positional) != len(names):
        raise UsageError(
            f"{action}: {' '.join(names)} expected, got {positional or 'nothing'}; {usage(action)}"
        )
    else:
        values.update({n.lower(): positional[i] for i, n in enumerate(names)})
    return SimpleNamespace(**values)


def main(argv: list[str]) -> int:
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    args = parse_args(argv)
    if args.action == "stop":
        targets = []
        for word in args.name:
            name, _, sig = word.partition(":")
            targets.append((Daemon(name, args.dir), signal_number(sig or args.signal)))
        lagging = drain_captures([Daemon(n, args.dir) for n in args.drain], args.timeout)
        for name, unread in lagging.items():
            said = (
                f"had {unread} packets its filter passed still to read"
                if unread >= 0
                else "did not answer for its counters"
            )
            print(f"trialbed-daemon: {name} {said} after {args.timeout:g} s; stopped all the same",
                  file=sys.stderr)  # fmt: skip
        for was_running in stop_all(targets, args.timeout):
            print("stopped-now" if was_running else "stopped")
        return 0
    if args.action == "stop-under":
        found = [
            Daemon(f[: -len(".pid")], top)
            for top, _, files in sorted(os.walk(args.root))
            for f in sorted(files)
            if f.endswith(".pid")
        ]
        sig = signal_number(args.signal)
        was_running = stop_all([(d, sig) for d in found], args.timeout)
        for i, daemon in enumerate(found):
            print(f"{daemon.dir}/{daemon.name}", "stopped-now" if was_running[i] else "stopped")
        return 0
    if args.action == "check":
        import json
        import resource

        answer = check([Daemon(n, args.dir) for n in args.name], args.dir)
        spent = resource.getrusage(resource.RUSAGE_SELF)
        answer["cpu_s"] = round(spent.ru_utime + spent.ru_stime, 4)
        print(json.dumps(answer))
        return 0
    daemon = Daemon(args.name, args.dir)

    if args.action in ("start", "restart"):
        word = "started"
        if args.action == "restart":
            daemon.stop(signal.SIGTERM, args.timeout)
            word = "restarted"
        elif daemon.pid() is not None:
            if args.if_stopped:
                print("running")
                return 0
            raise DaemonError(f"{args.name} is already running (pid {daemon.pid()})")
        offset = daemon.log_size() if args.append_log else 0
        daemon.start(command, args.at, args.append_log)
        if args.ready:
            until_start = max(0.0, (args.at or 0) - time.time())
            daemon.wait_log(args.ready, args.timeout + until_start, offset)
        print(word)
    elif args.action == "status":
        pid = daemon.pid()
        print("running" if pid is not None else "stopped")
        return 0 if pid is not None else 3
    elif args.action == "signal":
        pid = daemon.pid()
        if pid is None:
            raise DaemonError(f"{args.name} is not running ({daemon.pidfile})")
        if args.wait_file:
            remove(args.wait_file)
        os.kill(pid, signal_number(args.sig))
        if args.wait_file:
            deadline = time.monotonic() + args.timeout
            while not (os.path.exists(args.wait_file) and os.path.getsize(args.wait_file) > 0):
                if time.monotonic() > deadline:
                    raise DaemonError(
                        f"{args.name} wrote no {args.wait_file} within {args.timeout:g} s"
                    )
                time.sleep(0.05)
    elif args.action == "wait-log":
        daemon.wait_log(args.text, args.timeout)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except DaemonError as e:
        print(f"trialbed-daemon: {e}", file=sys.stderr)
        sys.exit(2 if isinstance(e, UsageError) else 1)
