"""Experiment files: what is accepted, and the messages for what is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from trials.spec import SpecError, load_experiment
from trials.units import parse_bytes, parse_duration_ns, parse_rate

PROJECT = Path(__file__).resolve().parents[2]
GOOD = """\
experiment: collateral_damage
rate: 1mbit
buffer: 60000B
duration: 40s
factors: {cc: [cubic, reno], rtt_ms: [50, 100], flows: [1, 2]}
repetitions: 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as exc:
        load_experiment(path)
    message = str(exc.value)
    assert str(path) in message  # every message names the file
    return message


def test_shipped_experiments_load():
    full = load_experiment(PROJECT / "experiments" / "collateral_damage.yml")
    assert len(full.trials()) == 3 * 2 * 3 * 5
    assert full.cc_params["htcp"] == {"use_bandwidth_switch": 0, "use_rtt_scaling": 1}
    smoke = load_experiment(PROJECT / "experiments" / "smoke.yml")
    assert [t.name for t in smoke.trials()] == ["cubic-rtt50ms-1flow-r1"]


def test_matrix_is_every_combination_in_a_seeded_order(tmp_path):
    exp = load_experiment(write(tmp_path, GOOD))
    names = [t.name for t in exp.trials()]
    assert len(names) == len(set(names)) == 2 * 2 * 2 * 2
    assert names == [t.name for t in load_experiment(write(tmp_path, GOOD)).trials()]
    assert names != sorted(names)


def test_units_are_exact():
    assert parse_rate("1mbit") == 1_000_000
    assert parse_rate("1.5Mbit") == 1_500_000
    assert parse_bytes("60kB") == parse_bytes("60000B") == 60_000
    assert parse_duration_ns("20ms") == 20_000_000
    assert parse_duration_ns("3min") == 180 * 10**9


def test_unknown_key_names_key_and_allowed_keys(tmp_path):
    message = error_of(tmp_path, GOOD + "bufer: 1B\n")
    assert "unknown key 'bufer'" in message
    assert "buffer" in message and "duration" in message


def test_unknown_nested_key(tmp_path):
    message = error_of(tmp_path, GOOD + "udp: {packet_bytes: 186, intervall: 20ms}\n")
    assert "unknown key 'udp.intervall'" in message
    assert "allowed here: packet_bytes, interval, port" in message


def test_wrong_unit_names_allowed_units(tmp_path):
    message = error_of(tmp_path, GOOD.replace("60000B", "60000 bytes"))
    assert "key 'buffer'" in message
    assert "B, kB, MB" in message


def test_negative_rate(tmp_path):
    message = error_of(tmp_path, GOOD.replace("rate: 1mbit", "rate: -1mbit"))
    assert "key 'rate'" in message and "greater than zero" in message


def test_unknown_congestion_control_lists_allowed(tmp_path):
    message = error_of(tmp_path, GOOD.replace("[cubic, reno]", "[cubic, newreno]"))
    assert "key 'factors.cc'" in message
    assert "'newreno'" in message and "reno, cubic, htcp" in message


def test_missing_key(tmp_path):
    message = error_of(tmp_path, GOOD.replace("duration: 40s\n", ""))
    assert "key 'duration' is required" in message


def test_cross_field_rules(tmp_path):
    assert "warmup" in error_of(tmp_path, GOOD + "warmup: 50s\n")
    assert "fill the bottleneck" in error_of(tmp_path, GOOD.replace("rate: 1mbit", "rate: 50kbit"))


def test_not_yaml_and_missing_file(tmp_path):
    assert "not valid YAML" in error_of(tmp_path, "experiment: [unclosed\n")
    with pytest.raises(SpecError, match="no such experiment file"):
        load_experiment(tmp_path / "nope.yml")
