"""Names that point elsewhere resolve, and nothing is addressed twice: every node, link and
capture point named exists; two spellings of one factor key, a --set on what a factor varies,
or a setting --set twice are refused; no two trials share a name or an id. Errors name the
file, the exact key and its line (a factor's line where the value came from a factor)."""

from __future__ import annotations

import pytest
import yaml

from tests.unit.spec_files import GOOD, check, error_of, write
from trials.plan import key_targets, load_plan
from trials.spec import SpecError, read_yaml

FACTORS = "  traffic[late].start: [0s, 15s]\n"


def with_factor(line: str) -> str:
    return GOOD.replace(FACTORS, FACTORS + f"  {line}\n")


@pytest.mark.parametrize(
    ("second", "varies"),
    [
        ("traffic[1].start: [1s, 2s]", "traffic[1].start"),
        ("traffic[-2].start: [1s, 2s]", "traffic[1].start"),
        ("'traffic[ 1 ].start': [1s, 2s]", "traffic[1].start"),
        ("traffic[*].start: [1s, 2s]", "traffic[1].start"),
        ("traffic[late]: [{type: bulk_tcp, from: S2, to: D2}]", "traffic[1]"),
    ],
)
def test_two_spellings_of_one_factor_key_are_refused(tmp_path, second, varies):
    message = error_of(tmp_path, with_factor(second))
    key = second.split(":")[0].strip("'")
    assert message == (
        f"{tmp_path / 'exp.yml'}: key 'factors.{key}': it varies {varies}, as "
        "factors.traffic[late].start does; give one factor for one setting"
    )


def test_paths_of_a_key_are_its_elements_by_any_spelling():
    raw = yaml.safe_load(GOOD)
    assert key_targets(raw, "traffic[late].start") == [("traffic", 1, "start")]
    assert key_targets(raw, "traffic[-2].start") == [("traffic", 1, "start")]
    assert key_targets(raw, "network.links[*].delay") == [
        ("network", "links", 0, "delay"),
        ("network", "links", 1, "delay"),
    ]
    assert key_targets(raw, "hosts.all.cc") == [("hosts", "all", "cc")]  # not there yet


def test_set_on_a_setting_a_factor_varies_is_refused_unless_it_names_the_factor(tmp_path):
    path = tmp_path / "exp.yml"
    message = error_of(tmp_path, GOOD, ("traffic[1].start=3s",))
    assert message == (
        f"{path}: --set traffic[1].start=3s: traffic[1].start is varied by "
        "factors.traffic[late].start; replace the factor with --set traffic[late].start=VALUE, "
        "or leave it"
    )
    two = (
        "traffic=[{type: bulk_tcp, from: S1, to: D1}, "
        "{type: bulk_tcp, name: late, from: S2, to: D2}]"
    )
    message = error_of(tmp_path, GOOD, (two,))
    assert message.startswith(f"{path}: --set {two[:70]}... D2}}]: ")  # a long --set, cut
    assert message.endswith(
        ": traffic[1].start is varied by factors.traffic[late].start; replace the factor with "
        "--set traffic[late].start=VALUE, or leave it"
    )
    # the factor's own key replaces it, as documented
    plan = load_plan(write(tmp_path, GOOD), ["traffic[late].start=3s"])
    assert {t.experiment.traffic[1].start for t in plan.trials} == {3 * 10**9}


def test_a_setting_set_twice_on_the_command_line_is_refused(tmp_path):
    message = error_of(tmp_path, GOOD, ("duration=20s", "duration=30s"))
    assert message == (
        f"{tmp_path / 'exp.yml'}: --set duration=30s: duration is already set by --set "
        "duration=20s; set it once"
    )
    message = error_of(tmp_path, GOOD, ("traffic[first].cc=cubic", "traffic[*].cc=reno"))
    assert "--set traffic[*].cc=reno: traffic[0].cc is already set by --set traffic[first]" in (
        message
    )


def test_levels_that_mean_one_trial_are_refused(tmp_path):
    path = tmp_path / "exp.yml"
    message = error_of(tmp_path, with_factor("network.links[bottleneck].rate: [1mbit, 1000kbit]"))
    assert message.startswith(f"{path}: key 'factors': trials ")
    assert message.endswith(
        'levels network.links[bottleneck].rate: "1mbit" and "1000kbit" give one trial; give each '
        "level once"
    )
    message = error_of(tmp_path, with_factor("traffic[0].name: [a_b, ab]"))
    assert " have one name (" in message and 'levels traffic[0].name: "a_b" and "ab"' in message


def test_trial_ids_and_names_of_a_valid_plan_are_unique(tmp_path):
    plan = load_plan(write(tmp_path, with_factor("network.links[bottleneck].rate: [1mbit, 2mbit]")))
    assert len({t.id for t in plan.trials}) == len({t.name for t in plan.trials}) == 24


def test_capture_nodes_and_markers_are_references_too(tmp_path):
    nodes = "network:\n  nodes: {R1: R1, R2: R2, S1: S1, S2: S2, D1: D1, D2: D2}\n"
    message = error_of(tmp_path, GOOD.replace("network:\n", nodes).replace("node: R2", "node: R7"))
    assert message == (
        f"{tmp_path / 'exp.yml'}: key 'capture.points[1].node': capture.points[1].node: node "
        "'R7' is not in network.nodes (R1, R2, S1, S2, D1, D2) (line 15)"
    )
    done = check(tmp_path, GOOD.replace("node: R2", "node: R9"))
    assert done.returncode == 2
    assert (
        f"{tmp_path / 'exp.yml'}: key 'capture.points[1].node': node 'R9' is not a host of the "
        "chain2 topology"
    ) in " ".join(done.stderr.split())


def test_errors_point_at_the_line_of_the_key(tmp_path):
    path = tmp_path / "exp.yml"
    lines = GOOD.splitlines()
    line_of = {word: next(i for i, ln in enumerate(lines, 1) if word in ln) for word in
               ("name: late", "name: r2_core", "duration:", "traffic[late].start")}  # fmt: skip
    message = error_of(tmp_path, GOOD.replace("name: r2_core", "name: before"))
    assert message == (
        f"{path}: key 'capture.points[1]': capture point names must be unique; repeated: before "
        f"(first at [0]) (line {line_of['name: r2_core']})"
    )
    message = error_of(tmp_path, GOOD, ("duration=10h",))
    assert "key 'duration': '10h' is not a duration" in message and "(line" not in message
    plan = load_plan(write(tmp_path, GOOD), ["duration=10s"])
    with pytest.raises(SpecError) as exc:
        plan.select(["*start-15s*"])
    assert str(exc.value).startswith(  # the value came from the factor: the factor's line
        f"{path}: key 'traffic[1].start': traffic[1].start (15 s) is not before the end of the "
        f"trial (duration 10 s) (line {line_of['traffic[late].start']}) (in the trial with "
    )
    message = error_of(tmp_path, GOOD.replace("duration: 30s", "duration: 30 secs"))
    assert message.endswith(f"(line {line_of['duration:']})")
    assert read_yaml(write(tmp_path, GOOD))["duration"] == "30s"
