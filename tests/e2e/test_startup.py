"""Seed-001 startup trials on the two-router chain, judged from their captures.

Bounds come from the experiment and from packets: the bottleneck carries its rate times
payload / frame of a full-size segment seen in the capture (the shaper counts frames). The
startup files send with the socket sender (tool: socket, hostside/traffic/bulk_socket.py),
which writes from connect: no control connection before the data SYN.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from analysis.pcap import ip_to_int, read_pcap
from analysis.startup import loss_events
from collect.fetch import verify_manifest
from core.link_rules import ETHERNET_HEADER
from core.rack import Rack
from tests.e2e.conftest import PROJECT, only_batch, recap, start_trials, trials_run, wait_for_daemon
from trials.plan import load_plan

pytestmark = pytest.mark.rack

EXPERIMENT = PROJECT / "experiments" / "startup_lswan.yml"
SATELLITE = PROJECT / "experiments" / "startup_satellite.yml"
SYN, ACK = 0x02, 0x10
FIRST_WINDOW_S = 5


def run_cli(*args: str, inventory: Path, results: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        trials_run(*args, inventory=inventory, results=results),
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def run_trials(experiment: Path, only: str, inventory: Path, results: Path) -> dict:
    """One repetition at initcwnd 3, rto_min 200 ms, without pacing, 25 s, of the trials
    matching `only`."""
    done = run_cli(
        str(experiment),
        "--set",
        "duration=25s",
        "--set",
        "hosts.senders.initcwnd=3",
        "--set",
        "hosts.senders.rto_min=200ms",
        "--set",
        "traffic[*].pacing=false",
        "--set",
        "repetitions=1",
        "--only",
        only,
        inventory=inventory,
        results=results,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    batch = only_batch(results)
    trials = {}
    for trial_dir in (batch / "trials").iterdir():
        trials[trial_dir.name] = {
            "dir": trial_dir,
            "record": json.loads((trial_dir / "trial.json").read_text()),
            "summary": json.loads((trial_dir / "analysis" / "summary.json").read_text()),
        }
    return {"trials": trials, "stdout": done.stdout}


@pytest.fixture(scope="module")
def lswan(chain_rack, tmp_path_factory):
    """LS-WAN, both pairs from T0."""
    out = run_trials(EXPERIMENT, "start-0s_*", chain_rack.inventory, tmp_path_factory.mktemp("ls"))
    assert set(out["trials"]) == {"start-0s_r1"}, set(out["trials"])
    return out


@pytest.fixture(scope="module")
def satellite(chain_rack, tmp_path_factory):
    """Satellite path (580 ms RTT, 512-byte MTU), pair2 joining at 15 s: with an RTT this
    long, slow start cannot reach a fair window within 5 s."""
    out = run_trials(SATELLITE, "start-15s_*", chain_rack.inventory, tmp_path_factory.mktemp("sat"))
    assert set(out["trials"]) == {"start-15s_r1"}, set(out["trials"])
    return out


def payload_capacity_bps(trial_dir: Path, record: dict, experiment: Path = EXPERIMENT) -> float:
    """The bottleneck rate times payload / frame of the largest data segment captured."""
    packets = read_pcap(trial_dir / "R1" / "sender1.pcap")
    data = packets[(packets.proto == 6) & (packets.payload_len > 0)]
    full = data[data.payload_len == data.payload_len.max()].iloc[0]
    exp = load_plan(experiment).base
    rate = exp.network.link("bottleneck").rate
    return rate * int(full.payload_len) / (int(full.ip_len) + ETHERNET_HEADER)


def first_syn_offset_s(trial_dir: Path, record: dict, point: str, sender: str) -> float:
    packets = read_pcap(trial_dir / "R1" / f"{point}.pcap")
    src = ip_to_int(record["network"]["addresses"][sender])
    syns = packets[
        (packets.proto == 6)
        & (packets.src == src)
        & ((packets.tcp_flags & SYN) > 0)
        & ((packets.tcp_flags & ACK) == 0)
    ]
    return (int(syns.ts_ns.min()) - record["times"]["t0_ns"]) / 1e9


def test_trials_complete_with_verified_files(lswan, satellite):
    for name, t in {**lswan["trials"], **satellite["trials"]}.items():
        assert t["record"]["status"] == "complete", (name, t["record"]["errors"])
        assert verify_manifest(t["dir"]) == []
        for gen in ("pair1", "pair2"):  # both ends of the socket sender reported
            g = t["record"]["traffic"][gen]
            assert g["tool"] == "socket"
            sent = json.loads((t["dir"] / g["client_json"]).read_text())
            got = json.loads((t["dir"] / g["server_json"]).read_text())
            assert sent["error"] is None and [f["status"] for f in sent["flows"]] == ["done"]
            (conn,) = got["connections"]
            assert conn["peer_port"] == sent["flows"][0]["local_port"]
            assert 0 < conn["bytes"] <= sent["flows"][0]["bytes_sent"]
        for point, counts in t["record"]["capture"].items():
            assert counts["dropped_by_kernel"] == 0, (name, point)
        assert t["record"]["hosts"]["S1"]["sysctls"]["net.ipv4.tcp_congestion_control"]
    assert "Effective throughput vs elapsed time" in lswan["stdout"]
    assert "Late joiner" in satellite["stdout"]
    # The satellite path's 512-byte MTU holds end to end: no data segment is larger.
    t = satellite["trials"]["start-15s_r1"]
    packets = read_pcap(t["dir"] / "R1" / "sender1.pcap")
    assert packets[packets.proto == 6].ip_len.max() == 512
    assert t["record"]["hosts"]["S1"]["mtu"] == {"a1": 512}


def test_the_network_is_restored_on_the_hosts_the_trials_used(lswan):
    """The chain has four pairs; LS-WAN uses two: the closing teardown runs on those, the
    routers and the controller, and gives the routers' shaping back."""
    t = lswan["trials"]["start-0s_r1"]
    teardown = (t["dir"].parent.parent / "ansible" / "teardown.log").read_text()
    hosts = recap(teardown)
    assert set(hosts) == {"localhost", *t["record"]["hosts"]}, sorted(hosts)
    assert set(t["record"]["hosts"]) == {"S1", "S2", "D1", "D2", "R1", "R2"}
    assert hosts["R1"]["changed"] > 0 and hosts["R2"]["changed"] > 0, hosts


def data_syn_offset_s(trial_dir: Path, record: dict, point: str) -> float:
    """When the data connection's SYN passed the capture (s after T0): the connection that
    carried the most payload, not iperf3's control connection, which opens first."""
    packets = read_pcap(trial_dir / "R1" / f"{point}.pcap")
    tcp = packets[packets.proto == 6]
    bulk = tcp[tcp.payload_len > 0].groupby("sport").payload_len.sum().idxmax()
    syns = tcp[(tcp.sport == bulk) & ((tcp.tcp_flags & SYN) > 0) & ((tcp.tcp_flags & ACK) == 0)]
    return (int(syns.ts_ns.min()) - record["times"]["t0_ns"]) / 1e9


def in_order_bytes(trial_dir: Path, record: dict, until_ns: int) -> int:
    """Payload bytes of the data connections (from S1 and S2) that passed R2's capture after
    the bottleneck in sequence (contiguous from each connection's first byte) by until_ns,
    worked out here apart from the analysis: each connection's bytes after its SYN's ISN."""
    packets = read_pcap(trial_dir / "R2" / "after_bottleneck.pcap")
    senders = {ip_to_int(record["network"]["addresses"][h]) for h in ("S1", "S2")}
    tcp = packets[(packets.proto == 6) & packets.src.isin(senders)]
    total = 0
    for _, flow in tcp.groupby(["src", "sport"]):
        syns = flow[(flow.tcp_flags & SYN) > 0]
        data = flow[(flow.payload_len > 0) & (flow.ts_ns <= until_ns)]
        if syns.empty or data.empty:
            continue
        isn = int(syns.seq.iloc[0])
        have, point = set(), 0
        for seq, n in zip(data.seq, data.payload_len, strict=True):
            start = (int(seq) - isn - 1) % 2**32
            have |= set(range(start, start + int(n)))
        while point in have:
            point += 1
        total += point
    return total


def test_the_table_counts_from_the_first_data_syn(lswan, satellite):
    """The startup table's origin is the first data SYN (issue 51); with the socket sender it
    is the first SYN its senders send (no control connection before it). The table counts the
    bytes that passed the bottleneck in sequence; the acknowledged ones, from the SYN and from
    T0, stay, named so, and hold no more."""
    for name, t in {**lswan["trials"], **satellite["trials"]}.items():
        s, record = t["summary"], t["record"]
        data = data_syn_offset_s(t["dir"], record, "sender1")
        first_syn = first_syn_offset_s(t["dir"], record, "sender1", "S1")
        # The table's origin is the earliest data SYN of both flows: with both starting at
        # once, pair 2's may pass its capture a few µs before pair 1's.
        first = min(data, data_syn_offset_s(t["dir"], record, "sender2"))
        print(f"{name}: first SYN at T0 + {first_syn:.3f} s, data SYN at T0 + {data:.3f} s")
        assert data == first_syn  # no control connection
        assert s["first_data_syn_s"] == pytest.approx(first, abs=1e-6)
        for c in (1, 5, 10, 20):
            assert s[f"transferred_since_first_syn_{c}s"] >= s[f"acked_since_first_syn_{c}s"]
            assert s[f"acked_since_first_syn_{c}s"] >= s[f"acked_since_t0_{c}s"]
        origin = record["times"]["t0_ns"] + round(first * 1e9)
        for c in (1, 5):
            want = in_order_bytes(t["dir"], record, origin + c * 10**9)
            assert s[f"transferred_since_first_syn_{c}s"] == want, (name, c)


def test_the_satellite_tables_first_cut_off_holds_the_first_flights(satellite):
    """580 ms: the socket senders' first segments leave right after the handshake's last ACK, one
    round trip after the SYN, and pass the bottleneck about 0.87 s after it: the table's 1 s
    column holds them (issue 51's done-when). Their ACKs reach the senders' side only after
    1 s, so the acknowledged count from the same origin is still empty."""
    s = satellite["trials"]["start-15s_r1"]["summary"]
    print(
        "satellite, from the first data SYN: transferred "
        + ", ".join(f"{c}: {s[f'transferred_since_first_syn_{c}']} B" for c in ("1s", "5s"))
        + f"; acknowledged 1s: {s['acked_since_first_syn_1s']} B"
    )
    assert s["transferred_since_first_syn_1s"] > 0
    assert s["acked_since_first_syn_1s"] == 0
    assert s["utilization_transferred_since_first_syn_1s"] > 0


def test_aggregate_effective_throughput_fills_the_bottleneck(lswan):
    t = lswan["trials"]["start-0s_r1"]
    capacity = payload_capacity_bps(t["dir"], t["record"])
    s = t["summary"]
    cutoff = 20
    measured_bps = s[f"transferred_since_first_syn_{cutoff}s"] * 8 / cutoff
    print(
        "transferred by the first data SYN + 1/5/10/20 s: "
        + ", ".join(
            f"{s[f'transferred_since_first_syn_{c}s'] / 1000:.0f} KB" for c in (1, 5, 10, 20)
        )
        + f"; {measured_bps / 1e6:.3f} of {capacity / 1e6:.3f} Mbit/s payload capacity"
    )
    assert abs(measured_bps - capacity) / capacity < 0.05
    # Drops at the bottleneck found from the captures on both sides equal the qdisc's counter.
    queue = s["queues"]["bottleneck"]
    assert queue["captures_before"] == ["sender1", "sender2"]
    assert queue["queue_drops_capture"] == queue["queue_drops_tc"] > 0
    # Startup costs: early cut-offs use less of the link than later ones.
    share = {c: s[f"utilization_transferred_since_first_syn_{c}s"] for c in (1, 5, 20)}
    assert share[1] < share[5] < share[20] + 0.01


def test_every_flow_starts_at_its_offset(lswan, satellite):
    for name, t in {**lswan["trials"], **satellite["trials"]}.items():
        record = t["record"]
        for gen, point, sender in (("pair1", "sender1", "S1"), ("pair2", "sender2", "S2")):
            offset = first_syn_offset_s(t["dir"], record, point, sender)
            wanted = record["traffic"][gen]["start_ns"] / 1e9
            print(f"{name}: {gen} first SYN at T0 + {offset:.3f} s (asked {wanted:g} s)")
            assert wanted <= offset < wanted + 0.25, (name, gen, offset)


def test_late_joiner_gets_less_than_its_fair_share_at_first(satellite):
    t = satellite["trials"]["start-15s_r1"]
    capacity = payload_capacity_bps(t["dir"], t["record"], SATELLITE)
    late = t["summary"]["generators"]["pair2"]
    fair_bytes = capacity * FIRST_WINDOW_S / 8 / 2  # two flows share the bottleneck
    got = late["delivered_bytes"][f"{FIRST_WINDOW_S}s"]
    print(
        f"late joiner: {got / 1000:.1f} KB in its first 5 s, fair share {fair_bytes / 1000:.1f} KB"
    )
    assert 0 < got < fair_bytes


def test_a_forced_outage_shows_as_retransmission_timeouts(chain_rack, tmp_path):
    """Drop everything R1 forwards for 3 s mid-trial: each sender goes silent and then
    retransmits after its RTO, with exponential backoff while the outage lasts."""
    results = tmp_path / "results"
    proc = start_trials(
        str(EXPERIMENT),
        "--set",
        "duration=20s",
        "--only",
        "start-0s_initcwnd-3_pacing-false_r1",
        inventory=chain_rack.inventory,
        results=results,
    )
    rule = "FORWARD -s 198.18.0.0/20 -j DROP"
    rack = Rack.load([chain_rack.inventory])
    try:
        wait_for_daemon(proc, chain_rack, "S1", "pair1_client")
        time.sleep(2.0 + 6.0)  # start lead, then flows in congestion avoidance
        outage = [time.time()]
        rack.run("R1", f"iptables -I {rule}")
        time.sleep(3.0)
        rack.run("R1", f"iptables -D {rule}")
        outage.append(time.time())
        out, err = proc.communicate(timeout=240)
    finally:
        rack.run("R1", f"iptables -D {rule} 2>/dev/null; true", check=False)
        rack.close()
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    (trial_dir,) = results.glob("*/trials/*")
    summary = json.loads((trial_dir / "analysis" / "summary.json").read_text())
    start, end = (int(v * 1e9) for v in outage)
    for gen, point in (("pair1", "sender1"), ("pair2", "sender2")):
        packets = read_pcap(trial_dir / "R1" / f"{point}.pcap")
        # The bulk connection is the one carrying the data (the socket sender opens no other;
        # iperf3's control connection would idle and may time out too: not the flow).
        data = packets[(packets.proto == 6) & (packets.payload_len > 0)]
        bulk_port = data.groupby("sport").payload_len.sum().idxmax()
        events = loss_events(packets, rto_threshold_ns=200_000_000)
        timeouts = events[(events.kind == "timeout") & (events.sport == bulk_port)]
        print(
            f"{gen}: {len(timeouts)} timeouts, idle "
            + ", ".join(f"{v / 1e6:.0f}" for v in timeouts.idle_ns)
            + " ms"
        )
        assert summary["generators"][gen]["timeouts"] == len(timeouts)
        # During the 3 s outage (and the retransmission that gets through after it) the RTO
        # fires and backs off: at least two timeouts there, idle times at least doubling.
        # (Recovery after it may time out again; those are real and counted too.)
        during = timeouts[(timeouts.ts_ns >= start) & (timeouts.ts_ns <= end + 4 * 10**9)]
        # The backoff chain is the run of timeouts up to the longest silence; timeouts after
        # it (recovery, within the 4 s) start again from the base RTO.
        idle = during.idle_ns.to_numpy()
        chain = idle[: int(np.argmax(idle)) + 1] if len(idle) else idle
        assert len(chain) >= 2, idle
        assert np.all(chain[1:] >= 1.8 * chain[:-1]), idle
        # A silence as long as the outage happens only there.
        long = timeouts[timeouts.idle_ns >= 10**9]
        assert len(long) and np.all((long.ts_ns >= start) & (long.ts_ns <= end + 4 * 10**9))


def test_a_rate_beyond_what_the_rack_carries_is_refused(chain_rack, tmp_path):
    results = tmp_path / "results"
    done = run_cli(
        str(EXPERIMENT),
        "--set",
        "network.links[bottleneck].rate=1gbit",
        "--only",
        "start-0s_initcwnd-3_*",
        inventory=chain_rack.inventory,
        results=results,
    )
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "link bottleneck (forward, R1:core): 1gbit is beyond what this rack carries" in message
    assert "trialbed_max_rate 155mbit" in message
    assert not results.exists()


def test_host_pacing_on_a_host_that_shapes_its_own_link_is_refused(chain_rack, tmp_path):
    results = tmp_path / "results"
    done = run_cli(
        str(EXPERIMENT), "--set", "hosts.S1.pacing=true", "--only", "start-0s_initcwnd-3_*",
        inventory=chain_rack.inventory, results=results,
    )  # fmt: skip
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "key 'hosts.*.pacing': node S1 shapes its own egress on" in message
    assert "traffic[].pacing" in message
    assert not results.exists()
