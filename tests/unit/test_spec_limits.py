"""An experiment file is read within limits (trials/spec/reader.py): size, nesting, entries,
values with aliases expanded, length of a value and of a number. Whatever the input (a
multi-GB file, /dev/zero, binary data, a YAML bomb, a deep or recursive document, or the same
through --set), it is refused with the file, the line, the limit and why, with memory bounded
by the file limit and no traceback; and a plan is bounded in trials and name length."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from tests.unit.spec_files import write
from trials.plan import MAX_TRIALS, load_plan
from trials.spec import SpecError, read_file
from trials.spec.reader import MAX_DEPTH, MAX_ENTRIES, MAX_FILE_BYTES, MAX_VALUES

PROJECT = Path(__file__).resolve().parents[2]
SMOKE = PROJECT / "experiments" / "smoke.yml"


def refusal(path: Path, sets: tuple[str, ...] = ()) -> tuple[str, int]:
    """The message loading `path` fails with, and the most memory it took (bytes)."""
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as exc:
            load_plan(path, sets)
        return str(exc.value), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_multi_gigabyte_file_is_refused_by_its_size_before_a_byte_is_read(tmp_path):
    path = tmp_path / "huge.yml"
    with path.open("wb") as f:
        f.truncate(3 * 2**30)  # a sparse 3 GiB file
    message, peak = refusal(path)
    assert message == (
        f"{path}: file size: {3 * 2**30} bytes; allowed: at most {MAX_FILE_BYTES} bytes (256 KiB: "
        "80 times the largest shipped file)"
    )
    assert peak < 2**20


@pytest.mark.parametrize("stream", ["/dev/zero", "/dev/urandom"])
def test_an_endless_stream_is_read_no_further_than_the_limit(stream):
    message, peak = refusal(Path(stream))
    assert message == (
        f"{stream}: file size: more than {MAX_FILE_BYTES} bytes; allowed: at most "
        f"{MAX_FILE_BYTES} bytes (256 KiB: 80 times the largest shipped file)"
    )
    assert peak < 4 * MAX_FILE_BYTES


def test_binary_data_is_not_a_text_file(tmp_path):
    path = tmp_path / "exp.yml"
    path.write_bytes(b"experiment: x\n\x00\x01\x02")
    assert refusal(path)[0] == f"{path}: not a text file (byte 14 is NUL)"
    path.write_bytes(b"experiment: x\n\xc3\x28")
    assert refusal(path)[0] == f"{path}: not a text file (byte 14 is not UTF-8)"
    path.write_bytes(b"experiment: x\n\x1b[31m: 1\n")
    assert refusal(path)[0] == (
        f"{path}: line 2, column 1: not valid YAML: character U+001B: control characters are "
        "not allowed"
    )


@pytest.mark.parametrize("opening", ["[", "{a: ", "- "])
def test_deep_nesting_is_refused_at_the_limit_without_recursion(tmp_path, opening):
    depth = 50_000
    if opening == "- ":  # block style: one level per line, indented
        text = "".join("  " * i + "- \n" for i in range(depth // 1000))
    else:
        text = "x: " + opening * depth + "1" + ("]" if opening == "[" else "}") * depth + "\n"
    message, peak = refusal(write(tmp_path, text))
    assert f"nesting depth: more than {MAX_DEPTH} levels; allowed: at most {MAX_DEPTH} levels " in (
        message
    )
    assert "RecursionError" not in message and peak < 4 * MAX_FILE_BYTES


def test_the_nesting_limit_counts_levels_exactly(tmp_path):
    inside = "[" * (MAX_DEPTH - 1) + "1" + "]" * (MAX_DEPTH - 1)
    message, _ = refusal(write(tmp_path, f"x: {inside}\n"))  # 16 levels: read, then judged
    assert "unknown key 'x'" in message
    message, _ = refusal(write(tmp_path, f"x: [{inside}]\n"))
    assert message.startswith(f"{tmp_path / 'exp.yml'}: line 1, column {MAX_DEPTH + 3}: nesting ")


def test_a_yaml_bomb_is_refused_by_its_expanded_size(tmp_path):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join([f'*{chr(96 + i)}'] * 10)}]")
    message, peak = refusal(write(tmp_path, "\n".join(lines) + "\n"))
    assert message == (
        f"{tmp_path / 'exp.yml'}: line 4, column 36: values in the file: more than {MAX_VALUES}; "
        f"allowed: at most {MAX_VALUES}, aliases expanded (25 times the largest shipped file, and "
        "an alias cannot multiply it)"
    )
    assert peak < 4 * MAX_FILE_BYTES


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    message, _ = refusal(write(tmp_path, "a: &a [1, *a]\n"))
    assert message == (
        f"{tmp_path / 'exp.yml'}: line 1, column 11: not valid YAML: alias *a refers to a node "
        "that contains it, or to no anchor before it"
    )


def test_long_lists_mappings_values_and_numbers_are_refused(tmp_path):
    path = tmp_path / "exp.yml"
    cases = [
        ("x: [" + ", ".join(["1"] * (MAX_ENTRIES + 1)) + "]\n",
         f"{path}: line 1, column {5 + 3 * MAX_ENTRIES}: entries of one list or mapping: more "
         f"than {MAX_ENTRIES}; allowed: at most {MAX_ENTRIES} (a rack has tens of hosts, links "
         "and flows; a factor's levels fit too)"),
        ("x: {" + ", ".join(f"k{i}: 1" for i in range(MAX_ENTRIES + 1)) + "}\n",
         "entries of one list or mapping: more than 1000"),
        ("description: " + "x" * 10_001 + "\n",
         f"{path}: line 1, column 14: characters of one value: 10001; allowed: at most 10000 (a "
         "long description)"),
        ("seed: " + "9" * 41 + "\n",
         f"{path}: line 1, column 7: characters of one number: 41; allowed: at most 40 (a 63-bit "
         "seed has 19 digits)"),
        ("seed: " + "9" * 5000 + "\n", "characters of one number: 5000"),
    ]  # fmt: skip
    for text, said in cases:
        message, _ = refusal(write(tmp_path, text))
        assert said in message, message


def test_yaml_errors_name_line_column_and_what_was_open(tmp_path):
    path = tmp_path / "exp.yml"
    for text, said in (
        ("experiment: x\nduration: [30s\n",
         f"{path}: line 3, column 1: not valid YAML: did not find expected ',' or ']' (while "
         "parsing a flow sequence, from line 2, column 11)"),
        ("? [a, b]\n: c\n",
         f"{path}: line 1, column 3: a key must be a plain value, not a list or mapping"),
        ("experiment: !!python/object/apply:os.system [reboot]\n",
         f"{path}: line 1, column 13: not valid YAML: could not determine a constructor for the "
         "tag 'tag:yaml.org,2002:python/object/apply:os.system'"),
        ("a: 1\n---\nb: 2\n",
         f"{path}: line 2, column 1: not valid YAML: but found another document (expected a "
         "single document in the stream, from line 1, column 1)"),
        ("a: &k [1]\n*k : 2\n",
         f"{path}: line 1, column 4: not valid YAML: found unhashable key (while constructing a "
         "mapping, from line 1, column 1)"),
    ):  # fmt: skip
        message, _ = refusal(write(tmp_path, text))
        assert message == said


def test_set_values_are_read_within_the_same_limits(tmp_path):
    deep = "[" * 1000 + "]" * 1000
    message, _ = refusal(SMOKE, (f"report.x={deep}",))
    assert (
        message.startswith(f"{SMOKE}: --set report.x={deep[:10]}")
        and "nesting depth: more than 16 levels" in message
    )
    bomb = (
        "[&a [1,1,1,1,1,1,1,1,1,1], " + ", ".join(["[*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]"] * 200) + "]"
    )
    message, _ = refusal(SMOKE, (f"report.x={bomb}",))
    assert "values in the file: more than 10000" in message
    # what is not YAML stays text, and is judged as such
    message, _ = refusal(SMOKE, ("traffic[0].cc=[reno",))
    assert "key 'traffic[0].cc': unknown congestion control '[reno'" in message


def test_a_plan_is_bounded_in_trials_and_in_the_length_of_trial_names(tmp_path):
    path = tmp_path / "exp.yml"
    levels = "[" + ", ".join(str(i) for i in range(1, 102)) + "]"  # 101 levels
    text = SMOKE.read_text() + f"factors:\n  traffic[0].flows: {levels}\n"
    message, _ = refusal(write(tmp_path, text), ("repetitions=100",))
    assert message == (
        f"{path}: key 'repetitions': 101 combinations x 100 repetitions = 10100 trials; "
        f"allowed: at most {MAX_TRIALS}"
    )
    message, _ = refusal(write(tmp_path, text + f"  hosts.all.initcwnd: {levels}\n"))
    assert message == (
        f"{path}: key 'factors': 10201 combinations of levels; allowed: at most {MAX_TRIALS} "
        "trials in one plan"
    )
    params = ", ".join(f"{'p' * 60}{i}: 1" for i in range(4))
    long = SMOKE.read_text() + f"factors:\n  hosts.all: [{{cc_params: {{cubic: {{{params}}}}}}}]\n"
    message, _ = refusal(write(tmp_path, long))
    assert message.startswith(f"{path}: key 'factors': trial name all-ccparamscubic")
    assert message.endswith(
        "characters; allowed: at most 200 (a directory name on every host); use shorter levels"
    )


def test_every_shipped_file_is_within_the_limits_by_a_wide_margin():
    for path in sorted((PROJECT / "experiments").glob("*.yml")):
        assert path.stat().st_size * 50 < MAX_FILE_BYTES, path
        assert read_file(path).data["experiment"]


def test_check_refuses_hostile_files_without_a_traceback(tmp_path):
    path = tmp_path / "deep.yml"
    path.write_text("x: " + "[" * 50_000 + "]" * 50_000 + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "trials", "check", str(path)],
        capture_output=True, text=True, cwd=PROJECT, check=False, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert "Traceback" not in done.stderr and "nesting depth: more than 16 levels" in done.stderr
