#!/usr/bin/env python3
"""Record SIFTR (siftr(4)) on a FreeBSD TCP sender into a file of the trial directory: the
FreeBSD counterpart of tcp_probe.py, read by analysis.siftr into the same cwnd table.

SIFTR is one kernel module per host with one log file, written by the kernel: this script
loads it if needed (kldload siftr), refuses to start while another recording has it enabled,
points net.inet.siftr.logfile at OUT (an absolute path), logs every packet (ppl=1), only the
trial's port if --port is given (port_filter, FreeBSD 14 onwards), and enables it. It prints
"recording siftr" to stderr (the daemon's log) once enabled and runs until SIGTERM or SIGINT;
then it disables SIFTR (the kernel writes its disable line and flushes the log) and gives
logfile, ppl and port_filter back their earlier values.

usage: siftr.py [--out siftr.log] [--port PORT] [--sysctl /sbin/sysctl] [--kldload /sbin/kldload]
"""

import argparse
import os
import signal
import subprocess
import sys
import time

PREFIX = "net.inet.siftr."


class Stop(Exception):
    pass


class Failed(Exception):
    """A sysctl that did not take: its command and message."""


def _stop(_signum, _frame):
    raise Stop


def main() -> int:
    ap = argparse.ArgumentParser(description="record SIFTR into a file")
    ap.add_argument("--out", default="siftr.log")
    ap.add_argument("--port", type=int, help="log only this port's flows (port_filter)")
    ap.add_argument("--sysctl", default="/sbin/sysctl")
    ap.add_argument("--kldload", default="/sbin/kldload")
    args = ap.parse_args()

    def get(name: str) -> str | None:
        done = subprocess.run(
            [args.sysctl, "-n", PREFIX + name], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else None

    def set_(name: str, value: str) -> None:
        done = subprocess.run(
            [args.sysctl, f"{PREFIX}{name}={value}"], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise Failed(f"{args.sysctl} {PREFIX}{name}={value}: {done.stderr.strip()}")

    if get("enabled") is None:
        loaded = subprocess.run([args.kldload, "siftr"], capture_output=True, text=True)
        if get("enabled") is None:
            print(
                f"siftr: the SIFTR module is not available ({args.kldload} siftr: "
                f"{(loaded.stderr or loaded.stdout).strip() or 'exit ' + str(loaded.returncode)})",
                file=sys.stderr,
            )
            return 1
    if get("enabled") == "1":
        print(
            f"siftr: SIFTR is already enabled on this host (logging to {get('logfile')}): "
            "another recording is running; it has one log per host",
            file=sys.stderr,
        )
        return 1
    earlier = {name: get(name) for name in ("logfile", "ppl", "port_filter")}
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    out = os.path.abspath(args.out)
    try:
        set_("logfile", out)
        set_("ppl", "1")
        if args.port is not None:
            if earlier["port_filter"] is None:
                print("siftr: this SIFTR has no port_filter (before FreeBSD 14)", file=sys.stderr)
                return 1
            set_("port_filter", str(args.port))
        set_("enabled", "1")
        print(f"recording siftr into {out}", file=sys.stderr, flush=True)  # the runner waits
        while True:
            time.sleep(3600)
    except Stop:
        pass
    except Failed as e:
        print(f"siftr: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        set_("enabled", "0")
        for name, value in earlier.items():
            if value is not None:
                set_(name, value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
