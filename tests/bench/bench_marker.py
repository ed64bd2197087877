"""How many packets/s a rack's edge-marker path carries, per marker implementation: the
calibration behind the inventory's trialbed_marker_max_pps (trialbed_vm_marker_max_pps on the VM
rack), which preflight holds every trial's offered load to (trials/preflight/marker_load.py).

On the rack that is up (the virtual one: namespaces or the VM, whichever `make rack-up` built;
a lab rack with -i), with an experiment's first marker (default: experiments/diffserv.yml's APM
at R1) and its first generator whose packets enter the marker (there: S1 -> D1):

  - the sender replays full-size TCP segments of 64 flows (core.link_rules.FULL_FRAME_BYTES,
    tcpreplay --pps) at a rate, for SECONDS, through the marker, which runs on its router as a
    trial runs it (trials/adaptive_marking.py, through trialbed-daemon); the segments leave
    with TTL 2, so they are forwarded by the marker's router and die at the next hop (no
    receiver answers them: no RST storm back through the router);
  - the router's egress counter (tx_packets of its interface towards the receiver) says how
    many the marker let through by the time the sender stopped and once the marker's queue
    drained;
  - a rate is carried when, by the sender's stop, at least KEPT_UP of the packets sent had left
    the router, and, drained, at least DELIVERED of them (none lost in the marker's queue);
  - the rate doubles from --start until one is not carried, then is bisected --refine times;
    the sender's own limit (it could not send within SENDER of the rate asked) ends the search
    too, the figure then a lower bound.

Per implementation (python: the NFQUEUE marker; bpf: the tc BPF program; none: no marker, the
router's own forwarding as a reference) it prints each rate tried, then the inventory lines
with the highest rate carried. Needs a rack where a trial has run (the hosts' programs are
shipped by configure) and no trial's shaping is left on the router: make bench-marker runs make
teardown first.

  make bench-marker [INVENTORY=...] [BENCH_ARGS=...], or, the rack cleared of trials' shaping:
  PYTHONPATH=. .venv/bin/python tests/bench/bench_marker.py [-i INVENTORY] [--experiment FILE]
      [--marker APM] [--implementations python bpf] [--seconds 10] [--start 250] [--top 256000]
      [--refine 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from core.command import STDOUT, command, redirected
from core.daemons import Daemons
from core.layout import remote_trial_dir
from core.link_rules import FULL_FRAME_BYTES, MTU
from core.rack import Rack, RackError
from trials import adaptive_marking
from trials.network import resolve_network
from trials.plan import load_plan
from trials.preflight.context import Context
from trials.preflight.marker_load import TAKES, enters
from trials.udp_stream import (
    TEMPLATE_DST,
    TEMPLATE_SRC,
    next_hop,
    rewrite_for_rack,
    write_pcap,
)

PROJECT = Path(__file__).resolve().parents[2]

FLOWS = 64
SEGMENTS = 80  # per flow in the file; tcpreplay loops it
PORT = 9200  # the flows' destination port (no one listens: the segments die a hop later)
TTL = 2  # forwarded by the marker's router, dropped by the next hop
KEPT_UP = 0.98  # of the packets sent, out of the router by the sender's stop
DELIVERED = 0.999  # of the packets sent, out of the router once drained
SENDER = 0.95  # of the rate asked, what the sender must reach for a step to count
DRAIN_QUIET_S = 1.0  # the egress counter unchanged this long: the marker's queue is empty
DRAIN_MOST_S = 120.0
MARKER_READY_S = 300.0  # the BPF marker builds on its first start (clang; minutes under TCG)
IMPLEMENTATIONS = ("none", *TAKES)
# Shaping left on the router by a trial would limit the rate and not the marker.
SHAPING_QDISCS = {"htb", "netem", "tbf", "red", "gred", "hfsc", "cake"}


def tcp_frames(flows: int = FLOWS, segments: int = SEGMENTS) -> np.ndarray:
    """Full-size TCP segments (ACK, PSH) of `flows` flows from TEMPLATE_SRC to TEMPLATE_DST,
    round robin, each flow's sequence numbers consecutive; checksums left to tcprewrite."""
    payload = MTU - 20 - 20
    frame = bytearray(FULL_FRAME_BYTES)
    frame[12:14] = b"\x08\x00"
    src, dst = (bytes(map(int, a.split("."))) for a in (TEMPLATE_SRC, TEMPLATE_DST))
    frame[14:34] = struct.pack("!BBHHHBBH4s4s", 0x45, 0, MTU, 0, 0, TTL, 6, 0, src, dst)
    frame[34:54] = struct.pack("!HHIIBBHHH", 0, PORT, 0, 1, 5 << 4, 0x18, 65535, 0, 0)
    n = flows * segments
    i = np.arange(n, dtype=np.uint64)
    flow, segment = i % flows, i // flows
    frames = np.tile(np.frombuffer(bytes(frame), dtype=np.uint8), (n, 1))
    frames[:, 18:20] = (i % 65536).astype(">u2").view(np.uint8).reshape(-1, 2)  # IP ID
    sport = (20000 + flow).astype(">u2")
    frames[:, 34:36] = sport.view(np.uint8).reshape(-1, 2)
    seq = (flow * 10_000_000 + segment * payload).astype(">u4")
    frames[:, 38:42] = seq.view(np.uint8).reshape(-1, 4)
    return frames


@dataclasses.dataclass
class Step:
    """One rate tried: what was asked and sent, what had left the router by the sender's stop
    and once drained, when the last left (s after the sender's start), and the marker's stats."""

    asked_pps: int
    sent: int
    sent_pps: float
    out_at_stop: int
    out_drained: int
    drained_s: float
    marker: dict | None = None

    @property
    def sender_limited(self) -> bool:
        return self.sent_pps < SENDER * self.asked_pps

    @property
    def carried(self) -> bool:
        return self.out_at_stop >= KEPT_UP * self.sent and self.out_drained >= DELIVERED * self.sent

    @property
    def out_pps(self) -> float:
        """The rate packets left the router: over the sending, or to the drain's end."""
        return self.out_drained / max(self.drained_s, self.sent / self.sent_pps)

    def line(self) -> str:
        said = "carried" if self.carried else "NOT carried"
        if self.sender_limited:
            said += f" (sender limited: {self.sent_pps / self.asked_pps:.0%} of the rate asked)"
        service = (self.marker or {}).get("service_us") or {}
        marker = (
            f"; marker: {self.marker.get('packets')} packets, service mean "
            f"{service['mean']:.0f} us, p99 {service['p99']} us"
            if self.marker and service.get("mean") is not None
            else ""
        )
        return (
            f"  {self.asked_pps:>7} pps asked, {self.sent_pps:>9.0f} sent ({self.sent}): "
            f"{self.out_at_stop / self.sent:6.1%} out by the stop, "
            f"{self.out_drained / self.sent:6.1%} drained after {self.drained_s:.1f} s, "
            f"{self.out_pps:.0f} pps out: {said}{marker}"
        )


def tcpreplay_counts(output: str) -> tuple[int, float]:
    """(packets sent, packets/s) from tcpreplay's statistics: the device's successful packets
    (those it could not send, ENOBUFS and the like, are not offered to the marker)."""
    sent = re.search(r"Successful packets:\s+(\d+)", output)
    actual = re.search(r"Actual: (\d+) packets", output)
    rate = re.search(r"Rated: .*?([\d.]+) pps", output)
    if not (sent or actual) or not rate or not actual:
        raise RuntimeError(f"tcpreplay printed no statistics:\n{output[-500:]}")
    done = int((sent or actual)[1])
    return done, float(rate[1]) * done / max(1, int(actual[1]))


class Bench:
    """The rack, the marker's site, the path, and a working directory on each host."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rack = Rack.load(args.inventory or None)
        trial = load_plan(args.experiment, ["factors={}"]).trials[0]
        exp, source = trial.experiment, str(args.experiment)
        self.net = resolve_network(exp, self.rack, source)
        site = adaptive_marking.marker_sites(exp, self.net, source)[0]
        spec = site.spec.model_copy(update={"marker": args.marker or site.spec.marker})
        self.site = dataclasses.replace(site, spec=spec)
        self.router = site.host
        feeders = {self.net.host_of(n) for lk in exp.network.links if lk.name in spec.links
                   for n in lk.ends if n != spec.at}  # fmt: skip
        gen = next(
            (g for g in exp.traffic if enters(self.net, *g.endpoints(), site.host, feeders)),
            None,
        )
        if gen is None:
            raise SystemExit(f"{source}: no traffic enters {spec.at} over {spec.links}")
        self.sender = self.net.host_of(gen.from_)
        self.dst = str(self.net.address_of(gen.to))
        self.egress = next(i for h, i in self.net.path(gen.from_, gen.to) if h == self.router)
        self.dirs = {
            h: remote_trial_dir(self.rack.host(h).workdir, "bench", "marker")
            for h in (self.router, self.sender)
        }
        self.daemons = Daemons(self.rack, self.dirs)
        self.pcap = f"{self.dirs[self.sender]}/bench_marker.pcap"

    def prepare(self) -> None:
        """The hosts' directories, a router left clean by trials, the pcap on the sender."""
        for host, where in self.dirs.items():
            self.rack.run(host, command("mkdir", "-p", where))
            helper = f"{self.rack.host(host).workdir}/bin/trialbed-daemon"
            if not self.rack.run(host, command("ls", helper), check=False).strip():
                raise SystemExit(
                    f"host {host} has no {helper}: the hosts' programs are shipped by configure; "
                    "run a trial on this rack once (make trial), then this again"
                )
        qdiscs = json.loads(self.rack.run(self.router, command("tc", "-j", "qdisc", "show")))
        left = sorted({q["kind"] for q in qdiscs} & SHAPING_QDISCS)
        rules = self.rack.run(self.router, command("iptables", "-w", "-t", "mangle", "-S"))
        if left or "NFQUEUE" in rules:
            raise SystemExit(
                f"host {self.router} still carries a trial's shaping ({', '.join(left) or ''}"
                f"{' NFQUEUE rules' if 'NFQUEUE' in rules else ''}): make teardown first"
            )
        iface, src_mac, hop_mac = next_hop(self.rack, self.sender, self.dst)
        self.iface = iface
        scratch = Path(tempfile.mkdtemp(prefix="trialbed-bench-marker-"))
        try:
            template, out = scratch / "template.pcap", scratch / "bench_marker.pcap"
            frames = tcp_frames()
            write_pcap(template, frames, np.arange(len(frames), dtype=np.uint64) * 1000)
            src = str(self.rack.host(self.sender).experiment_address())
            rewrite_for_rack(template, out, src_ip=src, dst_ip=self.dst, src_mac=src_mac,
                             next_hop_mac=hop_mac)  # fmt: skip
            self.rack.put(self.sender, out, self.pcap)
        finally:
            shutil.rmtree(scratch)
        # Every neighbour on the path resolved before the first step.
        self.rack.run(self.sender, command("ping", "-c", "3", "-i", "0.2", self.dst), check=False)

    def out_count(self) -> int:
        path = f"/sys/class/net/{self.egress}/statistics/tx_packets"
        return int(self.rack.run(self.router, command("cat", path)))

    def step(self, pps: int, marker: bool) -> Step:
        total = int(pps * self.args.seconds)
        loops = math.ceil(total / (FLOWS * SEGMENTS))
        replay = command("tcpreplay", "-i", self.iface, f"--pps={pps}", f"--loop={loops}",
                         f"--limit={total}", "--preload-pcap", self.pcap)  # fmt: skip
        replay = redirected(replay, stderr=STDOUT)  # its statistics, wherever it prints them
        stats = f"{self.dirs[self.router]}/{self.site.stats_file}"
        if marker:  # a new interval of the marker's counters
            self.daemons.signal(self.router, self.site.daemon, "USR1", wait_file=stats)
        before = self.out_count()
        start = time.monotonic()
        sent, sent_pps = tcpreplay_counts(
            self.rack.run(self.sender, replay, timeout=self.args.seconds * 3 + 60)
        )
        at_stop = self.out_count() - before
        last, last_t = at_stop, time.monotonic()
        while time.monotonic() - last_t < DRAIN_QUIET_S and time.monotonic() - start < (
            self.args.seconds + DRAIN_MOST_S
        ):
            time.sleep(0.25)
            now = self.out_count() - before
            if now != last:
                last, last_t = now, time.monotonic()
        found = None
        if marker:
            self.daemons.signal(self.router, self.site.daemon, "USR1", wait_file=stats)
            found = json.loads(self.rack.run(self.router, command("cat", stats)))
        return Step(pps, sent, sent_pps, at_stop, last, last_t - start, found)

    def search(self, implementation: str) -> list[Step]:
        """Rates doubled until one is not carried, then bisected; the marker (if any) runs
        throughout."""
        marker = implementation != "none"
        if marker:
            spec = self.site.spec.model_copy(update={"implementation": implementation})
            site = dataclasses.replace(self.site, spec=spec)
            adaptive_marking.start(self.rack, self.daemons, site, ready_timeout_s=MARKER_READY_S)
        steps: list[Step] = []
        try:
            rate, top = self.args.start, self.args.top
            good: Step | None = None
            bad: Step | None = None
            while rate <= top:
                s = self.step(rate, marker)
                steps.append(s)
                print(s.line(), flush=True)
                if not s.carried:
                    bad = s
                    break
                good = s
                if s.sender_limited:
                    break
                rate *= 2
            for _ in range(self.args.refine if good and bad else 0):
                rate = (good.asked_pps + bad.asked_pps) // 2  # type: ignore[union-attr]
                s = self.step(rate, marker)
                steps.append(s)
                print(s.line(), flush=True)
                good, bad = (s, bad) if s.carried else (good, s)
        finally:
            if marker:
                self.daemons.stop(self.router, self.site.daemon)
        return steps


def carried(steps: list[Step]) -> tuple[int | None, bool]:
    """The highest rate sent and carried (packets/s), and whether the sender limited it."""
    ok = [s for s in steps if s.carried]
    if not ok:
        return None, False
    best = max(ok, key=lambda s: s.sent_pps)
    return int(best.sent_pps), best.sender_limited or not any(not s.carried for s in steps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-i", "--inventory", type=Path, action="append", default=[])
    p.add_argument("--experiment", type=Path, default=PROJECT / "experiments/diffserv.yml")
    p.add_argument("--marker", choices=("NM", "APM", "WPM", "MPM"), help="default: the file's")
    p.add_argument("--implementations", nargs="+", choices=IMPLEMENTATIONS, default=list(TAKES))
    p.add_argument("--seconds", type=float, default=10.0, help="sending time per rate")
    p.add_argument("--start", type=int, default=250, help="first rate, packets/s")
    p.add_argument("--top", type=int, default=256_000, help="highest rate tried, packets/s")
    p.add_argument("--refine", type=int, default=3, help="bisections after the first failure")
    p.add_argument("--out", type=Path, help="write every step as JSON here")
    args = p.parse_args(argv)
    bench = Bench(args)
    bench.prepare()
    ctx = Context(bench.rack, str(args.experiment), [], [], None)
    var, _ = ctx.marker_capacities
    kind = bench.rack.vars.get("trialbed_rack_kind", "?")
    print(
        f"marker {bench.site.spec.marker} at {bench.router} ({', '.join(bench.site.ifaces)}), "
        f"{bench.sender} -> {bench.dst} out of {bench.router}:{bench.egress}; rack kind {kind}; "
        f"{args.seconds:g} s per rate",
        flush=True,
    )
    results: dict[str, list[Step]] = {}
    for implementation in args.implementations:
        print(f"{implementation}:", flush=True)
        try:
            results[implementation] = bench.search(implementation)
        except RackError as exc:  # e.g. a router that cannot build the BPF marker
            print(f"  could not run: {exc}", flush=True)
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    commit = subprocess.run(["git", "-C", str(PROJECT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    figures = {impl: carried(steps) for impl, steps in results.items()}
    lines = [f"{var}:"]
    for impl, (pps, limited) in figures.items():
        if impl != "none" and pps:
            lines.append(
                f"  {impl}: {pps}"
                + ("  # at least: the sender's limit or --top" if limited else "")
            )
    reference = figures.get("none", (None, False))[0]
    source = (
        f"make bench-marker {when} ({commit}), rack kind {kind}: the highest rate of full-size "
        f"TCP frames ({FLOWS} flows) the {bench.site.spec.marker} marker let through within "
        f"{1 - KEPT_UP:.0%} by the sender's stop and lost none of, {args.seconds:g} s per rate"
        + (f"; the router alone forwarded {reference} packets/s" if reference else "")
    )
    lines += ["  source: >-", textwrap.fill(source, 96, initial_indent=" " * 4,
                                            subsequent_indent=" " * 4)]  # fmt: skip
    print("\nPut in the inventory (inventory/virtual/group_vars/all.yml for the virtual racks):")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(
            {impl: [dataclasses.asdict(s) for s in steps] for impl, steps in results.items()},
            indent=1,
        ))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
