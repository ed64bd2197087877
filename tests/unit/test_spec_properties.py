"""Property-based tests of the experiment schema (hypothesis): the shipped experiment files,
mutated (keys dropped, values retyped, elements duplicated, numbers scaled, strings replaced
with hostile ones, values nested deep, keys renamed, text cut or spliced, --set given hostile
keys and values), are either accepted or refused with SpecError. Never a traceback, never a
hang (a deadline per example); a refusal names the file and, on every line, the key (or the
line and column, or the --set) at fault; what is accepted round-trips through its own record,
holds no identifier a shell would read, and renders to host commands (every command of its
first trial, on the virtual rack, no SSH: tests/unit/render_trial.py) built by core.command in
which each of its strings is quoted. Independently of the schema, trials whose names, congestion
controls, interfaces, directories and trial names are hostile strings (put past the schema)
render to commands in which each such string is text to sh, never syntax. The examples run and
their outcomes are printed at the end of the module."""

from __future__ import annotations

import copy
import json
import re
import shlex
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from core.rack import RackError
from tests.unit.render_trial import appears, dumps, topology_rack, trial_commands, unquoted
from trials.plan import load_plan
from trials.spec import Experiment, SpecError, validate
from trials.spec.errors import key_text

PROJECT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((PROJECT / "experiments").glob("*.yml"))
RAW = {p.name: yaml.safe_load(p.read_text()) for p in EXPERIMENTS}
TEXT = {p.name: p.read_text() for p in EXPERIMENTS}
HOSTILE = [
    "$(reboot)", ";rm -rf /", "`id`", "'", '"', "a\nb", "\x00", "a\x00b", "../../etc/passwd",
    "-oProxyCommand=sh", "| nc 198.18.0.1 1", "&& halt", "${IFS}", "\\", "*", "\u202eevil",
    "x" * 300, "", " ", "\t", "eth0;reboot", "R1 R2", "af11 ef", "10mbit; reboot", "\r\n",
    "{{ lookup('pipe', 'id') }}", "%s%n", "1e999", "0x10", "NaN", "-1", "true",
]  # fmt: skip
SETTINGS = settings(
    deadline=timedelta(seconds=10),  # a hang is minutes; the slowest valid file takes 0.4 s
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# A refusal's line names where: a key, a --set, or the file's line and column.
PLACE = re.compile(
    r"key '[^']*'|--set |line \d+, column \d+|: file size: |: not a text file \(byte \d+|"
    r": expected a mapping of keys at the top level"
)
STATS: Counter[str] = Counter()
SLOWEST: list[float] = [0.0]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
    st.sampled_from(HOSTILE),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.sampled_from(HOSTILE), inner, max_size=4)
    ),
    max_leaves=12,
)
_UNIT = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?)\s*([A-Za-z%]*)")


def paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path below the root (keys of mappings, indices of lists)."""
    out = []
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for k, v in items:
        out.append((*prefix, k))
        out += paths(v, (*prefix, k))
    return out


def scaled(value: Any, factor: float) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        product = value * factor
        return int(product) if isinstance(value, int) and abs(product) < 2**70 else product
    if isinstance(value, str) and (m := _UNIT.fullmatch(value)):
        number = float(m[1]) * factor
        return f"{number:g}{m[2]}"
    if isinstance(value, str):
        return (value * 100)[:20_000]  # beyond the longest value a file may hold
    return value


@st.composite
def mutated_file(draw: Any) -> tuple[str, Any, list[str]]:
    """(experiment name, its data with 1-3 mutations, what was done)."""
    name = draw(st.sampled_from(sorted(RAW)))
    raw = copy.deepcopy(RAW[name])
    done = []
    for _ in range(draw(st.integers(1, 3))):
        targets = paths(raw)
        if not targets:
            break
        path = draw(st.sampled_from(targets))
        parent = raw
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        op = draw(
            st.sampled_from(["drop", "retype", "duplicate", "scale", "hostile", "nest", "rename"])
        )
        done.append(f"{op} {key_text(path)}")
        if op == "drop":
            del parent[last]
        elif op == "retype":
            parent[last] = draw(values)
        elif op == "duplicate":
            if isinstance(parent, list):
                parent.insert(last, copy.deepcopy(parent[last]))
            else:
                parent[f"{last}2" if isinstance(last, str) else last + 1] = copy.deepcopy(
                    parent[last]
                )
        elif op == "scale":
            factor = draw(
                st.sampled_from([2, 0.5, 3, 0, -1, 1e-9, 10, 1000, 10**6, 10**12, 10**30])
            )
            parent[last] = scaled(parent[last], factor)
        elif op == "hostile":
            parent[last] = draw(st.sampled_from(HOSTILE))
        elif op == "nest":
            value = parent[last]
            for _ in range(draw(st.integers(1, 40))):
                value = draw(
                    st.sampled_from(
                        [[value], {"x": value}, {last: value} if isinstance(last, str) else [value]]
                    )
                )
            parent[last] = value
        elif op == "rename" and isinstance(parent, dict):
            new = draw(st.sampled_from(HOSTILE) | st.text(max_size=12))
            parent[new] = parent.pop(last)
    return name, raw, done


def outcome(path: Path, sets: list[str]) -> str:
    """Load and select every trial: 'accepted' or 'refused', asserting the properties."""
    start = time.monotonic()
    try:
        plan = load_plan(path, sets)
        plan.select(None)
    except SpecError as exc:
        message = str(exc)
        lines = [ln for ln in message.splitlines() if not ln.startswith("  (")]
        assert lines, message
        for line in lines:
            assert line.startswith(f"{path}: "), line
            assert PLACE.search(line), line  # names the key, the --set or the line
            assert ": keys: " not in line, line
            assert len(line) < 2000, line[:300]
        return "refused"
    finally:
        SLOWEST[0] = max(SLOWEST[0], time.monotonic() - start)
    for trial in plan.trials:
        exp = trial.experiment
        record = json.loads(exp.model_dump_json(by_alias=True))
        assert validate(record, "record") == exp  # what trial.json records reads back the same
        for word in identifiers(exp):
            assert shlex.quote(word) == word or word == "", word  # nothing for a shell to read
    if plan.trials:
        rendered(plan.trials[0], path)
    return "accepted"


def rendered(trial: Any, path: Path) -> None:
    """The trial's host commands on the virtual rack of its topology quote every string of
    it (a trial the virtual rack cannot hold is refused by the runner, naming the key)."""
    topology = PROJECT / "inventory/virtual/topologies" / f"{trial.experiment.topology}.yml"
    if not topology.exists():
        STATS["render: no such virtual topology"] += 1
        return
    try:
        commands = trial_commands(trial, topology_rack(trial.experiment.topology), str(path))
    except (RackError, SpecError) as exc:
        assert str(exc).startswith(f"{path}: ") or "inventory" in str(exc), str(exc)
        STATS["render: refused by the rack"] += 1
        return
    words = [w for w in {*identifiers(trial.experiment), trial.name} if w]
    for cmd in commands:
        for word in words:
            assert not unquoted(cmd, word), (word, cmd)
    STATS["render: commands quoted"] += 1


def identifiers(exp: Experiment) -> list[str]:
    """Every string of the experiment that names something on a host."""
    words = [*exp.nodes(), *exp.generator_names(), exp.experiment, exp.topology]
    words += [exp.network.host_of(n) for n in exp.nodes()]
    words += [lk.name for lk in exp.network.links]
    words += [p.name for p in exp.capture.points] + [p.interface or "" for p in exp.capture.points]
    for settings_ in exp.hosts.values():
        words += [settings_.cc or ""]
        for cc, params in settings_.cc_params.items():
            words += [cc, *params, *(str(v) for v in params.values())]
    words += [str(getattr(g, "cc", "") or "") for g in exp.traffic]
    words += [str(getattr(g, "dscp", "") or "") for g in exp.traffic]
    return [w for w in words if w != ":"] + [h for h in exp.hosts]


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    """Say, after the module, how many examples ran and how they ended (shown with -q too)."""
    yield
    line = (
        f"spec properties: {sum(STATS.values())} generated examples "
        f"({', '.join(f'{k} {v}' for k, v in sorted(STATS.items()))}); slowest "
        f"{SLOWEST[0]:.2f} s"
    )
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n{line}")


@settings(SETTINGS, max_examples=200)
@given(mutated_file())
def test_mutated_experiment_files_are_accepted_or_refused_by_key(tmp_path_factory, case):
    name, raw, done = case
    note(f"{name}: {'; '.join(done)}")
    path = tmp_path_factory.mktemp("mutated") / name
    path.write_text(yaml.safe_dump(raw, allow_unicode=True, sort_keys=False))
    STATS[f"data {outcome(path, [])}"] += 1


@st.composite
def spliced_text(draw: Any) -> tuple[str, str]:
    name = draw(st.sampled_from(sorted(TEXT)))
    text = TEXT[name]
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["cut", "insert", "line twice", "drop line", "brackets"]))
        lines = text.splitlines(keepends=True)
        row = draw(st.integers(0, max(0, len(lines) - 1)))
        if op == "cut":
            text = text[:at]
        elif op == "insert":
            piece = draw(
                st.sampled_from(HOSTILE)
                | st.text(max_size=20)
                | st.sampled_from(
                    ["\x00", "\xff", ": :", "- -", "&a", "*a", "!!binary", "? [", "{", "]"]
                )
            )
            text = text[:at] + piece + text[at:]
        elif op == "line twice" and lines:
            lines.insert(row, lines[row])
            text = "".join(lines)
        elif op == "drop line" and lines:
            del lines[row]
            text = "".join(lines)
        elif op == "brackets":
            depth = draw(st.integers(1, 5000))
            text = text[:at] + "[" * depth + text[at:]
    return name, text


@settings(SETTINGS, max_examples=150)
@given(spliced_text())
def test_spliced_text_is_accepted_or_refused_by_line(tmp_path_factory, case):
    name, text = case
    path = tmp_path_factory.mktemp("spliced") / name
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    STATS[f"text {outcome(path, [])}"] += 1


@st.composite
def hostile_sets(draw: Any) -> tuple[str, list[str]]:
    name = draw(st.sampled_from(sorted(RAW)))
    keys = [key_text(p) for p in paths(RAW[name])] + [
        "factors.duration",
        "factors",
        "x..y",
        "a[",
        "[0]",
    ]
    sets = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(keys) | st.sampled_from(HOSTILE))
        value = draw(
            st.sampled_from(HOSTILE)
            | values.map(lambda v: yaml.safe_dump(v, default_flow_style=True, width=10**6).strip())
        )
        sets.append(f"{key}={value}")
    return name, sets


@settings(SETTINGS, max_examples=150)
@given(hostile_sets())
def test_hostile_set_options_are_accepted_or_refused_by_key(case):
    name, sets = case
    STATS[f"--set {outcome(PROJECT / 'experiments' / name, sets)}"] += 1


# What an experiment names that reaches a host's command line, put past the schema: the
# runner's quoting must hold whatever the schema lets through.
# NUL cannot be a command word: core.command refuses it (tests/unit/test_command.py).
hostile_text = st.sampled_from([h for h in HOSTILE if "\x00" not in h]) | st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)


@st.composite
def hostile_trial(draw: Any) -> tuple[str, Any, dict[str, str]]:
    """(file, trial with hostile names, each hostile string -> where it was put)."""
    name = draw(st.sampled_from(sorted(RAW)))
    trial = load_plan(PROJECT / "experiments" / name).trials[0]
    exp = trial.experiment
    marks: dict[str, str] = {}

    def hostile(where: str) -> str:
        # '#', a number and '#': each string is unique, and sh would act on it unquoted; the
        # closing '#' keeps one ('x #1#') from being found inside another ('#13#' after a
        # word's separating space)
        text = f"{draw(hostile_text)}#{len(marks)}#"
        marks[text] = where
        return text

    traffic, renamed = [], {}
    for i, (g, label) in enumerate(zip(exp.traffic, exp.generator_names(), strict=True)):
        update = {"name": hostile(f"traffic[{i}].name")}
        renamed[label] = update["name"]
        if getattr(g, "cc", None):
            update["cc"] = hostile(f"traffic[{i}].cc")
        traffic.append(g.model_copy(update=update))
    iface = hostile("interface names")  # the rack's, and so a capture point's by name
    points = [
        p.model_copy(
            update={
                "name": hostile(f"capture.points[{i}].name"),
                **({"interface": iface + p.interface} if p.interface else {}),
            }
        )
        for i, p in enumerate(exp.capture.points)
    ]
    markers = [
        m.model_copy(update={"name": hostile(f"markers[{i}].name")})
        for i, m in enumerate(exp.markers)
    ]
    marking = [  # a rule names its flow by the generator's name
        r.model_copy(update={"flow": renamed[r.flow]}) if r.flow else r for r in exp.network.marking
    ]
    exp = exp.model_copy(
        update={
            "network": exp.network.model_copy(update={"marking": marking}),
            "traffic": traffic,
            "capture": exp.capture.model_copy(update={"points": points}),
            "markers": markers,
        }
    )
    rack = {"workdir": hostile("trialbed_dir"), "iface": iface, "cc": hostile("a switch's cc")}
    trial = SimpleNamespace(experiment=exp, name=hostile("trial name"))
    marks["batch"] = ""
    return name, (trial, rack), marks


@settings(SETTINGS, max_examples=40)
@given(hostile_trial(), hostile_text)
def test_hostile_strings_reach_the_hosts_as_text(case, batch):
    name, (trial, rack_strings), marks = case
    note(f"{name}: {marks}")
    marks.pop("batch")
    batch = f"{batch}#batch"
    rack = topology_rack(
        trial.experiment.topology, f"/srv/{rack_strings['workdir']}", rack_strings["iface"]
    )
    commands = trial_commands(
        trial, rack, name, batch=batch, name=trial.name, switch_cc=rack_strings["cc"]
    )
    for text, where in {**marks, batch: "batch name"}.items():
        found = [u for cmd in commands for u in unquoted(cmd, text)]
        assert not found, f"{where} {text!r} unquoted in: {found[:3]}"
        assert any(appears(cmd, text) for cmd in commands), f"{where} {text!r}: {dumps(commands)}"
    STATS["hostile strings quoted"] += 1
