"""A checkout right under /tmp (world-writable, as many a user's first clone is) runs `make
trial`: its rack's keys and sshd files live in that checkout, where an sshd with StrictModes
refuses them ("Authentication failed" was all the user saw). The checkout is a copy of this
one's tracked files that shares its Python environment (make setup finds it current), and its
rack has a namespace prefix and management subnet of its own beside the test racks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import PROJECT
from tests.e2e.test_collateral_damage import link_leaves_tcp_kBps
from trials.plan import load_plan

pytestmark = pytest.mark.rack

RACK_VARS = ["RACK_PREFIX=tq-", "RACK_SUBNET=8", "RACK=namespaces"]


def copy_tracked_files(to: Path) -> None:
    """This checkout's tracked files as they are now (uncommitted edits too), as a clone
    would have them."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=PROJECT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = PROJECT / name
        if source.exists():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name, follow_symlinks=False)


def make(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "TRIALBED_"))}
    return subprocess.run(
        ["make", "-C", str(checkout), *args, *RACK_VARS],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, env=env,
    )  # fmt: skip


def test_a_checkout_under_tmp_runs_make_trial():
    if os.geteuid() != 0:
        pytest.skip("the virtual rack needs root (network namespaces)")
    assert os.stat("/tmp").st_mode & 0o002  # the case: a world-writable directory above
    checkout = Path(tempfile.mkdtemp(prefix="trialbed-checkout-", dir="/tmp"))
    try:
        copy_tracked_files(checkout)
        (checkout / ".venv").symlink_to(PROJECT / ".venv")
        smoke = yaml.safe_load((checkout / "experiments" / "smoke.yml").read_text())
        (checkout / "experiments" / "short.yml").write_text(
            yaml.safe_dump({**smoke, "duration": "12s", "warmup": "2s"})
        )
        done = make(checkout, "trial", "EXPERIMENT=experiments/short.yml")
        said = done.stdout + done.stderr
        print(said[-2500:])
        assert done.returncode == 0, said[-4000:]
        assert "Authentication failed" not in said
        (trial_dir,) = (checkout / "results").glob("*/trials/*")
        record = json.loads((trial_dir / "trial.json").read_text())
        assert record["status"] == "complete", record["errors"]
        # from the captures: the TCP flow crossed the 1 Mbit/s bottleneck, the stream arrived
        summary = json.loads((trial_dir / "analysis" / "summary.json").read_text())
        print(json.dumps(summary)[:1500])
        assert str(checkout) in (trial_dir / "trial.json").read_text()  # its own rack's files
        # CUBIC keeps the queue busy: TCP carries what the UDP stream leaves of the link
        # (worked out from the packets), less its warm-up and its sawtooth's idle moments
        rate = load_plan(checkout / "experiments" / "short.yml").base.network.links[0].rate
        leaves = link_leaves_tcp_kBps(trial_dir, record, rate)
        print(f"goodput {summary['goodput_kBps']:.2f} KB/s, link leaves TCP {leaves:.2f} KB/s")
        assert 0.85 * leaves < summary["goodput_kBps"] < 1.03 * leaves, (summary, leaves)
        assert summary["udp_packets"] > 400 and summary["owd_min_ms"] >= 25, summary
    finally:
        down = make(checkout, "rack-down")
        shutil.rmtree(checkout, ignore_errors=True)
    assert down.returncode == 0, (down.stdout + down.stderr)[-3000:]
