"""core/link_rules.py is the one home of the link rules: the roles read it through their
filters, and the places that cannot import it say the same (configure.yml's tags, the programs
that run on hosts alone)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

from core import link_rules
from core.dscp import DSCP_NAMES

PROJECT = Path(__file__).resolve().parents[2]


def _filters(name: str) -> dict:
    path = PROJECT / "playbooks/filter_plugins" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.FilterModule().filters()


def _tags(node: object) -> set[str]:
    """Every tag named anywhere in a parsed playbook or task file."""
    found: set[str] = set()
    if isinstance(node, dict):
        tags = node.get("tags")
        if tags is not None:
            found |= {tags} if isinstance(tags, str) else set(tags)
        for value in node.values():
            found |= _tags(value)
    elif isinstance(node, list):
        for value in node:
            found |= _tags(value)
    return found


def configure_tags() -> set[str]:
    """The tags of playbooks/configure.yml and of the task files of the roles it runs."""
    play = yaml.safe_load((PROJECT / "playbooks/configure.yml").read_text())
    tags = _tags(play)
    roles: set[str] = set()
    for entry in play:
        roles |= {r["role"] if isinstance(r, dict) else r for r in entry.get("roles", [])}
        roles |= {
            task["ansible.builtin.include_role"]["name"]
            for task in entry.get("tasks", [])
            if "ansible.builtin.include_role" in task
        }
    for role in roles:
        for path in (PROJECT / "roles" / role / "tasks").glob("*.yml"):
            tags |= _tags(yaml.safe_load(path.read_text()))
    return tags


def test_every_configure_tag_of_a_trial_variable_is_a_tag_of_configure_and_back():
    tags = configure_tags()
    assert set(link_rules.CONFIGURE_TAGS.values()) <= tags
    others = {"always", link_rules.CONFIGURE_INPUT_CHECKS_TAG, *link_rules.CONFIGURE_FULL_RUN_TAGS}
    assert others <= tags
    # A tag no trial variable maps to and not run on a full run only would never run alone.
    assert tags - others == set(link_rules.CONFIGURE_TAGS.values())


def test_every_variable_with_a_tag_is_one_configure_hands_to_a_role():
    texts = [(PROJECT / "playbooks/configure.yml").read_text()] + [
        p.read_text() for p in (PROJECT / "roles").glob("*/meta/argument_specs.yml")
    ]
    for variable in link_rules.CONFIGURE_TAGS:
        assert any(variable in text for text in texts), variable


def test_dummynet_numbers_of_three_links():
    numbers = link_rules.dummynet_numbers(["droptail", "rio", "fq_codel"], 20000)
    assert [n["pipe"] for n in numbers] == [n["rule"] for n in numbers] == [20001, 20002, 20003]
    assert [n["rio"] for n in numbers] == [None, {"in": 20002, "out": 20005}, None]
    assert (numbers[2]["sched"], numbers[2]["queue"]) == (20003, 20003)
    owned = link_rules.dummynet_owned(["droptail", "rio", "fq_codel"], 20000)
    assert owned == {
        "rules": [20000, 20001, 20002, 20003],
        "pipes": [20001, 20002, 20003],
        "scheds": [20003],
        "queues": [20002, 20003, 20005],
    }


def test_queue_limits_and_red_thresholds_from_a_buffer():
    assert link_rules.limit_packets(60000, packets=False) == 40
    assert link_rules.limit_packets(1000, packets=False) == 1
    assert link_rules.limit_packets(20, packets=True) == 20
    assert link_rules.red_thresholds(60000, packets=False) == (6666, 20000)
    assert link_rules.red_thresholds(6000, packets=False) == (1500, 3000)
    assert link_rules.red_thresholds(30, packets=True) == (3, 10)


def test_the_roles_filters_read_the_same_rules():
    rule = _filters("trialbed_link_rules")["trialbed_link_rule"]
    assert rule("mtu") == link_rules.MTU
    # what roles/virtual_rack passes to the VM's calibration: 1448 of every 1514 bytes
    assert (rule("tcp_payload_bytes"), rule("full_frame_bytes")) == (1448, 1514)
    assert rule("dscp_names") == DSCP_NAMES
    assert rule("dummynet_number_base") == link_rules.DUMMYNET_NUMBER_BASE
    links = [{"iface": "em1"}, {"iface": "em2", "qdisc": "rio"}]
    numbers = _filters("trialbed_link_rules")["trialbed_dummynet_numbers"](links, "10000")
    assert numbers == link_rules.dummynet_numbers([None, "rio"])
    problems = _filters("trialbed_units")["trialbed_link_problems"]
    (said,) = problems({"iface": "em1", "qdisc": "sfq"}, ["em1"], True)
    assert said == f"qdisc 'sfq': one of {', '.join(link_rules.QDISC_NAMES)}"
    (said,) = problems({"iface": "em1", "rate": "1mbit", "buffer": "1513B"}, ["em1"], True)
    assert said == f"buffer: '1513B' holds no full frame; at least {link_rules.FULL_FRAME_BYTES}B"
