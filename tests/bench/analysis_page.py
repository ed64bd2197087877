"""The analysis bench's figures as text (tests/bench/bench_analysis.py measures them): its
table, its last line, and docs/analysis-performance.md with what it measured, how a trial is
read, and where the time goes."""

from __future__ import annotations

import os
import platform
import statistics
import sys
from datetime import UTC, datetime


def line(f: dict) -> str:
    """The bench's last line (see the module docstring)."""
    tcptrace = f["tools"]["tcptrace"][0]
    tshark = f["tools"].get("tshark")
    fresh, warm = f["fresh"][0], f["warm"][0]
    vs_tshark = f"{tshark[0] / fresh:.1f}x" if tshark else "-x"
    return (
        f"bench: report path warm {warm:.2f} s ({tcptrace / warm:.2f}x tcptrace), fresh "
        f"{fresh:.2f} s ({tcptrace / fresh:.2f}x tcptrace), {vs_tshark} tshark, peak RSS "
        f"{f['fresh'][2]:.0f} MB, captures {f['captures_mb']:.0f} MB"
    )


def report_text(f: dict) -> str:
    """The run's figures as a table and notes (printed, and in the document)."""
    tcptrace = f["tools"]["tcptrace"][0]
    rows = [
        ("trials report, fresh process (best)", *f["fresh"]),
        ("trials report, fresh process, no numba cache", *f["cold"]),
        ("  its imports alone (no analysis)", *f["imports"]),
        ("in a process that analysed it before (best)", *f["warm"], float("nan")),
        ("  its first analysis (imports, cache loaded)", *f["first"], float("nan")),
        *[(f"{name} over both files", *v) for name, v in f["tools"].items()],
    ]
    out = [f"{'':48} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12} {'tcptrace/this':>14}"]
    for name, wall, cpu, rss in rows:
        shown = "" if rss != rss else f"{rss:.0f}"
        out.append(f"{name:48} {wall:8.2f} {cpu:8.2f} {shown:>12} {tcptrace / wall:14.2f}")
    later = sorted(c[0] for c in f["later"])
    out.append(
        f"warm analyses after the first: median {statistics.median(later):.2f} s, slowest "
        f"{later[-1]:.2f} s (of {len(later)})"
    )
    for jobs, (wall, cpu, rss) in f["scaling"].items():
        # Workers are forkserver children nobody waits for: their CPU and RSS escape wait4.
        counted = f", CPU {cpu:.2f} s, peak RSS {rss:.0f} MB" if jobs == 1 else ""
        out.append(
            f"a batch of {f['batch']} trials, {jobs} worker(s): {wall:.2f} s "
            f"({wall / f['batch']:.2f} s a trial){counted}"
        )
    if f["breakdown"]:
        total = sum(f["breakdown"].values())
        out.append(f"where a warm analysis's {total:.2f} s go:")
        for stage, s in sorted(f["breakdown"].items(), key=lambda x: -x[1]):
            out.append(f"  {stage:56} {s:6.2f} s  {100 * s / total:3.0f} %")
    if f["check"]:
        wall, cpu = f["check"]
        out.append(
            f"checking the trial's files against its manifest (sha256 of {f['checked_mb']:.0f} "
            f"MB), alone: {wall:.2f} s, CPU {cpu:.2f} s (the report runs it beside the analysis)"
        )
    largest = max(f["sizes"]) / 1e6
    out.append(
        f"peak RSS of the fresh process {f['fresh'][2]:.0f} MB: captures {f['captures_mb']:.0f} "
        f"MB in all, the largest {largest:.0f} MB"
    )
    out.append(
        f"agreement with tcptrace (bytes, data packets, retransmitted packets and bytes, per "
        f"flow): {'exact' if f['tcptrace_agrees'] else 'DIFFERENT'}; with the generator's "
        f"truth: {'exact' if f['truth_agrees'] else 'DIFFERENT: ' + f['wrong']}"
    )
    return "\n".join(out)


def document(f: dict, text: str, args) -> str:
    """docs/analysis-performance.md: what this run measured, and where the time goes."""
    fresh = f["fresh"]
    read_s = f["breakdown"].get("reading the captures (scan)")
    probe_s = f["breakdown"].get("reading tcp_probe")
    per_flow = f["probe_mb"] / f["minutes"] / 8
    share = 21 * f["packets"] / f["sizes"][0]  # the PACKET columns' bytes (recordpass.py)
    command = 'make bench BENCH_ARGS="' + " ".join(sys.argv[1:]) + '"'
    return f"""# Analysis performance

Written by `{command}` (tests/bench/bench_analysis.py) on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC,
{os.cpu_count()} CPUs ({platform.machine()}), load average {os.getloadavg()[0]:.1f} at the end;
every figure below is that run's. Run it again to regenerate this page.

## What is measured

One generated trial (tests/analysis/trialgen.py): {f["packets"]:,} packets in the capture before
the bottleneck router, {f["captures_mb"]:.0f} MB of captures in all, {f["probe_mb"]:.0f} MB of
tcp_probe text (one event per ACK reaching a sender: {per_flow:.1f} MB a minute a flow) and
{f["samples_mb"]:.1f} MB of tc samples ({f["samples_mb"] / f["minutes"]:.2f} MB a minute, one
link sampled every 10 ms). `trials report` analyses it in a fresh process (what one trial of
`trials report` costs), and again in a process that analysed it before (how batch workers run);
tcptrace, tshark and cat read the same two capture files.

```
{text}
```

{line(f)}

{_goals(f, read_s)}

## How a trial is read

One path: `make trial`, `trials report`, the batch workers and this bench all run
`analysis.trial.analyse_trial`. It reads each capture once, one at a time, with the one reader
(analysis/scan.py: compiled record pass, analysis/recordpass.py; in blocks, read ahead by a
thread, analysis/blocks.py; a large capture as two halves at once where two CPUs may be used,
analysis/halves.py). While a capture is read, each generator's and each bottleneck's analysis
says what it needs of it (analysis/captures.py) and takes it as arrays: the TCP flow kernels
(analysis/tcpflows.py: goodput, retransmissions, losses, startup figures), the matching of
packets across a router (analysis/match.py) and the queue's events (analysis/queuemerge.py,
analysis/bottleneck.py). tcp_probe recordings are parsed a chunk at a time by a compiled
reader (analysis/tcp_probe.py), tc and ipfw samples all at once by pyarrow's JSON reader (and
its regular expressions over ipfw's text, analysis/ipfw_samples.py). The DataFrames (the
parquet tables, `analysis.load`) are built from the arrays at the end and written by a thread
of their own (analysis/tables.py). `analysis.pcap.read_pcap` (a DataFrame
of a capture, for tests and notebooks) reads through the same reader and the DataFrame
functions of analysis/metrics.py call the same kernels. `trials report` (trials/results_check.py)
also checks every file of each trial against its MANIFEST.sha256, in a thread beside the
analysis (sha256 lets go of the GIL); each trial's row waits for it. Its command line imports
only what the report needs (trials/__main__.py; the other commands' rack, plan and Ansible
machinery is in trials/commands.py).

## Where the time goes

{_where(f, read_s, probe_s)}

## Memory

The analysis reads one capture at a time (analysis/scan.py: in blocks of 1 MB, never the whole
file, one capture's columns let go before the next is read) and keeps 21 bytes a packet of it
(direction, time, payload length, flags, DSCP, sequence and acknowledgement numbers), 11 more
for a packet crossing a bottleneck or of a UDP stream (direction, key hash, IP length): what
reading a capture holds grows with its packets (its packets' columns: {share:.2f} of the bytes
of this run's capture before the router). A queue's crossing packets are matched as soon as the
capture after it is read; its events are merged and written a piece at a time, and so is the
cwnd table; tcp_probe recordings are read a chunk at a time.
pandas and pyarrow are imported only once the captures are read. Besides that, a process holds
its interpreter, numpy, numba, pandas, pyarrow and the compiled code (a fixed part: the larger
the captures, the smaller its share). The budget: peak RSS below the size of the largest
capture, which tests/analysis/test_memory.py checks on a fresh process reporting a generated
trial of 6 M packets a capture. Here: peak RSS {fresh[2]:.0f} MB, captures of
{" and ".join(f"{s / 1e6:.0f}" for s in f["sizes"])} MB.
"""


def _goals(f: dict, read_s) -> str:
    """Issue 46's goals on this run's figures, and what tcptrace's time is compared with."""
    tcptrace = f["tools"]["tcptrace"][0]
    rw, rf = tcptrace / f["warm"][0], tcptrace / f["fresh"][0]
    rss, largest = f["fresh"][2], max(f["sizes"]) / 1e6
    text = (
        f"The goals (issue 46) on a 3 M packet trial: RW >= 5 (here {rw:.2f}: "
        f"{'met' if rw >= 5 else 'not met'}), RF >= 2 (here {rf:.2f}: "
        f"{'met' if rf >= 2 else 'not met'}), N < M (here N {rss:.0f} MB, M "
        f"{f['captures_mb']:.0f} MB: "
        f"{'met' if rss < f['captures_mb'] else 'not met'}; below the largest capture, "
        f"{largest:.0f} MB: {'yes' if rss < largest else 'no'}). tcptrace reads the two "
        f"captures only; `trials report` also reads the senders' tcp_probe recordings "
        f"({f['probe_mb']:.0f} MB) and the tc samples, writes the tables (parquet) and the "
        f"summary, and checks every file ({f['checked_mb']:.0f} MB) against the trial's manifest."
    )
    if read_s:
        text += (
            f" Reading the captures alone, the work tcptrace does, takes {read_s:.2f} s "
            f"in the breakdown below ({tcptrace / read_s:.1f}x tcptrace)."
        )
    b = f["breakdown"]
    if b and rw < 5:
        beyond = b.get("reading tcp_probe", 0) + b.get("writing parquet", 0)
        text += (
            f" RW >= 5 leaves a warm analysis {tcptrace / 5:.2f} s: reading tcp_probe and "
            f"writing the tables alone take {beyond:.2f} s of the breakdown's one thread."
        )
    if f["check"] and rf < 2:
        text += (
            f" RF >= 2 leaves a fresh process {tcptrace / 2:.2f} s: its imports alone take "
            f"{f['imports'][0]:.2f} s, and the manifest's sha256 {f['check'][1]:.2f} s of CPU "
            "besides the analysis."
        )
    return text + (
        " The same figures of another checkout (e.g. before a change): "
        "`.venv/bin/python tests/bench/bench_analysis.py --code DIR --no-doc`."
    )


def _where(f: dict, read_s, probe_s) -> str:
    b = f["breakdown"]
    if not b:
        return "(no breakdown: --code measured another checkout)"
    total = sum(b.values())
    lines = [
        f"A warm analysis takes {total:.2f} s in the breakdown's own run, which does the work "
        "the analysis does in threads of its own (the next tcp_probe recording read, parquet "
        "written) in line, one stage after the other; by stage, exclusive:",
        "",
    ]
    for stage, s in sorted(b.items(), key=lambda x: -x[1]):
        lines.append(f"- {stage}: {s:.2f} s ({100 * s / total:.0f} %)")
    fresh, warm = f["fresh"][0], f["warm"][0]
    lines += [
        "",
        f"A fresh process adds {fresh - warm:.2f} s to the warm analysis (CPU: "
        f"{f['fresh'][1]:.2f} s against {f['warm'][1]:.2f} s). Importing what it imports takes "
        f"{f['imports'][0]:.2f} s alone (CPU {f['imports'][1]:.2f} s: the interpreter, the "
        "command line, numpy, numba, pydantic, rich, pandas and pyarrow; pandas and pyarrow "
        "are imported once the captures are read). numba's compiled code is loaded from its "
        f"disk cache at each kernel's first call: the first analysis in a process took "
        f"{f['first'][0]:.2f} s, CPU {f['first'][1]:.2f} s. Without a numba cache (the first "
        f"run of a fresh clone) the compiling takes {f['cold'][0] - fresh:.0f} s more, once.",
    ]
    if f["check"]:
        wall, cpu = f["check"]
        lines.append(
            f"`trials report` checks every file of the trial against its manifest ("
            f"{f['checked_mb']:.0f} MB hashed with sha256: {wall:.2f} s alone, CPU {cpu:.2f} s) "
            "in a thread beside the analysis; a warm analysis (a batch worker's) does not."
        )
    if read_s:
        mb_s = f["captures_mb"] / read_s
        lines.append(f"Reading the captures runs at {mb_s:.0f} MB/s (cat: "
                     f"{f['captures_mb'] / f['tools']['cat'][0]:.0f} MB/s).")  # fmt: skip
    if probe_s:
        lines.append(f"Reading tcp_probe runs at {f['probe_mb'] / probe_s:.0f} MB/s.")
    return "\n".join(lines)
