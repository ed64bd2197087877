#!/usr/bin/env python3
"""trialbed BPF edge marker: seed 004's per-flow markers (NM, APM, WPM, MPM) as the tc BPF
program hostside/bpf_tc/edge_marker/ on a Linux edge router's ingress, run as a daemon the
way edge_marker.py (the NFQUEUE marker, its reference) is: same options, same signals, same
stats file.

On start it builds the program and its loader once per source (<build-dir>/<sha256 of
hostside/bpf_tc>/, with ../bpf_tc/build.sh: clang, libbpf-dev, gcc), loads it once with the
parameters, attaches it to the ingress of every --iface (one program, one flow table) and
logs "ready". It never drops a packet. On SIGTERM or SIGINT it writes STATS and detaches;
the clsact qdisc it added goes too when no other filter uses it. Should it die without
that (SIGKILL), the filter stays and marks on: the next start on that interface replaces it
(same handle and priority), linux_router's teardown removes it with the clsact of an
interface it shapes, and `trialbed-bpf-tc detach IF` removes it by hand.

Usage: bpf_edge_marker.py --marker NM|APM|WPM|MPM --stats STATS.json --iface IF [--iface ...]
                          --code-points 10,12,14 [--af-class 1] [--a0 7] [--alpha 0.5]
                          [--ns 5] [--na 5] --build-dir DIR

Signals: SIGUSR1 writes STATS (atomically) and starts a new interval; SIGTERM or SIGINT
writes STATS and exits 0. STATS has edge_marker.py's keys (packets, per drop precedence and
per DSCP written, retransmissions, flows held) from the program's counters; what only a
program in user space measures (time per packet, packets/s while busy) is null. Under
"bpf": the program's id, the sha256 of its sources and of its object, its counters.
"""

import argparse
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BPF_TC = os.path.join(os.path.dirname(HERE), "bpf_tc")
PROGRAM = "edge_marker"
LOADER = "trialbed-bpf-tc"
KINDS = ("NM", "APM", "WPM", "MPM")


def log(msg):
    print(f"trialbed_bpf_edge_marker: {msg}", file=sys.stderr, flush=True)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def source_sha256(root=BPF_TC):
    """One sha256 for every file of hostside/bpf_tc: '<sha256>  <path>' lines, path order."""
    files = sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, names in os.walk(root)
        for f in names
        if not f.startswith(".")
    )
    lines = "".join(f"{sha256(os.path.join(root, p))}  {p}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def build(build_dir, digest):
    """The built object and loader for sources `digest` (built now unless already there)."""
    out = os.path.join(build_dir, digest)
    if not os.path.exists(os.path.join(out, LOADER)):
        os.makedirs(build_dir, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=build_dir, prefix=".build-")
        done = subprocess.run(
            ["sh", os.path.join(BPF_TC, "build.sh"), tmp, PROGRAM], capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(f"building {BPF_TC} failed (needs clang, libbpf-dev, gcc):\n"
                             f"{done.stderr}")  # fmt: skip
        try:
            os.rename(tmp, out)  # a marker beside this one may have built it meanwhile
        except OSError:
            subprocess.run(["rm", "-rf", tmp], check=False)
    return os.path.join(out, f"{PROGRAM}.bpf.o"), os.path.join(out, LOADER)


def loader(tool, *args):
    done = subprocess.run([tool, *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{LOADER} {' '.join(args)}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def tc_empty(iface):
    """No filter on the interface's ingress or egress hook."""
    for hook in ("ingress", "egress"):
        done = subprocess.run(["tc", "-j", "filter", "show", "dev", iface, hook],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode or json.loads(done.stdout or "[]"):
            return False
    return True


class BpfEdgeMarker:
    def __init__(self, args):
        self.args = args
        self.dscp = dict(enumerate(args.code_points, start=1))
        self.source_sha256 = source_sha256()
        self.obj, self.tool = build(args.build_dir, self.source_sha256)
        self.object_sha256 = sha256(self.obj)
        self.attached = None
        self.attaching = False
        self.flag_usr1 = self.flag_stop = False
        self.base = {}

    def params(self):
        a = self.args
        return [f"marker={a.marker}", f"a0={a.a0!r}", f"alpha={a.alpha!r}", f"n_s={a.ns}",
                f"n_a={a.na}", *(f"dscp{p}={d}" for p, d in self.dscp.items())]  # fmt: skip

    def attach(self):
        self.attaching = True
        self.attached = loader(self.tool, "attach", self.obj, *self.args.iface, *self.params())
        self.start_s = time.monotonic()

    def detach(self):
        """Every interface's filter off (an attach that failed half way left some on)."""
        try:
            loader(self.tool, "detach", *self.args.iface)
        except RuntimeError as e:
            log(str(e))
        for iface, entry in (self.attached or {}).get("interfaces", {}).items():
            if entry["clsact_added"] and tc_empty(iface):
                subprocess.run(["tc", "qdisc", "del", "dev", iface, "clsact"], check=False)
        self.attached = None

    def stats(self):
        now = loader(self.tool, "stats", str(self.attached["prog_id"]))
        counters = now["stats"]
        delta = {k: v - self.base.get(k, 0) for k, v in counters.items()}
        precedence = {str(p): delta[f"precedence{p}"] for p in (1, 2, 3)}
        written = {}
        for p, count in precedence.items():
            if count:
                dscp = str(self.dscp[int(p)])
                written[dscp] = written.get(dscp, 0) + count
        a = self.args
        return {
            "pid": os.getpid(),
            "implementation": "bpf",
            "marker": a.marker,
            "af_class": a.af_class,
            "interfaces": a.iface,
            "parameters": {"a0": a.a0, "alpha": a.alpha, "n_s": a.ns, "n_a": a.na},
            "interval_s": time.monotonic() - self.start_s,
            "packets": sum(precedence.values()) + delta["not_marked"],
            "packets_not_tcp": delta["not_marked"],
            "busy_span_s": None,
            "packets_per_s": None,
            "precedence": precedence,
            "dscp_written": dict(sorted(written.items(), key=lambda kv: int(kv[0]))),
            "retransmissions": delta["retransmissions"],
            "flows_held": now["maps"]["flows"]["entries"],
            "service_us": None,
            "bpf": {
                "source": "hostside/bpf_tc/edge_marker",
                "source_sha256": self.source_sha256,
                "object_sha256": self.object_sha256,
                "prog_id": self.attached["prog_id"],
                "params": self.attached["params"],
                "counters": delta,
            },
        }, counters

    def write_stats(self):
        stats, counters = self.stats()
        tmp = f"{self.args.stats}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(stats, f, indent=1)
        os.replace(tmp, self.args.stats)
        self.base = counters
        self.start_s = time.monotonic()

    def run(self):
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "flag_usr1", True))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(self, "flag_stop", True))
        self.attach()
        log(f"ready: marker {self.args.marker} (BPF, program {self.attached['prog_id']}) "
            f"on {self.args.iface}")  # fmt: skip
        while not self.flag_stop:
            if wake_r in select.select([wake_r], [], [], 1.0)[0]:
                os.read(wake_r, 4096)
            if self.flag_usr1:
                self.flag_usr1 = False
                self.write_stats()
        self.write_stats()


def code_points(text):
    """'10,12,14' -> (10, 12, 14): three 6-bit DSCPs."""
    values = tuple(int(v) for v in text.split(","))
    if len(values) != 3 or not all(0 <= v <= 63 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: three DSCPs 0..63, e.g. 10,12,14")
    return values


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--marker", required=True, choices=KINDS)
    p.add_argument("--stats", required=True)
    p.add_argument("--iface", action="append", required=True, help="an ingress to mark")
    p.add_argument("--af-class", type=int, default=1, choices=(1, 2, 3, 4), help="for the stats")
    p.add_argument(
        "--code-points", required=True, type=code_points,
        help="the DSCPs of drop precedence 1,2,3 (core/dscp.py af_code_points), e.g. 10,12,14",
    )  # fmt: skip
    p.add_argument("--a0", type=float, default=7.0)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--ns", type=int, default=5)
    p.add_argument("--na", type=int, default=5)
    p.add_argument("--build-dir", required=True, help="where the program is built, per source")
    return p.parse_args(argv)


def main(argv=None):
    marker = BpfEdgeMarker(parse_args(argv))
    try:
        marker.run()
    finally:
        if marker.attached is not None or marker.attaching:
            marker.detach()
    log("stopped")


if __name__ == "__main__":
    main()
