"""H-TCP on the default rack, whose kernel has no tcp_htcp: testbed_host registers the BPF
implementation (hostside/bpf_cc/htcp/) once per kernel, experiments/htcp_smoke.yml runs on it,
and the trial's teardown unregisters it. Judged from the trial's own files: the socket's
congestion control as iperf3 read it, goodput from the captures, cwnd from tcp_probe.

The registration module alone (roles/testbed_host/library/testbed_host_bpf_cc.py) is run on
this kernel too, as Ansible runs it, under another name (htcp's folder built as tbhtcp, as
cc_implementation bpf builds it as bpf_htcp), so that it never meets a registration of htcp by
a rack that is up."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.tcp_probe import congestion_events, for_flows, read_tcp_probe
from tests.e2e.conftest import PROJECT, only_batch, recap
from trials.bpf_cc import BPF_CC_DIR, bpf_cc_provenance

pytestmark = pytest.mark.rack

EXPERIMENT = PROJECT / "experiments" / "htcp_smoke.yml"
MODULE = PROJECT / "roles/testbed_host/library/testbed_host_bpf_cc.py"
AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
# Where testbed_host records what it registered (testbed_host_bpf_cc_record_dir).
RECORDS = Path("/run/trialbed/bpf_cc")


def registration_module():
    """The Ansible module's functions (its source hash rule among them)."""
    spec = importlib.util.spec_from_file_location("testbed_host_bpf_cc", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sources() -> dict[str, str]:
    """hostside/bpf_cc's sources as the role passes them (path -> text)."""
    files = [*BPF_CC_DIR.glob("*.[ch]"), *BPF_CC_DIR.glob("*.sh"), *BPF_CC_DIR.glob("*/*.[ch]")]
    return {str(f.relative_to(BPF_CC_DIR)): f.read_text() for f in files}


def registered(struct_ops_id: int) -> bool:
    shown = subprocess.run(
        ["bpftool", "struct_ops", "show", "id", str(struct_ops_id)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return shown.returncode == 0


@pytest.fixture
def call(tmp_path: Path):
    """The module as Ansible runs it, its records and builds under tmp_path."""

    def run(state: str, user: Path, ccs: dict | None = None, **given) -> dict:
        args = {
            "state": state,
            "user": str(user),
            "ccs": ccs or {},
            "sources": given.pop("sources", {}),
            "build_dir": str(tmp_path / "build"),
            "record_dir": str(tmp_path / "run"),
            **given,
        }
        done = subprocess.run(
            [sys.executable, str(MODULE)],
            input=json.dumps({"ANSIBLE_MODULE_ARGS": args}),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        return json.loads(done.stdout)

    return run


def test_one_registration_per_kernel_shared_by_its_users(call, tmp_path):
    cc = "tbhtcp"
    if cc in AVAILABLE.read_text().split():
        pytest.skip(f"{cc} is registered already (another test session)")
    src = sources()
    renamed = {"folders": {cc: "htcp"}}  # built from htcp/ under the name cc
    one, two = tmp_path / "host-one", tmp_path / "host-two"
    one.mkdir(), two.mkdir()
    first = call("present", one, {cc: {"use_bandwidth_switch": 0}}, sources=src, **renamed)
    try:
        assert first["changed"] and first["providers"] == {cc: "bpf"}, first
        record = first["registered"][cc]
        assert cc in AVAILABLE.read_text().split() and registered(record["id"])
        assert record["params"] == {
            "use_rtt_scaling": "1",  # the object's default
            "use_bandwidth_switch": "0",
            "use_adaptive_backoff": "1",
        }
        module = registration_module()
        assert record["source_sha256"] == module.source_sha256(module.source_files(src, "htcp"))
        assert record["source"] == "htcp"
        again = call("present", one, {cc: {"use_bandwidth_switch": 0}}, sources=src, **renamed)
        assert not again["changed"] and again["registered"][cc]["id"] == record["id"]

        # A second host of this kernel finds it (no second registration), and may not ask for
        # another value of a parameter the first asked for: parameters are kernel-wide.
        joined = call("present", two, {cc: {}}, sources=src, **renamed)
        assert joined["changed"] and joined["registered"][cc]["id"] == record["id"]
        clash = call("present", two, {cc: {"use_bandwidth_switch": 1}}, sources=src, **renamed)
        assert (
            clash["failed"]
            and str(one) in clash["msg"]
            and "use_bandwidth_switch=0" in clash["msg"]
        )
        unknown = call("present", two, {cc: {"beta": 1}}, sources=src, **renamed)
        assert unknown["failed"] and "has no parameter beta" in unknown["msg"], unknown

        # Live: a parameter set on the registered one is read back from its map.
        live = call("present", two, {cc: {"use_adaptive_backoff": 0}}, sources=src, **renamed)
        assert live["changed"] and live["registered"][cc]["id"] == record["id"]
        loader = record["loader"]
        shown = subprocess.run(
            [loader, "set", str(record["params_map_id"])],
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(shown.stdout)["params"]["use_adaptive_backoff"] == 0

        # The first user done: still registered for the second; the second done: unregistered.
        assert call("absent", one)["changed"]
        assert registered(record["id"]) and cc in AVAILABLE.read_text().split()
        assert call("absent", two)["changed"]
        assert not registered(record["id"]) and cc not in AVAILABLE.read_text().split()
        assert not (tmp_path / "run" / f"{cc}.json").exists()
        assert not call("absent", two)["changed"]
    finally:
        for user in (one, two):
            call("absent", user)


def test_a_congestion_control_the_kernel_has_is_left_to_it(call, tmp_path):
    own = AVAILABLE.read_text().split()[0]  # reno: always built in
    done = call("present", tmp_path, {own: {}}, sources=sources())
    assert not done["changed"] and done["providers"] == {own: "kernel"}
    assert not (tmp_path / "run" / f"{own}.json").exists()


@pytest.fixture(scope="module")
def trial(test_rack, tmp_path_factory):
    results = tmp_path_factory.mktemp("htcp") / "results"
    done = subprocess.run(
        [sys.executable, "-m", "trials", "run", str(EXPERIMENT), "-i", str(test_rack.inventory),
         "--results", str(results)],
        cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    batch = only_batch(results)
    (trial_dir,) = (batch / "trials").iterdir()
    return {
        "dir": trial_dir,
        "rack": test_rack,
        "record": json.loads((trial_dir / "trial.json").read_text()),
        "summary": json.loads((trial_dir / "analysis" / "summary.json").read_text()),
    }


def test_the_flow_ran_the_bpf_htcp_built_from_this_checkout(trial):
    record = trial["record"]
    assert record["status"] == "complete", record["errors"]
    # The sending socket's own congestion control, as iperf3 read it (TCP_CONGESTION).
    client = json.loads((trial["dir"] / "A" / "tcp_client.json").read_text())
    assert client["end"]["sender_tcp_congestion"] == "htcp"
    sender = record["hosts"]["A"]
    assert sender["sysctls"]["net.ipv4.tcp_congestion_control"] == "htcp"
    assert "htcp" not in sender["cc_modules"]  # the point: this kernel has no module
    ran = bpf_cc_provenance(sender, "htcp")
    assert record["cc_implementation"]["A"]["htcp"] == ran  # the record names it itself
    module = registration_module()
    assert ran["implementation"] == "bpf"
    assert ran["source_sha256"] == module.source_sha256(module.source_files(sources(), "htcp"))
    # The experiment's parameters, and the object's default for the one it does not name.
    assert ran["params"] == {
        "use_bandwidth_switch": "0",
        "use_rtt_scaling": "1",
        "use_adaptive_backoff": "1",
    }


def test_goodput_from_the_captures(trial):
    goodput = trial["summary"]["goodput_kBps"]
    print(f"goodput {goodput:.1f} KB/s")
    assert 0 < goodput <= 1_000_000 / 8 / 1000  # at most the 1 Mbit/s link


def test_cwnd_halves_at_each_loss_and_grows_faster_after_a_second(trial):
    """H-TCP with the paper's settings: beta 0.5 (adaptive backoff cannot raise it: RTTmin
    over RTTmax is far below 0.5 with this queue), and NewReno's increase only for the first
    second after a congestion event; then alpha grows with the time since (NewReno's would
    slow down as the queue and the RTT grow)."""
    addresses = trial["record"]["network"]["addresses"]
    events = read_tcp_probe(trial["dir"] / "A" / "tcp_probe.txt")
    sockets = for_flows(events, pd.DataFrame({"src": [addresses["A"]], "dst": [addresses["C"]]}))
    bulk = sockets.sport.value_counts().idxmax()  # not iperf3's control connection
    flow = sockets[sockets.sport == bulk]
    losses = congestion_events(flow)
    print(losses[["ts_ns", "cwnd_before", "ssthresh"]].to_string())
    assert len(losses) >= 4
    assert ((losses.ssthresh - losses.cwnd_before // 2).abs() <= 1).all()
    faster = []
    for start, end in itertools.pairwise(losses.ts_ns.to_numpy()):
        epoch = flow[(flow.ts_ns >= start) & (flow.ts_ns < end)]
        # Recovery is over once what was sent when the loss was found is acked (H-TCP counts
        # the time since the congestion event from there).
        high = int(epoch.snd_nxt.iloc[0])
        done = ((epoch.snd_una.astype("int64") - high) % 2**32) < 2**31
        if not done.any():
            continue
        grown = epoch[done.to_numpy().argmax() :]
        since = grown.ts_ns - grown.ts_ns.iloc[0]
        if since.iloc[-1] < 2e9:
            continue
        at = [int(grown.snd_cwnd[since <= s * 10**9].max()) for s in (0, 1, 2)]
        print(f"epoch at {start}: cwnd {at[0]} after recovery, +{at[1] - at[0]} in the "
              f"first second, +{at[2] - at[1]} in the next")  # fmt: skip
        faster.append(at[2] - at[1] > at[1] - at[0])
    assert len(faster) >= 3 and sum(faster) > len(faster) / 2, faster


def test_the_registration_is_gone_after_the_trial(trial):
    """The runner's teardown gave the rack's hosts their own congestion control back and
    unregistered htcp (unless another rack on this machine still uses it: then no user of it
    is this rack's)."""
    ran = bpf_cc_provenance(trial["record"]["hosts"]["A"], "htcp")
    state_dir = str(trial["rack"].state_dir)
    try:
        users = json.loads((RECORDS / "htcp.json").read_text())["users"]
    except OSError:
        users = {}
    assert not [u for u in users if u.startswith(state_dir)]
    if not users:
        assert not registered(ran["struct_ops_id"])


@pytest.fixture(scope="module")
def by_hand(trial):
    """The trial's variables applied by hand after the runner (whose teardown unregistered
    htcp), twice, then teardown without variables, twice: what the record under /run said
    after each."""
    rack = trial["rack"]
    inventory = ("-i", str(rack.inventory))
    overlay = ("-i", str(trial["dir"] / "ansible" / "trial_vars.yml"))
    out = {}
    for step, playbook, args in (
        ("configure", "configure.yml", (*inventory, *overlay)),
        ("configure_again", "configure.yml", (*inventory, *overlay)),
        ("teardown", "teardown.yml", inventory),
        ("teardown_again", "teardown.yml", inventory),
    ):
        done = rack.playbook(playbook, *args)
        assert done.returncode == 0, done.stdout[-3000:]
        try:
            record = json.loads((RECORDS / "htcp.json").read_text())
        except OSError:
            record = None
        out[step] = {"changed": {h: r["changed"] for h, r in recap(done.stdout).items()},
                     "record": record}  # fmt: skip
    return out


def test_configure_registers_htcp_once_for_the_rack_and_again_changes_nothing(by_hand, trial):
    state_dir = str(trial["rack"].state_dir)
    first = by_hand["configure"]
    assert first["changed"]["localhost"] > 0  # registered (and allowed) for the rack
    users = [u for u in first["record"]["users"] if u.startswith(state_dir)]
    # The rack (its controller, before the allowed list) and each of its five hosts: one
    # registration.
    assert len(users) == 6 and state_dir in users, users
    again = by_hand["configure_again"]
    assert all(v == 0 for v in again["changed"].values()), again["changed"]
    assert again["record"]["id"] == first["record"]["id"]


def test_teardown_unregisters_it_and_again_changes_nothing(by_hand, trial):
    struct_ops_id = by_hand["configure"]["record"]["id"]
    state_dir = str(trial["rack"].state_dir)
    down = by_hand["teardown"]
    assert not [u for u in (down["record"] or {}).get("users", {}) if u.startswith(state_dir)]
    if down["record"] is None:
        assert not registered(struct_ops_id)
    again = by_hand["teardown_again"]
    assert all(v == 0 for v in again["changed"].values()), again["changed"]
