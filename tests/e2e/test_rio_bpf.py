"""qdisc rio on the namespace rack, whose kernel has no GRED: role linux_router builds and
attaches the BPF RIO (hostside/bpf_tc/rio) in front of HTB + bfifo, and the trial records it.
Judged from a real trial's files: which implementation ran (and its source's sha256), its
counters per level (OUT dropped, IN spared), the real bfifo's own drops (none: the virtual FIFO
never fell behind it), and the captures' losses against the router's count.

Written with the BPF RIO (issue 50, item 2); not run where it was written (no rack there)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from analysis.bottleneck import tc_drops
from core import rio_bpf
from tests.e2e.conftest import PROJECT, only_batch

pytestmark = pytest.mark.rack

# 1.2 times the link: IN (AF11) 1 Mbit/s and OUT (AF12) 0.8 Mbit/s of full packets into
# 1.5 Mbit/s, seed 004's thresholds (IN 9/27, OUT 2/6 packets, w_q 0.0012).
EXPERIMENT = """\
experiment: diffserv
description: the BPF RIO end to end
network:
  links:
    - {name: downstream, from: R, to: C, rate: 1500kbit, buffer: 60000B, qdisc: rio}
    - {name: upstream, from: R, to: A, rate: 10mbit, buffer: 60000B}
traffic:
  - {type: cbr_udp, name: in_flow, from: A, to: C, packet_bytes: 1500, interval: 12ms, dscp: af11}
  - {type: cbr_udp, name: out_flow, from: B, to: D, packet_bytes: 1500, interval: 15ms, dscp: af12}
capture:
  points:
    - {name: bottleneck_in, link: upstream, at: R}
    - {name: bottleneck_out, link: downstream, at: R}
duration: 12s
"""


@pytest.fixture(scope="module")
def trial(test_rack, tmp_path_factory):
    base = tmp_path_factory.mktemp("rio_bpf")
    exp_file = base / "rio.yml"
    exp_file.write_text(EXPERIMENT)
    done = subprocess.run(
        [sys.executable, "-m", "trials", "run", str(exp_file),
         "-i", str(test_rack.inventory), "--results", str(base / "results")],
        cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (trial_dir,) = (only_batch(base / "results") / "trials").iterdir()
    yield {
        "dir": trial_dir,
        "record": json.loads((trial_dir / "trial.json").read_text()),
        "summary": json.loads((trial_dir / "analysis" / "summary.json").read_text()),
    }


def test_the_bpf_rio_ran_and_its_record_says_so(trial):
    record = trial["record"]
    assert record["status"] == "complete", record["errors"]
    ((where, rio),) = record["rio"].items()
    host = where.split(":")[0]
    assert rio["implementation"] == "bpf", rio
    assert rio["bpf"]["source_sha256"] == rio_bpf.source_sha256()
    assert (
        rio["bpf"]["params"]["in_min"] == 9 * 1500 and rio["bpf"]["params"]["rate_bps"] == 1500000
    )
    assert record["delay"][host]["rio_implementation"] == "bpf"
    c_in, c_out = rio["counters"]["0"], rio["counters"]["1"]
    drop_in, drop_out = c_in["drops"] / c_in["packets"], c_out["drops"] / c_out["packets"]
    print(f"{where}: IN {c_in['packets']} packets, {drop_in:.2%} dropped; OUT {c_out['packets']}, "
          f"{drop_out:.2%}")  # fmt: skip
    assert c_in["packets"] > 500 and c_out["packets"] > 500
    assert drop_out > 0.2 and drop_in < drop_out / 5  # OUT sheds what the link cannot carry


def test_the_real_fifo_never_dropped_what_the_program_let_through(trial):
    """The program does the bfifo's tail drop on its virtual FIFO, whose backlog is at least
    the real one's while HTB keeps its rate: the bfifo's own counter stays at (about) zero,
    and the captures' losses are the program's drops."""
    ((where, rio),) = trial["record"]["rio"].items()
    host, iface = where.split(":")
    host_dir = trial["dir"] / host
    bfifo = tc_drops((host_dir / "tc_after.txt").read_text(), iface) - tc_drops(
        (host_dir / "tc_before.txt").read_text(), iface
    )
    program = sum(c["drops"] for c in rio["counters"].values())
    print(f"bfifo dropped {bfifo}, the program {program}")
    assert bfifo <= max(1, program // 100)
    queue = trial["summary"]["queues"]["downstream"]
    assert queue["queue_drops_tc"] == program + bfifo
    assert abs(queue["queue_drops_capture"] - queue["queue_drops_tc"]) <= 2 + program // 100
