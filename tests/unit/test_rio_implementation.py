"""network.links[].rio.implementation (auto, gred, bpf) from the experiment file to the router:
the schema's message for a wrong value, the router's role variable (one per router; a router
whose rio links ask for two is refused naming both keys), what configure runs when only it
changes, preflight's refusals (gred without GRED, bpf without the BPF RIO's tools, either on a
FreeBSD router), the record's `asked`, and `trialbed validate-rio` refusing the namespace rack.
Nothing here touches a host."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import yaml

from core import rio_bpf
from core.link_rules import RIO_IMPLEMENTATIONS
from core.rack import RackError
from tests.unit.render_trial import topology_rack
from tests.unit.spec_files import error_of, write
from tests.unit.test_rio import EXPERIMENT, FakeRack, fake_facts
from trials import preflight
from trials import record as trial_record
from trials.ansible import configure_tags
from trials.host_vars import host_vars, shaping_switchable
from trials.network import host_settings, resolve_network
from trials.plan import load_plan
from trials.spec import SpecError
from trials.validation import VALIDATIONS, refusal, this_kernel_has

PROJECT = Path(__file__).resolve().parents[2]
VALIDATION = PROJECT / "experiments" / "rio_validation.yml"
FACTOR = "network.links[bottleneck].rio.implementation"
VAR = "linux_router_rio_implementation"
RIO = "qdisc: rio}"  # the end of EXPERIMENT's rio link


def asking(implementation: str) -> str:
    return EXPERIMENT.replace(RIO, f"qdisc: rio, rio: {{implementation: {implementation}}}}}")


def router_vars(trial, rack, source: str) -> dict[str, dict]:
    net = resolve_network(trial.experiment, rack, source)
    return host_vars(trial, net, host_settings(trial.experiment, net, source))


def test_a_wrong_value_names_the_key_and_the_allowed_ones(tmp_path):
    message = error_of(tmp_path, asking("kernel"))
    assert "key 'network.links[0].rio.implementation'" in message
    assert all(f"'{name}'" in message for name in RIO_IMPLEMENTATIONS), message


def test_the_validation_factor_sets_the_routers_implementation_and_nothing_else():
    """Each trial of experiments/rio_validation.yml gives the RIO router (R2) the
    implementation its factor level asks for; the links themselves are the same in both, so
    configure runs the shaping tag alone, and no shaping switch stands in for it."""
    rack = topology_rack("chain2")
    plan = load_plan(VALIDATION)
    assert {t.overrides[FACTOR] for t in plan.trials} == {"gred", "bpf"}
    assert all(t.error is None for t in plan.trials)
    seen = {}
    for level in ("gred", "bpf"):
        trial = next(t for t in plan.trials if t.overrides[FACTOR] == level)
        seen[level] = router_vars(trial, rack, str(VALIDATION))
        assert seen[level]["R2"][VAR] == level
        assert VAR not in seen[level]["R1"]  # its links have no rio
    gred, bpf = seen["gred"]["R2"], seen["bpf"]["R2"]
    assert gred["linux_router_links"] == bpf["linux_router_links"]
    assert "implementation" not in str(gred["linux_router_links"])
    assert configure_tags(gred, bpf) == {"shaping"}
    choices = {"linux_router_links_choices": [gred["linux_router_links"], []]}
    assert not shaping_switchable({**gred, **choices}, {**bpf, **choices})


def test_auto_leaves_the_role_its_default(tmp_path):
    trial = load_plan(write(tmp_path, EXPERIMENT)).trials[0]
    v = router_vars(trial, FakeRack("vm", set()), "exp.yml")
    assert not [h for h, hv in v.items() if VAR in hv]


def test_a_router_whose_rio_links_ask_for_two_implementations_is_refused_naming_both(tmp_path):
    """R sends rio into C (gred) and into A: bpf is refused, naming both keys; auto beside
    gred gives the router gred; a direction's own rio names its key."""
    back = "    - {name: back, from: R, to: A, rate: 1500kbit, buffer: 60kB, qdisc: rio, rio: %s}\n"
    text = asking("gred").replace("traffic:", back % "{implementation: bpf}" + "traffic:")
    trial = load_plan(write(tmp_path, text)).trials[0]
    with pytest.raises(RackError) as exc:
        resolve_network(trial.experiment, FakeRack("vm", set()), "exp.yml")
    message = str(exc.value)
    assert message.startswith("exp.yml: key 'network.links[back].rio.implementation': bpf")
    assert "asks for gred ('network.links[core].rio.implementation')" in message
    text = asking("gred").replace("traffic:", back % "{}" + "traffic:")
    trial = load_plan(write(tmp_path, text)).trials[0]
    assert router_vars(trial, FakeRack("vm", set()), "exp.yml")["R"][VAR] == "gred"
    text = EXPERIMENT.replace(RIO, "qdisc: rio, forward: {rio: {implementation: bpf}}}")
    exp = load_plan(write(tmp_path, text)).trials[0].experiment
    net = resolve_network(exp, FakeRack("vm", set()), "exp.yml")
    key = "network.links[core].forward.rio.implementation"
    assert net.rio_implementation == {"R": ("bpf", key)}


def with_bpf_tools(rack, names, **_):
    facts = fake_facts(rack, names)
    for f in facts.values():
        f["bpf_cc_kernel"] = {"tools": {"clang": "/usr/bin/clang"}, "libbpf_headers": True}
    return facts


@pytest.fixture
def answering(monkeypatch):
    monkeypatch.setattr(preflight.run, "reachability", lambda rack, names: (list(names), []))
    monkeypatch.setattr(preflight.run, "host_facts", with_bpf_tools)
    return monkeypatch


def preflight_problems(tmp_path, text: str, rack) -> str:
    trials = load_plan(write(tmp_path, text)).select(None)
    try:
        preflight.preflight(trials, rack, "exp.yml")
    except SpecError as exc:
        return " ".join(str(exc).split())
    return ""


def test_preflight_refuses_gred_where_the_kernel_has_none(tmp_path, answering):
    """This machine's kernel (no GRED, the BPF RIO's modules): auto and bpf run, gred is
    refused naming the key and the VM rack; the VM rack's kernel takes gred."""
    here = FakeRack("namespaces", set(rio_bpf.KERNEL_MODULES))
    for ok in ("auto", "bpf"):
        assert preflight_problems(tmp_path, asking(ok), here) == ""
    said = preflight_problems(tmp_path, asking("gred"), here)
    assert (
        "exp.yml: key 'network.links[core].rio.implementation': gred on host R, whose kernel "
        "(6.12-cloud) cannot load sch_gred, sch_ingress, cls_flower, cls_matchall"
    ) in said and "RACK=vm" in said
    vm = FakeRack("vm", set(preflight.QDISC_MODULES["rio"]) | set(rio_bpf.KERNEL_MODULES))
    assert preflight_problems(tmp_path, asking("gred"), vm) == ""


def test_preflight_refuses_bpf_where_the_host_cannot_build_it(tmp_path, answering):
    """A kernel with GRED (auto runs GRED there) whose host lacks clang and libbpf-dev: bpf is
    refused naming the key and what is missing."""
    answering.setattr(preflight.run, "host_facts", fake_facts)
    vm = FakeRack("vm", set(preflight.QDISC_MODULES["rio"]) | set(rio_bpf.KERNEL_MODULES))
    assert preflight_problems(tmp_path, asking("auto"), vm) == ""
    said = preflight_problems(tmp_path, asking("bpf"), vm)
    assert (
        "key 'network.links[core].rio.implementation': bpf on host R runs RIO as the BPF program "
        "hostside/bpf_tc/rio, which needs clang, libbpf-dev there"
    ) in said


def test_preflight_refuses_either_on_a_freebsd_router(tmp_path, answering):
    rack = FakeRack("vm", set())
    rack.hosts["R"] = dataclasses.replace(rack.hosts["R"], groups=("freebsd_routers",))
    said = preflight_problems(tmp_path, asking("gred"), rack)
    assert (
        "key 'network.links[core].rio.implementation': gred on host R, a FreeBSD router, whose "
        "RIO is dummynet's approximation"
    ) in said


def test_the_record_says_what_was_asked(tmp_path):
    trial = load_plan(write(tmp_path, asking("gred"))).trials[0]
    net = resolve_network(trial.experiment, FakeRack("vm", set()), "exp.yml")
    record = trial_record.rio_record(tmp_path, net, {"R": {"rio_implementation": "gred"}})
    (entry,) = record.values()
    assert (entry["asked"], entry["implementation"]) == ("gred", "gred")


def test_the_roles_default_and_choices_are_the_rule():
    role = PROJECT / "roles/linux_router"
    defaults = yaml.safe_load((role / "defaults/main.yml").read_text())
    assert defaults[VAR] == RIO_IMPLEMENTATIONS[0]
    spec = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
    assert tuple(spec["argument_specs"]["main"]["options"][VAR]["choices"]) == RIO_IMPLEMENTATIONS


def test_validate_rio_refuses_the_namespace_rack_and_too_few_repetitions_before_anything_runs():
    rio = VALIDATIONS["validate-rio"]
    asked = Namespace(repetitions=5, racks=None, rack_kind="namespaces")
    if this_kernel_has("sch_gred"):
        assert refusal(rio, asked) is None
    else:
        assert "no sch_gred module, so only the BPF implementation" in refusal(rio, asked)
        assert "RACK=vm" in refusal(rio, asked)
    assert refusal(rio, Namespace(repetitions=5, racks=None, rack_kind="vm")) is None
    assert refusal(rio, Namespace(repetitions=5, racks=["lab.yml"], rack_kind="namespaces")) is None
    few = refusal(rio, Namespace(repetitions=1, racks=None, rack_kind="vm"))
    assert "at least 2 trials of each implementation" in few
    done = subprocess.run(
        [sys.executable, "-m", "trials", "validate-rio", "--repetitions", "1"],
        cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2 and "validate-rio: --repetitions 1" in done.stderr + done.stdout
