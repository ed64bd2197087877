"""bulk_tcp's socket sender: the commands a trial of experiments/startup_*.yml sends for it
(rendered without a rack), the schema's refusals naming the key, and
hostside/traffic/bulk_socket.py run for real on loopback (bytes and timing in its reports
against what was asked, its socket options as the kernel took them, a refused connection)."""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.hostside import BULK_SOCKET, SOURCE
from tests.unit.render_trial import topology_rack, trial_commands
from trials.generators.base import TrialContext
from trials.generators.bulk_tcp import PACING_CAP_BPS, BulkTcp
from trials.network import resolve_network
from trials.plan import load_plan
from trials.spec import SpecError

PROJECT = Path(__file__).resolve().parents[2]
PROGRAM = SOURCE / BULK_SOCKET
HOST = "127.0.0.1"


def runs(commands, mode: str) -> list[dict[str, str]]:
    """The options of every bulk_socket.py `mode` command line among the rendered ones."""
    out = []
    for c in commands:
        words = shlex.split(str(c))
        if words[:1] == ["python3"] and words[1].endswith(BULK_SOCKET) and words[2] == mode:
            out.append(dict(zip(words[3::2], words[4::2], strict=True)))
    return out


def render(name: str, sets: list[str] | None = None):
    trial = load_plan(PROJECT / "experiments" / name, sets or []).trials[0]
    rack = topology_rack(trial.experiment.topology)
    return trial, trial_commands(trial, rack, str(PROJECT / "experiments" / name))


@pytest.mark.parametrize(
    "name", ["startup_lswan.yml", "startup_hswan.yml", "startup_satellite.yml"]
)
def test_the_startup_files_run_the_socket_sender_not_iperf3(name: str) -> None:
    trial, commands = render(name)
    exp = trial.experiment
    assert {g.tool for g in exp.traffic} == {"socket"}
    assert not [c for c in commands if "iperf3" in shlex.split(str(c))]
    senders, receivers = runs(commands, "sender"), runs(commands, "receiver")
    assert len(senders) == len(receivers) == len(exp.traffic)
    for spec, opt, server in zip(exp.traffic, senders, receivers, strict=True):
        assert server["--port"] == opt["--port"] and server["--out"].endswith("_server.json")
        assert opt["--cc"] == spec.cc == "reno"
        assert opt["--flows"] == str(spec.flows)
        assert float(opt["--duration-s"]) == (exp.duration - spec.start) / 1e9
        assert float(opt["--start-at"]) == pytest.approx(1.0e9 + spec.start / 1e9)
        assert opt["--out"].endswith("_client.json")


def test_pacing_and_dscp_reach_the_socket_sender_as_socket_options() -> None:
    _, commands = render(
        "startup_lswan.yml",
        ["traffic[*].pacing=true", "traffic[pair1].dscp=af11", "traffic[pair1].bytes=1MB"],
    )
    opt = runs(commands, "sender")[0]
    assert int(opt["--pacing-rate"]) * 8 == PACING_CAP_BPS  # bytes/s, as iperf3's bits/s
    assert int(opt["--tos"]) == 10 << 2  # af11: DSCP 10 in the ToS byte's upper six bits
    assert opt["--bytes"] == "1000000" and "--duration-s" not in opt


BASE = """\
experiment: startup
topology: chain2
network:
  links: [{name: bottleneck, between: [R1, R2], rate: 1.5mbit, buffer: 20pkt}]
traffic:
  - {type: bulk_tcp, name: pair1, from: S1, to: D1, %s}
duration: 5s
"""


@pytest.mark.parametrize(
    ("fields", "wanted"),
    [
        ("tool: ftp", "key 'traffic[0].tool': Input should be 'iperf3' or 'socket', not 'ftp'"),
        (
            "tool: socket, flows: 4, bytes: 3B",
            "key 'traffic[0]': bytes 3 B with tool socket: at least one byte per flow (flows 4)",
        ),
    ],
)
def test_the_schema_refuses_by_key(tmp_path: Path, fields: str, wanted: str) -> None:
    path = tmp_path / "exp.yml"
    path.write_text(BASE % fields)
    with pytest.raises(SpecError) as exc:
        load_plan(path)
    assert wanted in str(exc.value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def transfer(tmp_path: Path, *sender: str, port: int | None = None) -> tuple[dict, dict, int]:
    """A receiver, and a sender with the given options to its end: both reports and the
    sender's exit status."""
    port = port or free_port()
    recv_out, send_out = tmp_path / "server.json", tmp_path / "client.json"
    receiver = subprocess.Popen(
        [sys.executable, str(PROGRAM), "receiver", "--bind", HOST, "--port", str(port),
         "--out", str(recv_out)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stderr is not None
        assert "ready" in receiver.stderr.readline()
        done = subprocess.run(
            [sys.executable, str(PROGRAM), "sender", "--bind", HOST, "--connect", HOST,
             "--port", str(port), *sender, "--out", str(send_out)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        time.sleep(0.3)  # what the buffers still held
    finally:
        receiver.send_signal(signal.SIGTERM)
        receiver.communicate(timeout=10)
    return json.loads(send_out.read_text()), json.loads(recv_out.read_text()), done.returncode


def test_bytes_are_split_over_the_flows_and_each_ends_when_the_receiver_has_them(
    tmp_path: Path,
) -> None:
    total, flows = 10_000_003, 3
    sent, got, rc = transfer(tmp_path, "--flows", str(flows), "--bytes", str(total))
    assert rc == 0 and sent["error"] is None
    assert [f["bytes_sent"] for f in sent["flows"]] == [3_333_335, 3_333_334, 3_333_334]
    assert [f["status"] for f in sent["flows"]] == ["done"] * flows
    by_port = {c["peer_port"]: c for c in got["connections"]}
    assert sorted(by_port) == sorted(f["local_port"] for f in sent["flows"])
    for f in sent["flows"]:
        c = by_port[f["local_port"]]
        assert c["bytes"] == f["bytes_sent"]
        # The sender writes as soon as it is connected, and ends once the receiver has read
        # everything and closed (it reads to EOF first).
        assert f["connect_ns"] <= f["connected_ns"] <= f["first_send_ns"]
        assert f["first_send_ns"] - f["connect_ns"] < 50_000_000
        assert c["accepted_ns"] <= c["first_byte_ns"] <= c["last_byte_ns"] <= c["eof_ns"]
        assert f["last_send_ns"] <= c["eof_ns"] <= f["closed_ns"]


def test_a_duration_sends_until_it_ends_with_the_socket_options_asked(tmp_path: Path) -> None:
    start_at = time.time() + 0.5
    sent, got, rc = transfer(
        tmp_path, "--flows", "2", "--duration-s", "1", "--start-at", repr(start_at),
        "--cc", "reno", "--tos", "40", "--pacing-rate", "2500000",
    )  # fmt: skip
    assert rc == 0 and sent["error"] is None
    assert sent["start_ns"] == int(start_at * 1e9)
    by_port = {c["peer_port"]: c for c in got["connections"]}
    for f in sent["flows"]:
        assert f["status"] == "done" and f["cc"] == "reno"
        assert f["connect_ns"] >= sent["start_ns"]
        assert f["last_send_ns"] < sent["start_ns"] + 10**9 + 50_000_000
        # Paced at 2.5 MB/s: about that reached the receiver in the 1.3 s it had, nowhere
        # near loopback's gigabytes (the rest of what was written waits in the send buffer).
        received = by_port[f["local_port"]]["bytes"]
        assert 1_000_000 < received <= min(f["bytes_sent"], 1.3 * 2_500_000 * 1.2)


def test_a_refused_connection_is_reported_and_fails_the_sender(tmp_path: Path) -> None:
    out = tmp_path / "client.json"
    done = subprocess.run(
        [sys.executable, str(PROGRAM), "sender", "--bind", HOST, "--connect", HOST,
         "--port", str(free_port()), "--duration-s", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert done.returncode == 1
    assert report["error"] == "1 of 1 flows failed"
    assert report["flows"][0]["status"] == "error"
    assert report["flows"][0]["error"] == "Connection refused"


def test_its_reports_are_read_back_for_problems(tmp_path: Path) -> None:
    """What the runner says of a socket sender's trial from its reports: a failed flow with
    its reason, a receiver that left no report; the record names both reports and the tool."""
    trial = load_plan(PROJECT / "experiments" / "startup_lswan.yml").trials[0]
    exp, rack = trial.experiment, topology_rack(trial.experiment.topology)
    net = resolve_network(exp, rack, str(PROJECT / "experiments" / "startup_lswan.yml"))
    gen = BulkTcp(exp.traffic[0], "pair1", 0, TrialContext(rack, net, None, exp.duration))
    record = gen.record()
    assert (record["tool"], record["client_json"], record["server_json"]) == (
        "socket", "S1/pair1_client.json", "D1/pair1_server.json",
    )  # fmt: skip
    sent, got, _ = transfer(tmp_path, "--flows", "1", "--bytes", "1000")
    for path, report in ((record["client_json"], sent), (record["server_json"], got)):
        (tmp_path / path).parent.mkdir()
        (tmp_path / path).write_text(json.dumps(report))
    assert gen.problems(tmp_path) == []
    sent["flows"][0] |= {"status": "error", "error": "Connection refused"}
    sent["error"] = "1 of 1 flows failed"
    (tmp_path / record["client_json"]).write_text(json.dumps(sent))
    (tmp_path / record["server_json"]).unlink()
    assert gen.problems(tmp_path) == [
        "pair1: bulk_socket client on S1: 1 of 1 flows failed (Connection refused)",
        "pair1: bulk_socket server on D1 left no report",
    ]
