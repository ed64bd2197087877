"""Benchmark (not a test): what `trials report` costs on a generated trial, against tcptrace,
tshark and cat of the same capture files, in one run; writes docs/analysis-performance.md.

    .venv/bin/python tests/bench/bench_analysis.py [--packets 3000000] [--repeat 3]
        [--batch 4] [--no-tshark] [--dir /var/tmp] [--code DIR] [--doc FILE | --no-doc] [--keep]

tests/analysis/trialgen.py writes one trial directory (in a batch directory of its own): the
captures before and after a bottleneck router (eight bulk TCP pairs with handshake, delayed
ACKs, losses, fast retransmissions and sequence wraparound, a UDP stream, one FIFO queue),
each sender's tcp_probe recording (an event per ACK) and the router's tc samples, with the
truth of all of it. Measured, each in a process of its own:

- fresh: a new process doing what `trials report BATCH` does (analysis.report's analyse_batch,
  then print_batch): interpreter, imports, numba's compiled code loaded from its cache, the
  analysis, the tables and summary written, the report printed; wall time, CPU time and peak
  RSS (/usr/bin/time; MB = 10^6 bytes, as file sizes), the best of --repeat runs. Once with
  no numba cache (cold: the first run of a fresh clone compiles).
- warm: the time per trial inside a process that already analysed one (how batch workers
  run): analysis.workers.analyse_trials on the same trial again, the best of several.
- the whole report of a batch of --batch such trials (the same files linked), one worker and
  as many as the CPUs: how it scales with trials and cores.
- tcptrace -n -l, tshark -T fields (--no-tshark skips it) and cat, over both capture files.

The analysis's numbers must agree exactly with tcptrace's on the capture before the router
(bytes, data packets, retransmitted packets and bytes per flow) and with the generator's
truth (bytes, retransmissions, UDP losses, the queue's drops, congestion epochs). --code DIR
measures another checkout's analysis (e.g. main's) on the same trial and tools.

The last line is the one to compare from run to run:

    bench: report path warm W s (RWx tcptrace), fresh F s (RFx tcptrace), Tx tshark,
    peak RSS N MB, captures M MB
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from core.layout import MANIFEST, RECORD, sha256_file  # noqa: E402 (this checkout's, from ROOT)
from tests.bench.analysis_page import document, line, report_text  # noqa: E402

TSHARK_FIELDS = (
    "frame.time_epoch ip.src ip.dst tcp.srcport tcp.dstport tcp.seq_raw tcp.ack_raw tcp.len "
    "tcp.analysis.retransmission udp.srcport udp.dstport"
)
WARM_CALLS = 4  # analyses after the first in the warm process (their times vary)
# `trials report BATCH` as the console command runs it (pyproject.toml's [project.scripts]):
# every file checked against its trial's manifest, the batch analysed again, printed.
REPORT = "import sys; from trials.__main__ import main; sys.exit(main(['report', sys.argv[1]]))"
# What a fresh `trials report` imports before and while it analyses, alone (no analysis).
IMPORTS = (
    "import trials.__main__, trials.results_check, analysis.trial, analysis.report, pandas, "
    "pyarrow.parquet"
)
# A batch worker's loop: the same trial analysed again and again (the first pays imports).
WARM = """
import json, sys, time
from pathlib import Path
from analysis.workers import analyse_trials
calls = []
for _ in range(int(sys.argv[2])):
    t, c = time.perf_counter(), time.process_time()
    [(_, result)] = analyse_trials([Path(sys.argv[1])], jobs=1)
    if isinstance(result, Exception):
        raise result
    calls.append((time.perf_counter() - t, time.process_time() - c))
print(json.dumps(calls))
"""


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT, out: bool = False):
    """(wall s, CPU s, peak RSS MB, stdout if ``out``) of one run of ``cmd`` in its own
    process (the peak RSS of /usr/bin/time: a child's own ru_maxrss would start at this
    process's)."""
    with tempfile.NamedTemporaryFile("r") as rss, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(
            ["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd],
            stdout=subprocess.PIPE if out else subprocess.DEVNULL, stderr=err, cwd=cwd,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        text = proc.stdout.read().decode() if out else ""
        _, status, usage = os.wait4(proc.pid, 0)  # the command's CPU time, reaped with it
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status):
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed: {err.read().decode()[-3000:]}")
        peak = int(rss.read().split()[-1]) * 1024 / 1e6
    return wall, usage.ru_utime + usage.ru_stime, peak, text


def best(cmd: list[str], repeat: int, env=None, cwd: Path = ROOT):
    return min((run(cmd, env, cwd) for _ in range(repeat)), key=lambda r: r[0])


def _python(code: Path, snippet: str, *args: str) -> list[str]:
    """``snippet`` run by this checkout's interpreter on ``code``'s analysis: -P keeps the
    working directory off sys.path, so PYTHONPATH (``code``) decides what is imported."""
    return [str(ROOT / ".venv" / "bin" / "python"), "-P", "-c", snippet, *map(str, args)]


_CACHE: dict[Path, str] = {}  # another checkout's numba cache (a directory of this run's)


def _env(code: Path, **extra: str) -> dict[str, str]:
    """The environment of a process running ``code``'s analysis: another checkout's keeps
    its compiled code and bytecode out of that checkout."""
    env = {"PYTHONPATH": str(code)}
    if code != ROOT:
        env |= {"NUMBA_CACHE_DIR": _CACHE[code], "PYTHONDONTWRITEBYTECODE": "1"}
    return {**env, **extra}


def link_batch(trial: Path, batch: Path, n: int) -> list[Path]:
    """A batch of ``n`` copies of a trial directory (files hard-linked: no copy of the
    captures; each copy's analysis is its own)."""
    dirs = []
    for i in range(n):
        dst = batch / "trials" / f"t{i + 1}"
        shutil.copytree(
            trial, dst, copy_function=os.link, ignore=shutil.ignore_patterns("analysis")
        )
        record = json.loads((dst / RECORD).read_text())
        record["trial"] = dst.name
        (dst / RECORD).unlink()  # (a link: the original's stays as it is)
        (dst / RECORD).write_text(json.dumps(record))
        manifest = (
            (dst / MANIFEST)
            .read_text()
            .replace(
                f"{sha256_file(trial / RECORD)}  {RECORD}\n",
                f"{sha256_file(dst / RECORD)}  {RECORD}\n",
            )
        )
        (dst / MANIFEST).unlink()
        (dst / MANIFEST).write_text(manifest)  # the copy's record as collected
        dirs.append(dst)
    return dirs


def agreement(trial, analysed: Path) -> tuple[bool, bool, str]:
    """Whether the flows table agrees with tcptrace on the capture before the router, and
    the summary with the generator's truth; what differed."""
    import pandas as pd

    from tests.analysis.tcptrace import FIELDS, tcptrace

    key = ["src", "dst", "sport", "dport"]
    flows = pd.read_parquet(analysed / "analysis" / "flows.parquet")
    ours = flows.rename(columns={"lifetime_bytes": "bytes"}).astype({"src": str, "dst": str})
    ref = tcptrace(trial.captures[0])
    both = ours.merge(ref, on=key, suffixes=("", "_tcptrace"))
    same = len(both) == len(ref) == len(trial.truth.flows) and all(
        (both[f] == both[f"{f}_tcptrace"]).all() for f in FIELDS.values()
    )
    summary = json.loads((analysed / "analysis" / "summary.json").read_text())
    gens, queue = summary["generators"], summary["queues"]["downstream"]
    truth = pd.DataFrame(trial.truth.flows).sort_values("sport")
    got = ours.sort_values("sport")
    checks = {
        "bytes, data packets, retransmissions": all(
            got[c].tolist() == truth[c].tolist()
            for c in ("bytes", "data_packets", "retransmitted_packets", "retransmitted_bytes")
        ),
        "UDP packets and losses": (gens["voip"]["udp_packets"], gens["voip"]["udp_lost"])
        == (trial.truth.udp_sent, trial.truth.udp_lost),
        "queue drops (capture, router)": queue["queue_drops_capture"]
        == queue["queue_drops_tc"]
        == trial.queue_drops,
        "congestion epochs": [gens[f"tcp{f}"]["congestion_epochs"] for f in range(8)]
        == [[n] for n in trial.congestion_epochs],
    }
    wrong = ", ".join(k for k, ok in checks.items() if not ok)
    return same, not wrong, wrong


class _Inline:
    """An executor that runs what it is given at once, in the caller's thread: the stages'
    times of one thread add up to the analysis's wall time."""

    def __init__(self, *_args, **_kwargs) -> None:
        pass

    def submit(self, fn, *args, **kwargs) -> Future:
        done: Future = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:  # the caller's result() raises it, as from a thread
            done.set_exception(exc)
        return done

    def shutdown(self, *_args, **_kwargs) -> None:
        pass


def stages(trial_dir: Path) -> dict[str, float]:
    """Where a warm analysis of the trial spends its time (this checkout's code): exclusive
    seconds of each stage, the second of two analyses in this process, with the work the
    analysis does in threads of its own (the next tcp_probe read, parquet written) done in
    line, one stage after the other."""
    from analysis import bottleneck, startup, tables, tcpflows, trial
    from analysis.traffic import bulk_tcp, cbr_udp
    from analysis.workers import analyse_trials

    spent: dict[str, float] = {}
    stack: list[list] = []

    def within(stage: str, step, *args, **kwargs):
        stack.append([stage, time.perf_counter(), 0.0])
        try:
            return step(*args, **kwargs)
        finally:
            label, start, inner = stack.pop()
            took = time.perf_counter() - start
            spent[label] = spent.get(label, 0.0) + took - inner
            if stack:
                stack[-1][2] += took

    def timed(owner, name: str, stage: str) -> None:
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            return within(stage, real, *args, **kwargs)

        def steps(*args, **kwargs):  # a generator's time is spent where it is advanced
            items = real(*args, **kwargs)
            while True:
                try:
                    yield within(stage, next, items)
                except StopIteration:
                    return

        setattr(owner, name, steps if inspect.isgeneratorfunction(real) else wrapper)

    for owner, name, stage in (
        (trial, "scan", "reading the captures (scan)"),
        (startup, "data_pass", "flow kernels (data pass)"),
        (tcpflows, "ack_pass", "flow kernels (ACK pass)"),
        (bottleneck, "match_rows", "matching packets across the router"),
        (cbr_udp, "match_times", "matching packets across the router"),
        (bottleneck, "queue_pieces", "the queue's events (merge, pieces)"),
        (bottleneck._EventTables, "__call__", "the queue's events (merge, pieces)"),
        (tables.Tables, "stream", "writing parquet"),
        (tables.Tables, "write", "writing parquet"),
        (bulk_tcp, "read_tcp_probe", "reading tcp_probe"),
        (bottleneck, "queue_samples", "reading tc samples"),
    ):
        timed(owner, name, stage)
    trial.ThreadPoolExecutor = tables.ThreadPoolExecutor = _Inline
    list(analyse_trials([trial_dir], jobs=1))
    spent.clear()
    t = time.perf_counter()
    list(analyse_trials([trial_dir], jobs=1))
    total = time.perf_counter() - t
    spent["the rest (frames, figures, summary, memory handed back)"] = total - sum(spent.values())
    return spent


def check_alone(batch: Path) -> tuple[float, float]:
    """(wall s, CPU s) of `trials report`'s check of the files against their manifests,
    alone (the report runs it in a thread beside the analysis)."""
    from trials.results_check import file_problems

    t, c = time.perf_counter(), time.process_time()
    if file_problems(batch):
        raise SystemExit(f"{batch}: files not as collected")
    return time.perf_counter() - t, time.process_time() - c


def bench(args) -> str:
    from collect.fetch import write_manifest
    from tests.analysis.trialgen import write_trial

    workdir = Path(tempfile.mkdtemp(prefix="trialbed-bench-", dir=args.dir))
    try:
        batch = workdir / "one"
        t = time.perf_counter()
        trial = write_trial(batch / "trials" / "t1", packets=args.packets)
        write_manifest(trial.dir)  # as collected: `trials report` checks every file against it
        before, after = trial.captures
        sizes = [p.stat().st_size for p in trial.captures]
        captures_mb = sum(sizes) / 1e6
        probe_mb = (
            sum((trial.dir / f"A{f}" / "tcp_probe.txt").stat().st_size for f in range(8)) / 1e6
        )
        samples_mb = (trial.dir / "R" / "tc_samples.jsonl").stat().st_size / 1e6
        minutes = (
            (json.loads((trial.dir / "trial.json").read_text())["traffic"]["tcp0"]["duration_ns"])
            / 60e9
        )
        print(
            f"== {trial.truth.before_packets:,} packets before the router "
            f"({sizes[0] / 1e6:.0f} MB),"
            f" {trial.truth.after_packets:,} after ({sizes[1] / 1e6:.0f} MB); tcp_probe "
            f"{probe_mb:.0f} MB, tc samples {samples_mb:.1f} MB; generated in "
            f"{time.perf_counter() - t:.1f} s",
            flush=True,
        )
        for f in (*trial.captures, *trial.dir.glob("*/tcp_probe.txt")):  # page cache warm
            run(["cat", str(f)])
        code = args.code
        _CACHE[code] = str(workdir / "numba-cache")
        report = _python(code, REPORT, batch)
        where = run(
            _python(code, "import analysis; print(analysis.__file__)"), _env(code), out=True
        )
        if not Path(where[3].strip()).is_relative_to(code):
            raise SystemExit(f"the measured process imports {where[3].strip()}, not {code}'s")
        with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
            cold = run(report, _env(code, NUMBA_CACHE_DIR=cache))
        run(report, _env(code))  # fills the checkout's own cache (a fresh clone has none)
        fresh = best(report, args.repeat, _env(code))
        imports = best(_python(code, IMPORTS), args.repeat, _env(code))
        warm_calls = json.loads(
            run(_python(code, WARM, trial.dir, WARM_CALLS + 1), _env(code), out=True)[3]
        )
        first, later = warm_calls[0], warm_calls[1:]
        warm = min(later, key=lambda c: c[0])
        same_tcptrace, same_truth, wrong = agreement(trial, trial.dir)
        files = f"{before} {after}"
        each = f"for f in {files}; do"
        tools = {
            "cat": best(["sh", "-c", f"cat {files} > /dev/null"], args.repeat),
            "tcptrace": best(
                ["sh", "-c", f"{each} tcptrace -n -l $f > /dev/null; done"], args.repeat
            ),
        }
        if not args.no_tshark and shutil.which("tshark"):
            fields = " ".join(f"-e {f}" for f in TSHARK_FIELDS.split())
            tools["tshark"] = run(
                ["sh", "-c", f"{each} tshark -n -r $f -T fields {fields} > /dev/null; done"]
            )
        scaling = {}
        if args.batch:
            many = workdir / "many"
            link_batch(trial.dir, many, args.batch)
            cpus = len(os.sched_getaffinity(0))
            for jobs in sorted({1, cpus}):
                scaling[jobs] = run(
                    _python(code, REPORT, many), _env(code, TRIALBED_ANALYSIS_JOBS=str(jobs))
                )
        breakdown, check = {}, None
        if code == ROOT:
            staged = json.loads(
                run(
                    [str(ROOT / ".venv" / "bin" / "python"), __file__, "--stages", str(trial.dir)],
                    _env(code),
                    out=True,
                )[3]
            )
            breakdown, check = staged["stages"], staged["check"]
        listed = [line.split("  ", 1)[1] for line in (trial.dir / MANIFEST).read_text().split("\n")
                  if line]  # fmt: skip
        checked_mb = sum((trial.dir / name).stat().st_size for name in listed) / 1e6
        figures = {
            "packets": trial.truth.before_packets, "sizes": sizes, "captures_mb": captures_mb,
            "probe_mb": probe_mb, "samples_mb": samples_mb, "minutes": minutes,
            "fresh": fresh[:3], "imports": imports[:3], "cold": cold[:3], "first": first,
            "warm": warm, "later": later, "tools": {k: v[:3] for k, v in tools.items()},
            "scaling": {k: v[:3] for k, v in scaling.items()}, "batch": args.batch,
            "breakdown": breakdown, "check": check, "checked_mb": checked_mb,
            "tcptrace_agrees": same_tcptrace, "truth_agrees": same_truth,
            "wrong": wrong, "code": str(code),
        }  # fmt: skip
        text = report_text(figures)
        print(text)
        if args.doc:
            args.doc.parent.mkdir(parents=True, exist_ok=True)
            args.doc.write_text(document(figures, text, args))
            print(f"written: {args.doc}")
        return line(figures)
    finally:
        if args.keep:
            print(f"kept: {workdir}")
        else:
            shutil.rmtree(workdir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=3_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4, help="trials in the batch run (0: none)")
    ap.add_argument("--no-tshark", action="store_true")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose analysis runs")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "analysis-performance.md")
    ap.add_argument("--no-doc", dest="doc", action="store_const", const=None)
    ap.add_argument("--keep", action="store_true", help="keep the generated trial")
    ap.add_argument("--stages", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stages:
        batch = args.stages.parents[1]  # <batch>/trials/<trial>
        print(json.dumps({"stages": stages(args.stages), "check": check_alone(batch)}))
        return
    args.code = args.code.resolve()
    if args.code != ROOT:
        args.doc = None  # the document is this checkout's
    print(bench(args))  # the last line


if __name__ == "__main__":
    main()
