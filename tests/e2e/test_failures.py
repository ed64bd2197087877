"""What goes wrong on a lab rack in the middle of a trial, made real on the test rack: a capture
and a sender killed, a host's sshd killed, a host's management link down, a host's disk filled,
the controller's results disk full. Each trial fails at once (the trial's watch,
trials/watch.py) with the cause named, the network is restored where hosts answer, and nothing
already captured is lost."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from collect.fetch import verify_manifest
from core.rack import Rack
from tests.e2e.conftest import PREFIX, PROJECT, recap, start_trials, trials_run, wait_for_daemon
from tests.e2e.test_interrupt import namespace_commands

pytestmark = pytest.mark.rack

DURATION_S = 40  # long enough that a trial ending before it can only be the watch's doing
EXPERIMENT = """\
experiment: collateral_damage
network:
  links:
    - {name: downstream, from: R, to: C, rate: 1mbit, buffer: 60000B, delay: 20ms}
    - {name: upstream, from: R, to: A, rate: 1mbit, buffer: 60000B, delay: 20ms}
traffic:
  - {type: bulk_tcp, name: tcp, from: A, to: C, flows: 1}
  - {type: cbr_udp, name: voip, from: B, to: D}
capture:
  points:
    - {name: bottleneck_in, link: upstream, at: R}
    - {name: bottleneck_out, link: downstream, at: R}
hosts:
  all: {cc: reno}
"""


def trials_dir(test_rack, host: str) -> Path:
    return test_rack.state_dir / "hosts" / host / "work" / "trials"


def daemon_pid(test_rack, host: str, name: str) -> int:
    (pidfile,) = trials_dir(test_rack, host).glob(f"*/*/{name}.pid")
    return int(pidfile.read_text().split()[0])


def start(
    test_rack, tmp_path: Path, results: Path | None = None, duration_s: int = DURATION_S
) -> subprocess.Popen:
    exp_file = tmp_path / "fail.yml"
    exp_file.write_text(EXPERIMENT + f"duration: {duration_s}s\n")
    return start_trials(
        str(exp_file), inventory=test_rack.inventory, results=results or tmp_path / "results"
    )


def finish(proc: subprocess.Popen, results: Path) -> tuple[str, dict, Path]:
    out, err = proc.communicate(timeout=300)
    said = " ".join((out + err).split())  # rich wraps long lines
    assert proc.returncode == 1, said[-3000:]
    (trial_dir,) = results.glob("*/trials/*")
    return said, json.loads((trial_dir / "trial.json").read_text()), trial_dir


def failed_at(record: dict) -> float:
    """When the runner failed the trial (epoch seconds)."""
    from datetime import datetime

    return datetime.fromisoformat(record["times"]["failed_at"]).timestamp()


def ran_for_s(record: dict) -> float:
    return failed_at(record) - record["times"]["t0"]


def rack_is_clean(test_rack, hosts: str = "ABCDR") -> None:
    rack = Rack.load([test_rack.inventory])
    try:
        if "R" in hosts:
            assert "htb" not in rack.run("R", "tc qdisc show")
            assert "TRIALBED_DELAY" not in rack.run("R", "iptables -t mangle -S")
    finally:
        rack.close()
    for host in hosts:
        assert namespace_commands(host) <= {"sshd"}, host


def test_processes_killed_and_a_full_disk_fail_the_trial_at_once(test_rack, tmp_path):
    """Three failures in one trial (each costs a whole trial otherwise): R's capture of
    bottleneck_in and A's TCP sender are killed, and R's disk fills up (a 256 MB one where R
    writes the trial's files, made and filled from a shell on R: each host has a mount
    namespace of its own). The watch names all three; the capture that went on writing to the
    full disk is found cut short."""
    rack = Rack.load([test_rack.inventory])
    on_r = f"{rack.host('R').workdir}/trials"
    # big enough for preflight (200 MB free), filled while the trial runs
    rack.run("R", f"mkdir -p {on_r} && mount -t tmpfs -o size=256m tmpfs {on_r}")
    try:
        proc = start(test_rack, tmp_path)
        wait_for_daemon(proc, test_rack, "A", "tcp_client")
        time.sleep(4)
        # The runner held still meanwhile, so that one round of its watch sees all three.
        proc.send_signal(signal.SIGSTOP)
        try:
            rack.run("R", f"dd if=/dev/zero of={on_r}/filler bs=64k", check=False)
            os.kill(daemon_pid(test_rack, "A", "tcp_client"), signal.SIGKILL)
            rack.run("R", f"kill -9 $(cut -d' ' -f1 {on_r}/*/*/bottleneck_in.tcpdump.pid)")
        finally:
            proc.send_signal(signal.SIGCONT)
        said, record, trial_dir = finish(proc, tmp_path / "results")
    finally:
        rack.run("R", f"umount {on_r}", check=False)
        rack.close()
    print(f"failed after {ran_for_s(record):.1f} s: {record['errors']}; {record['capture']}")
    assert record["status"] == "failed"
    errors = " ".join(record["errors"])
    assert "capture bottleneck_in on R ended by +" in errors
    assert "tcp (bulk_tcp) on A ended by +" in errors
    assert "R: its disk is full (0.0 MiB free in" in errors
    assert f"trial {record['trial']} failed:" in said and "its disk is full" in said
    assert ran_for_s(record) < DURATION_S / 2  # stopped by the watch, not by the schedule
    # tcpdump at bottleneck_out kept counting what it could no longer write: its file is
    # shorter than its count.
    cut = record["capture"]["bottleneck_out"]
    assert cut["in_file"] < cut["captured"]
    assert "capture bottleneck_out on R: its file holds" in errors
    # Everything was collected intact, the killed capture's file as far as it got.
    assert verify_manifest(trial_dir) == []
    assert (trial_dir / "R" / "bottleneck_in.pcap").stat().st_size > 10_000
    rack_is_clean(test_rack)


def mgmt_link(host: str, state: str) -> None:
    """The host's management link (its cable to the controller) up or down."""
    subprocess.run(["ip", "-n", PREFIX + host, "link", "set", "mgmt", state], check=True)


def test_hosts_that_stop_answering_fail_the_trial_and_the_others_are_restored(test_rack, tmp_path):
    """D's sshd is killed (SSH is refused at once) and B's management link goes down (SSH
    waits until its timeout, as when a cable is pulled or a host hangs)."""
    proc = start(test_rack, tmp_path)
    wait_for_daemon(proc, test_rack, "B", "voip_replay")
    time.sleep(4)
    mgmt_link("B", "down")
    link_down_at = time.time()
    pids = subprocess.run(
        ["ip", "netns", "pids", PREFIX + "D"], capture_output=True, text=True, check=True
    ).stdout.split()
    for pid in pids:  # the listener and the runner's session: D no longer answers over SSH
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                os.kill(int(pid), signal.SIGKILL)
    try:
        said, record, trial_dir = finish(proc, tmp_path / "results")
        print(f"failed after {ran_for_s(record):.1f} s: {record['errors']}")
        errors = " ".join(record["errors"])
        for host in "BD":
            assert f"{host} stopped answering at +" in errors
            assert f"{host} not stopped nor collected" in errors
            assert f"restore: {host} did not answer" in said
        # Stopped by the watch, not by the schedule: B's turn in a round comes within the
        # round's spacing of its link going down, and its check waits its timeout (15 s here;
        # both recorded) for an answer; a few seconds on top for the runner's reaction.
        assert ran_for_s(record) < DURATION_S
        reaction_s = failed_at(record) - link_down_at
        print(f"failed {reaction_s:.1f} s after B's link went down, watch {record['watch']}")
        assert reaction_s < record["watch"]["every_s"] + record["watch"]["timeout_s"] + 8
        # The hosts that answer were collected and restored.
        assert verify_manifest(trial_dir) == []
        assert (trial_dir / "R" / "bottleneck_in.pcap").stat().st_size > 10_000
        assert not (trial_dir / "D").exists() and not (trial_dir / "B").exists()
        rack_is_clean(test_rack, "ACR")
        # D and B keep what they had: D's UDP sink, B's UDP sender (its link is down, the
        # process does not know), their files where they were.
        assert "voip_sink.log" in {p.name for p in trials_dir(test_rack, "D").glob("*/*/*")}
        assert "voip_replay.log" in {p.name for p in trials_dir(test_rack, "B").glob("*/*/*")}
    finally:
        mgmt_link("B", "up")
        # D answers again (rack-up starts its sshd); teardown.yml stops what they still ran.
        up = test_rack.rack("present")
        assert up.returncode == 0, up.stdout[-3000:]
    down = test_rack.playbook("teardown.yml", "-i", str(test_rack.inventory))
    assert down.returncode == 0, down.stdout[-3000:]
    assert recap(down.stdout)["D"]["unreachable"] == recap(down.stdout)["B"]["unreachable"] == 0
    rack_is_clean(test_rack)


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


def umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], check=False)


def test_a_results_disk_too_small_is_refused_before_any_host_is_touched(test_rack, tmp_path):
    # What earlier tests left on the rack's hosts (a killed runner's files stay there).
    before = set(trials_dir(test_rack, "A").glob("*/*"))
    results = tmp_path / "results"
    mount_tmpfs(results, "100m")  # under the 200 MB every run needs free
    try:
        exp_file = tmp_path / "fail.yml"
        exp_file.write_text(EXPERIMENT + f"duration: {DURATION_S}s\n")
        done = subprocess.run(
            trials_run(str(exp_file), inventory=test_rack.inventory, results=results),
            cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert list(results.iterdir()) == []
    finally:
        umount(results)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, said[-2000:]
    assert f"results {results}: only 105 MB free on its disk" in said
    assert "free space there or give --results a larger disk" in said
    assert set(trials_dir(test_rack, "A").glob("*/*")) == before  # nothing started on the hosts


def test_a_results_disk_filled_mid_trial_keeps_the_captures_on_the_host(test_rack, tmp_path):
    before = set(trials_dir(test_rack, "R").glob("*/*/bottleneck_in.pcap"))
    results = tmp_path / "results"
    restores = set(Path(tempfile.gettempdir()).glob("trialbed-restore-*"))
    mount_tmpfs(results, "300m")  # enough for preflight; filled while the trial runs
    try:
        _fill_the_results_disk_mid_trial(test_rack, tmp_path, results, before)
    finally:
        # The restore's files went to a directory of their own (the results disk was full).
        for leftover in set(Path(tempfile.gettempdir()).glob("trialbed-restore-*")) - restores:
            subprocess.run(["rm", "-rf", str(leftover)], check=True)


def _fill_the_results_disk_mid_trial(test_rack, tmp_path, results, before):
    """The test's trial, its disk filled while it runs (the test removes what the restore
    left in /tmp whatever happens here)."""
    try:
        proc = start(test_rack, tmp_path, results=results, duration_s=20)
        wait_for_daemon(proc, test_rack, "A", "tcp_client")
        # All but 400 kB: room for the run's logs and small files, not for a 20-s capture
        # (about 30 kB/s here).
        free = os.statvfs(results).f_bavail * os.statvfs(results).f_frsize
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={results / 'filler'}", "bs=64k",
             f"count={(free - 400_000) // 65536}"],
            capture_output=True, check=True,
        )  # fmt: skip
        out, err = proc.communicate(timeout=300)
    finally:
        umount(results)
    said = " ".join((out + err).split())
    print(said[-1500:])
    assert proc.returncode == 1, said[-3000:]
    assert "the results disk is full" in said and "R keeps its copies in" in said
    # Nothing is lost: R's copies of the captures are still on R, whole.
    (kept,) = set(trials_dir(test_rack, "R").glob("*/*/bottleneck_in.pcap")) - before
    assert kept.stat().st_size > 400_000
    rack_is_clean(test_rack)
    subprocess.run(["rm", "-rf", str(kept.parent.parent)], check=True)
