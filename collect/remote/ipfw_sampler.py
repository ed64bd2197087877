#!/usr/bin/env python3
"""Sample `ipfw pipe N... show` on a FreeBSD dummynet router every INTERVAL ms; one JSON line
per sample:

    {"ts_ns": <CLOCK_REALTIME ns, midpoint of the ipfw call>, "spread_ns": <call duration>,
     "devs": {"10001": "em1", ...}, "text": "<ipfw's output, as printed>"}

The text is kept as ipfw prints it and parsed on the controller (analysis.ipfw_samples), so
that a parser fix needs no new trial. Runs until SIGTERM or SIGINT, then writes a last line
{"end": true, "samples": N, "skipped": M, "failed": F}, like tc_sampler.py. Standard library
only.

usage: ipfw_sampler.py [--interval-ms 10] [--out FILE] [--ipfw /sbin/ipfw] DEV=PIPE...
"""

import argparse
import json
import signal
import subprocess
import sys
import time


class Stop(Exception):
    pass


def _stop(_signum, _frame):
    raise Stop


def main() -> int:
    ap = argparse.ArgumentParser(description="sample ipfw pipe show")
    ap.add_argument("--interval-ms", type=float, default=10.0)
    ap.add_argument("--out", default="-")
    ap.add_argument("--ipfw", default="/sbin/ipfw")
    ap.add_argument("pipes", nargs="+", help="egress interface=pipe number, e.g. em1=10001")
    args = ap.parse_args()
    devs = {}
    for spec in args.pipes:
        dev, _, number = spec.partition("=")
        if not number.isdigit():
            ap.error(f"{spec!r}: give DEV=PIPE, e.g. em1=10001")
        devs[number] = dev
    out = sys.stdout if args.out == "-" else open(args.out, "w", buffering=1)  # noqa: SIM115
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    period = int(args.interval_ms * 1e6)
    samples = skipped = failed = 0
    # `ipfw pipe show N M` (ipfw(8) synopsis; `pipe N show` takes one number only).
    cmd = [args.ipfw, "pipe", "show", *sorted(devs, key=int)]  # one fork per sample
    try:
        next_ns = time.time_ns()
        while True:
            t0 = time.time_ns()
            run = subprocess.run(cmd, capture_output=True, text=True, check=False)
            t1 = time.time_ns()
            failed += run.returncode != 0
            if run.returncode == 0:
                line = {"ts_ns": (t0 + t1) // 2, "spread_ns": t1 - t0, "devs": devs}
                out.write(json.dumps({**line, "text": run.stdout}) + "\n")
            samples += 1
            next_ns += period
            now = time.time_ns()
            if now >= next_ns:  # overran: skip to the next slot on the grid
                missed = (now - next_ns) // period + 1
                skipped += missed
                next_ns += missed * period
            # One reading of the clock: two could straddle the deadline and ask for a
            # negative sleep (seen once in CI: the sampler died with ValueError).
            wait_ns = next_ns - time.time_ns()
            if wait_ns > 0:
                time.sleep(wait_ns / 1e9)
    except Stop:
        pass
    out.write(
        json.dumps({"end": True, "samples": samples, "skipped": skipped, "failed": failed}) + "\n"
    )
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
