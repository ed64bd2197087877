"""The rack hosts' daemon helper (hostside/daemon/trialbed_daemon.py), run here on
real processes: several daemons of a host stop in one call, each with its own signal."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.command import command, script
from core.daemons import READY_TIMEOUT_S, Daemons
from core.hostside import SOURCE

HELPER = SOURCE / "daemon/trialbed_daemon.py"
CHECK = HELPER.with_name("trialbed_check.sh")


def helper(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(HELPER), *args, "--dir", str(tmp_path)] if "--" not in args else
        [sys.executable, str(HELPER), *args[: args.index("--")], "--dir", str(tmp_path),
         *args[args.index("--"):]],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip


# Ends only on SIGINT or SIGKILL (SIGTERM ignored), after printing "up".
IGNORES_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)


def pid_of(tmp_path: Path, name: str) -> int:
    return int((tmp_path / f"{name}.pid").read_text().split()[0])


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_one_call_stops_several_daemons_each_with_its_signal(tmp_path):
    # "int_only" ends only on SIGINT (like tcpdump flushing); "term" on SIGTERM.
    script = IGNORES_TERM
    started = helper(
        tmp_path, "start", "int_only", "--ready", "up", "--", sys.executable, "-c", script
    )
    assert started.returncode == 0, started.stderr
    assert helper(tmp_path, "start", "term", "--", "sleep", "60").returncode == 0
    pids = {name: pid_of(tmp_path, name) for name in ("int_only", "term")}
    t = time.monotonic()
    stopped = helper(tmp_path, "stop", "term", "int_only:INT", "never_started", "--timeout", "5")
    took = time.monotonic() - t
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.split() == ["stopped-now", "stopped-now", "stopped"]
    assert not any(alive(p) for p in pids.values())
    assert took < 4, f"INT should have ended int_only at once, took {took:.1f} s (it was killed?)"
    assert not list(tmp_path.glob("*.pid"))


def test_a_daemon_that_ignores_its_signal_is_killed_after_the_timeout(tmp_path):
    script = IGNORES_TERM
    assert (
        helper(
            tmp_path, "start", "stubborn", "--ready", "up", "--", sys.executable, "-c", script
        ).returncode
        == 0
    )
    pid = pid_of(tmp_path, "stubborn")
    t = time.monotonic()
    stopped = helper(tmp_path, "stop", "stubborn", "--timeout", "1")
    assert stopped.stdout.split() == ["stopped-now"]
    assert 1 <= time.monotonic() - t < 10
    assert not alive(pid)


def test_check_tells_a_running_daemon_from_one_that_ended_and_one_never_started(tmp_path):
    """The trial's watch: `check` reports per daemon running / ended (with its log's last
    lines) / absent, and the free bytes of the directory's file system, as JSON."""
    import json
    import os
    import signal

    up = helper(tmp_path, "start", "server", "--ready", "up", "--", sys.executable, "-c",
                IGNORES_TERM)  # fmt: skip
    assert up.returncode == 0, up.stderr
    crash = "import sys; print('disk full', flush=True); sys.exit(1)"
    assert helper(tmp_path, "start", "writer", "--", sys.executable, "-c", crash).returncode == 0
    deadline = time.monotonic() + 10
    while alive(pid_of(tmp_path, "writer")) and time.monotonic() < deadline:
        time.sleep(0.05)
    done = helper(tmp_path, "check", "server", "writer", "never")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    fs = os.statvfs(tmp_path)
    assert abs(answer["free_bytes"] - fs.f_bavail * fs.f_frsize) < 64 * 2**20
    assert answer["daemons"]["server"] == {"state": "running"}
    assert answer["daemons"]["writer"] == {"state": "ended", "log": "disk full"}
    assert answer["daemons"]["never"] == {"state": "absent"}
    # A daemon killed from outside ends too (no stop removed its pid file).
    os.kill(pid_of(tmp_path, "server"), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(pid_of(tmp_path, "server")) and time.monotonic() < deadline:
        time.sleep(0.05)
    answer = json.loads(helper(tmp_path, "check", "server").stdout)
    assert answer["daemons"]["server"] == {"state": "ended", "log": "up"}
    # After a stop it is absent again: a stopped daemon did not end on its own.
    assert helper(tmp_path, "stop", "server").returncode == 0
    assert json.loads(helper(tmp_path, "check", "server").stdout)["daemons"]["server"] == {
        "state": "absent"
    }


def test_a_daemon_started_from_a_background_job_still_ends_on_sigint(tmp_path):
    """sh starts a background job with SIGINT ignored, and an ignored signal stays ignored
    across exec: a Python daemon started so would never see KeyboardInterrupt, and a stop
    with INT would wait out its timeout and kill it (measured: 5.1 s, the capture unflushed)."""
    start = [sys.executable, str(HELPER), "start", "int_only", "--ready", "up", "--dir",
             str(tmp_path), "--", sys.executable, "-c", IGNORES_TERM]  # fmt: skip
    started = subprocess.run(
        ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *start],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    pid = pid_of(tmp_path, "int_only")
    t = time.monotonic()
    stopped = helper(tmp_path, "stop", "int_only:INT", "--timeout", "5")
    took = time.monotonic() - t
    assert stopped.stdout.split() == ["stopped-now"] and not alive(pid)
    assert took < 4, f"INT did not end the daemon at once, took {took:.1f} s (it was killed)"


def test_stop_under_stops_what_every_trial_directory_left_running(tmp_path):
    """teardown.yml after a runner that died: daemons in two trials' directories, one that
    ended by itself (its pid file stays), all found below the trials root and stopped with
    SIGINT in one call."""
    trials = tmp_path / "trials"
    first, second = trials / "batch1" / "t1", trials / "batch2" / "t7"
    script = IGNORES_TERM  # ends on INT only: the stop must send INT, not TERM
    up = helper(first, "start", "capture", "--ready", "up", "--", sys.executable, "-c", script)
    assert up.returncode == 0, up.stderr
    assert helper(second, "start", "server", "--", "sleep", "60").returncode == 0
    assert helper(second, "start", "gone", "--", "true").returncode == 0
    pids = [pid_of(first, "capture"), pid_of(second, "server")]
    t = time.monotonic()
    stopped = subprocess.run(
        [sys.executable, str(HELPER), "stop-under", str(trials), "--signal", "INT",
         "--timeout", "8"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    took = time.monotonic() - t
    assert stopped.returncode == 0, stopped.stderr
    assert took < 6, f"INT should have ended the capture at once, took {took:.1f} s (killed?)"
    assert sorted(stopped.stdout.splitlines()) == [
        f"{first}/capture stopped-now",
        f"{second}/gone stopped",
        f"{second}/server stopped-now",
    ]
    assert not any(alive(p) for p in pids)
    assert not list(trials.rglob("*.pid"))


class LocalRack:
    """Rack.host and Rack.run for this machine: the helper installed under `workdir`/bin."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        (workdir / "bin").mkdir(parents=True)
        wrapper = workdir / "bin/trialbed-daemon"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {HELPER} "$@"\n')
        wrapper.chmod(0o755)
        check = workdir / "bin/trialbed-check"
        check.write_bytes(CHECK.read_bytes())
        check.chmod(0o755)

    def host(self, _name: str) -> SimpleNamespace:
        return SimpleNamespace(workdir=str(self.workdir))

    def run(self, _host: str, command: str, check: bool = True, timeout: float = 60) -> str:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0 or not check, done.stderr
        return done.stdout


def test_a_daemon_slow_to_get_ready_is_waited_for_past_the_helpers_own_5_s(tmp_path):
    """A server that needs 6 s to say ready (as on the VM rack under TCG, where a web server
    took over 5 s and failed its trial) is waited for; one that never says it fails."""
    trials = tmp_path / "trial"
    trials.mkdir()
    daemons = Daemons(LocalRack(tmp_path / "work"), {"A": str(trials)})  # type: ignore[arg-type]
    started = time.monotonic()
    daemons.spawn("A", "slow", script("sleep 6; echo ready; sleep 60"), ready="ready")
    assert 6 <= time.monotonic() - started < READY_TIMEOUT_S
    helper(trials, "stop", "slow")
    with pytest.raises(AssertionError, match=r"'ready' not in .* after 1 s"):
        daemons.spawn("A", "mute", command("sleep", 60), ready="ready", ready_timeout_s=1)
    helper(trials, "stop", "mute")


def test_the_shell_check_answers_as_the_helper_does_and_alone_while_nothing_ended(tmp_path):
    """trialbed-check (sh, /proc) is the watch's check: for running, absent, recycled-pid and
    zombie daemons it answers what `trialbed-daemon check` answers; while nothing ended it needs
    no Python (its helper broken here, it still answers), and an ended daemon's answer, with its
    log, comes from the helper."""
    import json
    import os

    trials = tmp_path / "trial"
    trials.mkdir()
    rack = LocalRack(tmp_path / "work")
    daemons = Daemons(rack, {"A": str(trials)})  # type: ignore[arg-type]
    daemons.spawn("A", "server", command("sleep", 60))
    (trials / "recycled.pid").write_text(f"{os.getpid()} 1\n")  # our pid, another start time
    zombie = subprocess.Popen(["true"])  # not reaped until wait(): a zombie meanwhile
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (trials / "zombie.pid").write_text(str(zombie.pid))  # no start time, as old pid files
    try:
        names = ["server", "never", "-", "recycled", "zombie"]
        ours = json.loads(daemons.check("A", names, 30))
        theirs = json.loads(helper(trials, "check", *names).stdout)
        for answer in (ours, theirs):
            assert answer["daemons"]["server"] == {"state": "running"}
            assert answer["daemons"]["never"] == answer["daemons"]["-"] == {"state": "absent"}
            for gone in ("recycled", "zombie"):
                assert answer["daemons"][gone]["state"] == "ended"
        assert abs(ours["free_bytes"] - theirs["free_bytes"]) < 64 * 2**20
        assert ours["cpu_s"] >= 0
        assert daemons.running("A", "server") and not daemons.running("A", "zombie")

        (tmp_path / "work/bin/trialbed-daemon").write_text("#!/bin/sh\nexit 3\n")
        assert json.loads(daemons.check("A", ["server", "never"], 30))["daemons"] == {
            "server": {"state": "running"},
            "never": {"state": "absent"},
        }
        with pytest.raises(AssertionError):  # an ended one goes to the (broken) helper
            daemons.check("A", ["server", "zombie"], 30)
        # unless only the states are asked (the wait for the senders to end)
        assert not daemons.running("A", "zombie") and daemons.running("A", "server")
        assert json.loads(daemons.check("A", ["zombie"], 30, logs=False))["daemons"] == {
            "zombie": {"state": "ended"}
        }
    finally:
        zombie.wait()
        helper(trials, "stop", "server")


# A stand-in for tcpdump: its filter passed 10 packets; each counters request (SIGUSR1, as
# tcpdump answers on Linux) finds it STEP packets further, 0.15 s later (mute: it does not
# answer); SIGINT writes out what it has read.
FAKE_TCPDUMP = """
import signal, sys, time
read, passed, step = [0], 10, sys.argv[1]
def counters(*_):
    time.sleep(0.15)  # slower than the drain's 50 ms round: a request still unanswered
    read[0] = min(passed, read[0] + int(step))
    sys.stderr.write(f"tcpdump: {read[0]} packets captured, {passed} packets received by "
                     "filter, 0 packets dropped by kernel\\n")
    sys.stderr.flush()
def stop(*_):
    sys.stderr.write(f"{read[0]} packets captured\\n{passed} packets received by filter\\n"
                     "0 packets dropped by kernel\\n")
    sys.exit(0)
signal.signal(signal.SIGUSR1, signal.SIG_IGN if step == "mute" else counters)
signal.signal(signal.SIGINT, stop)
print("listening on", flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize(("step", "read"), [("3", 10), ("0", 0), ("mute", 0)])
def test_stop_lets_a_capture_read_what_its_filter_passed_first(tmp_path, step, read):
    """On SIGINT tcpdump writes out what it has read and drops what is still in the ring
    (6453 of 6455 packets, on the loaded VM rack): stop --drain asks it for its counters until
    it has read them all (3 packets an answer: 4 answers), or its answers have said the same
    for 0.2 s (it reads no more); one that does not answer within the timeout is named, and
    stopped all the same. It is asked again only once it has answered: one answer a request,
    however slow."""
    script = tmp_path / "fake_tcpdump.py"
    script.write_text(FAKE_TCPDUMP)
    started = helper(
        tmp_path, "start", "cap.tcpdump", "--ready", "listening on", "--",
        sys.executable, str(script), step,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    timeout = "1" if step == "mute" else "20"  # (a loaded machine may be slow to answer)
    stopped = helper(
        tmp_path, "stop", "cap.tcpdump:INT", "--drain", "cap.tcpdump", "--timeout", timeout
    )
    assert stopped.returncode == 0 and stopped.stdout.split() == ["stopped-now"]
    log = (tmp_path / "cap.tcpdump.log").read_text().splitlines()
    assert log[-3:] == [
        f"{read} packets captured",
        "10 packets received by filter",
        "0 packets dropped by kernel",
    ]
    answers = [line for line in log if line.startswith("tcpdump: ")]
    if step == "mute":
        assert not answers
        assert "cap.tcpdump did not answer for its counters after 1 s" in stopped.stderr
    else:
        captured = [int(line.split()[1]) for line in answers]
        if step == "3":
            assert captured == [3, 6, 9, 10]  # asked until it read them all, once an answer
        else:
            assert len(captured) >= 2 and set(captured) == {0}  # the same, for a while
        assert stopped.stderr == ""


def test_options_go_anywhere_before_the_command_and_take_both_spellings(tmp_path):
    # As the linux_router role calls it: options before and after the name.
    started = subprocess.run(
        [sys.executable, str(HELPER), "start", "--if-stopped", "talker", f"--dir={tmp_path}",
         "--append-log", "--ready", "up", "--timeout", "10", "--",
         sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert (started.returncode, started.stdout.split()) == (0, ["started"]), started.stderr
    again = helper(tmp_path, "start", "--if-stopped", "talker", "--", "sleep", "1")
    assert again.stdout.split() == ["running"]
    stopped = helper(tmp_path, "stop", "talker", "--signal=INT", "--timeout", "5")
    assert stopped.stdout.split() == ["stopped-now"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["start", "x", "--redy", "up"], "start: unknown option --redy (allowed: --dir, --timeout"),
        (["stop", "x", "--timeout"], "stop: --timeout needs a value"),
        (["stop", "x", "--timeout", "soon"], "stop: --timeout 'soon': a number is required"),
        (["signal", "x"], "signal: NAME SIG expected, got ['x']"),
        (["check"], "check: at least one NAME is required"),
        (["start", "x", "--if-stopped=yes"], "start: --if-stopped takes no value"),
        (["launch", "x"], "unknown action 'launch' (allowed: start, restart, stop"),
    ],
)
def test_a_usage_error_names_the_action_the_word_and_what_is_allowed(tmp_path, args, said):
    done = helper(tmp_path, *args)
    assert done.returncode == 2
    assert said in done.stderr
    assert not list(tmp_path.iterdir())  # nothing was started or written


def test_no_action_is_a_usage_error():
    done = subprocess.run(
        [sys.executable, str(HELPER)], capture_output=True, text=True, check=False, timeout=30
    )
    assert done.returncode == 2
    assert "an action is required (allowed: start, restart, stop" in done.stderr


def test_a_start_imports_neither_argparse_nor_json_nor_re(tmp_path):
    # Each import cost a call about 0.1-0.5 s of the VM rack's emulated CPU. (-S: not the
    # imports of this virtualenv's site, which a rack host's python3 does not have.)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", str(HELPER), "start", "quiet", "--dir",
         str(tmp_path), "--", "sleep", "5"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert done.stdout.split() == ["started"], done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert {"signal", "os"} <= imported  # the report lists what was imported
    assert not imported & {"argparse", "json", "re", "contextlib"}
    assert helper(tmp_path, "stop", "quiet").stdout.split() == ["stopped-now"]
