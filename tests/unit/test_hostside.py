"""hostside/ shipped by role remote_daemons, run by Ansible itself against this machine (a working
directory of its own under tmp_path): every file of the folder and of its subfolders arrives
byte for byte with SHA256SUMS beside it (`sha256sum -c` agrees), bytecode left by a test is not
shipped, the helper and the watch's check are linked where the runner calls them (replacing the
files an older install put there), a second run changes nothing and a changed program is shipped
again. Then the host facts the runner reads each trial (hostside/probes/host_facts.py, Linux and
FreeBSD branches, sent as preflight sends them) record the sha256 of each shipped file as it is
on the host, and core.hostside.stale names what differs from the controller's."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import hostside, link_rules
from core.program_source import program_source

PROJECT = Path(__file__).resolve().parents[2]
PLAYBOOK = """
- name: Ship the host programs
  hosts: all
  gather_facts: false
  roles:
    - role: remote_daemons
"""


def ship(tmp_path: Path, source: Path) -> subprocess.CompletedProcess:
    """ansible-playbook with role remote_daemons against localhost, shipping `source` (the
    role's own is the project's hostside/) into tmp_path/work."""
    play = tmp_path / "play.yml"
    play.write_text(PLAYBOOK)
    variables = {
        "trialbed_dir": str(tmp_path / "work"),
        "__remote_daemons_source": str(source),
        "ansible_python_interpreter": sys.executable,
    }
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = {**os.environ, "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(
        [str(PROJECT / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local",
         str(play), "-e", f"@{tmp_path / 'vars.json'}"],
        cwd=PROJECT, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done


def changed(run: subprocess.CompletedProcess) -> int:
    return int(re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", run.stdout).group(1))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A copy of the project's hostside/ with a program two folders down (as a BPF congestion
    control's, hostside/bpf_cc/<name>/) and the bytecode a test importing a program leaves."""
    copy = tmp_path / "hostside"
    shutil.copytree(hostside.SOURCE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "bpf_cc/probe_cc").mkdir(parents=True)
    (copy / "bpf_cc/probe_cc/probe_cc.bpf.c").write_text("/* a congestion control */\n")
    (copy / "markers/__pycache__").mkdir(exist_ok=True)
    (copy / "markers/__pycache__/markers.cpython-311.pyc").write_bytes(b"\x00bytecode")
    return copy


def test_the_folder_is_shipped_once_with_its_sums_and_the_helper_linked(tmp_path, source):
    bin_dir = tmp_path / "work/bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "trialbed-daemon").write_text("#!/bin/sh\necho installed before hostside/\n")
    first = ship(tmp_path, source)
    shipped = tmp_path / "work" / hostside.REMOTE_NAME

    files = hostside.shipped_files(source)
    assert "bpf_cc/probe_cc/probe_cc.bpf.c" in files and "daemon/trialbed_daemon.py" in files
    assert not any("__pycache__" in p for p in files)
    on_host = {p.relative_to(shipped).as_posix() for p in shipped.rglob("*") if p.is_file()} - {
        hostside.SUMS
    }
    assert on_host == set(files)
    for path in files:
        assert (shipped / path).read_bytes() == (source / path).read_bytes(), path
    assert (shipped / hostside.SUMS).read_text() == hostside.sums_text(files)
    check = subprocess.run(
        ["sha256sum", "-c", "--strict", hostside.SUMS], cwd=shipped, capture_output=True, text=True
    )
    assert check.returncode == 0 and check.stdout.count(": OK") == len(files), check.stdout
    assert (shipped / "daemon/trialbed_daemon.py").stat().st_mode & 0o777 == 0o755
    assert (shipped / "markers/markers.py").stat().st_mode & 0o777 == 0o644

    # Linked where core.daemons calls them, relative, the file installed before replaced.
    for command, program in (
        ("trialbed-daemon", "daemon/trialbed_daemon.py"),
        ("trialbed-check", "daemon/trialbed_check.sh"),
    ):
        link = bin_dir / command
        assert link.is_symlink() and not os.readlink(link).startswith("/")
        assert link.resolve() == (shipped / program).resolve()
    trial = tmp_path / "work/trials/t"
    trial.mkdir(parents=True)
    helper = str(bin_dir / "trialbed-daemon")
    started = subprocess.run(
        [helper, "start", "nap", "--dir", str(trial), "--", "sleep", "30"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert started.stdout.strip() == "started"
    answer = subprocess.run(
        [str(bin_dir / "trialbed-check"), str(trial), "nap"], capture_output=True, text=True
    )
    assert json.loads(answer.stdout)["daemons"] == {"nap": {"state": "running"}}
    subprocess.run([helper, "stop", "nap", "--dir", str(trial)], capture_output=True, check=True)
    # A daemon that ended: the check hands over to the helper beside its link (with the log).
    subprocess.run([helper, "start", "brief", "--dir", str(trial), "--", "echo", "said bye"],
                   capture_output=True, check=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while (trial / "brief.pid").exists() and time.monotonic() < deadline:
        answer = subprocess.run(
            [str(bin_dir / "trialbed-check"), str(trial), "brief"], capture_output=True, text=True
        )
        if json.loads(answer.stdout)["daemons"]["brief"]["state"] == "ended":
            break
        time.sleep(0.1)
    assert "said bye" in json.dumps(json.loads(answer.stdout)["daemons"]["brief"]), answer.stdout

    assert changed(first) > 0
    assert changed(ship(tmp_path, source)) == 0
    # A changed program: it and SHA256SUMS are shipped again, nothing else.
    sampler = source / "recorders/tc_sampler.py"
    sampler.write_text(sampler.read_text() + "# changed\n")
    assert changed(ship(tmp_path, source)) == 2
    assert (shipped / "recorders/tc_sampler.py").read_bytes() == sampler.read_bytes()
    assert (shipped / hostside.SUMS).read_text() == hostside.sums_text(
        hostside.shipped_files(source)
    )


def probe(name: str, *args: str) -> dict:
    """A probe as preflight, the runner and `trials status` send it: its text with the core
    modules it imports inside, given to `python3 -I -c` (isolated: no checkout, no venv, no
    PYTHONPATH can lend it core) in a directory of its own."""
    source = program_source(hostside.SOURCE / hostside.PROBES[name])
    out = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", source, *args], cwd=args[0] if args else None,
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return json.loads(out.stdout)


def facts_of(workdir: Path) -> dict:
    """The host facts as preflight and the runner ask for them, their changing part."""
    workdir.mkdir(parents=True, exist_ok=True)
    return probe("host_facts", str(workdir), "--changing")


def test_the_probes_as_sent_run_where_there_is_no_checkout(tmp_path):
    facts = probe("host_facts", str(tmp_path))
    # the link model's kernel qdiscs (core.link_rules, carried inside), as this kernel has them
    assert facts["qdiscs"] and set(facts["qdiscs"]) <= set(link_rules.LINUX_KERNEL_QDISCS)
    assert facts["hostside"] is None  # looked for where role remote_daemons ships
    status = probe("status", str(tmp_path))
    assert status["leftover_trials"] == [] and status["qdiscs"] == {} and "daemons" in status


def test_each_trial_records_the_sha256_of_every_shipped_file_as_on_the_host(tmp_path, source):
    work = tmp_path / "work"
    assert facts_of(work)["hostside"] is None  # never shipped
    assert "never shipped" in hostside.stale("A", None, source)[0]
    ship(tmp_path, source)
    recorded = facts_of(work)["hostside"]
    assert recorded == hostside.shipped_files(source)
    assert hostside.stale("A", recorded, source) == []

    shipped = work / hostside.REMOTE_NAME
    (shipped / "traffic/web_flows.py").write_text("# edited on the host\n")
    (shipped / "recorders/siftr.py").unlink()
    recorded = facts_of(work)["hostside"]
    edited = hashlib.sha256(b"# edited on the host\n").hexdigest()
    assert recorded["traffic/web_flows.py"] == edited and recorded["recorders/siftr.py"] is None
    assert hostside.stale("A", recorded, source) == [
        "A: hostside/recorders/siftr.py is missing: run "
        "playbooks/configure.yml on it (role remote_daemons ships the folder)",
        "A: hostside/traffic/web_flows.py differs from the controller's: run "
        "playbooks/configure.yml on it (role remote_daemons ships the folder)",
    ]


def test_a_freebsd_host_records_them_too(tmp_path, source, monkeypatch, capsys):
    from tests.unit.test_host_facts_freebsd import run_facts, standins

    ship(tmp_path, source)
    standins(tmp_path, monkeypatch)
    facts = run_facts(tmp_path, capsys, ["em1"], True)
    assert facts["hostside"] == hostside.shipped_files(source)


def test_the_host_facts_look_where_the_role_ships():
    assert hostside.remote_dir("/var/lib/trialbed") == "/var/lib/trialbed/hostside"


def test_a_program_of_several_files_is_named_by_one_sha256_of_its_folder(source):
    """The transaction generator is built from a folder (hostside/traffic/transact/): its
    binary's name changes with any file of that folder, and only with those."""
    folder = "traffic/transact"
    files = hostside.folder_files(folder, source)
    assert {"transact.c", "udp.c", "transact.h"} <= set(files)
    sums = subprocess.run(
        ["sha256sum", *files], cwd=source / folder, capture_output=True, text=True, check=True
    ).stdout
    before = hostside.folder_sha256(folder, source)
    assert before == hashlib.sha256(sums.encode()).hexdigest()
    (source / "traffic/web_flows.py").write_text("# elsewhere in hostside/\n")
    assert hostside.folder_sha256(folder, source) == before
    (source / folder / "transact.h").write_text("/* a changed header */\n")
    assert hostside.folder_sha256(folder, source) != before
    with pytest.raises(ValueError, match="ships no file under 'traffic/none'"):
        hostside.folder_files("traffic/none", source)
