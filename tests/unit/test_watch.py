"""The trial's watch (trials/watch.py) against a host whose answers are scripted: what counts
as a failure, and what is a process that ended on schedule while it was asked."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

import trials.watch
from core.daemons import Daemons
from core.rack import RackError
from trials.watch import (
    CHECK_TIMEOUT_S,
    MIN_FREE_BYTES,
    UNTIL_STOPPED,
    WATCH_CPU_SHARE,
    TrialWatch,
    WatchFailure,
    watch_timeout_s,
)


class VirtualClock:
    """Time that passes only when slept. The schedule tests run the watch on it, so that they
    check the schedule, not the machine: on a loaded CI runner a thread started 70 ms late and
    failed a real-time bound that said nothing about the watch."""

    def __init__(self):
        self.now = 1.8e9

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


@pytest.fixture
def clock(monkeypatch) -> VirtualClock:
    """The watch's `time` module replaced by a virtual clock; pass it to ScriptedRack too."""
    virtual = VirtualClock()
    monkeypatch.setattr(trials.watch, "time", virtual)
    return virtual


class ScriptedRack:
    """Answers `trialbed-check DIR NAME...` with the states given, after `delay_s` (on `clock`:
    real time unless a test gives the virtual one)."""

    def __init__(
        self,
        states: dict[str, str],
        free: int = 10**9,
        delay_s: float = 0.0,
        cpu_s: float = 0.0,
        clock=time,
    ):
        self.states, self.free, self.delay_s, self.cpu_s = states, free, delay_s, cpu_s
        self.clock = clock
        self.asked_at: list[float] = []

    def host(self, name):
        return type("H", (), {"workdir": "/w"})()

    def run(self, host, command, check=True, timeout=None):
        if host == "gone":
            raise RackError(f"{host}: cannot run 'x': refused") from OSError("refused")
        self.asked_at.append(self.clock.time())
        self.clock.sleep(self.delay_s)
        _check, _directory, *asked = command.split()
        assert _check.endswith("/bin/trialbed-check"), command
        daemons = {n: {"state": self.states.get(n, "absent")} for n in asked}
        return json.dumps({"free_bytes": self.free, "daemons": daemons, "cpu_s": self.cpu_s})


def watch(rack, hosts=("A",)) -> TrialWatch:
    return TrialWatch(
        Daemons(rack, {h: f"/w/t/{h}" for h in hosts}), t0=getattr(rack, "clock", time).time()
    )


def test_a_capture_that_ended_fails_the_trial_naming_it():
    w = watch(ScriptedRack({"p.tcpdump": "ended", "tcp_client": "running"}))
    w.expect("A", "p.tcpdump", "capture p", time.time() + 60)
    w.expect("A", "tcp_client", "tcp (bulk_tcp)", time.time() + 60)
    (problem,) = w.check()
    assert problem.startswith("capture p on A ended by +") and "p.tcpdump: ended" in problem
    with pytest.raises(WatchFailure, match="capture p on A"):
        w.until(time.time() + 0.5, every_s=0.1)


def test_a_sender_that_ends_on_schedule_while_asked_is_no_failure():
    # The round starts before the sender's end and the answer comes after it (a slow host).
    w = watch(ScriptedRack({"tcp_client": "ended"}, delay_s=0.3))
    w.expect("A", "tcp_client", "tcp (bulk_tcp)", time.time() + 0.1)
    assert w.check() == []


def test_a_full_disk_and_a_host_that_does_not_answer():
    w = watch(ScriptedRack({}, free=MIN_FREE_BYTES - 1), hosts=("A", "gone"))
    problems = w.check()
    assert any(p.startswith("A: its disk is full (4.0 MiB free in /w/t/A") for p in problems)
    assert any(p.startswith("gone stopped answering at +") and "refused" in p for p in problems)
    assert "gone" in w.unreachable and w.check() == [p for p in problems if p.startswith("A")]


def test_a_process_that_ended_on_a_full_disk_is_tied_to_it():
    w = watch(ScriptedRack({"tc_sampler": "ended"}, free=MIN_FREE_BYTES - 1))
    w.expect("A", "tc_sampler", "recorder tc_sampler", time.time() + 60)
    disk, sampler = w.check()
    assert disk.startswith("A: its disk is full")
    assert sampler.startswith("recorder tc_sampler on A ended by +")
    assert sampler.endswith("the host's disk is full, which may be why)")
    # With room left, no such remark.
    w = watch(ScriptedRack({"tc_sampler": "ended"}))
    w.expect("A", "tc_sampler", "recorder tc_sampler", time.time() + 60)
    (alone,) = w.check()
    assert "disk" not in alone


def test_the_racks_watch_timeout_is_what_a_check_waits():
    """trialbed_watch_timeout (the VM rack sets 60s: its emulated CPU stalls) is the time a
    check waits for each host; a malformed value names the key before any host is asked."""
    waited = []

    class Recording(ScriptedRack):
        def run(self, host, command, check=True, timeout=None):
            waited.append(timeout)
            return super().run(host, command, check, timeout)

    rack = SimpleNamespace(vars={"trialbed_watch_timeout": "60s"}, inventory=["inv/hosts.yml"])
    w = TrialWatch(Daemons(Recording({}), {"A": "/w/t/A"}), t0=time.time())
    w.timeout_s = watch_timeout_s(rack)  # type: ignore[arg-type]
    w.check()
    assert waited == [60.0]
    assert watch_timeout_s(SimpleNamespace(vars={}, inventory=[])) == CHECK_TIMEOUT_S  # type: ignore[arg-type]
    rack.vars["trialbed_watch_timeout"] = "60"
    with pytest.raises(RackError, match=r"inv/hosts.yml: trialbed_watch_timeout: '60' is not a"):
        watch_timeout_s(rack)  # type: ignore[arg-type]


def test_costly_checks_are_spaced_out_one_host_after_another_and_all_at_the_end(clock):
    """Two hosts whose check costs 0.05 s of CPU each. The first round (every_s, nothing known
    of the cost yet) asks A at 0.05 s and B at 0.1 s, one after the other; then each host's
    next check is 2 s away (WATCH_CPU_SHARE of a CPU): A's falls at 1.1 s, B's after the end.
    The last round asks both at once at the end (after the measurement)."""
    rack = ScriptedRack({"p.tcpdump": "running"}, cpu_s=0.05, clock=clock)
    w = watch(rack, hosts=("A", "B"))
    w.expect("A", "p.tcpdump", "capture p", UNTIL_STOPPED)
    start = clock.time()
    end = start + 1.8
    w.until(end, every_s=0.1)
    spacing = 2 * 0.05 / WATCH_CPU_SHARE
    asked = [t - start for t in sorted(rack.asked_at)]
    assert len(asked) == 5, asked
    for at, expected in zip(asked, (0.05, 0.1, 0.1 + spacing / 2, 1.8, 1.8), strict=True):
        assert at == pytest.approx(expected, abs=1e-6), asked
    assert w.summary() == {
        "rounds": 3,
        "every_s": spacing,
        "round_cpu_s": 0.1,
        "timeout_s": w.timeout_s,
    }


def test_cheap_checks_keep_every_s(clock):
    rack = ScriptedRack({}, cpu_s=0.001, clock=clock)
    w = watch(rack)
    w.until(clock.time() + 0.55, every_s=0.1)
    assert w.every_s == 0.1 and len(rack.asked_at) == 6  # at 0.1 ... 0.5, and at the end


def test_a_capture_that_ends_after_the_last_spaced_round_is_seen_at_the_end(clock):
    class EndsLate(ScriptedRack):
        def run(self, host, command, check=True, timeout=None):
            self.states["p.tcpdump"] = "ended" if clock.time() > self.ends_at else "running"
            return super().run(host, command, check, timeout)

    rack = EndsLate({}, cpu_s=1.0, clock=clock)  # rounds 20 s apart: the first and the final
    rack.ends_at = clock.time() + 0.5
    w = watch(rack)
    w.expect("A", "p.tcpdump", "capture p", UNTIL_STOPPED)
    end = clock.time() + 1.8
    with pytest.raises(WatchFailure, match="capture p on A ended"):
        w.until(end, every_s=0.1)
    assert len(rack.asked_at) == 2 and rack.asked_at[-1] >= end


def test_a_problem_on_one_host_has_the_others_asked_at_once_and_names_every_cause(clock):
    """Hosts are asked one after another; when A's answer shows a problem, B (whose turn would
    come 0.5 s later) is asked at once, so that the failure names both causes."""
    rack = ScriptedRack({"p.tcpdump": "ended", "tcp_client": "ended"}, clock=clock)
    w = watch(rack, hosts=("A", "B"))
    w.expect("A", "p.tcpdump", "capture p", UNTIL_STOPPED)
    w.expect("B", "tcp_client", "tcp (bulk_tcp)", clock.time() + 60)
    start = clock.time()
    with pytest.raises(WatchFailure, match=r"capture p on A ended .*; tcp \(bulk_tcp\) on B"):
        w.until(start + 10, every_s=1.0)
    a, b = rack.asked_at
    assert a - start == pytest.approx(0.5, abs=1e-6) and b == a


def test_ctrl_c_during_a_check_interrupts_and_is_no_unreachable_host(monkeypatch):
    """The signal handler raises Interrupted inside the SSH call of a check (core.rack.Rack.run
    wraps what the connection raises): it reaches the runner as an interrupt, not as a host
    that stopped answering."""
    from core.rack import Rack
    from trials.interrupts import Interrupted

    class CtrlC:
        def run(self, *args, **kwargs):
            raise Interrupted("SIGINT")

    rack = Rack([], {}, {})
    monkeypatch.setattr(rack, "connection", lambda name: CtrlC())
    monkeypatch.setattr(rack, "host", lambda name: SimpleNamespace(workdir="/w", login_command=str))
    w = watch(rack)
    w.expect("A", "tcp_client", "tcp (bulk_tcp)", time.time() + 60)
    with pytest.raises(Interrupted):
        w.check()
    assert w.unreachable == {}
