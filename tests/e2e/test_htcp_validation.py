"""`trialbed validate-htcp` (make validate-htcp) on the VM rack (prefix tv-, Debian's stock
kernel: tcp_htcp and BPF both), with 2 repetitions of each implementation: every trial ran the
implementation it asked for (the sending socket's congestion control as iperf3 read it, and the
record), the table judges every metric, the exit code follows the verdicts, and nothing of the
BPF registration is left in the VM's kernel afterwards.

Long (make test-long): a VM rack-up and four one-minute trials under TCG, about 25 minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from analysis.implementations import METRICS, batch_metrics, compare
from core.link_rules import cc_kernel_name
from tests.e2e import vm_boot
from tests.e2e.conftest import PROJECT, ad_hoc, only_batch

pytestmark = [pytest.mark.rack, pytest.mark.long]
REPETITIONS = 2


@pytest.fixture(scope="module")
def validation(tmp_path_factory):
    if (why := vm_boot.missing()) is not None:
        if os.geteuid() != 0:
            pytest.skip(why)
        pytest.fail(why)
    boot = vm_boot.take_over(tmp_path_factory)
    up = boot.take()
    rack = boot.rack
    if up.returncode != 0:
        rack.rack("absent")
    assert up.returncode == 0, up.stdout[-6000:]
    results = tmp_path_factory.mktemp("htcp-validation")
    done = subprocess.run(
        [sys.executable, "-m", "trials", "validate-htcp", "--repetitions", str(REPETITIONS),
         "--rack", str(rack.inventory), "--results", str(results)],
        cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    print(done.stdout[-6000:])
    try:
        yield {"done": done, "batch": only_batch(results), "rack": rack}
    finally:
        down = rack.rack("absent")
        assert down.returncode == 0, down.stdout[-3000:]


def test_each_trial_ran_the_implementation_it_asked_for(validation):
    trials = sorted((validation["batch"] / "trials").iterdir())
    assert len(trials) == 2 * REPETITIONS, validation["done"].stdout[-3000:]
    for trial in trials:
        record = json.loads((trial / "trial.json").read_text())
        assert record["status"] == "complete", record["errors"]
        asked = record["overrides"]["hosts.all.cc_implementation"]
        ran = record["cc_implementation"]["A"]["htcp"]
        assert (ran["implementation"], ran["asked"]) == (asked, asked)
        # The sending socket's own congestion control, as iperf3 read it (TCP_CONGESTION).
        client = json.loads((trial / "A" / "tcp_client.json").read_text())
        assert client["end"]["sender_tcp_congestion"] == cc_kernel_name("htcp", asked)
        if asked == "bpf":
            assert ran["registered_as"] == "bpf_htcp" and len(ran["source_sha256"]) == 64
            assert ran["params"]["use_bandwidth_switch"] == "0"
        else:
            assert "htcp" in record["hosts"]["A"]["cc_modules"]


def test_the_table_judges_every_metric_and_the_exit_code_follows(validation):
    done = validation["done"]
    names, verdicts = compare(batch_metrics(validation["batch"]))
    assert names == ("htcp/bpf", "htcp/module")
    assert {v.metric for v in verdicts} >= set(METRICS)
    assert all(v.n == (REPETITIONS, REPETITIONS) for v in verdicts)
    for label in METRICS.values():
        assert label in done.stdout
    assert done.returncode == (0 if all(v.agree for v in verdicts) else 1), done.stderr[-3000:]


def test_the_vm_kernel_has_no_bpf_htcp_left(validation):
    """The batch's teardown unregistered bpf_htcp (the kernel's own htcp stays)."""
    shown = ad_hoc(
        [validation["rack"].inventory], "A", "ansible.builtin.command",
        "cat /proc/sys/net/ipv4/tcp_available_congestion_control",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stdout + shown.stderr
    available = shown.stdout.split(">>", 1)[-1].split()
    assert "htcp" in available and "bpf_htcp" not in available, shown.stdout
