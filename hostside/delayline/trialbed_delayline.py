#!/usr/bin/env python3
"""trialbed delay line: a constant per-queue delay for kernels without sch_netem.

iptables sends each direction of the router to its own NFQUEUE number
(`iptables -t mangle -A FORWARD ... -j NFQUEUE --queue-num N`). This program
binds every configured queue, holds each packet for exactly that queue's delay
and then accepts it (a deferred verdict). It never drops a packet and adds no
rate limit and no queue limit of its own: rate and buffer belong to the tc
qdiscs. Because a queue's delay is constant, release order is arrival order,
so each queue is a FIFO and packet order is preserved.

Usage: trialbed_delayline.py --config CONFIG.json --stats STATS.json
(started and stopped through trialbed-daemon, which keeps its pid file; it logs
"ready" once it handles signals)

CONFIG: {"max_len": 20000,
         "queues": [{"num": 1, "delay_us": 25000, "label": "to-right"}, ...]}

Signals: SIGUSR1 writes STATS (atomically) and resets the counters, so a trial
runner sends it once at the start and once at the end of a trial. SIGTERM or
SIGINT writes STATS, accepts every packet still held and exits 0.
"""

import argparse
import collections
import gc
import json
import os
import select
import signal
import sys
import time
import warnings

from netfilterqueue import COPY_META, NetfilterQueue

PROC_NFQUEUE = "/proc/net/netfilter/nfnetlink_queue"
# Bytes of socket buffer per queued packet, as netfilterqueue's own default
# (4876 // 2 per packet; the kernel doubles it): a stall of the event loop then
# overflows the kernel queue (max_len) long before the netlink socket.
SOCK_BYTES_PER_PACKET = 2438
# The loop wakes at least this often, so that it notices when the machine stops running it
# (measured on the 2-vCPU CI VM: a SCHED_FIFO loop is sometimes descheduled for 30-90 ms).
HEARTBEAT_NS = 1_000_000
# A wake-up later than this is recorded as a stall, with its wall-clock time: while this
# process is stalled the kernel's own timers (HTB) are most likely stalled too, so packets
# crossing the router then did not see the emulated link.
STALL_US = 2000
MAX_STALLS = 10000


def log(msg):
    print(f"trialbed_delayline: {msg}", file=sys.stderr, flush=True)


def kernel_counters():
    """Per queue number: (queue_dropped, user_dropped) from the kernel.

    Columns: queue, portid, queued now, copy mode, copy range, queue_dropped
    (kernel queue full), user_dropped (netlink socket full), last id, 1.
    """
    counters = {}
    with open(PROC_NFQUEUE) as f:
        for line in f:
            cols = [int(c) for c in line.split()]
            counters[cols[0]] = (cols[5], cols[6])
    return counters


class Queue:
    """One NFQUEUE: packets held in arrival order, and this interval's counters."""

    def __init__(self, num, delay_us, label, max_len):
        self.num, self.label = num, label
        self.delay_ns = delay_us * 1000
        self.held = collections.deque()  # (due_ns, packet), due times non-decreasing
        self.nfq = NetfilterQueue()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.nfq.bind(
                num, self._arrive, max_len=max_len, mode=COPY_META,
                sock_len=max_len * SOCK_BYTES_PER_PACKET,
            )  # fmt: skip
        for w in caught:  # the kernel capped the socket buffer: say so, carry on
            log(f"queue {num}: {w.message}")
        self.fd = self.nfq.get_fd()
        self.kernel_base = kernel_counters().get(num, (0, 0))
        self.reset()

    def reset(self):
        self.packets = 0
        self.max_held = len(self.held)
        # Lateness histogram in whole microseconds: exact percentiles, memory
        # bounded by the spread of lateness rather than by packet count, and no
        # sort of millions of samples that would stall the loop at a USR1.
        self.lateness = collections.Counter()

    def _arrive(self, packet):
        # Stamp on arrival in user space: the kernel's timestamp is present
        # only while some socket on the host asks for timestamps, and it is on
        # the wall clock.
        self.held.append((time.monotonic_ns() + self.delay_ns, packet))
        self.packets += 1
        self.max_held = max(self.max_held, len(self.held))

    def release_due(self, now):
        held, lateness = self.held, self.lateness
        while held and held[0][0] <= now:
            due, packet = held.popleft()
            packet.accept()
            lateness[(time.monotonic_ns() - due) // 1000] += 1

    def stats(self):
        n = sum(self.lateness.values())
        late = {"count": n, "mean": None, "p50": None, "p99": None, "max": None}
        if n:
            values = sorted(self.lateness)
            late["mean"] = sum(v * c for v, c in self.lateness.items()) / n
            late["max"] = values[-1]
            for name, q in (("p50", 0.50), ("p99", 0.99)):
                rank, seen = q * n, 0
                for v in values:
                    seen += self.lateness[v]
                    if seen >= rank:
                        late[name] = v
                        break
        queue_dropped, user_dropped = kernel_counters().get(self.num, (0, 0))
        base_q, base_u = self.kernel_base
        self.kernel_base = (queue_dropped, user_dropped)
        return {
            "num": self.num,
            "label": self.label,
            "delay_us": self.delay_ns // 1000,
            "packets": self.packets,
            "held_now": len(self.held),
            "max_held": self.max_held,
            "lateness_us": late,
            "kernel": {
                "queue_dropped": queue_dropped - base_q,
                "user_dropped": user_dropped - base_u,
            },
        }


class DelayLine:
    def __init__(self, config, stats_path):
        self.stats_path, self.max_len = stats_path, config["max_len"]
        self.queues = [
            Queue(q["num"], q["delay_us"], q.get("label", ""), config["max_len"])
            for q in config["queues"]
        ]
        self.by_fd = {q.fd: q for q in self.queues}
        self.sched_fifo = raise_priority()
        self.interval_start = time.monotonic_ns()
        self.flag_usr1 = self.flag_stop = False
        self.stalls = []  # [wall-clock ns at the end of the stall, its length in us]

    def record_stall(self, lag_ns):
        if len(self.stalls) < MAX_STALLS:
            self.stalls.append([time.time_ns(), lag_ns // 1000])

    def write_stats(self):
        now = time.monotonic_ns()
        stats = {
            "pid": os.getpid(),
            "sched_fifo": self.sched_fifo,
            "max_len": self.max_len,
            "interval_ns": {"start": self.interval_start, "end": now},
            "queues": [q.stats() for q in self.queues],
            "stalls": {
                "threshold_us": STALL_US,
                "heartbeat_us": HEARTBEAT_NS // 1000,
                "count": len(self.stalls),
                "total_us": sum(us for _, us in self.stalls),
                "events": self.stalls,
            },
        }
        tmp = f"{self.stats_path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(stats, f, indent=1)
        os.replace(tmp, self.stats_path)
        for q in self.queues:
            q.reset()
        self.stalls = []
        self.interval_start = now

    def catch_signals(self):
        # Handlers only set flags; the wakeup fd makes select() return so they
        # are acted on at once, between two packets, never in the middle of one.
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "flag_usr1", True))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(self, "flag_stop", True))

    def run(self):
        wake_r = self.wake_r
        fds = [*self.by_fd, wake_r]
        while not self.flag_stop:
            start = time.monotonic_ns()
            wake_by = min([start + HEARTBEAT_NS] + [q.held[0][0] for q in self.queues if q.held])
            # Round up to the next microsecond (select's resolution) so we
            # do not wake just before the due time and spin.
            timeout = max(0, -(-(wake_by - start) // 1000)) / 1e6
            ready, _, _ = select.select(fds, [], [], timeout)
            woke = time.monotonic_ns()
            for fd in ready:
                if fd == wake_r:
                    os.read(wake_r, 4096)  # one byte per signal; the flags say which
                else:
                    self.by_fd[fd].nfq.run(block=False)
            now = time.monotonic_ns()
            for q in self.queues:
                q.release_due(now)
            # From the moment we should have been running (the deadline, or the earlier
            # wake-up by a packet) to the end of this round: more than STALL_US is a stall.
            lag = time.monotonic_ns() - min(wake_by, woke)
            if lag > STALL_US * 1000:
                self.record_stall(lag)
            if self.flag_usr1:
                self.flag_usr1 = False
                self.write_stats()
        # Stopping: take in what is still in the sockets so the last stats
        # count it, then let everything held go at once, early rather than lost.
        for q in self.queues:
            q.nfq.run(block=False)
        self.write_stats()
        self.flush()

    def flush(self):
        """Accept everything held or waiting in the sockets: stopping must not drop."""
        for q in self.queues:
            q.nfq.run(block=False)
            while q.held:
                q.held.popleft()[1].accept()
            # Packets that arrive after unbind are dropped by the kernel (no
            # --queue-bypass): remove the iptables rules before stopping us.
            q.nfq.unbind()


def raise_priority():
    """Try SCHED_FIFO 50, so that busy processes on the router cannot hold back verdicts.

    Measured on a 2-CPU VM with busy loops running: mean lateness under 0.1 ms
    with it and 1-5 ms without; worst case up to 13 ms with it, 90 ms without.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    except OSError as e:
        log(f"SCHED_FIFO not available ({e}); running at normal priority")
        return False
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="JSON: max_len and queues")
    parser.add_argument("--stats", required=True, help="where SIGUSR1/SIGTERM write stats")
    args = parser.parse_args(argv)
    with open(args.config) as f:
        config = json.load(f)

    line = DelayLine(config, args.stats)
    for q in line.queues:
        log(f"queue {q.num} ({q.label}): delay {q.delay_ns // 1000} us")
    log(f"max_len {config['max_len']}, sched_fifo {line.sched_fifo}, pid {os.getpid()}")
    # Nothing here forms reference cycles, and a full collection (about 1 ms
    # with a few thousand packets held) would delay every due verdict.
    gc.disable()
    line.catch_signals()
    log("ready")  # whoever waits for this line may signal at once
    line.run()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
