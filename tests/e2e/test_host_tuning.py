"""Host tuning by testbed_host on the test rack, judged from the hosts themselves: interface MTU
and the TCP route metrics of the startup experiments (initcwnd, rto_min) are set, idempotent,
recorded by host_facts, put back to the defaults by a configure without them, refused when
wrong, and they act on the wire.

The rack's paths have a round-trip time of well under a millisecond, so the first ACK would
come back in the middle of the first flight. The receiver therefore holds back its ACKs for
HOLD_S (an nftables rule in its output hook): the sender sends what its initial window allows,
then nothing new until an ACK arrives, only retransmissions after each RTO. A tail loss probe
would send one more new segment after two jiffies; probes are off on the sender meanwhile.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest

from analysis.pcap import ip_to_int, read_pcap
from core.command import command, sequence
from core.daemons import Daemons
from core.rack import Rack
from tests.e2e.conftest import recap
from trials.ansible import write_host_vars
from trials.preflight import host_facts as preflight_facts

pytestmark = pytest.mark.rack

SENDER, RECEIVER = "A", "C"
PORT = 5399
TRANSFER_BYTES = 100 * 1024
HOLD_S = 0.6
HOLD_TABLE = "trialbed_test_hold"
# Drop every packet of the sink's but its SYN-ACK (the handshake completes, no ACK of data).
HOLD_RULES = f"""\
table inet {HOLD_TABLE} {{
  chain out {{
    type filter hook output priority 0;
    tcp sport {PORT} tcp flags & syn == 0 drop
  }}
}}
"""
TUNED = {
    "testbed_host_route_metrics": {"initcwnd": 10, "rto_min": "200ms"},
    "testbed_host_mtu": {"left": 512},
}
# The receiver window of the startup experiments comes through the existing sysctls path.
RMEM = "4096 131072 131072"
RECEIVER_VARS = {
    "testbed_host_sysctls": {"net.ipv4.tcp_no_metrics_save": 1, "net.ipv4.tcp_rmem": RMEM}
}
# A sink on the receiver: one connection, read to the end, close.
SINK = """\
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
while c.recv(65536):
    pass
c.close()
"""
# The sender writes everything at once, so that only the congestion window holds data back.
SEND = """\
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
s.sendall(b"x" * int(sys.argv[3]))
s.shutdown(socket.SHUT_WR)
s.recv(1)
"""


class Configure:
    """configure.yml with the rack's inventory and a host-variable overlay; keeps timings."""

    def __init__(self, test_rack, base: Path):
        self.test_rack, self.base, self.timings = test_rack, base, []

    def __call__(self, host_vars: dict[str, dict] | None, *args: str):
        inventory = ["-i", str(self.test_rack.inventory)]
        if host_vars is not None:
            overlay = write_host_vars(self.base / f"overlay{len(self.timings)}.yml", host_vars)
            inventory += ["-i", str(overlay)]
        start = time.monotonic()
        done = self.test_rack.playbook("configure.yml", *inventory, *args)
        self.timings.append((" ".join(args) or "all hosts", time.monotonic() - start))
        return done


@pytest.fixture(scope="module")
def rack(test_rack):
    rack = Rack.load([test_rack.inventory])
    yield rack
    rack.close()


@pytest.fixture(scope="module")
def configure(test_rack, tmp_path_factory):
    run = Configure(test_rack, tmp_path_factory.mktemp("host_tuning"))
    run.restored = False
    yield run
    if not run.restored:  # a test failed before the defaults were back: put them back
        done = run(None)
        assert done.returncode == 0, done.stdout[-3000:]
    print("configure runs: " + ", ".join(f"{what} {s:.1f} s" for what, s in run.timings))


@pytest.fixture(scope="module")
def tuned(configure, rack):
    rmem_before = rack.run(RECEIVER, "sysctl -n net.ipv4.tcp_rmem").strip()
    overlay = {SENDER: TUNED, RECEIVER: RECEIVER_VARS}
    try:
        first = configure(overlay)
        assert first.returncode == 0, first.stdout[-3000:]
        second = configure(overlay)
        assert second.returncode == 0, second.stdout[-3000:]
        yield {"first": recap(first.stdout), "second": recap(second.stdout)}
    finally:
        # The next configure would give the receiver's tcp_rmem back (the host's record); put it
        # back now, so that a test run alone after this module starts from the rack's state.
        rack.run(RECEIVER, f"sysctl -qw net.ipv4.tcp_rmem={shlex.quote(rmem_before)}")


def route_metrics(rack: Rack, host: str, dev: str) -> dict[str, dict]:
    """dst -> metrics of the host's IPv4 routes through `dev`, read on the host."""
    routes = json.loads(rack.run(host, "ip -4 -j route show"))
    out = {}
    for route in routes:
        if route.get("dev") == dev:
            metrics: dict = {}
            for entry in route.get("metrics", []):
                metrics.update(entry)
            out[route["dst"]] = metrics
    return out


def mtu(rack: Rack, host: str, dev: str) -> int:
    return int(rack.run(host, f"cat /sys/class/net/{dev}/mtu"))


def host_facts(rack: Rack, host: str) -> dict:
    """The host's facts as preflight and each trial's record read them."""
    return preflight_facts(rack, [host])[host]


def test_metrics_and_mtu_are_on_the_host(tuned, rack):
    routes = route_metrics(rack, SENDER, "left")
    print(f"{SENDER}'s routes through left: {routes}")
    # The connected subnet and the route towards the right side through the router.
    assert len(routes) == 2
    assert all(m == {"initcwnd": 10, "rto_min": 200} for m in routes.values()), routes
    assert mtu(rack, SENDER, "left") == 512
    # The other hosts keep the defaults.
    assert all(m == {} for m in route_metrics(rack, "B", "left").values())
    assert mtu(rack, "B", "left") == 1500
    facts = host_facts(rack, SENDER)
    assert facts["mtu"] == {"left": 512}
    recorded = [r["metrics"] for r in facts["routes"] if r.get("dev") == "left"]
    assert recorded and all(m == {"initcwnd": 10, "rto_min": 200} for m in recorded)


def test_receive_buffer_sysctl_reaches_the_receivers_namespace(tuned, rack):
    assert rack.run(RECEIVER, "sysctl -n net.ipv4.tcp_rmem").split() == RMEM.split()
    assert rack.run("D", "sysctl -n net.ipv4.tcp_rmem").split() != RMEM.split()


def test_second_configure_changes_nothing(tuned):
    assert tuned["first"][SENDER]["changed"] > 0
    changed = {host: counts["changed"] for host, counts in tuned["second"].items()}
    assert set(changed) >= {"A", "B", "C", "D", "R"}
    assert all(v == 0 for v in changed.values()), changed


def first_flight(rack: Rack, tag: str, local: Path) -> dict:
    """A connection from SENDER to RECEIVER writing TRANSFER_BYTES at once while the receiver
    holds its ACKs back, captured on the sender: the new data it sent before the first packet
    of the receiver's came back, and when it first retransmitted (one RTO after the flight)."""
    sender, receiver = rack.host(SENDER), rack.host(RECEIVER)
    src, dst = sender.experiment_address(), receiver.experiment_address()
    remote = {h: f"{rack.host(h).workdir}/host_tuning" for h in (SENDER, RECEIVER)}
    for h, d in remote.items():
        rack.run(h, f"mkdir -p {shlex.quote(d)}")
    daemons = Daemons(rack, remote)
    pcap = f"{remote[SENDER]}/flight_{tag}.pcap"
    tlp = rack.run(SENDER, "sysctl -n net.ipv4.tcp_early_retrans").strip()
    try:
        rack.run(SENDER, "sysctl -qw net.ipv4.tcp_early_retrans=0")
        rack.run(RECEIVER, f"nft -f - <<'EOF'\n{HOLD_RULES}EOF")
        daemons.spawn(RECEIVER, "sink", command("python3", "-c", SINK, str(dst), PORT))
        daemons.wait_for_log(RECEIVER, "sink", "listening")
        iface = sender.interface_towards(src)
        # Immediate mode: otherwise the last second's packets may still sit in the kernel's
        # ring when the capture is stopped, and are lost (the flight's ACKs went so once).
        capture = command(
            "tcpdump", "-i", iface, "-n", "--immediate-mode", "-s", 96, "-w", pcap,
            "tcp", "port", PORT,
        )  # fmt: skip
        daemons.spawn(SENDER, "capture", capture)
        daemons.wait_for_log(SENDER, "capture", "listening on")
        send = command("python3", "-c", SEND, str(dst), PORT, TRANSFER_BYTES)
        daemons.spawn(SENDER, "send", send)
        # Started after the sender, so the hold outlasts its first flight whatever SSH takes.
        release = sequence(
            command("sleep", f"{HOLD_S:g}"), command("nft", "delete", "table", "inet", HOLD_TABLE)
        )
        daemons.spawn(RECEIVER, "release", release)
        deadline = time.monotonic() + 20
        while daemons.running(SENDER, "send") and time.monotonic() < deadline:
            time.sleep(0.1)
        sent = rack.run(SENDER, f"cat {remote[SENDER]}/send.log").strip()
        assert not daemons.running(SENDER, "send") and not sent, sent
    finally:
        daemons.stop(SENDER, "send")
        daemons.stop(SENDER, "capture", "INT")
        daemons.stop(RECEIVER, "sink")
        daemons.stop(RECEIVER, "release")
        rack.run(RECEIVER, f"nft delete table inet {HOLD_TABLE} 2>/dev/null; true", check=False)
        rack.run(SENDER, f"sysctl -qw net.ipv4.tcp_early_retrans={tlp}")
    rack.get(SENDER, pcap, local)
    rack.run(SENDER, f"rm -f {shlex.quote(pcap)}")
    packets = read_pcap(local)
    data = packets[(packets.src == ip_to_int(str(src))) & (packets.payload_len > 0)]
    seen = (
        f"{len(packets)} packets in {SENDER}'s capture on {iface}, {len(data)} with data from "
        f"{src}; the sink's log: {rack.run(RECEIVER, f'cat {remote[RECEIVER]}/sink.log')!r}"
    )
    assert len(data), seen
    start = data.ts_ns.iloc[0]
    back = packets[(packets.dst == ip_to_int(str(src))) & (packets.ts_ns > start)]
    assert len(back), seen
    first_ack = back.ts_ns.iloc[0]
    before = data[data.ts_ns < first_ack]
    new = before.drop_duplicates("seq")
    retransmitted = before[before.duplicated("seq")]
    return {
        "segments": len(new),
        "payload": sorted(set(new.payload_len.tolist())),
        "flight_ms": (new.ts_ns.iloc[-1] - start) / 1e6,
        "first_ack_ms": (first_ack - start) / 1e6,
        "retransmissions": len(retransmitted),
        "rto_ms": (retransmitted.ts_ns.iloc[0] - start) / 1e6 if len(retransmitted) else None,
        "bytes": int(data.drop_duplicates("seq").payload_len.sum()),
    }


def test_initcwnd_sets_the_first_flight(tuned, rack, configure, tmp_path):
    flights = {(10, 200): first_flight(rack, "initcwnd10", tmp_path / "initcwnd10.pcap")}
    metrics = {"initcwnd": 1, "rto_min": "1s"}
    one = configure({SENDER: {**TUNED, "testbed_host_route_metrics": metrics}}, "-l", SENDER)
    assert one.returncode == 0, one.stdout[-3000:]
    assert route_metrics(rack, SENDER, "left")["198.18.0.0/16"] == {"initcwnd": 1, "rto_min": 1000}
    flights[1, 1000] = first_flight(rack, "initcwnd1", tmp_path / "initcwnd1.pcap")
    for (initcwnd, rto_min), f in flights.items():
        print(f"initcwnd {initcwnd}, rto_min {rto_min} ms: {f}")
    for (initcwnd, rto_min), f in flights.items():
        assert f["bytes"] == TRANSFER_BYTES  # the whole transfer is in the capture
        assert f["first_ack_ms"] >= 0.5 * HOLD_S * 1000  # the hold covered the flight
        assert f["flight_ms"] < 50  # back to back
        assert f["segments"] == initcwnd
        # The first retransmission waits at least rto_min (the rack's RTT adds next to nothing).
        assert f["rto_ms"] is not None and rto_min <= f["rto_ms"] < rto_min + 500
    # Full segments of A's MTU 512: 512 - 20 (IP) - 32 (TCP with timestamps).
    assert flights[10, 200]["payload"] == [512 - 20 - 32]


def test_configure_without_the_variables_restores_the_defaults(tuned, rack, configure):
    done = configure(None, "-l", SENDER)
    assert done.returncode == 0, done.stdout[-3000:]
    configure.restored = True
    routes = route_metrics(rack, SENDER, "left")
    assert routes and all(m == {} for m in routes.values()), routes
    assert mtu(rack, SENDER, "left") == 1500


@pytest.mark.parametrize(
    ("host_vars", "named"),
    [
        ({"testbed_host_route_metrics": {"initcwnd": 0}}, "testbed_host_route_metrics"),
        ({"testbed_host_route_metrics": {"rto_min": "5us"}}, "testbed_host_route_metrics"),
        ({"testbed_host_route_metrics": {"initcwd": 10}}, "testbed_host_route_metrics.initcwd"),
        ({"testbed_host_mtu": {"left": 20}}, "testbed_host_mtu.left"),
        ({"testbed_host_mtu": {"eth9": 1500}}, "testbed_host_mtu.eth9"),
    ],
    ids=["initcwnd-0", "rto_min-unit", "misspelt-key", "mtu-20", "mtu-unknown-iface"],
)
def test_bad_value_fails_naming_the_variable(rack, configure, host_vars, named):
    before = mtu(rack, SENDER, "left"), route_metrics(rack, SENDER, "left")
    done = configure({SENDER: host_vars}, "-l", SENDER)
    assert done.returncode != 0, done.stdout[-3000:]
    failure = done.stdout[re.search(r"^(fatal|failed):", done.stdout, re.M).start() :]
    assert named in failure, failure[:2000]
    # Refused before anything on the host was touched.
    assert recap(done.stdout)[SENDER]["changed"] == 0
    assert (mtu(rack, SENDER, "left"), route_metrics(rack, SENDER, "left")) == before
