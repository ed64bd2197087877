"""Benchmark (not a test): the project's analysis of a trial against tcptrace, tshark,
tcpdump and cat, on generated captures with real TCP dynamics, in one run.

    .venv/bin/python tests/bench/bench_analysis.py [--packets 300000,3000000] [--dir /var/tmp]
        [--repeat 3] [--no-tshark] [--keep]

For each size, tests/analysis/tcpgen.py writes a capture before a bottleneck router and one
after it (8 bulk TCP flows with handshake, delayed ACKs, losses, fast retransmissions and
sequence wraparound, plus a UDP stream). Every contender runs as its own process; wall time
is the best of --repeat runs (tshark: one run), with that run's CPU time and the process's
peak RSS (from wait4). The project's analysis of the trial: read both captures, goodput
(after), retransmissions (before), one-way delay of the UDP stream, the bottleneck queue
(match before/after + occupancy over time). The tools read only the capture before the
router: the project does more work than they do. The project's bytes and retransmissions are
checked against tcptrace's on the same file.

Targets (issue 6): >= 5x faster than tcptrace, >= 50x faster than tshark on 3 M packets,
within 10x of cat, peak RSS below the file size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "analysis"))

TSHARK_FIELDS = (
    "frame.time_epoch ip.src ip.dst tcp.srcport tcp.dstport tcp.seq_raw tcp.ack_raw tcp.len "
    "tcp.analysis.retransmission udp.srcport udp.dstport"
)
MAX_DELAY_NS = 2 * 10**9


def analyse(before: Path, after: Path) -> dict:
    """The analysis of one trial, stage by stage (runs in its own process)."""
    from analysis.match import match_packets
    from analysis.metrics import one_way_delay, summarize_owd, tcp_goodput, tcp_retransmissions
    from analysis.pcap import read_pcap
    from analysis.queue import crossing, queue_occupancy

    stages: dict[str, float] = {}
    t = time.perf_counter()

    def stage(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        stages[name] = now - t
        t = now

    b = read_pcap(before)
    a = read_pcap(after)
    stage("read")
    goodput = tcp_goodput(a)
    stage("goodput")
    retx = tcp_retransmissions(b)
    sent = tcp_goodput(b)  # the same flow table: acked bytes seen at the sender's side
    stage("retransmissions")
    udp_b, udp_a = b[b.proto.to_numpy() == 17], a[a.proto.to_numpy() == 17]
    owd = summarize_owd(one_way_delay(udp_b, udp_a, max_delay_ns=MAX_DELAY_NS))
    stage("owd")
    pairs = {(int(s), int(d)) for s, d in zip(retx.src, retx.dst, strict=True)}
    pairs |= {(int(s), int(d)) for s, d in zip(udp_b.src[:1], udp_b.dst[:1], strict=True)}
    matched = match_packets(crossing(b, pairs), crossing(a, pairs), max_delay_ns=MAX_DELAY_NS)
    queue = queue_occupancy(matched, max_delay_ns=MAX_DELAY_NS)
    stage("queue")
    flows = retx.merge(sent[["src", "dst", "sport", "dport", "bytes"]])
    return {
        "stages": stages,
        "packets": [len(b), len(a)],
        "flows": [{k: int(v) for k, v in row.items()} for row in flows.to_dict("records")],
        "goodput_bytes_after": int(goodput.bytes.sum()),
        "udp_lost": owd["lost"],
        "owd_median_ms": owd["median_ms"],
        "queue_events": len(queue),
        "queue_max_packets": int(queue.packets.max()),
    }


def run(cmd: list[str], capture: bool = False) -> tuple[float, float, float, bytes]:
    """(wall s, CPU s, peak RSS MB, stdout) of one run of ``cmd`` in its own process.

    Peak RSS comes from /usr/bin/time -f %M: a child's own ru_maxrss would start at this
    Python process's size (the high-water mark survives fork + exec)."""
    with tempfile.NamedTemporaryFile("r") as rss:
        t = time.perf_counter()
        out = subprocess.PIPE if capture else subprocess.DEVNULL
        timed = ["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd]
        proc = subprocess.Popen(timed, stdout=out, stderr=subprocess.DEVNULL)
        text = proc.stdout.read() if proc.stdout else b""
        _, status, usage = os.wait4(proc.pid, 0)  # includes the command's reaped CPU time
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (wait status {status})")
        peak_mb = int(rss.read().split()[-1]) / 1024
    return wall, usage.ru_utime + usage.ru_stime, peak_mb, text


def best(cmd: list[str], repeat: int, capture: bool = False):
    return min((run(cmd, capture) for _ in range(repeat)), key=lambda r: r[0])


def agreement(before: Path, flows: list[dict]) -> tuple[int, bool]:
    from tcptrace import FIELDS, tcptrace

    from analysis.pcap import int_to_ip

    ref = tcptrace(before)
    ours = {(int_to_ip(f["src"]), int_to_ip(f["dst"]), f["sport"], f["dport"]): f for f in flows}
    same = len(ref) == len(ours) and all(
        ours.get((r.src, r.dst, r.sport, r.dport), {}).get(k) == getattr(r, k)
        for r in ref.itertuples()
        for k in FIELDS.values()
    )
    return len(ref), same


def bench(n: int, workdir: Path, repeat: int, tshark: bool) -> None:
    from tcpgen import generate

    before, after = workdir / f"before_{n}.pcap", workdir / f"after_{n}.pcap"
    t = time.perf_counter()
    truth = generate(before, after, packets=n)
    size = before.stat().st_size
    print(
        f"\n== {truth.before_packets:,} packets, {size / 1e6:.0f} MB before the router "
        f"({truth.after_packets:,} after); generated in {time.perf_counter() - t:.1f} s"
    )
    for f in (before, after):  # page cache warm for everyone
        run(["cat", str(f)])
    me = best([sys.executable, __file__, "--analyse", str(before), str(after)], repeat, True)
    result = json.loads(me[3])
    rows = [("project: analysis of the trial", *me[:3])]
    rows.append(("cat F", *best(["sh", "-c", f"cat {before} > /dev/null"], repeat)[:3]))
    tcpdump = ["tcpdump", "-r", str(before), "-w", "/dev/null"]
    rows.append(("tcpdump -r F -w /dev/null", *best(tcpdump, repeat)[:3]))
    rows.append(("tcptrace -n -l F", *best(["tcptrace", "-n", "-l", str(before)], repeat)[:3]))
    if tshark and shutil.which("tshark"):
        fields = [x for f in TSHARK_FIELDS.split() for x in ("-e", f)]
        cmd = ["tshark", "-n", "-r", str(before), "-T", "fields", *fields]
        rows.append(("tshark -T fields F", *best(cmd, 1)[:3]))
    mine = rows[0][1]
    print(f"{'':32} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12} {'time / project':>15}")
    for name, wall, cpu, rss in rows:
        print(f"{name:32} {wall:8.2f} {cpu:8.2f} {rss:12.0f} {wall / mine:15.2f}")
    inside = sum(result["stages"].values())
    print(
        f"project stages (s), {inside:.2f} in all (the rest of its wall time: Python and "
        "pandas start-up): " + ", ".join(f"{k} {v:.2f}" for k, v in result["stages"].items())
    )
    tools = {name.split()[0]: wall for name, wall, *_ in rows[1:]}
    for label, t in (("process", mine), ("in-process stages", inside)):
        vs_tshark = f"tshark {tools['tshark'] / t:.1f}x (50x); " if "tshark" in tools else ""
        print(
            f"ratios, project {label} {t:.2f} s: faster than tcptrace "
            f"{tools['tcptrace'] / t:.2f}x (target 5x), {vs_tshark}"
            f"time / cat {t / max(tools['cat'], 1e-3):.1f} (target <= 10)"
        )
    print(f"peak RSS {rows[0][3]:.0f} MB vs file {size / 1e6:.0f} MB (target: below)")
    flows, same = agreement(before, result["flows"])
    retx = sum(f["retransmitted_packets"] for f in result["flows"])
    print(
        f"agreement with tcptrace on {flows} flows (bytes, data packets, retransmitted packets "
        f"and bytes): {'exact' if same else 'DIFFERENT'}; {retx} retransmissions, UDP lost "
        f"{result['udp_lost']}, OWD median {result['owd_median_ms']:.1f} ms, "
        f"{result['queue_events']:,} queue events"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", default="300000,3000000")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-tshark", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the generated captures")
    ap.add_argument("--analyse", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.analyse:
        print(json.dumps(analyse(*args.analyse)))
        return
    workdir = Path(tempfile.mkdtemp(prefix="trialbed-bench-", dir=args.dir))
    try:
        for n in (int(x) for x in args.packets.split(",")):
            bench(n, workdir, args.repeat, not args.no_tshark)
    finally:
        if args.keep:
            print(f"captures kept in {workdir}")
        else:
            shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
