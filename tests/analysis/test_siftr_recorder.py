"""hostside/recorders/siftr.py as the runner would start it, against a stand-in for FreeBSD's
sysctl(8) and kldload(8) (no FreeBSD host runs here): the module loaded when missing, the
log pointed at the trial directory, every packet logged, enabled until SIGTERM, then disabled
and the earlier settings given back; a second recording on the host is refused. The stand-in
writes SIFTR's enable and disable lines as the kernel would (siftr(4) 1.3.0), so that the
recording reads back through analysis.siftr."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.siftr import read_siftr
from core.hostside import SOURCE, siftr_command

# A sysctl(8) for the net.inet.siftr tree, its state in a JSON file beside it.
FAKE_SYSCTL = r"""
import json, os, sys
state_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "state.json")
state = json.load(open(state_file))
state["calls"].append(sys.argv[1:])
def save():
    json.dump(state, open(state_file, "w"))
if not state["loaded"]:
    save(); print("sysctl: unknown oid 'net.inet.siftr'", file=sys.stderr); sys.exit(1)
if sys.argv[1] == "-n":
    save(); print(state["oids"][sys.argv[2].rsplit(".", 1)[1]]); sys.exit(0)
name, value = sys.argv[1].split("=", 1)
key = name.rsplit(".", 1)[1]
if key == "enabled" and value != state["oids"]["enabled"]:
    with open(state["oids"]["logfile"], "a") as log:
        if value == "1":
            log.write("enable_time_secs=1795400000\tenable_time_usecs=1\tsiftrver=1.3.0\t"
                      "sysname=FreeBSD\tsysver=1400097\tipmode=4\n")
            log.write("i,1795400000.5,198.18.1.11,40001,198.18.3.13,5201,1073725440,14480,0,"
                      "65536,65700,7,7,4,1448,50000,1,0,230000,32768,0,65536,0,0,0,0,0\n")
        else:
            log.write("disable_time_secs=1795400001\tdisable_time_usecs=2\ttotal_tcp_pkts=1\n")
state["oids"][key] = value
save()
"""
FAKE_KLDLOAD = r"""
import json, os, sys
state_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "state.json")
state = json.load(open(state_file))
state["calls"].append(["kldload", *sys.argv[1:]])
state["loaded"] = True
json.dump(state, open(state_file, "w"))
"""


@pytest.fixture
def freebsd(tmp_path):
    tools = tmp_path / "sbin"
    tools.mkdir()
    for name, source in (("sysctl", FAKE_SYSCTL), ("kldload", FAKE_KLDLOAD)):
        script = tools / name
        script.write_text(f"#!{sys.executable}\n{source}")
        script.chmod(0o755)
    state = {
        "loaded": False,
        "calls": [],
        "oids": {"enabled": "0", "logfile": "/var/log/siftr.log", "ppl": "1", "port_filter": "0"},
    }
    (tools / "state.json").write_text(json.dumps(state))
    return tools


def state(tools: Path) -> dict:
    return json.loads((tools / "state.json").read_text())


def start(tools: Path, cwd: Path, port: int | None = 5201) -> subprocess.Popen:
    command = (
        siftr_command(str(SOURCE), port=port)
        + f" --sysctl {tools}/sysctl --kldload {tools}/kldload"
    )
    return subprocess.Popen(
        ["sh", "-c", "exec " + command], cwd=cwd, stderr=subprocess.PIPE, text=True
    )


def test_records_until_sigterm_and_gives_the_settings_back(freebsd, tmp_path):
    trial = tmp_path / "trial"
    trial.mkdir()
    proc = start(freebsd, trial)
    assert "recording siftr into" in proc.stderr.readline()
    now = state(freebsd)
    assert now["oids"] == {
        "enabled": "1", "logfile": str(trial / "siftr.log"), "ppl": "1", "port_filter": "5201"
    }  # fmt: skip
    assert ["kldload", "siftr"] in now["calls"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, proc.stderr.read()
    after = state(freebsd)
    assert after["oids"] == {
        "enabled": "0", "logfile": "/var/log/siftr.log", "ppl": "1", "port_filter": "0"
    }  # fmt: skip
    # disabled before the log file is pointed away (the kernel flushes into the trial's file)
    sets = [c[0] for c in after["calls"] if c[0] != "-n" and c[0] != "kldload"]
    assert sets.index("net.inet.siftr.enabled=0") < sets.index(
        "net.inet.siftr.logfile=/var/log/siftr.log"
    )
    events = read_siftr(trial / "siftr.log")
    assert events.snd_cwnd.tolist() == [10] and events.srtt_us.tolist() == [50000]
    proc.stderr.close()


def test_a_second_recording_on_the_host_is_refused(freebsd, tmp_path):
    first = start(freebsd, tmp_path)
    assert "recording siftr" in first.stderr.readline()
    second = start(freebsd, tmp_path, port=None)
    _, err = second.communicate(timeout=10)
    assert second.returncode == 1
    assert "SIFTR is already enabled on this host" in err and str(tmp_path / "siftr.log") in err
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=10) == 0
    first.stderr.close()
    assert state(freebsd)["oids"]["enabled"] == "0"


def test_a_host_without_the_module_says_so(freebsd, tmp_path):
    (freebsd / "kldload").write_text(f"#!{sys.executable}\nimport sys\n"
                                     "print('kldload: can\\'t load siftr: No such file', "
                                     "file=sys.stderr)\nsys.exit(1)\n")  # fmt: skip
    proc = start(freebsd, tmp_path)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert "the SIFTR module is not available" in err and "No such file" in err
