#!/usr/bin/env python3
"""trialbed edge marker: seed 004's per-flow markers (NM, APM, WPM, MPM) on a Linux edge
router's packet path, for kernels without nftables' `queue` statement.

iptables sends the packets to mark to one NFQUEUE; this program binds it, runs each IPv4
TCP packet through the marker (markers.py beside this file: the same state machines the unit
tests check), writes the DSCP of the drop precedence it gets (AF<c><p>; the ECN bits kept),
fixes the IP header checksum (RFC 1624 incremental update) and accepts
the packet. Other packets are accepted unchanged. It never drops.

With --iface IF (repeatable) it adds the rules itself once bound, and removes them on exit:
    iptables -t mangle -A PREROUTING -i IF -p tcp -j NFQUEUE --queue-num N --queue-bypass
(PREROUTING: the delay line's rules in mangle FORWARD still see every packet after the
verdict; --queue-bypass: should this program die, packets pass unmarked, not dropped).
Without --iface the rules are the caller's.

Usage: edge_marker.py --queue N --marker NM|APM|WPM|MPM --stats STATS.json [--iface IF ...]
                      [--af-class 1] [--a0 7] [--alpha 0.5] [--ns 5] [--na 5]
(started and stopped through trialbed-daemon; it logs "ready" once its rules are in place)

Signals: SIGUSR1 writes STATS (atomically) and resets the interval's counters; SIGTERM or
SIGINT writes STATS and exits 0. STATS: packets and packets/s over the interval, packets per
drop precedence and per DSCP written, retransmissions seen, flows held, and the time each
packet spent in this program (arrival in user space to verdict) in microseconds.
"""

import argparse
import collections
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from markers import Marker
from netfilterqueue import COPY_PACKET, NetfilterQueue

SOCK_BYTES_PER_PACKET = 2438  # as the delay line: the kernel queue overflows first
EXPIRE_EVERY_NS = 10 * 10**9
TCP = 6


def log(msg):
    print(f"trialbed_edge_marker: {msg}", file=sys.stderr, flush=True)


def rule(action, iface, queue):
    return ["iptables", "-w", "-t", "mangle", action, "PREROUTING", "-i", iface, "-p", "tcp",
            "-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]  # fmt: skip


def checksum_update(old_sum, old_word, new_word):
    """RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'), ones' complement 16-bit arithmetic."""
    s = (~old_sum & 0xFFFF) + (~old_word & 0xFFFF) + new_word
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def tcp_fields(raw):
    """(key, seq, payload length, flags) of the IPv4 TCP packet `raw` as the marker takes them
    (markers.py's Marker.mark), or None for another packet."""
    if len(raw) < 20 or raw[0] >> 4 != 4 or raw[9] != TCP:
        return None
    ihl = (raw[0] & 0x0F) * 4
    total = (raw[2] << 8) | raw[3]
    sport, dport, seq = struct.unpack_from("!HHI", raw, ihl)
    doff = (raw[ihl + 12] >> 4) * 4
    flags = raw[ihl + 13]
    return (raw[12:16], raw[16:20], sport, dport), seq, total - ihl - doff, flags


def remark(raw, dscp):
    """The IPv4 packet `raw` with DSCP `dscp` (ECN kept) and its header checksum fixed; the
    same object when the DSCP is already right."""
    tos = raw[1]
    new_tos = (dscp << 2) | (tos & 0x03)
    if new_tos == tos:
        return raw
    old_word, new_word = (raw[0] << 8) | tos, (raw[0] << 8) | new_tos
    (old_sum,) = struct.unpack_from("!H", raw, 10)
    out = bytearray(raw)
    out[1] = new_tos
    struct.pack_into("!H", out, 10, checksum_update(old_sum, old_word, new_word))
    return bytes(out)


class EdgeMarker:
    def __init__(self, args):
        self.args = args
        self.marker = Marker(args.marker, a0=args.a0, alpha=args.alpha, n_s=args.ns, n_a=args.na)
        self.dscp = dict(enumerate(args.code_points, start=1))
        self.nfq = NetfilterQueue()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.nfq.bind(
                args.queue, self.packet, max_len=args.max_len, mode=COPY_PACKET,
                sock_len=args.max_len * SOCK_BYTES_PER_PACKET,
            )  # fmt: skip
        for w in caught:
            log(f"queue {args.queue}: {w.message}")
        self.flag_usr1 = self.flag_stop = False
        self.rules = []  # interfaces whose rule this program added
        self.last_expire = time.monotonic_ns()
        self.reset()

    def reset(self):
        self.start_ns = time.monotonic_ns()
        self.packets = self.other = 0
        self.first_ns = self.last_ns = None
        self.dscp_written = collections.Counter()
        self.service_us = collections.Counter()  # histogram in whole microseconds
        self.base_counts = dict(self.marker.counts)
        self.base_retrans = self.marker.retransmissions

    def packet(self, pkt):
        t = time.monotonic_ns()
        raw = pkt.get_payload()
        fields = tcp_fields(raw)
        if fields:
            p = self.marker.mark(*fields, t)
            dscp = self.dscp[p]
            out = remark(raw, dscp)
            if out is not raw:
                pkt.set_payload(out)
            self.dscp_written[dscp] += 1
        else:
            self.other += 1
        pkt.accept()
        done = time.monotonic_ns()
        self.packets += 1
        self.first_ns = self.first_ns or t
        self.last_ns = done
        self.service_us[(done - t) // 1000] += 1

    def stats(self):
        n = sum(self.service_us.values())
        service = {"count": n, "mean": None, "p50": None, "p99": None, "max": None}
        if n:
            values = sorted(self.service_us)
            service["mean"] = sum(v * c for v, c in self.service_us.items()) / n
            service["max"] = values[-1]
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                seen = 0
                for v in values:
                    seen += self.service_us[v]
                    if seen >= q * n:
                        service[name] = v
                        break
        span = (self.last_ns - self.first_ns) / 1e9 if self.packets > 1 else 0.0
        return {
            "pid": os.getpid(),
            "queue": self.args.queue,
            "marker": self.args.marker,
            "af_class": self.args.af_class,
            "interfaces": self.args.iface,
            "parameters": {
                "a0": self.args.a0,
                "alpha": self.args.alpha,
                "n_s": self.args.ns,
                "n_a": self.args.na,
            },
            "interval_s": (time.monotonic_ns() - self.start_ns) / 1e9,
            "packets": self.packets,
            "packets_not_tcp": self.other,
            "busy_span_s": span,
            "packets_per_s": self.packets / span if span > 0 else None,
            "precedence": {str(p): c - self.base_counts[p] for p, c in self.marker.counts.items()},
            "dscp_written": {str(d): c for d, c in sorted(self.dscp_written.items())},
            "retransmissions": self.marker.retransmissions - self.base_retrans,
            "flows_held": len(self.marker.flows),
            "service_us": service,
        }

    def write_stats(self):
        tmp = f"{self.args.stats}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.stats(), f, indent=1)
        os.replace(tmp, self.args.stats)
        self.reset()

    def run(self):
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "flag_usr1", True))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(self, "flag_stop", True))
        fd = self.nfq.get_fd()
        for iface in self.args.iface:
            subprocess.run(rule("-A", iface, self.args.queue), check=True)
            self.rules.append(iface)
        log(f"ready: queue {self.args.queue}, marker {self.args.marker}, on {self.args.iface}")
        while not self.flag_stop:
            ready, _, _ = select.select([fd, wake_r], [], [], 1.0)
            if fd in ready:
                self.nfq.run(block=False)
            if wake_r in ready:
                os.read(wake_r, 4096)
            now = time.monotonic_ns()
            if now - self.last_expire > EXPIRE_EVERY_NS:
                self.marker.expire(now)
                self.last_expire = now
            if self.flag_usr1:
                self.flag_usr1 = False
                self.write_stats()
        self.remove_rules()
        self.nfq.run(block=False)
        self.write_stats()
        self.nfq.unbind()

    def remove_rules(self):
        while self.rules:
            iface = self.rules.pop()
            done = subprocess.run(rule("-D", iface, self.args.queue), capture_output=True)
            if done.returncode:
                log(f"could not remove the rule on {iface}: {done.stderr.decode().strip()}")


def raise_priority():
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    except OSError as e:
        log(f"SCHED_FIFO not available ({e}); running at normal priority")
        return False
    return True


def code_points(text):
    """'10,12,14' -> (10, 12, 14): three 6-bit DSCPs."""
    values = tuple(int(v) for v in text.split(","))
    if len(values) != 3 or not all(0 <= v <= 63 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: three DSCPs 0..63, e.g. 10,12,14")
    return values


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queue", type=int, required=True, help="NFQUEUE number")
    p.add_argument("--marker", required=True, choices=Marker.KINDS)
    p.add_argument("--stats", required=True)
    p.add_argument("--iface", action="append", default=[], help="add/remove its own rule here")
    p.add_argument("--af-class", type=int, default=1, choices=(1, 2, 3, 4), help="for the stats")
    p.add_argument(
        "--code-points", required=True, type=code_points,
        help="the DSCPs of drop precedence 1,2,3 (core/dscp.py af_code_points), e.g. 10,12,14",
    )  # fmt: skip
    p.add_argument("--a0", type=float, default=7.0)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--ns", type=int, default=5)
    p.add_argument("--na", type=int, default=5)
    p.add_argument("--max-len", type=int, default=20000)
    p.add_argument("--normal-priority", action="store_true", help="do not ask for SCHED_FIFO")
    args = p.parse_args(argv)
    if not args.normal_priority:
        raise_priority()
    marker = EdgeMarker(args)
    try:
        marker.run()
    finally:
        marker.remove_rules()
    log("stopped")


if __name__ == "__main__":
    main()
