"""The transaction generator's spec: the EFT family's file expands to its matrix, defaults
follow the paper per protocol, and every bad value is refused naming the key and what is
allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from trials.generators.transaction import TransactionSpec
from trials.plan import load_plan
from trials.spec import SpecError

PROJECT = Path(__file__).resolve().parents[2]
BASE = """\
experiment: eft
topology: dumbbell
network:
  links: [{name: lan, from: R, to: C, rate: 10mbit, buffer: 100pkt}]
traffic:
  - {type: transaction, name: eft, from: A, to: C, %s}
duration: 5s
"""


def error_of(tmp_path: Path, extra: str) -> str:
    path = tmp_path / "exp.yml"
    fields = extra if "workload:" in extra else f"workload: eft_short, {extra}"
    path.write_text(BASE % fields)  # a key given twice is refused as such: one of each
    with pytest.raises(SpecError) as exc:
        load_plan(path)
    return str(exc.value)


def test_the_family_file_expands_to_its_matrix():
    plan = load_plan(PROJECT / "experiments/eft.yml")
    assert len(plan.trials) == 12
    specs = {
        (t.experiment.traffic[0].workload, t.experiment.traffic[0].protocol) for t in plan.trials
    }
    assert len(specs) == 6


def test_defaults_follow_the_paper_per_protocol():
    tcp = TransactionSpec.model_validate(
        {"type": "transaction", "from": "A", "to": "C", "workload": "filetransf_long"}
    )
    assert (tcp.send_bytes, tcp.request_bytes) == (32767, 1_460_000)
    udp = TransactionSpec.model_validate(
        {"type": "transaction", "from": "A", "to": "C", "workload": "eft_long", "protocol": "udp"}
    )
    assert (udp.send_bytes, udp.request_bytes, udp.window_bytes) == (8863, 100, 17726)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("protocol: sctp", "key 'traffic[0].protocol': Input should be 'tcp' or 'udp'"),
        ("workload: eft_medium", "'eft_short', 'eft_long' or 'filetransf_long'"),
        ("protocol: tcp, window: 17726B", "window applies to protocol udp only"),
        ("protocol: tcp, rto: 50ms", "rto applies to protocol udp only"),
        ("file_size: 100000B", "file_size applies to workload filetransf_long only"),
        ("protocol: udp, send_size: 70000B", "send_size 70000 B: allowed 1 to 65487 B for udp"),
        ("protocol: udp, window: 4000B", "window 4000 B must hold at least one send"),
        ("tcp_window: 100B", "tcp_window 100 B: allowed 1024 B"),
        ("pairs: 0", "key 'traffic[0].pairs'"),
        ("port: 65530, pairs: 10", "goes beyond port 65535"),
        ("send_size: 1460", "key 'traffic[0].send_size': 1460 is not a size in bytes"),
    ],
)
def test_bad_values_are_refused_naming_the_key(tmp_path, extra, message):
    text = error_of(tmp_path, extra)
    assert "exp.yml" in text and message in text


def test_tcp_timestamps_is_0_or_1(tmp_path):
    path = tmp_path / "exp.yml"
    path.write_text(
        BASE % "workload: eft_short, protocol: tcp" + "hosts:\n  all: {tcp_timestamps: 2}\n"
    )
    with pytest.raises(SpecError) as exc:
        load_plan(path)
    assert "hosts.all.tcp_timestamps" in str(exc.value) and "0 or 1" in str(exc.value)
