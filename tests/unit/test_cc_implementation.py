"""hosts.<key>.cc_implementation (auto, module, bpf) from the experiment file to the host: the
schema's message for a wrong value, the trial's role variables, the name the flow selects
(iperf3 -C), what testbed_host would register (its own variables, evaluated by Ansible on
localhost, nothing applied), the preflight's refusal and what the trial record says ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.link_rules import BPF_CC_PREFIX, CC_IMPLEMENTATIONS, cc_kernel_name
from core.rack import Rack
from tests.unit.spec_files import error_of
from trials.bpf_cc import bpf_cc_problem, bpf_cc_provenance
from trials.generators.base import TrialContext
from trials.generators.bulk_tcp import BulkTcp
from trials.host_vars import host_vars
from trials.network import host_cc, host_settings, resolve_network
from trials.plan import load_plan

PROJECT = Path(__file__).resolve().parents[2]
VALIDATION = PROJECT / "experiments" / "htcp_validation.yml"
SMOKE = PROJECT / "experiments" / "htcp_smoke.yml"
INVENTORY = PROJECT / "inventory" / "lab.example" / "hosts.yml"  # a dumbbell: A, B, C, D, R


def test_a_wrong_value_names_the_key_and_the_allowed_ones(tmp_path):
    text = SMOKE.read_text().replace("cc: htcp", "cc: htcp\n    cc_implementation: kernel")
    message = error_of(tmp_path, text)
    assert "key 'hosts.all.cc_implementation'" in message
    assert all(f"'{name}'" in message for name in CC_IMPLEMENTATIONS), message
    assert "'kernel'" in message


def test_a_wrong_factor_level_fails_its_own_trials_naming_the_key():
    plan = load_plan(VALIDATION, ["factors.hosts.all.cc_implementation=[module,ebpf]"])
    errors = {t.overrides["hosts.all.cc_implementation"]: t.error for t in plan.trials}
    assert errors["module"] is None
    assert "key 'hosts.all.cc_implementation'" in errors["ebpf"]
    assert "'auto', 'module' or 'bpf', not 'ebpf'" in errors["ebpf"]


@pytest.fixture(scope="module")
def rack():
    return Rack.load([INVENTORY])


def trial_of(implementation: str):
    plan = load_plan(VALIDATION, [])
    factor = "hosts.all.cc_implementation"
    return next(t for t in plan.trials if t.overrides.get(factor) == implementation)


@pytest.mark.parametrize("implementation", ["module", "bpf"])
def test_the_roles_variables_carry_the_choice(rack, implementation):
    trial = trial_of(implementation)
    net = resolve_network(trial.experiment, rack, str(VALIDATION))
    settings = host_settings(trial.experiment, net, str(VALIDATION))
    v = host_vars(trial, net, settings)
    sender = net.host_of("A")
    assert v[sender]["testbed_host_cc"] == "htcp"  # the record's cc: the experiment's name
    assert v[sender]["testbed_host_cc_implementation"] == implementation
    assert v[sender]["testbed_host_cc_params"] == {"use_bandwidth_switch": 0, "use_rtt_scaling": 1}


def test_auto_leaves_the_role_its_default(rack):
    plan = load_plan(SMOKE, [])
    (trial,) = plan.trials
    net = resolve_network(trial.experiment, rack, str(SMOKE))
    v = host_vars(trial, net, host_settings(trial.experiment, net, str(SMOKE)))
    assert not [h for h, hv in v.items() if "testbed_host_cc_implementation" in hv]


@pytest.mark.parametrize(
    ("implementation", "flow_cc", "selected"),
    [(None, None, None), ("module", None, None), ("bpf", None, "bpf_htcp"),
     ("bpf", "htcp", "bpf_htcp"), (None, "htcp", "htcp"), ("module", "htcp", "htcp")],
)  # fmt: skip
def test_the_flow_selects_the_name_the_kernel_knows(rack, implementation, flow_cc, selected):
    plan = load_plan(SMOKE, [f"traffic[0].cc={flow_cc}"] if flow_cc else [])
    trial = plan.trials[0]
    net = resolve_network(trial.experiment, rack, str(SMOKE))
    settings = host_settings(trial.experiment, net, str(SMOKE))
    settings = {
        n: s.model_copy(update={"cc_implementation": implementation}) for n, s in settings.items()
    }
    ctx = TrialContext(rack, net, None, trial.experiment.duration, host_cc(settings))  # type: ignore[arg-type]
    flow = BulkTcp(trial.experiment.traffic[0], "tcp", 0, ctx)
    assert flow.cc_selected() == selected
    socket = BulkTcp(
        trial.experiment.traffic[0].model_copy(update={"tool": "socket"}), "tcp", 0, ctx
    )
    args = socket.socket_args(0.0)
    assert (args[args.index("--cc") + 1] if "--cc" in args else None) == selected
    assert cc_kernel_name("htcp", implementation) == (selected or "htcp")


# The role's own variables, evaluated by Ansible on localhost as configure would on a host:
# what it registers (name -> parameters) and from which folder.
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_vars: {file: "{{ project }}/roles/testbed_host/defaults/main.yml"}
    - ansible.builtin.include_vars: {file: "{{ project }}/roles/testbed_host/vars/main.yml"}
    - name: Check the role's inputs as configure does
      ansible.builtin.validate_argument_spec:
        argument_spec: "{{ (lookup('ansible.builtin.file', specs) | from_yaml)[key].main.options }}"
        provided_arguments:
          testbed_host_cc: "{{ testbed_host_cc }}"
          testbed_host_cc_implementation: "{{ testbed_host_cc_implementation }}"
    - ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ {'wanted': __testbed_host_bpf_cc_wanted,
                      'folders': __testbed_host_bpf_cc_renamed} | to_json }}"
        mode: "0644"
"""


def role_decides(tmp_path: Path, **variables) -> subprocess.CompletedProcess:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    given = {
        "project": str(PROJECT),
        "out": str(tmp_path / "out.json"),
        "specs": str(PROJECT / "roles/testbed_host/meta/argument_specs.yml"),
        "key": "argument_specs",
        "testbed_host_bpf_cc_source_dir": str(PROJECT / "hostside" / "bpf_cc"),
        "ansible_python_interpreter": sys.executable,
        **variables,
    }
    (tmp_path / "vars.json").write_text(json.dumps(given))
    env = {**os.environ, "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(PROJECT / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(play),
         "-e", f"@{tmp_path / 'vars.json'}"],
        cwd=PROJECT, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("implementation", "wanted"),
    [
        ("auto", {"htcp": {"use_bandwidth_switch": 0}}),
        ("module", {}),
        ("bpf", {"htcp": {"use_bandwidth_switch": 0},
                 f"{BPF_CC_PREFIX}htcp": {"use_bandwidth_switch": 0}}),
    ],
)  # fmt: skip
def test_what_the_role_registers_for_each_choice(tmp_path, implementation, wanted):
    done = role_decides(
        tmp_path,
        testbed_host_cc="htcp",
        testbed_host_cc_params={"use_bandwidth_switch": 0},
        testbed_host_cc_implementation=implementation,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    decided = json.loads((tmp_path / "out.json").read_text())
    # auto: htcp as BPF where the kernel lacks it (cc_modules.yml loads the module first where
    # it has one); bpf: also bpf_htcp beside it, from htcp/; module: no BPF at all.
    assert decided["wanted"] == wanted
    assert decided["folders"] == {f"{BPF_CC_PREFIX}htcp": "htcp"}


def test_a_flows_congestion_control_is_registered_for_bpf_too(tmp_path):
    done = role_decides(
        tmp_path, testbed_host_cc="cubic", trialbed_flow_cc=["htcp"],
        testbed_host_cc_implementation="bpf",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert json.loads((tmp_path / "out.json").read_text())["wanted"] == {"bpf_htcp": {}}


def test_the_role_refuses_another_implementation_naming_the_choices(tmp_path):
    done = role_decides(tmp_path, testbed_host_cc="htcp", testbed_host_cc_implementation="kernel")
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "testbed_host_cc_implementation" in said and "auto, module, bpf" in said, said[-2000:]


def test_the_role_docs_name_the_variable():
    defaults = yaml.safe_load((PROJECT / "roles/testbed_host/defaults/main.yml").read_text())
    assert defaults["testbed_host_cc_implementation"] == CC_IMPLEMENTATIONS[0]
    specs = yaml.safe_load((PROJECT / "roles/testbed_host/meta/argument_specs.yml").read_text())
    option = specs["argument_specs"]["main"]["options"]["testbed_host_cc_implementation"]
    assert tuple(option["choices"]) == CC_IMPLEMENTATIONS


def test_the_vm_image_can_build_a_bpf_congestion_control():
    defaults = yaml.safe_load((PROJECT / "roles/testbed_host/defaults/main.yml").read_text())
    listed = PROJECT / "roles/virtual_rack/files/vm/image-packages.txt"
    image = {line.strip() for line in listed.read_text().splitlines() if not line.startswith("#")}
    assert set(defaults["testbed_host_bpf_cc_packages"]) <= image


# A kernel as host_facts reports it: with the module (the VM's) and without (this machine's).
KERNEL = {"kernel": "6.1.0-28-amd64", "cc_loaded": ["reno", "cubic", "htcp"],
          "cc_modules": ["htcp"],
          "cc_params": {"htcp": {"use_bandwidth_switch": "0"}},
          "bpf_cc_kernel": {"btf": True, "bpf_tcp_ca": True, "jit": True,
                            "tools": {"clang": "/usr/bin/clang", "cc": "/usr/bin/cc",
                                      "bpftool": "/usr/sbin/bpftool"},
                            "libbpf_headers": True}}  # fmt: skip
RECORD = {"id": 7, "params": {"use_rtt_scaling": "1"}, "source_sha256": "a" * 64,
          "object_sha256": "b" * 64}  # fmt: skip
NO_MODULE = {**KERNEL, "kernel": "6.18.44", "cc_loaded": ["reno", "cubic", "htcp"],
             "cc_modules": [], "bpf_cc": {"htcp": RECORD}}  # fmt: skip


def test_module_is_refused_where_the_kernel_has_only_the_bpf_one():
    assert bpf_cc_problem(KERNEL, "htcp", "module") is None
    problem = bpf_cc_problem(NO_MODULE, "htcp", "module")
    assert "cc_implementation module" in problem and "no htcp of its own" in problem
    assert "RACK=vm" in problem


def test_bpf_is_asked_of_the_kernel_even_where_it_has_the_module():
    assert bpf_cc_problem(KERNEL, "htcp", "bpf") is None
    no_btf = {**KERNEL, "bpf_cc_kernel": {**KERNEL["bpf_cc_kernel"], "btf": False}}
    assert bpf_cc_problem(no_btf, "htcp") is None  # auto: the module does
    assert "cc_implementation bpf" in bpf_cc_problem(no_btf, "htcp", "bpf")
    assert "has no BPF implementation of cubic" in bpf_cc_problem(KERNEL, "cubic", "bpf")


def test_the_record_says_what_ran_under_which_name():
    bpf = bpf_cc_provenance({**KERNEL, "bpf_cc": {"bpf_htcp": RECORD}}, "htcp", "bpf")
    assert (bpf["cc"], bpf["implementation"], bpf["asked"]) == ("htcp", "bpf", "bpf")
    assert bpf["registered_as"] == "bpf_htcp" and bpf["source"] == "hostside/bpf_cc/htcp"
    assert (bpf["source_sha256"], bpf["params"]) == ("a" * 64, {"use_rtt_scaling": "1"})
    module = bpf_cc_provenance({**KERNEL, "bpf_cc": {"bpf_htcp": RECORD}}, "htcp", "module")
    assert (module["implementation"], module["asked"]) == ("module", "module")
    assert module["params"] == {"use_bandwidth_switch": "0"}
    # The rack's own htcp registered as BPF is not what a bpf_htcp flow ran.
    assert bpf_cc_provenance(NO_MODULE, "htcp", "bpf")["implementation"] == "unknown"
    assert bpf_cc_provenance(NO_MODULE, "htcp")["registered_as"] == "htcp"


def test_validate_htcp_refuses_a_rack_without_the_module_before_anything_runs():
    from argparse import Namespace

    from trials.validate_htcp import refusal, this_kernel_has_htcp

    asked = Namespace(repetitions=5, racks=None, rack_kind="namespaces")
    if this_kernel_has_htcp():
        assert refusal(asked) is None
    else:
        assert "no tcp_htcp module" in refusal(asked) and "RACK=vm" in refusal(asked)
    assert refusal(Namespace(repetitions=5, racks=None, rack_kind="vm")) is None
    few = refusal(Namespace(repetitions=1, racks=None, rack_kind="vm"))
    assert "at least 2 trials of each implementation" in few
    done = subprocess.run(
        [sys.executable, "-m", "trials", "validate-htcp", "--repetitions", "1"],
        cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2 and "--repetitions 1" in done.stderr
