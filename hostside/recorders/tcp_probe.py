#!/usr/bin/env python3
"""Record the tcp:tcp_probe tracepoint for the trial's flows into a text file.

Uses its own tracefs instance (instances/trialbed-<tag>-<pid>), so it neither consumes nor
disturbs the global trace buffer or another recorder (the virtual rack's hosts share one
kernel: every namespace's sockets fire the tracepoint). Keeps only events whose src or dest
address is one of ADDR (the trial's hosts). The instance's clock is CLOCK_MONOTONIC
("mono"); the first line of the output gives its offset to CLOCK_REALTIME (the clock of the
captures) as JSON:

    # trialbed-tcp-probe {"clock": "mono", "realtime_minus_clock_ns": ..., "addresses": [...]}

then the trace lines as the kernel prints them, e.g.

    iperf3-1234 [001] ..s1. 5678.901234: tcp_probe: family=AF_INET src=198.18.1.1:40000
    dest=198.18.2.2:5201 mark=0x0 data_len=0 snd_nxt=0x... snd_una=0x... snd_cwnd=10 ...

Mounts tracefs at /sys/kernel/tracing if it is not mounted (needs root). Prints
"recording tcp_probe" to stderr (the daemon's log) once the event is enabled. Runs until
SIGTERM or SIGINT; then drains what the buffer still holds, removes the instance and writes
"# end {"events": N, "lost": L}" (L: events the kernel dropped for a full buffer, from
per_cpu stats).

usage: tcp_probe.py [--out FILE] [--tag TAG] [--buffer-kb 4096] ADDR [ADDR...]
"""

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

TRACEFS = "/sys/kernel/tracing"


class Stop(Exception):
    pass


def _stop(_signum, _frame):
    raise Stop


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def mount_tracefs() -> None:
    if not os.path.exists(f"{TRACEFS}/instances"):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], check=True)


def clock_offset_ns() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few paired readings."""
    best = None
    for _ in range(20):
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    return best[1]


def lost_events(inst: str) -> int:
    lost = 0
    for cpu in os.listdir(f"{inst}/per_cpu"):
        try:
            with open(f"{inst}/per_cpu/{cpu}/stats") as f:
                m = re.search(r"^overrun: (\d+)", f.read(), re.M)
            lost += int(m[1]) if m else 0
        except OSError:
            pass
    return lost


def main() -> int:
    ap = argparse.ArgumentParser(description="record tcp:tcp_probe for some addresses")
    ap.add_argument("--out", default="-")
    ap.add_argument("--tag", default="probe")
    ap.add_argument("--buffer-kb", type=int, default=4096)
    ap.add_argument("addresses", nargs="+")
    args = ap.parse_args()
    # "src=198.18.1.1:40000" or "dest=..."; IPv6 is printed as [addr]:port.
    wanted = re.compile(
        r" (?:src|dest)=\[?(?:" + "|".join(re.escape(a) for a in args.addresses) + r")\]?:\d"
    )
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    mount_tracefs()
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", args.tag)[:40]
    inst = f"{TRACEFS}/instances/trialbed-{tag}-{os.getpid()}"
    os.mkdir(inst)
    events = 0
    out = sys.stdout if args.out == "-" else open(args.out, "w", buffering=1)  # noqa: SIM115
    try:
        _write(f"{inst}/buffer_size_kb", str(args.buffer_kb))
        _write(f"{inst}/trace_clock", "mono")
        meta = {
            "clock": "mono",
            "realtime_minus_clock_ns": clock_offset_ns(),
            "addresses": args.addresses,
            "kernel": os.uname().release,
        }
        out.write("# trialbed-tcp-probe " + json.dumps(meta) + "\n")
        _write(f"{inst}/events/tcp/tcp_probe/enable", "1")
        print(f"recording tcp_probe into {args.out}", file=sys.stderr, flush=True)  # runner waits
        try:
            with open(f"{inst}/trace_pipe", "rb", buffering=0) as pipe:
                pending = b""
                while True:
                    chunk = pipe.read(65536)
                    if not chunk:
                        continue
                    lines = (pending + chunk).split(b"\n")
                    pending = lines.pop()
                    for raw in lines:
                        line = raw.decode(errors="replace")
                        if wanted.search(line):
                            out.write(line + "\n")
                            events += 1
        except Stop:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        _write(f"{inst}/events/tcp/tcp_probe/enable", "0")
        with open(f"{inst}/trace") as f:  # what trace_pipe had not handed out yet
            for line in f:
                if not line.startswith("#") and wanted.search(line):
                    out.write(line)
                    events += 1
        out.write("# end " + json.dumps({"events": events, "lost": lost_events(inst)}) + "\n")
    finally:
        out.flush()
        with contextlib.suppress(OSError):
            _write(f"{inst}/events/tcp/tcp_probe/enable", "0")
        os.rmdir(inst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
