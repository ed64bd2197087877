"""The parts of the marker calibration (tests/bench/bench_marker.py) that need no rack: the
segments it replays, as the rack's routers and markers will read them once pointed at the rack,
tcpreplay's statistics, and when a rate counts as carried."""

from __future__ import annotations

import json
import shlex
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from analysis.pcap import ip_to_int, read_pcap
from core.command import Command
from core.link_rules import FULL_FRAME_BYTES, MTU
from core.rack import Rack, RackError
from tests.bench import bench_marker
from tests.bench.bench_marker import DELIVERED, FLOWS, KEPT_UP, Step, tcp_frames, tcpreplay_counts
from tests.unit.render_trial import topology_hosts
from trials.udp_stream import rewrite_for_rack, write_pcap

PROJECT = Path(__file__).resolve().parents[2]
REPLAY_LOG = PROJECT / "tests/data/results_v1/20261206T195014Z-smoke/trials/r1/B/voip_replay.log"


def ones_complement_sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


@pytest.mark.skipif(not shutil.which("tcprewrite"), reason="needs tcprewrite (make setup)")
def test_the_replayed_segments_are_full_size_tcp_with_valid_checksums(tmp_path: Path) -> None:
    frames = tcp_frames()
    template, out = tmp_path / "t.pcap", tmp_path / "o.pcap"
    write_pcap(template, frames, np.arange(len(frames), dtype=np.uint64) * 1000)
    rewrite_for_rack(template, out, src_ip="198.18.1.10", dst_ip="198.18.17.10",
                     src_mac="02:00:00:00:00:01", next_hop_mac="02:00:00:00:00:02")  # fmt: skip
    seen = read_pcap(out)
    assert len(seen) == len(frames)
    assert (seen.wirelen == FULL_FRAME_BYTES).all() and (seen.ip_len == MTU).all()
    assert (seen.proto == 6).all() and (seen.payload_len == MTU - 40).all()
    assert (seen.src == ip_to_int("198.18.1.10")).all() and (
        seen.dst == ip_to_int("198.18.17.10")
    ).all()
    assert seen.sport.nunique() == FLOWS
    for _, flow in seen.groupby("sport"):  # each flow's segments follow one another
        assert (np.diff(flow.seq.to_numpy().astype(np.int64)) == MTU - 40).all()
    raw = out.read_bytes()[24:]
    for i in range(0, 3 * (16 + FULL_FRAME_BYTES), 16 + FULL_FRAME_BYTES):  # the first three
        ip = raw[i + 16 + 14 : i + 16 + 14 + MTU]
        assert ip[8] == 2  # TTL: the marker's router forwards it, the next hop drops it
        assert ones_complement_sum(ip[:20]) == 0xFFFF  # the IP header checksum holds
        pseudo = ip[12:20] + struct.pack("!BBH", 0, 6, MTU - 20)
        assert ones_complement_sum(pseudo + ip[20:]) == 0xFFFF  # and the TCP checksum


def test_tcpreplays_statistics_are_read() -> None:
    assert tcpreplay_counts(REPLAY_LOG.read_text()) == (300, pytest.approx(49.79))
    with pytest.raises(RuntimeError, match="no statistics"):
        tcpreplay_counts("File Cache is enabled\n")


def test_a_rate_is_carried_when_the_router_kept_up_and_lost_nothing() -> None:
    sent = 100_000

    def step(at_stop: float, drained: float, sent_pps: float = 10_000) -> Step:
        return Step(10_000, sent, sent_pps, int(at_stop * sent), int(drained * sent), 10.0)

    assert step(1.0, 1.0).carried and step(KEPT_UP, DELIVERED).carried
    assert not step(KEPT_UP - 0.01, 1.0).carried  # a queue built up in the marker
    assert not step(1.0, DELIVERED - 0.001).carried  # the marker's queue overflowed
    assert step(1.0, 1.0, sent_pps=9_000).sender_limited
    assert not step(1.0, 1.0, sent_pps=9_600).sender_limited


class SimulatedRack(Rack):
    """The chain2 rack answering the bench's commands as a router whose marker carries
    `capacity` packets/s would: what the sender replays at a higher rate leaves the router at
    that rate, the rest drains after the sender stops."""

    def __init__(self, capacity: float, sender_limit: float = 1e9):
        super().__init__([], topology_hosts("chain2"), {"trialbed_rack_kind": "virtual"})
        self.capacity, self.sender_limit = capacity, sender_limit
        self.sent: list[tuple[str, str]] = []
        self.out = 0.0  # packets out of the router's egress
        self.queued = 0.0  # in the marker's queue when the sender stopped
        self.stats: dict[str, str] = {}

    def run(self, name: str, cmd: Command, *, check: bool = True, timeout=None) -> str:
        assert isinstance(cmd, Command), f"not built by core.command: {cmd!r}"
        self.sent.append((name, cmd))
        words = shlex.split(cmd)
        if words[0] == "tcpreplay":
            assert words[-1] == "2>&1"  # its statistics on stdout, wherever it prints them
            pps = min(
                float(next(w for w in words if w.startswith("--pps="))[6:]), self.sender_limit
            )
            total = int(next(w for w in words if w.startswith("--limit="))[8:])
            seconds = total / pps
            carried = min(total, self.capacity * seconds)
            self.out, self.queued = self.out + carried, total - carried
            return (
                f"Actual: {total} packets ({total * 1514} bytes) sent in {seconds:.2f} seconds\n"
                f"Rated: 1.0 Bps, 1.0 Mbps, {pps:.2f} pps\nSuccessful packets:        {total}\n"
            )
        if words[-1].endswith("/statistics/tx_packets"):
            out = int(self.out)
            drain = min(self.queued, self.capacity * 0.25)  # what leaves until the next read
            self.out, self.queued = self.out + drain, self.queued - drain
            return f"{out}\n"
        if words[:2] == ["ip", "-j"]:  # next_hop: the route and the links, one line each
            (iface, itf), *_ = self.hosts[name].interfaces.items()
            gateway = next(
                str(a.ip) for a in self.hosts["R1"].interfaces.values() if a.network == itf.network
            )
            route = [{"dev": iface, "gateway": gateway}]
            return f"{json.dumps(route)}\n{json.dumps([{'ifname': iface, 'address': 'mac'}])}\n"
        if words[0] == "tc":
            return '[{"kind": "noqueue"}]'
        if words[0] == "ls":
            return words[1]
        if words[0] == "cat" and words[1].endswith("_stats.json"):
            return json.dumps({"packets": 1, "service_us": {"mean": 50.0, "p99": 90}})
        if words[0] == "cat":  # a MAC address
            return "02:00:00:00:00:02\n"
        return ""

    def put(self, name: str, local: Path, remote: str) -> None:
        self.host(name)


def run_bench(monkeypatch, tmp_path: Path, rack: SimulatedRack, *args: str) -> str:
    monkeypatch.setattr(bench_marker.Rack, "load", classmethod(lambda cls, inventory: rack))
    monkeypatch.setattr(bench_marker.time, "sleep", lambda s: None)
    clock = iter(range(10**9))
    monkeypatch.setattr(bench_marker.time, "monotonic", lambda: next(clock) * 0.25)
    out = tmp_path / "steps.json"
    assert bench_marker.main(["--seconds", "2", "--out", str(out), *args]) == 0
    return out.read_text()


def test_the_search_finds_what_a_simulated_marker_carries(monkeypatch, tmp_path, capsys) -> None:
    rack = SimulatedRack(capacity=3000)
    steps = json.loads(run_bench(monkeypatch, tmp_path, rack, "--implementations", "python"))
    asked = [s["asked_pps"] for s in steps["python"]]
    assert asked == [250, 500, 1000, 2000, 4000, 3000, 3500, 3250]
    said = capsys.readouterr().out
    assert "marker APM at R1 (a1, a2, a3, a4), S1 -> 198.18.17.1" in said  # diffserv.yml's
    assert "trialbed_marker_max_pps:\n  python: 3000\n  source: >-\n    make bench-marker" in said
    # It replayed from S1, counted on R1's interface towards R2, ran the marker on R1.
    replays = [n for n, c in rack.sent if c.startswith("tcpreplay")]
    assert set(replays) == {"S1"} and len(replays) == len(asked)
    r1, r2 = rack.hosts["R1"].interfaces, rack.hosts["R2"].interfaces.values()
    towards_r2 = {i for i, a in r1.items() if any(a.network == b.network for b in r2)}
    assert {c.split("/")[4] for n, c in rack.sent if "tx_packets" in c} == towards_r2
    assert {n for n, c in rack.sent if "tx_packets" in c} == {"R1"}
    started = [c for n, c in rack.sent if n == "R1" and "edge_marker.py" in c]
    assert len(started) == 1 and "--marker APM" in started[0] and "--queue" in started[0]


def test_a_sender_that_cannot_reach_the_rate_gives_a_lower_bound(monkeypatch, tmp_path, capsys):
    rack = SimulatedRack(capacity=50_000, sender_limit=1500)
    steps = json.loads(run_bench(monkeypatch, tmp_path, rack, "--implementations", "bpf"))
    assert [s["asked_pps"] for s in steps["bpf"]] == [250, 500, 1000, 2000]
    said = capsys.readouterr().out
    assert "  bpf: 1500  # at least: the sender's limit or --top" in said
    started = [c for n, c in rack.sent if n == "R1" and "bpf_edge_marker.py" in c]
    assert len(started) == 1 and "--queue" not in started[0]


def test_an_implementation_that_cannot_start_is_said_and_the_others_measured(
    monkeypatch, tmp_path, capsys
):
    rack = SimulatedRack(capacity=3000)
    run = rack.run

    def no_bpf(name: str, cmd: Command, **kwargs) -> str:
        if "bpf_edge_marker.py" in cmd:
            raise RackError(f"{name}: building hostside/bpf_tc failed (needs clang)")
        return run(name, cmd, **kwargs)

    monkeypatch.setattr(rack, "run", no_bpf)
    steps = json.loads(run_bench(monkeypatch, tmp_path, rack, "--implementations", "bpf", "python"))
    assert list(steps) == ["python"]
    said = capsys.readouterr().out
    assert "bpf:\n  could not run: R1: building hostside/bpf_tc failed (needs clang)" in said
    assert "  python: 3000\n" in said and "  bpf:" not in said.split("Put in the inventory")[1]
