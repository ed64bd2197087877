"""trials/bpf_cc: whether a host can run a congestion control its kernel lacks, as a BPF
program, read from this machine's own facts (hostside/probes/host_facts.py run here) and from those
facts with one piece taken away; and what the trial record says ran."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.hostside import load
from tests.unit.test_hostside import probe
from trials.bpf_cc import bpf_cc_names, bpf_cc_problem, bpf_cc_provenance

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def facts(tmp_path_factory) -> dict:
    """This machine's facts, as a rack host reports them (full, not --changing)."""
    return probe("host_facts", str(tmp_path_factory.mktemp("w")))


def kernel_without(facts: dict, **missing) -> dict:
    support = {**facts["bpf_cc_kernel"], **missing}
    return {**facts, "cc_loaded": ["reno"], "cc_modules": [], "bpf_cc_kernel": support}


def test_the_folders_are_the_names():
    assert "htcp" in bpf_cc_names()
    for cc in bpf_cc_names():
        assert (PROJECT / "hostside/bpf_cc" / cc / f"{cc}.bpf.c").is_file()


def test_what_the_kernel_has_needs_nothing(facts):
    assert bpf_cc_problem(facts, facts["cc_loaded"][0]) is None


def test_htcp_can_run_here_as_bpf(facts):
    support = facts["bpf_cc_kernel"]
    if not (support["btf"] and support["bpf_tcp_ca"] and support["jit"]):
        pytest.skip(f"this kernel cannot take a BPF congestion control: {support}")
    if "htcp" in facts["cc_modules"]:
        pytest.skip("this kernel has tcp_htcp")
    if not all(support["tools"].values()) or not support["libbpf_headers"]:
        pytest.skip(f"build tools missing here: {support}")
    assert bpf_cc_problem(facts, "htcp") is None


def test_each_missing_piece_is_named(facts):
    no_btf = bpf_cc_problem(kernel_without(facts, btf=False, jit=False), "htcp")
    assert "BTF (/sys/kernel/btf/vmlinux: CONFIG_DEBUG_INFO_BTF)" in no_btf
    assert "the BPF JIT (net.core.bpf_jit_enable=1)" in no_btf
    assert "tcp_htcp" in no_btf and "RACK=vm" in no_btf
    no_ca = bpf_cc_problem(kernel_without(facts, bpf_tcp_ca=False), "htcp")
    assert "bpf_tcp_ca" in no_ca
    tools = kernel_without(facts, tools={"clang": None, "cc": "/usr/bin/cc", "bpftool": None})
    no_tools = bpf_cc_problem(
        {**tools, "bpf_cc_kernel": {**tools["bpf_cc_kernel"], "libbpf_headers": False}}, "htcp"
    )
    assert "lacks clang, bpftool, libbpf-dev" in no_tools


def test_a_congestion_control_without_a_folder_is_named_with_those_there_are(facts):
    problem = bpf_cc_problem(kernel_without(facts), "vegas")
    assert "hostside/bpf_cc/ has no BPF implementation" in problem
    assert f"(it has: {', '.join(bpf_cc_names())})" in problem


def test_a_host_without_the_kernel_fact_is_unknown(facts):
    freebsd = {k: v for k, v in kernel_without(facts).items() if k != "bpf_cc_kernel"}
    assert "unknown" in bpf_cc_problem(freebsd, "htcp")


def test_provenance_says_which_implementation(facts):
    own = facts["cc_loaded"][0]
    kernel = bpf_cc_provenance(facts, own)
    assert kernel == {
        "cc": own,
        "implementation": "module",
        "asked": "auto",
        "kernel": facts["kernel"],
        "params": facts["cc_params"].get(own, {}),
    }
    # A registration record as host_facts reads it from testbed_host's record.
    record = {"id": 7, "params": {"use_rtt_scaling": "1"}, "source_sha256": "a" * 64,
              "object_sha256": "b" * 64}  # fmt: skip
    bpf = bpf_cc_provenance({**facts, "bpf_cc": {"htcp": record}}, "htcp")
    assert bpf["implementation"] == "bpf" and bpf["source"] == "hostside/bpf_cc/htcp"
    assert (bpf["source_sha256"], bpf["params"]) == ("a" * 64, {"use_rtt_scaling": "1"})


def test_host_facts_reads_the_records_where_the_role_writes_them():
    defaults = yaml.safe_load((PROJECT / "roles/testbed_host/defaults/main.yml").read_text())
    host_facts = load("probes/host_facts.py")
    assert defaults["testbed_host_bpf_cc_record_dir"] == host_facts.BPF_CC_RECORDS
