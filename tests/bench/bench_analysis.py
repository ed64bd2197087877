"""Benchmark (not a test): the project's analysis of a trial against tcptrace, tshark,
tcpdump and cat, on generated captures with real TCP dynamics, in one run.

    .venv/bin/python tests/bench/bench_analysis.py [--packets 300000,3000000] [--dir /var/tmp]
        [--repeat 3] [--no-tshark] [--keep]

For each size, tests/analysis/tcpgen.py writes a capture before a bottleneck router and one
after it (8 bulk TCP flows with handshake, delayed ACKs, losses, fast retransmissions and
sequence wraparound, plus a UDP stream, all through one FIFO queue as at a real bottleneck).
Every contender runs as its own process; wall time is the best of --repeat runs (tshark: one
run; in-process figures: the best of --repeat processes), with that run's CPU time and the
process's peak RSS (from /usr/bin/time; MB = 10^6 bytes, as the file sizes; for the project,
also how much of it is the process's own, anonymous memory and how much pages of the libraries
it maps, whose count depends on the page cache, not on the analysis). The project's
analysis of the trial: read both captures, goodput (after), retransmissions (before), one-way
delay of the UDP stream, the bottleneck queue (match before/after + occupancy over time), on the
array fast path of analysis/fastpath.py (one compiled pass per capture, then compiled passes
over the packets kept; numpy and numba, no pandas). As analysis/trial.py, it is given the (src,
dst) pairs that send through the bottleneck (a trial's record names them; here the generator's
flows and UDP stream), so each scan keeps the crossing packets as it reads. It is timed three
ways, each labelled: a fresh process as a user pays it (interpreter, imports, numba's compiled
code loaded from its disk cache: "warm"; or compiled because there is no cache yet: "cold", the
first run of a checkout), with its time split into interpreter start/exit, imports and analysis;
and in-process (the analyses after the first in the same process: what each further trial
of a batch costs; the best of them, with their median and slowest). The same analysis
through the DataFrame API (read_pcap, tcp_goodput, ..., what analysis/trial.py calls) runs
as a process too, and must give the same numbers. Each tool runs over the same two files, one
after the other (the issue's "on the same files"; cat of both is the read limit); tcptrace
also runs on the capture before the router alone, against the project's share of that job
(read it, count its flows). The project's bytes and retransmissions are checked against
tcptrace's on the same file. Each capture is read, and the queue merged, as two halves at
once (the default where the process may use two CPUs; CPU times are printed beside wall
times); a last line shows the same analysis with one thread (time, peak RSS, and whether the
numbers are the same).

Targets (issue 6): >= 5x faster than tcptrace, >= 50x faster than tshark on 3 M packets,
within 10x of cat, peak RSS below the file size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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
FLOWS = ("src", "dst", "sport", "dport")
ARRIVING = ("direction", "key_hash", "ip_len")  # and its ts_ns, copied once counted
DEPARTING = ("key_hash",)  # matching reads these and ts_ns of the capture after the router
WARM_CALLS = 4  # analyses after the first in each in-process run (their times vary)


def _udp_rows(capture):
    """The crossing rows of the UDP stream, its crossing packets' directions taken out."""
    import numpy as np

    udp = capture.directions["proto"] == 17
    return np.flatnonzero(udp[capture.crossing.pop("direction")])


def _last_ns(capture) -> int:
    """The capture's last timestamp (0 when it holds no packet)."""
    return int(capture.ts_ns.max()) if len(capture.ts_ns) else 0


def _memory_mb() -> dict[str, float]:
    """This process's peak RSS and its resident memory now, anonymous (its own: interpreter,
    numba, the analysis's arrays) and pages of mapped files (libraries: shared, clean, and
    as many as the page cache maps per fault), in MB (10^6 bytes)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    kib = {k: int(fields[k].split()[0]) for k in ("VmHWM", "RssAnon", "RssFile", "RssShmem")}
    return {k: v * 1024 / 1e6 for k, v in kib.items()}


def analyse(before: Path, after: Path, crossing: list[int], threads: int | None = None) -> dict:
    """The analysis of one trial, stage by stage, on the array fast path (analysis/fastpath.py:
    one compiled pass per capture, no pandas). ``crossing``: the (src, dst) pairs through
    the bottleneck as src << 32 | dst (a trial's record names them). Each capture is scanned
    once: its flow counters, and the time, key and size of its packets crossing the
    bottleneck; the second is scanned into the first one's memory. The crossing packets'
    times come from each capture's own time column once its counters are done (the first's
    copied, the second's taken in place), not written a second time while it is read. One
    matching of the crossing packets gives the queue and the UDP stream's one-way delay
    (matching is per key: the UDP packets pair as they would alone). ``threads``: scan's
    (None: two halves of each capture at once where the process may use two CPUs)."""
    import numpy as np

    from analysis.fastpath import (
        crossing_times,
        flow_counters,
        match_rows,
        queue_levels,
        scan,
        summarize_owd,
        take_crossing_times,
        undecided,
    )

    stages: dict[str, float] = {}
    t = time.perf_counter()

    def stage(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        stages[name] = stages.get(name, 0.0) + now - t
        t = now

    pairs = np.asarray(crossing, np.uint64)
    b = scan(before, crossing=pairs, crossing_columns=ARRIVING, threads=threads)
    stage("read")
    sent = flow_counters(b)  # retransmissions, and acked bytes seen at the sender's side
    stage("retransmissions")
    udp, arrivals = _udp_rows(b), b.crossing
    arrivals["ts_ns"] = crossing_times(b)  # b's memory is the next scan's
    a = scan(after, reuse=b, crossing=pairs, crossing_columns=DEPARTING, threads=threads)
    del b
    stage("read")
    goodput = flow_counters(a)
    stage("goodput")
    departing, end_ns = a.crossing, _last_ns(a)
    departing["ts_ns"] = take_crossing_times(a)  # from a's own ts_ns; a is spent
    del a
    ts_out, departures = match_rows(
        arrivals["key_hash"], arrivals["ts_ns"], departing["key_hash"], departing["ts_ns"],
        max_delay_ns=MAX_DELAY_NS,
    )  # fmt: skip
    del departing, arrivals["key_hash"]  # the queue needs arrivals, departures and sizes only
    stage("match")
    sent_at, out_at = arrivals["ts_ns"][udp], ts_out[udp]
    fwd = out_at >= 0
    cut = undecided(sent_at, fwd, max_delay_ns=MAX_DELAY_NS, end_ns=end_ns)
    owd = summarize_owd({"lost": ~fwd[~cut], "owd_ns": (out_at - sent_at)[~cut]})
    stage("owd")
    queue = queue_levels(
        arrivals["ts_ns"], ts_out, arrivals["ip_len"], max_delay_ns=MAX_DELAY_NS,
        departures=departures, header_bytes=14, threads=threads, consume=True,
    )  # fmt: skip
    stage("queue")
    flows = [
        {k: int(sent[k][i]) for k in (*FLOWS, "data_packets", "retransmitted_packets",
                                        "retransmitted_bytes", "bytes")}
        for i in range(len(sent["src"]))
    ]  # fmt: skip
    return {
        "stages": stages,
        "flows": flows,
        "goodput_bytes_after": int(goodput["bytes"].sum()),
        "udp_lost": owd["lost"],
        "owd_median_ms": owd["median_ms"],
        "queue_events": len(queue["ts_ns"]),
        "queue_max_packets": int(queue["packets"].max()),
    }


def analyse_frames(before: Path, after: Path, crossing: list[int]) -> dict:
    """The same analysis through the DataFrame API that analysis/trial.py uses (read_pcap,
    tcp_goodput, tcp_retransmissions, one_way_delay, match_packets, queue_occupancy)."""
    from analysis.match import match_packets
    from analysis.metrics import one_way_delay, summarize_owd, tcp_goodput, tcp_retransmissions
    from analysis.pcap import read_pcap
    from analysis.queue import crossing as through
    from analysis.queue import queue_occupancy

    b, a = read_pcap(before), read_pcap(after)
    goodput = tcp_goodput(a)
    retx = tcp_retransmissions(b)
    sent = tcp_goodput(b)
    owd = summarize_owd(one_way_delay(b, a, max_delay_ns=MAX_DELAY_NS))  # its UDP packets
    pairs = {(k >> 32, k & 0xFFFFFFFF) for k in crossing}
    matched = match_packets(through(b, pairs), through(a, pairs), max_delay_ns=MAX_DELAY_NS)
    queue = queue_occupancy(matched, max_delay_ns=MAX_DELAY_NS)
    flows = retx.merge(sent[[*FLOWS, "bytes"]])
    return {
        "flows": [{k: int(v) for k, v in row.items()} for row in flows.to_dict("records")],
        "goodput_bytes_after": int(goodput.bytes.sum()),
        "udp_lost": owd["lost"],
        "owd_median_ms": owd["median_ms"],
        "queue_events": len(queue),
        "queue_max_packets": int(queue.packets.max()),
    }


def analyse_warm(before: Path, after: Path, crossing: list[int], threads: int | None) -> dict:
    """In one process: the first call (imports; compiled code loaded from numba's cache, or
    compiled when there is none) and WARM_CALLS more (what a process analysing several
    trials pays for each further trial: the best, its stages and CPU time, and every call's
    time); then tcptrace's job alone (one capture's flow counters)."""
    t = time.perf_counter()
    first = analyse(before, after, crossing, threads)
    first_s = time.perf_counter() - t
    # Every library the analysis maps is mapped now: the peak RSS of the calls below (the
    # high-water mark reset to the present RSS) less the file pages mapped is their own.
    Path("/proc/self/clear_refs").write_text("5")
    files_before = _memory_mb()["RssFile"]
    calls = []
    for _ in range(WARM_CALLS):
        t, cpu = time.perf_counter(), time.process_time()
        out = analyse(before, after, crossing, threads)
        calls.append((time.perf_counter() - t, time.process_time() - cpu, out))
        assert {k: v for k, v in first.items() if k != "stages"} == {
            k: v for k, v in out.items() if k != "stages"
        }
    second_s, second_cpu, second = min(calls, key=lambda c: c[0])
    memory = _memory_mb()
    own = memory["VmHWM"] - memory["RssFile"] - memory["RssShmem"]
    if memory["RssFile"] != files_before:  # a file mapped or dropped: no exact split
        own = float("nan")
    from analysis.fastpath import flow_counters, scan

    t, cpu = time.perf_counter(), time.process_time()  # tcptrace's job alone: one capture
    flow_counters(scan(before, crossing=[], threads=threads))  # its flows (no packet kept)
    alone, alone_cpu = time.perf_counter() - t, time.process_time() - cpu
    return {
        **second,
        "first_call_s": first_s,
        "warm_call_s": second_s,
        "warm_call_cpu_s": second_cpu,
        "warm_calls_s": [c[0] for c in calls],
        "tcptrace_job_s": alone,
        "tcptrace_job_cpu_s": alone_cpu,
        "warm_peak_mb": memory["VmHWM"],
        "warm_peak_own_mb": own,
        "file_pages_mb": memory["RssFile"],
    }


def run(
    cmd: list[str], capture: bool = False, env: dict[str, str] | None = None
) -> tuple[float, float, float, bytes]:
    """(wall s, CPU s, peak RSS MB, stdout) of one run of ``cmd`` in its own process.

    Peak RSS comes from /usr/bin/time -f %M: a child's own ru_maxrss would start at this
    Python process's size (the high-water mark survives fork + exec)."""
    with tempfile.NamedTemporaryFile("r") as rss:
        t = time.perf_counter()
        out = subprocess.PIPE if capture else subprocess.DEVNULL
        timed = ["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd]
        proc = subprocess.Popen(
            timed, stdout=out, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}
        )
        text = proc.stdout.read() if proc.stdout else b""
        _, status, usage = os.wait4(proc.pid, 0)  # includes the command's reaped CPU time
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (wait status {status})")
        peak_mb = int(rss.read().split()[-1]) * 1024 / 1e6  # KiB -> MB, as the file's size
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
    truth = generate(before, after, packets=n, shared_queue=True)
    size = before.stat().st_size
    print(
        f"\n== {truth.before_packets:,} packets, {size / 1e6:.0f} MB before the router "
        f"({truth.after_packets:,} after); generated in {time.perf_counter() - t:.1f} s"
    )
    for f in (before, after):  # page cache warm for everyone
        run(["cat", str(f)])
    crossing = ",".join(str(k) for k in truth.crossing)
    me = [sys.executable, __file__, "--analyse", str(before), str(after), "--crossing", crossing]
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        cold = run(me, True, env={"NUMBA_CACHE_DIR": cache})  # nothing cached: compiles
    run(me)  # fills the checkout's own cache, which a fresh clone does not have yet
    warm = best(me, repeat, True)
    warm_runs = [json.loads(run([*me, "--warm"], True)[3]) for _ in range(repeat)]
    alone = [*me, "--threads", "1"]  # what the second CPU buys
    alone_warm = best(alone, repeat, True)
    alone_inside = min(
        (json.loads(run([*alone, "--warm"], True)[3]) for _ in range(repeat)),
        key=lambda r: r["warm_call_s"],
    )
    result = min(warm_runs, key=lambda r: r["warm_call_s"])  # in-process figures: the best run
    for job in ("tcptrace_job_s", "tcptrace_job_cpu_s"):  # and tcptrace's job: its best
        result[job] = min(r[job] for r in warm_runs)
    frames = best([*me, "--frames"], repeat, True)
    rows = [
        ("project, fresh process, warm", *warm[:3]),
        ("project, fresh process, cold", *cold[:3]),
        ("project, DataFrame API, process", *frames[:3]),
    ]
    files = f"{before} {after}"  # the files the project's analysis of the trial reads
    each = f"for f in {files}; do"  # each tool over both files, one after the other
    for name, both in (
        ("cat F A", f"cat {files} > /dev/null"),
        ("tcpdump -r -w /dev/null, F and A",
         f"{each} tcpdump -r $f -w /dev/null 2>/dev/null; done"),
        ("tcptrace -n -l, F and A", f"{each} tcptrace -n -l $f > /dev/null; done"),
    ):  # fmt: skip
        rows.append((name, *best(["sh", "-c", both], repeat)[:3]))
    one = best(["tcptrace", "-n", "-l", str(before)], repeat)
    if tshark and shutil.which("tshark"):
        fields = [x for f in TSHARK_FIELDS.split() for x in ("-e", f)]
        tshark_both = " ".join(
            f"tshark -n -r {f} -T fields {' '.join(fields)} > /dev/null;" for f in (before, after)
        )
        rows.append(("tshark -T fields, F and A", *best(["sh", "-c", tshark_both], 1)[:3]))
    inside = result["warm_call_s"]
    print(
        f"{'':34} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12} {'/ in-process':>13} "
        f"{'/ process':>10}"
    )
    name, cpu = "project, in-process (best warm call)", result["warm_call_cpu_s"]
    print(f"{name:34} {inside:8.2f} {cpu:8.2f} {'':12} {1:13.2f}")
    job = result["tcptrace_job_s"]
    name = "  of it: tcptrace's job (F only)"
    print(f"{name:34} {job:8.2f} {result['tcptrace_job_cpu_s']:8.2f} {'':12} {job / inside:13.2f}")
    for name, wall, cpu, rss in rows:
        print(
            f"{name:34} {wall:8.2f} {cpu:8.2f} {rss:12.0f} {wall / inside:13.2f} "
            f"{wall / warm[0]:10.2f}"
        )
    calls = sorted(c for r in warm_runs for c in r["warm_calls_s"])
    print(
        f"project in-process: 1st call {result['first_call_s']:.2f} s (imports, loads the cached "
        f"compiled code), best warm call {inside:.2f} s: "
        + ", ".join(f"{k} {v:.2f}" for k, v in result["stages"].items())
        + f"; the {len(calls)} warm calls of {len(warm_runs)} processes: median "
        f"{statistics.median(calls):.2f} s, slowest {calls[-1]:.2f} s (new memory's first "
        "writes cost more in some runs than in others: the kernel's time varies, the CPU's not)"
    )
    fresh = json.loads(warm[3])
    print(
        f"project fresh process, warm {warm[0]:.2f} s: interpreter start and exit "
        f"{warm[0] - fresh['imports_s'] - fresh['analysis_s']:.2f}, imports (numpy, numba, "
        f"analysis.fastpath; no pandas) {fresh['imports_s']:.2f}, analysis "
        f"{fresh['analysis_s']:.2f} (in-process, best warm call: {inside:.2f}; the difference is "
        "loading numba's cached code and first use of memory): "
        + ", ".join(f"{k} {v:.2f}" for k, v in fresh["stages"].items())
    )
    print(
        "fresh process = what `python script` pays: interpreter, numpy/numba imports, "
        "loading numba's on-disk cache (warm) or compiling (cold, first run of a checkout), "
        "then the analysis; in-process = the analysis alone, in a process that already ran it"
    )
    print(f"{'tcptrace -n -l F (one file)':34} {one[0]:8.2f} {one[1]:8.2f} {one[2]:12.0f}")
    # The trial's analysis reads both files: it is compared with each tool run over both.
    tools = {name.split()[0]: wall for name, wall, *_ in rows[3:]}
    labels = (("in-process", inside), ("fresh process, warm", warm[0]))
    for label, t in labels:
        vs_tshark = f"tshark {tools['tshark'] / t:.1f}x (target 50x), " if "tshark" in tools else ""
        print(
            f"ratios, project {label} {t:.2f} s against the tools over both files: faster "
            f"than tcptrace {tools['tcptrace'] / t:.2f}x (target 5x), {vs_tshark}"
            f"time / cat {t / max(tools['cat'], 1e-3):.1f} (target <= 10)"
        )
    print(
        f"ratios, tcptrace's job in-process (read F + its flow counters) {job:.2f} s against "
        f"tcptrace on F: faster {one[0] / job:.2f}x"
    )
    cpu = {name.split()[0]: c for name, _, c, _ in rows[3:]}
    labels = (("in-process", result["warm_call_cpu_s"]), ("fresh process, warm", warm[1]))
    for label, c in labels:  # a busy machine stretches wall times, CPU times much less
        vs_tshark = f"tshark {cpu['tshark'] / c:.1f}x, " if "tshark" in cpu else ""
        print(
            f"CPU-time ratios, project {label} {c:.2f} s: faster than tcptrace "
            f"{cpu['tcptrace'] / c:.2f}x, {vs_tshark}CPU / cat's {c / max(cpu['cat'], 1e-3):.1f}"
        )
    print(
        f"CPU-time ratio, tcptrace's job {result['tcptrace_job_cpu_s']:.2f} s against "
        f"tcptrace on F: faster {one[1] / result['tcptrace_job_cpu_s']:.2f}x"
    )
    owns = [r["warm_peak_own_mb"] for r in warm_runs]
    own = max(owns) if all(o == o for o in owns) else float("nan")  # nan: a file was mapped
    print(
        f"peak RSS {warm[2]:.0f} MB vs file {size / 1e6:.0f} MB (target: below), a fresh process;"
        f" of its resident memory at exit, {fresh['RssFile']:.0f} MB are pages of mapped files "
        f"(libraries: how many a fault maps depends on how the page cache holds the file) and "
        f"{fresh['RssAnon']:.0f} MB its own. Calls after the first in one process: peak "
        f"{max(r['warm_peak_mb'] for r in warm_runs):.0f} MB, of it at most {own:.0f} MB the "
        f"process's own (anonymous) memory, the rest library pages ({len(warm_runs)} processes)"
    )
    t1 = alone_inside["warm_call_s"]
    same_alone = all(
        alone_inside[k] == result[k]
        for k in ("flows", "goodput_bytes_after", "udp_lost", "owd_median_ms", "queue_events")
    )
    print(
        "one thread (captures read and the queue merged from start to end): in-process "
        f"{t1:.2f} s, CPU {alone_inside['warm_call_cpu_s']:.2f} s ("
        + ", ".join(f"{k} {v:.2f}" for k, v in alone_inside["stages"].items())
        + f"): faster than tcptrace {tools['tcptrace'] / t1:.2f}x, time / cat "
        f"{t1 / max(tools['cat'], 1e-3):.1f}; tcptrace's job {alone_inside['tcptrace_job_s']:.2f}"
        f" s; fresh process {alone_warm[0]:.2f} s, peak RSS {alone_warm[2]:.0f} MB; numbers "
        f"{'the same' if same_alone else 'DIFFERENT'} as with two"
    )
    same_api = all(
        json.loads(frames[3])[k] == result[k]
        for k in ("flows", "goodput_bytes_after", "udp_lost", "owd_median_ms", "queue_events")
    )
    flows, same = agreement(before, result["flows"])
    retx = sum(f["retransmitted_packets"] for f in result["flows"])
    print(
        f"agreement with tcptrace on {flows} flows (bytes, data packets, retransmitted packets "
        f"and bytes): {'exact' if same else 'DIFFERENT'}; with the DataFrame API: "
        f"{'exact' if same_api else 'DIFFERENT'}; {retx} retransmissions, UDP lost "
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
    ap.add_argument("--crossing", default="", help=argparse.SUPPRESS)
    ap.add_argument("--frames", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    crossing = [int(k) for k in args.crossing.split(",") if k]
    if args.analyse and not (args.frames or args.warm):  # a fresh process: where its time goes
        t = time.perf_counter()
        import numpy  # noqa: F401

        from analysis import fastpath  # noqa: F401

        imports = time.perf_counter() - t
        t = time.perf_counter()
        out = analyse(*args.analyse, crossing, args.threads)
        spent = time.perf_counter() - t
        print(json.dumps({**out, "imports_s": imports, "analysis_s": spent, **_memory_mb()}))
        return
    if args.analyse:
        if args.frames:
            print(json.dumps(analyse_frames(*args.analyse, crossing)))
        else:
            print(json.dumps(analyse_warm(*args.analyse, crossing, args.threads)))
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
