"""One real collateral-damage trial on the test rack, judged from its captures.

Bounds are derived here from the experiment and from packets, never pasted: the TCP flow can
carry (rate - the UDP stream's share) x payload/frame, where the shaper counts Ethernet frames.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.metrics import MAX_FRAME_BYTES, owd_upper_bound_ns
from analysis.pcap import ip_to_int, read_pcap
from collect.fetch import verify_manifest
from core.link_rules import ETHERNET_HEADER
from core.rack import Rack
from tests.e2e.conftest import PROJECT, host_states, only_batch, recap
from trials.plan import load_plan

pytestmark = pytest.mark.rack

EXPERIMENT = """\
experiment: collateral_damage
description: end-to-end test
network:
  links:
    - {name: downstream, from: R, to: C, rate: 1mbit, buffer: 60000B, delay: 25ms}
    - {name: upstream, from: R, to: A, rate: 1mbit, buffer: 60000B, delay: 25ms}
traffic:
  - {type: bulk_tcp, name: tcp, from: A, to: C, flows: 1}
  - {type: cbr_udp, name: voip, from: B, to: D, packet_bytes: 186, interval: 20ms, dscp: ef}
capture:
  points:
    - {name: bottleneck_in, link: upstream, at: R}
    - {name: bottleneck_out, link: downstream, at: R}
hosts:
  all: {cc: cubic}
duration: 30s
warmup: 5s
"""
DELAY_ACCURACY_MS = 2  # how far the emulated delay may be off (timer and scheduling)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trials", *args],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def trial(test_rack, tmp_path_factory):
    base = tmp_path_factory.mktemp("trial")
    exp_file = base / "cd.yml"
    exp_file.write_text(EXPERIMENT)
    done = run_cli(
        "run", str(exp_file), "-i", str(test_rack.inventory), "--results", str(base / "results")
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    batch = only_batch(base / "results")
    (trial_dir,) = (batch / "trials").iterdir()
    return {
        "exp": load_plan(exp_file).base,
        "dir": trial_dir,
        "batch": batch,
        "stdout": done.stdout,
        "record": json.loads((trial_dir / "trial.json").read_text()),
        "summary": json.loads((trial_dir / "analysis" / "summary.json").read_text()),
    }


def test_trial_completed_and_files_are_verified(trial):
    record = trial["record"]
    assert record["status"] == "complete", record["errors"]
    assert record["errors"] == []
    assert verify_manifest(trial["dir"]) == []
    for key in ("git", "hosts", "delay", "times", "parameters", "configure"):
        assert record[key], key
    assert record["hosts"]["A"]["sysctls"]["net.ipv4.tcp_congestion_control"] == "cubic"
    assert (trial["dir"] / "R" / "tc_before.txt").read_text().count("bfifo") == 2
    assert record["delay"]["R"]["models_serialization"] is False
    assert trial["summary"]["generators"]["voip"]["dscp_seen"] == [46]  # ef, as generated
    for point, counts in record["capture"].items():
        assert counts["dropped_by_kernel"] == 0, point
    assert "Table 1" in trial["stdout"] and "Table 2" in trial["stdout"]


def link_leaves_tcp_kBps(trial_dir: Path, record: dict, rate_bps: float) -> float:
    """What the link leaves TCP after the UDP stream, in payload KB/s (from packets): the UDP
    stream's share of the shaper in Ethernet-frame bits as sent, the rest carried as full-size
    TCP segments (payload over the frame the shaper counts)."""
    before = read_pcap(trial_dir / "R" / "bottleneck_in.pcap")
    addresses = record["network"]["addresses"]
    udp = before[(before.proto == 17) & (before.src == ip_to_int(addresses["B"]))]
    tcp = before[(before.proto == 6) & (before.src == ip_to_int(addresses["A"]))]
    tcp = tcp[tcp.payload_len > 0]
    udp_bps = (
        (udp.ip_len.astype(int) + ETHERNET_HEADER).sum()
        * 8
        / ((udp.ts_ns.iloc[-1] - udp.ts_ns.iloc[0]) / 1e9)
    )
    full = tcp[tcp.payload_len == tcp.payload_len.max()].iloc[0]
    fraction = int(full.payload_len) / (int(full.ip_len) + ETHERNET_HEADER)
    return (rate_bps - udp_bps) * fraction / 8000


def test_tcp_goodput_fills_what_the_link_leaves_it(trial):
    rate = trial["exp"].network.links[0].rate
    expected_kBps = link_leaves_tcp_kBps(trial["dir"], trial["record"], rate)
    measured = trial["summary"]["goodput_kBps"]
    print(f"goodput {measured:.2f} KB/s, link leaves TCP {expected_kBps:.2f} KB/s")
    assert abs(measured - expected_kBps) / expected_kBps < 0.03


def test_udp_one_way_delay_bounds(trial):
    exp, s = trial["exp"], trial["summary"]
    link, udp = exp.network.links[0], exp.traffic[1]
    one_way_ms = link.delay / 1e6
    bound_ms = (
        owd_upper_bound_ns(
            one_way_delay_ns=link.delay,
            buffer_bytes=link.buffer.in_bytes(MAX_FRAME_BYTES),
            rate_bps=link.rate,
        )
        / 1e6
    )
    print(
        f"OWD min {s['owd_min_ms']:.2f} median {s['owd_median_ms']:.2f} "
        f"max {s['owd_max_ms']:.2f} ms ({s['owd_max_ms_unstalled']:.2f} ms without the "
        f"{s['udp_delay_path_stalled']} packets in transit during the router's "
        f"{s['router_stalls']} measured stalls, {s['router_stalled_ms']:.0f} ms in all, or "
        f"left over 2 ms late: {s['router_stalls_from']}), "
        f"lost {s['udp_lost']}/{s['udp_packets']}"
    )
    assert abs(s["owd_min_ms"] - one_way_ms) <= DELAY_ACCURACY_MS
    # This VM sometimes stops running the router for tens of ms (a SCHED_FIFO loop sees it
    # too); the delay line records every such stall, and packets in transit during one did not
    # see the emulated link, nor did those that left over 2 ms later than the rate allows (HTB
    # runs in softirqs the delay line does not see). The bounds are judged on the others,
    # which must be most.
    assert s["udp_delay_path_stalled"] <= 0.5 * s["udp_packets"]
    # The kernel's HTB here sends at its rate: the service each UDP packet lost while it
    # waited, read from the packets (measured: median 0.001, p99 0.53 ms; in the VM under
    # TCG 2.9 and 115 ms).
    print(
        f"service lost per UDP packet: median {s['udp_lost_service_median_ms']:.3f} p99 "
        f"{s['udp_lost_service_p99_ms']:.3f} ms, {s['udp_served_late']} over 2 ms"
    )
    assert abs(s["udp_lost_service_median_ms"]) < 0.5
    assert s["udp_served_late"] <= 0.05 * s["udp_packets"]
    assert s["owd_max_ms_unstalled"] >= one_way_ms + 400  # the queue filled
    # A packet waits at most behind a full queue and the full-size frame being sent; the
    # delay line's accuracy (the same 2 ms as for the minimum) on top.
    assert s["owd_max_ms_unstalled"] <= bound_ms + DELAY_ACCURACY_MS
    expected_packets = exp.duration // udp.interval
    assert s["udp_packets"] >= 0.9 * expected_packets


def test_drops_from_captures_match_the_queue_counter(trial):
    s = trial["summary"]
    assert s["queue_drops_capture"] > 0
    assert s["queue_drops_capture"] == s["queue_drops_tc"]
    assert s["queue_full_events"] > 0
    assert s["retransmitted_packets"] > 0
    owd = pd.read_parquet(trial["dir"] / "analysis" / "owd.parquet")
    assert int(owd.lost.sum()) == s["udp_lost"]


def status(test_rack, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "trials", "status", "-i", str(test_rack.inventory), *args],
        cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def changed(done: subprocess.CompletedProcess) -> dict[str, int]:
    counts = {host: c["changed"] for host, c in recap(done.stdout).items()}
    assert counts and done.returncode == 0, done.stdout[-3000:]
    return counts


@pytest.fixture(scope="module")
def by_hand(trial, test_rack, tmp_path_factory):
    """The trial's variables applied by hand after the runner, twice; then the next trial's
    (another CC, another delay) by the tags the runner would re-run (trials.ansible
    .configure_tags), then in full; then teardown without variables, twice. Each playbook
    run's output and what `trials status` saw, in order: six playbook runs serve the four
    tests below (each run takes tens of seconds on five hosts)."""
    import yaml

    from trials.ansible import configure_tags

    first = trial["dir"] / "ansible" / "trial_vars.yml"
    before = yaml.safe_load(first.read_text())["all"]["hosts"]
    after = json.loads(json.dumps(before))
    for host in after.values():
        if "testbed_host_cc" in host:
            host["testbed_host_cc"] = "reno"
        for link in host.get("linux_router_links", []):
            link["delay_ms"] = link["delay_ms"] * 2
    second = tmp_path_factory.mktemp("by-hand") / "next_trial_vars.yml"
    second.write_text(yaml.safe_dump({"all": {"hosts": after}}))
    tags = set().union(*(configure_tags(before[h], after[h]) for h in after))

    inventory = ("-i", str(test_rack.inventory))
    out = {"tags": tags, "clean": json.loads(status(test_rack, "--json").stdout)}
    out["configure"] = test_rack.playbook("configure.yml", *inventory, "-i", str(first))
    out["configure_again"] = test_rack.playbook("configure.yml", *inventory, "-i", str(first))
    out["configured"] = json.loads(status(test_rack, "--json").stdout)
    out["configured_table"] = status(test_rack).stdout
    out["tagged"] = test_rack.playbook(
        "configure.yml", *inventory, "-i", str(second), "--tags", ",".join(sorted(tags))
    )
    out["full_after_tagged"] = test_rack.playbook("configure.yml", *inventory, "-i", str(second))
    out["teardown"] = test_rack.playbook("teardown.yml", *inventory)  # no trial variables
    out["torn_down"] = json.loads(status(test_rack, "--json").stdout)
    out["teardown_again"] = test_rack.playbook("teardown.yml", *inventory)
    return out


def test_reapplying_the_configuration_changes_nothing(by_hand):
    assert changed(by_hand["configure"])
    again = changed(by_hand["configure_again"])
    assert all(v == 0 for v in again.values()), again


def test_a_tagged_configure_leaves_the_hosts_as_a_full_one_would(by_hand):
    """The runner re-runs only the tags of the variables that changed; a full configure.yml
    afterwards must find nothing to change."""
    assert by_hand["tags"] == {"cc", "shaping"}
    tagged = recap(by_hand["tagged"].stdout)
    assert by_hand["tagged"].returncode == 0, by_hand["tagged"].stdout[-3000:]
    # Every rack host the tags reached changed; the controller's cc play (allowed list, BPF
    # registrations) has nothing to change between two CCs the kernel has.
    hosts = {h: c for h, c in tagged.items() if h != "localhost"}
    assert all(c["changed"] > 0 for c in hosts.values() if c["ok"] > 4), tagged
    full = changed(by_hand["full_after_tagged"])
    assert all(v == 0 for v in full.values()), full


def test_status_shows_what_the_rack_is_doing(by_hand):
    shaped = by_hand["configured"]
    for iface in ("left", "right"):
        link = shaped["R"]["interfaces"][iface]
        assert (link["chain"], link["rate"], link["limit"], link["delay"]) == (
            "htb → bfifo", "1Mbit", "60000B", "25 ms (delay line)"
        ), link  # fmt: skip
    assert shaped["A"]["cc"] == "cubic" and shaped["A"]["running"] == []
    # What teardown will give back: the CC the host had before configure, among others.
    own = shaped["A"]["own_settings_recorded"]
    assert own["sysctls"]["net.ipv4.tcp_congestion_control"] and "left" in own["interfaces"]
    assert [d["name"] for d in shaped["R"]["running"]] == ["delayline"]
    assert "25 ms (delay line)" in by_hand["configured_table"]  # the table a person reads

    clean = by_hand["torn_down"]
    for iface in ("left", "right"):
        link = clean["R"]["interfaces"][iface]
        assert "htb" not in link["chain"] and link["rate"] == link["delay"] == "-", link
    assert clean["R"]["running"] == [] and clean["R"]["left_behind"] == []
    assert all(host["own_settings_recorded"] is None for host in clean.values())


def test_teardown_without_variables_removes_what_was_applied(by_hand):
    assert by_hand["configured"]["R"]["running"]  # the delay line
    assert changed(by_hand["teardown"])["R"] > 0
    assert by_hand["torn_down"] == by_hand["clean"]
    again = changed(by_hand["teardown_again"])
    assert all(v == 0 for v in again.values()), again


def test_by_hand_configure_check_and_teardown_with_the_examples(test_rack):
    """make configure VARS=<example> [CHECK=1], then make teardown, on this rack, with both
    examples (the router's bottleneck, the end hosts' TCP tuning)."""
    examples = PROJECT / "playbooks" / "examples"
    inventory = ("-i", str(test_rack.inventory))
    with_examples = (
        *inventory,
        *("-i", str(examples / "dumbbell_bottleneck.yml")),
        *("-i", str(examples / "dumbbell_tcp_tuning.yml")),
    )
    # (The rack is clean: the runner's teardown, then the by_hand fixture's, left it so.)
    clean = json.loads(status(test_rack, "--json").stdout)
    assert clean["R"]["running"] == [] and clean["A"]["own_settings_recorded"] is None
    rack = Rack.load([test_rack.inventory])
    try:
        before = host_states(rack)
        check = test_rack.playbook("configure.yml", *with_examples, "--check", "--diff")
        assert check.returncode == 0, check.stdout[-3000:]
        assert recap(check.stdout)["R"]["changed"] > 0
        assert "rate 1mbit" in check.stdout  # the diff of the rendered shaping
        assert json.loads(status(test_rack, "--json").stdout) == clean
        assert host_states(rack) == before

        applied = test_rack.playbook("configure.yml", *with_examples)
        assert applied.returncode == 0, applied.stdout[-3000:]
        now = json.loads(status(test_rack, "--json").stdout)
        link = now["R"]["interfaces"]["right"]
        assert (link["rate"], link["limit"], link["delay"]) == (
            "1Mbit",
            "60000B",
            "25 ms (delay line)",
        )
        assert now["A"]["cc"] == "reno" and now["C"]["cc"] == "cubic"
        # (a second configure changing nothing: test_reapplying_the_configuration_changes_nothing)

        down_check = test_rack.playbook("teardown.yml", *inventory, "--check", "--diff")
        assert down_check.returncode == 0, down_check.stdout[-3000:]
        assert "restore net.ipv4.tcp_congestion_control=" in down_check.stdout
        assert json.loads(status(test_rack, "--json").stdout)["A"]["cc"] == "reno"
        down = test_rack.playbook("teardown.yml", *inventory)
        assert down.returncode == 0, down.stdout[-3000:]
        assert host_states(rack) == before
        assert json.loads(status(test_rack, "--json").stdout) == clean
    finally:
        rack.close()


def test_a_variable_no_role_reads_is_refused_naming_the_nearest(test_rack, tmp_path):
    before = json.loads(status(test_rack, "--json").stdout)
    done = test_rack.playbook(
        "configure.yml", "-i", str(test_rack.inventory),
        "-e", "rate=2mbit", "-e", "linux_router_link=[]",
    )  # fmt: skip
    assert done.returncode != 0
    said = " ".join(done.stdout.split())  # the callback wraps long messages
    assert "variables no role of this project reads" in said
    nearest = "linux_router_link (nearest known: linux_router_links, linux_router_links_choices)"
    assert nearest in said
    assert "rate (a key of each entry of freebsd_router_links or linux_router_links)" in said
    assert "TASK [testbed_host" not in said  # refused before any role ran
    assert json.loads(status(test_rack, "--json").stdout) == before


def test_a_wrong_unit_or_a_missing_capture_iface_is_refused_before_any_host_is_touched(
    test_rack, tmp_path
):
    """The roles read units as experiment files do (core/units.py): mbps is refused with the
    allowed units, and the whole run stops before any host is changed."""
    before = json.loads(status(test_rack, "--json").stdout)
    wrong = tmp_path / "wrong_units.yml"
    link = {"iface": "right", "rate": "2mbps", "buffer": "30000B", "delay_ms": 25}
    wrong.write_text(json.dumps({"all": {"hosts": {"R": {"linux_router_links": [link]}}}}))
    done = test_rack.playbook("configure.yml", "-i", str(test_rack.inventory), "-i", str(wrong))
    assert done.returncode != 0
    said = " ".join(done.stdout.split()).replace("''", "'")
    assert "linux_router_links entry" in said and "on R: rate: '2mbps' is not a rate" in said
    assert "bit, kbit, mbit, gbit" in said
    assert "Record the host's own settings" not in said  # no role started on any host
    assert all(c["changed"] == 0 for c in recap(done.stdout).values())
    assert json.loads(status(test_rack, "--json").stdout) == before

    # A capture point on an interface the host lacks: only that problem is named.
    points = [{"name": "bottleneck", "iface": "eth9"}]
    wrong.write_text(json.dumps({"all": {"hosts": {"R": {"capture_points": points}}}}))
    done = test_rack.playbook("configure.yml", "-i", str(test_rack.inventory), "-i", str(wrong))
    assert done.returncode != 0
    said = " ".join(done.stdout.split())
    assert "capture on R: capture_points: no interface eth9 on this host (it has left, right)" in (
        said
    )
    assert "capture_snaplen" not in said
    assert all(c["changed"] == 0 for c in recap(done.stdout).values())
    assert json.loads(status(test_rack, "--json").stdout) == before


def test_unavailable_cc_is_refused_before_any_host_is_touched(test_rack, tmp_path):
    exp_file = tmp_path / "vegas.yml"
    exp_file.write_text(EXPERIMENT.replace("all: {cc: cubic}", "all: {cc: vegas}"))
    results = tmp_path / "results"
    done = run_cli("run", str(exp_file), "-i", str(test_rack.inventory), "--results", str(results))
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert str(exp_file) in message and "hosts.all.cc" in message and "'vegas'" in message
    assert "reno" in message  # says what the host has
    assert not results.exists()


def test_cc_parameter_the_kernel_lacks_is_refused_before_any_host_is_touched(test_rack, tmp_path):
    # CUBIC's "max increment" of 2.6-era kernels no longer exists.
    exp_file = tmp_path / "maxinc.yml"
    exp_file.write_text(
        EXPERIMENT.replace(
            "all: {cc: cubic}", "all: {cc: cubic, cc_params: {cubic: {max_increment: 16}}}"
        )
    )
    results = tmp_path / "results"
    done = run_cli("run", str(exp_file), "-i", str(test_rack.inventory), "--results", str(results))
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert f"{exp_file}: key 'hosts.all.cc_params.cubic.max_increment'" in message
    assert "hystart" in message  # lists the parameters tcp_cubic does have
    assert not results.exists()


def test_host_pacing_without_fq_is_refused_before_any_host_is_touched(test_rack, tmp_path):
    has_fq = subprocess.run(
        "test -d /sys/module/sch_fq || modprobe -n sch_fq", shell=True, check=False
    )
    if has_fq.returncode == 0:
        pytest.skip("this kernel has sch_fq: host pacing runs (tested on the VM rack)")
    exp_file = tmp_path / "paced.yml"
    exp_file.write_text(EXPERIMENT)
    results = tmp_path / "results"
    done = run_cli(
        "run", str(exp_file), "--set", "hosts.senders.pacing=true",
        "-i", str(test_rack.inventory), "--results", str(results),
    )  # fmt: skip
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "key 'hosts.*.pacing" in message and "fq qdisc" in message
    assert "traffic[].pacing" in message  # says what works on this kernel instead
    assert not results.exists()


def test_bad_file_is_refused_with_file_key_and_allowed_values(tmp_path):
    exp_file = tmp_path / "bad.yml"
    exp_file.write_text(EXPERIMENT.replace("rate: 1mbit", "rate: 1 megabit", 1))
    done = run_cli("check", str(exp_file))
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert f"{exp_file}: key 'network.links[0].rate'" in message
    assert "bit, kbit, mbit, gbit" in message
