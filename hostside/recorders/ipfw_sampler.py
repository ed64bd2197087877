#!/usr/bin/env python3
"""Sample `ipfw pipe N... show` on a FreeBSD dummynet router every INTERVAL ms; one JSON line
per sample:

    {"ts_ns": <CLOCK_REALTIME ns, midpoint of the ipfw call>, "spread_ns": <call duration>,
     "devs": {"10001": "em1", ...}, "text": "<ipfw's output, as printed>"}

An interface with qdisc rio (DEV=PIPE/IN,OUT) holds its packets in two dummynet queues (RED
flowsets IN and OUT on the pipe), not in the pipe's own queue, which stays empty: for it the
sampler reads `ipfw queue show IN OUT` instead, and the line says so with two more keys,

    "rio": {"em2": {"pipe": 10002, "in": 10002, "out": 10004}}, "queue_text": "<its output>"

("devs" and "text" are then those of the other pipes: {} and "" when every one is rio). With
both kinds, both commands run and ts_ns/spread_ns span the two. Lines without a rio interface
are as they always were.

The text is kept as ipfw prints it and parsed on the controller (analysis.ipfw_samples), so
that a parser fix needs no new trial. Runs until SIGTERM or SIGINT, then writes a last line
{"end": true, "samples": N, "skipped": M, "failed": F}, like tc_sampler.py (failed: samples
where an ipfw call failed; those write no line). Standard library only.

usage: ipfw_sampler.py [--interval-ms 10] [--out FILE] [--ipfw /sbin/ipfw]
                       DEV=PIPE | DEV=PIPE/IN,OUT ...
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
    ap = argparse.ArgumentParser(description="sample ipfw pipe show (and queue show)")
    ap.add_argument("--interval-ms", type=float, default=10.0)
    ap.add_argument("--out", default="-")
    ap.add_argument("--ipfw", default="/sbin/ipfw")
    ap.add_argument(
        "pipes",
        nargs="+",
        help="egress interface=pipe number, e.g. em1=10001; a rio interface with its IN and "
        "OUT queue numbers, e.g. em2=10002/10002,10004",
    )
    args = ap.parse_args()
    devs, rio = {}, {}
    for spec in args.pipes:
        dev, _, number = spec.partition("=")
        number, slash, pair = number.partition("/")
        q_in, _, q_out = pair.partition(",")
        numbers = [number, q_in, q_out] if slash else [number]
        if not dev or not all(n.isdigit() for n in numbers):
            ap.error(f"{spec!r}: give DEV=PIPE or DEV=PIPE/IN,OUT, e.g. em1=10001")
        if slash:
            rio[dev] = {"pipe": int(number), "in": int(q_in), "out": int(q_out)}
        else:
            devs[number] = dev
    out = sys.stdout if args.out == "-" else open(args.out, "w", buffering=1)  # noqa: SIM115
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    period = int(args.interval_ms * 1e6)
    samples = skipped = failed = 0
    # `ipfw pipe show N M` (ipfw(8) synopsis; `pipe N show` takes one number only), one fork
    # per sample; `ipfw queue show N M` for the rio interfaces' queues (a second one).
    commands = []
    if devs:
        commands.append(("text", [args.ipfw, "pipe", "show", *sorted(devs, key=int)]))
    if rio:
        queues = sorted({q[p] for q in rio.values() for p in ("in", "out")})
        commands.append(("queue_text", [args.ipfw, "queue", "show", *map(str, queues)]))
    try:
        next_ns = time.time_ns()
        while True:
            t0 = time.time_ns()
            runs = [
                (key, subprocess.run(cmd, capture_output=True, text=True, check=False))
                for key, cmd in commands
            ]
            t1 = time.time_ns()
            ok = all(run.returncode == 0 for _, run in runs)
            failed += not ok
            if ok:
                line = {"ts_ns": (t0 + t1) // 2, "spread_ns": t1 - t0, "devs": devs}
                texts = {"text": "", **{key: run.stdout for key, run in runs}}
                if rio:
                    line["rio"] = rio
                out.write(json.dumps({**line, **texts}) + "\n")
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
