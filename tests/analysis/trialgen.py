"""A whole trial directory, generated, with its ground truth: what `trials report` reads of a
real one (trial.json, the captures before and after the bottleneck router, each sender's
iperf3 report and tcp_probe recording, the router's `tc -s` samples and snapshots).

The captures are tests/analysis/tcpgen.py's (its TCP flows through one shared FIFO queue,
and its UDP stream); each flow is a bulk_tcp generator of its own (sender A<f>, receiver C<f>,
as seed 001's pairs), the UDP stream a cbr_udp generator (B to D). With ``iperf3``, each flow
comes after its iperf3 control connection, as a real trial's do; with ``socket``, each is the
socket sender's (tool: socket, writing from connect); each sender's report (iperf3's or
bulk_socket.py's) names its data connection unless ``reports`` is False (a killed sender
leaves none).
trial.json has the shape the runner writes (trials/runner.py, trials/network.py's
path_summary), with what analysis/ reads of it. The tcp_probe recordings hold one event per
ACK reaching the sender (a sender at a high rate records about that many), in the kernel's
text format; each flow's ssthresh falls at each of its retransmissions (the truth: one
congestion epoch for each that comes once the last counted one's window is acked). The tc
samples hold the true occupancy and drop counter of the queue every 10 ms.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .tcpgen import MSS, T0_NS, Truth, generate

DELAY_NS = 25_000_000  # tcpgen's link delay ahead of the queue (its default)
RATE_BPS = 400_000_000  # about what tcpgen's flows send together
BUFFER = "2000000B"
SAMPLE_NS = 10_000_000  # tc_sampler.py's default interval
CLOCK_OFFSET_NS = 1_763_000_000 * 10**9  # tcp_probe: realtime minus the trace clock
BEFORE, AFTER = "bottleneck_in", "bottleneck_out"  # capture points on the router R
LEAF = "bfifo"


@dataclass
class GeneratedTrial:
    dir: Path
    truth: Truth
    captures: tuple[Path, Path]  # before and after the router
    congestion_epochs: list[int]  # per TCP flow: its congestion events in its tcp_probe events
    queue_drops: int


def _ip(value: int) -> str:
    return ".".join(str(value >> s & 0xFF) for s in (24, 16, 8, 0))


def _path(sender: str, receiver: str, delay_ns: int, rate_bps: int) -> dict:
    return {
        "hops": [f"{sender}:left", "R:right"],
        "return_hops": [f"{receiver}:right", "R:left"],
        "rtt_ns": 2 * delay_ns,
        "one_way_delay_ns": delay_ns,
        "bottleneck": {
            "link": "downstream",
            "host": "R",
            "iface": "right",
            "rate_bps": rate_bps,
            "buffer": BUFFER,
            "qdisc": "droptail",
        },
        "mtu": 1500,
    }


def _record(
    name: str, truth: Truth, duration_ns: int, family: str, delay_ns: int, rate_bps: int,
    starts_ns: list[int], tool: str,
) -> dict:  # fmt: skip
    traffic, addresses, interfaces = (
        {},
        {},
        {"R": {"left": "198.18.1.1/24", "right": "198.18.2.1/24"}},
    )
    for f, flow in enumerate(truth.flows):
        sender, receiver = f"A{f}", f"C{f}"
        src, dst = _ip(flow["src"]), _ip(flow["dst"])
        addresses |= {sender: src, receiver: dst}
        interfaces |= {sender: {"left": f"{src}/24"}, receiver: {"right": f"{dst}/24"}}
        traffic[f"tcp{f}"] = {
            "type": "bulk_tcp", "from": sender, "to": receiver, "sender": sender,
            "receiver": receiver, "src": src, "dst": dst, "start_ns": starts_ns[f],
            "duration_ns": duration_ns - starts_ns[f],
            "metrics": ["goodput", "retransmissions", "startup"],
            "spec": {"type": "bulk_tcp", "name": f"tcp{f}", "from": sender, "to": receiver,
                     "flows": 1, "cc": None, "start": f"{starts_ns[f] / 1e9:g}s",
                     "pacing": False, "tool": tool},
            "proto": 6, "port": flow["dport"], "tool": tool,
            "client_json": f"{sender}/tcp{f}_client.json",
            "path": _path(sender, receiver, delay_ns, rate_bps),
        }  # fmt: skip
    src, dst = (_ip(a) for a in truth.udp)
    addresses |= {"B": src, "D": dst}
    interfaces |= {"B": {"left": f"{src}/24"}, "D": {"right": f"{dst}/24"}}
    traffic["voip"] = {
        "type": "cbr_udp", "from": "B", "to": "D", "sender": "B", "receiver": "D", "src": src,
        "dst": dst, "start_ns": 0, "duration_ns": duration_ns,
        "metrics": ["one_way_delay", "loss"],
        "spec": {"type": "cbr_udp", "name": "voip", "from": "B", "to": "D", "start": "0s"},
        "proto": 17, "port": 4001, "dscp": 0, "packet_bytes": 214, "interval_ns": 1_000_000,
        "stream_file": "B/voip_stream.pcap", "path": _path("B", "D", delay_ns, rate_bps),
    }  # fmt: skip
    egress = {"link": "downstream", "direction": "forward", "node": "R", "host": "R"}
    egress |= {"iface": "right", "towards": "C0", "rate": f"{rate_bps}bit"}
    egress |= {"delay": f"{delay_ns // 10**6}ms"}
    egress |= {"buffer": BUFFER, "qdisc": "droptail", "rio": None}
    site = {"host": "R", "node": "R", "clock": "controller"}
    return {
        "trial": name, "id": "generated", "batch": "generated", "status": "complete",
        "family": family, "repetition": 1, "overrides": {},
        "parameters": {
            "duration": f"{duration_ns // 10**9}s", "warmup": "5s", "drain": "1s",
            "experiment": family,
            "capture": {"snaplen": 96, "points": [{"name": BEFORE}, {"name": AFTER}]},
        },
        "network": {
            "nodes": {n: n for n in [*addresses, "R"]}, "routers": ["R"],
            "addresses": addresses, "interfaces": interfaces, "egress": [egress],
            "captures": {BEFORE: {**site, "iface": "left"}, AFTER: {**site, "iface": "right"}},
        },
        "host_settings": {n: {"cc": "reno", "cc_params": {}} for n in addresses},
        "traffic": traffic,
        "times": {"started": "2025-11-21T04:40:00+00:00", "t0_ns": T0_NS},
        "errors": [],
    }  # fmt: skip


def _tcp_probe(
    path: Path, flow: dict, acks: tuple[np.ndarray, np.ndarray], retx: np.ndarray, every: int
):
    """One tcp_probe event per ``every`` ACKs reaching the sender; ssthresh falls at each
    retransmission and cwnd (20 segments, one more every 64 events) starts again. Returned:
    the flow's congestion epochs, the falls at which everything sent at the last counted one
    was acked (a loss within the reduction of the one before is the same congestion event)."""
    at, una = acks
    order = np.argsort(at, kind="stable")[::every]
    at, una = at[order], una[order]
    epoch = np.searchsorted(np.sort(retx), at, side="right")  # retransmissions before each
    ssthresh = np.where(epoch > 0, 100_000 - epoch, 2**31 - 1)
    since = np.arange(len(at)) - np.searchsorted(epoch, epoch, side="left")  # ACKs this epoch
    cwnd = np.where(epoch > 0, 20, 10) + since // 64
    mono = at - CLOCK_OFFSET_NS
    sec, usec = mono // 10**9, mono % 10**9 // 1000
    nxt = (una + cwnd * MSS) % 2**32
    src, dst = f"{_ip(flow['src'])}:{flow['sport']}", f"{_ip(flow['dst'])}:{flow['dport']}"
    header = {"clock": "mono", "realtime_minus_clock_ns": CLOCK_OFFSET_NS}
    head = f"# trialbed-tcp-probe {json.dumps(header)}\n"
    with open(path, "w") as f:
        f.write(head)
        step = 100_000
        for i in range(0, len(at), step):
            f.writelines(
                f"          iperf3-1200{flow['sport'] % 10}   [001] ..s2. {s}.{u:06d}: "
                f"tcp_probe: family=AF_INET src={src} dest={dst} mark=0x0 data_len=0 "
                f"snd_nxt=0x{n:x} snd_una=0x{a:x} snd_cwnd={c} ssthresh={t} snd_wnd=64512 "
                f"srtt={50_000 + c % 997} rcv_wnd=65160 sock_cookie={flow['sport']:x} "
                f"skbaddr=0000000007511e0d skaddr=00000000ebe63de9\n"
                for s, u, n, a, c, t in zip(
                    sec[i : i + step].tolist(),
                    usec[i : i + step].tolist(),
                    nxt[i : i + step].tolist(),
                    una[i : i + step].tolist(),
                    cwnd[i : i + step].tolist(),
                    ssthresh[i : i + step].tolist(),
                    strict=True,
                )
            )
    epochs, high = 0, None
    for i in np.flatnonzero(np.diff(ssthresh) < 0) + 1:
        if high is None or (int(una[i]) - high) % 2**32 < 2**31:
            epochs, high = epochs + 1, int(nxt[i])
    return epochs


def _tc_samples(router: Path, truth: Truth) -> int:
    """The queue's true occupancy and drop counter every SAMPLE_NS (tc_sampler.py's lines),
    and `tc -s qdisc show` snapshots before and after; the true drops are returned."""
    entered, left, frame = truth.queue()
    departed = np.sort(left[left >= 0])
    by_departure = frame[left >= 0][np.argsort(left[left >= 0], kind="stable")]
    dropped = np.sort(entered[left < 0])
    forwarded_in, forwarded_frame = entered[left >= 0], frame[left >= 0]
    times = np.arange(entered[0], departed[-1] + SAMPLE_NS, SAMPLE_NS)
    n_in = np.searchsorted(forwarded_in, times, side="right")
    n_out = np.searchsorted(departed, times, side="right")
    bytes_in = np.r_[0, np.cumsum(forwarded_frame)][n_in]
    bytes_out = np.r_[0, np.cumsum(by_departure)][n_out]
    drops = np.searchsorted(dropped, times, side="right")
    sent_p, sent_b = n_out, bytes_out
    with open(router / "tc_samples.jsonl", "w") as f:
        for t, q, b, d, sp, sb in zip(
            times.tolist(), (n_in - n_out).tolist(), (bytes_in - bytes_out).tolist(),
            drops.tolist(), sent_p.tolist(), sent_b.tolist(), strict=True,
        ):  # fmt: skip
            counters = {"bytes": sb, "packets": sp, "drops": d, "overlimits": 0, "requeues": 0}
            root = {"kind": "htb", "handle": "1:", "dev": "right", "root": True, "refcnt": 3}
            leaf = {"kind": LEAF, "handle": "10:", "dev": "right", "parent": "1:10"}
            leaf |= {"options": {"limit": 2000000}, **counters, "backlog": b, "qlen": q}
            root |= {"options": {"r2q": 10}, **counters, "backlog": b, "qlen": q}
            line = {"ts_ns": t, "spread_ns": 1_500_000, "dev": "right", "qdiscs": [root, leaf]}
            f.write(json.dumps(line) + "\n")
        f.write(json.dumps({"end": True, "samples": len(times), "skipped": 0, "failed": 0}) + "\n")
    for when, d in (("before", 0), ("after", len(dropped))):
        (router / f"tc_{when}.txt").write_text(
            "## right\nqdisc htb 1: root refcnt 3 r2q 10 default 0x10\n"
            f" Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0) \n"
            f"qdisc {LEAF} 10: parent 1:10 limit 2000000b\n"
            f" Sent 0 bytes 0 pkt (dropped {d}, overlimits 0 requeues 0) \n"
        )
    return len(dropped)


def write_trial(
    trial_dir: Path, *, packets: int, seed: int = 1, duration_ns: int = 60 * 10**9,
    probe_every: int = 1, family: str = "collateral_damage", flows: int = 8,
    delay_ns: int = DELAY_NS, rate_bps: int = RATE_BPS, iperf3: bool = False,
    reports: bool = True, starts_ns: list[int] | None = None, socket: bool = False,
) -> GeneratedTrial:  # fmt: skip
    """A trial directory with about ``packets`` packets in the capture before the router;
    a tcp_probe event for every ``probe_every`` ACKs reaching a sender; ``flows`` bulk_tcp
    pairs (``iperf3``: behind their control connections; ``socket``: the socket sender's;
    ``reports``: with their senders' reports;
    ``starts_ns``: each one's start after T0, default 0, its sender launched then) through a
    bottleneck of ``rate_bps`` after a link of ``delay_ns``."""
    router = trial_dir / "R"
    router.mkdir(parents=True)
    before, after = router / f"{BEFORE}.pcap", router / f"{AFTER}.pcap"
    truth = generate(
        before, after, packets=packets, seed=seed, shared_queue=True, duration_ns=duration_ns,
        delay_ns=delay_ns, flows=flows, iperf3=iperf3, launches_ns=starts_ns, socket=socket,
    )  # fmt: skip
    starts = starts_ns or [0] * flows
    tool = "socket" if socket else "iperf3"
    record = _record(trial_dir.name, truth, duration_ns, family, delay_ns, rate_bps, starts, tool)
    (trial_dir / "trial.json").write_text(json.dumps(record, indent=1) + "\n")
    epochs = []
    for f, flow in enumerate(truth.flows):
        sender = trial_dir / f"A{f}"
        sender.mkdir()
        report = (
            {"flows": [{"flow": 0, "local_port": flow["sport"], "status": "done"}], "error": None}
            if socket
            else {"start": {"connected": [{"local_port": flow["sport"]}]}}
        )
        if reports:
            (sender / f"tcp{f}_client.json").write_text(json.dumps(report))
        epochs.append(
            _tcp_probe(
                sender / "tcp_probe.txt",
                flow,
                truth.acks_at_sender[f],
                truth.retransmitted_at[f],
                probe_every,
            )
        )
    drops = _tc_samples(router, truth)
    return GeneratedTrial(trial_dir, truth, (before, after), epochs, drops)
