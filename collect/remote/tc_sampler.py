#!/usr/bin/env python3
"""Sample `tc -s -j qdisc show` every INTERVAL ms; one JSON line per sample and device:

    {"ts_ns": <CLOCK_REALTIME ns, midpoint of the tc call>, "spread_ns": <tc call duration>,
     "dev": "eth1", "qdiscs": [<tc's JSON objects for that device>]}

Runs until SIGTERM or SIGINT, then writes a last line {"end": true, "samples": N,
"skipped": M, "failed": F} (M: slots missed because a call overran; F: tc calls that
failed). Samples sit on a fixed grid of
absolute times, so they do not drift. Standard library only: it runs on any rack host with
python3 and iproute2 (tc with -j).

usage: tc_sampler.py [--interval-ms 10] [--out FILE] DEV [DEV...]
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
    ap = argparse.ArgumentParser(description="sample tc -s qdisc counters")
    ap.add_argument("--interval-ms", type=float, default=10.0)
    ap.add_argument("--out", default="-")
    ap.add_argument("devices", nargs="+")
    args = ap.parse_args()
    devices = set(args.devices)
    out = sys.stdout if args.out == "-" else open(args.out, "w", buffering=1)  # noqa: SIM115
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    period = int(args.interval_ms * 1e6)
    samples = skipped = failed = 0
    # One call shows every device (each object carries "dev"): one fork per sample.
    cmd = ["tc", "-s", "-j", "qdisc", "show"]
    try:
        next_ns = time.time_ns()
        while True:
            t0 = time.time_ns()
            run = subprocess.run(cmd, capture_output=True, text=True, check=False)
            t1 = time.time_ns()
            text = run.stdout if run.returncode == 0 else ""
            failed += run.returncode != 0
            by_dev = {}
            for q in json.loads(text or "[]"):
                if q.get("dev") in devices:
                    by_dev.setdefault(q["dev"], []).append(q)
            for dev in sorted(by_dev):
                line = {"ts_ns": (t0 + t1) // 2, "spread_ns": t1 - t0, "dev": dev}
                out.write(json.dumps({**line, "qdiscs": by_dev[dev]}) + "\n")
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
