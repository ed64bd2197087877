"""Queue over time on a FreeBSD rio link (two dummynet RED queues, IN and OUT, on the link's
pipe, whose own queue stays empty): the runner hands the sampler the two queues
(DEV=PIPE/IN,OUT), the sampler reads `ipfw queue show IN OUT` every 10 ms, and the analysis
gives the link's occupancy as the two queues' backlogs summed, each queue's beside it.

The sampler runs here as the runner starts it, with a stand-in for ipfw (a shell script that
prints a recorded sequence of `ipfw queue show` outputs, one per call, written with the
printf formats of sbin/ipfw/dummynet.c as tests/unit/test_rio_freebsd.py writes them). No
FreeBSD host is contacted."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.bottleneck import IPFW_SAMPLES, queue_samples, tc_cross_check
from analysis.ipfw_samples import (
    RIO_COLUMNS,
    RIO_KINDS,
    read_ipfw_samples,
    rio_queue_samples,
    with_rio_queues,
)
from analysis.tc_samples import compare_with_samples, leaf_samples, read_tc_samples
from core.hostside import SOURCE, ipfw_sampler_command, remote_dir
from tests.analysis.test_ipfw_samples import pipe_block
from tests.unit.test_lab_inventory import lab_trial
from tests.unit.test_rio_freebsd import EXPERIMENT, queue_show
from trials import host_commands

PIPE, Q_IN, Q_OUT = 10002, 10002, 10004
HOSTSIDE = str(SOURCE)  # the programs as the hosts get them
# A recorded sequence of the two queues (IN, OUT): total packets and bytes through each, packets
# and bytes queued at the sample, drops. An empty tuple: no packet yet (no flow line).
SEQUENCE = [
    ((), ()),
    ((10, 15000, 2, 3000, 0), ()),
    ((40, 60000, 5, 7500, 1), (12, 18000, 3, 4500, 0)),
    ((90, 135000, 9, 13500, 4), (30, 45000, 6, 9000, 2)),
    ((120, 180000, 0, 0, 4), (41, 61500, 1, 1500, 7)),
]


def occupancy(counted: tuple) -> tuple[int, int]:
    return (counted[2], counted[3]) if counted else (0, 0)


def fake_ipfw(tmp_path: Path, outputs: dict[str, list[str]]) -> Path:
    """A stand-in for /sbin/ipfw: per `ipfw pipe|queue show ...` the next of `outputs[kind]`
    (the last one again once they are used up), each call's arguments logged in calls.log."""
    data = tmp_path / "ipfw_data"
    data.mkdir()
    for kind, texts in outputs.items():
        for i, text in enumerate(texts):
            (data / f"{kind}_{i}.txt").write_text(text)
        (data / f"{kind}_last.txt").write_text(texts[-1])
    d = shlex.quote(str(data))
    script = tmp_path / "ipfw"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {d}/calls.log\n'
        'case "$1 $2" in "pipe show"|"queue show") ;; *) exit 64 ;; esac\n'
        f"n=$(cat {d}/$1.count 2>/dev/null || echo 0)\n"
        f"echo $((n + 1)) > {d}/$1.count\n"
        f"if [ -e {d}/$1_$n.txt ]; then cat {d}/$1_$n.txt; else cat {d}/$1_last.txt; fi\n"
    )
    script.chmod(0o755)
    return script


def sample(command: str, ipfw: Path, cwd: Path, lines: int) -> list[dict]:
    """Runs the sampler as core.daemons.Daemons.spawn does (sh -c 'exec COMMAND', in the trial
    directory), with the stand-in ipfw, until it wrote `lines` samples; its records."""
    argv = ["sh", "-c", f"exec {command} --ipfw {shlex.quote(str(ipfw))}"]
    proc = subprocess.Popen(argv, cwd=cwd, stderr=subprocess.PIPE)
    out = cwd / IPFW_SAMPLES
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        not out.exists() or len(out.read_text().splitlines()) < lines
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err.decode()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[-1]["end"] and records[-1]["failed"] == 0
    return records[:-1]


def rio_trial(tmp_path: Path, experiment: str = EXPERIMENT):
    path = tmp_path / "exp.yml"
    path.write_text(experiment)
    return lab_trial(tmp_path, experiment=path)


def test_the_runner_hands_the_sampler_a_rio_links_two_queues(tmp_path):
    # A second flow back towards A: its bottleneck is em1, a drop-tail pipe.
    both_ways = EXPERIMENT.replace(
        "duration:",
        "  - {type: cbr_udp, name: back, from: C, to: A, packet_bytes: 1500, interval: 12ms}\n"
        "duration:",
    )
    _, net, generators = rio_trial(tmp_path, both_ways)
    pipes = net.dummynet_pipes("R")
    queues = host_commands.dummynet_rio_queues(net, "R")["em2"]
    assert queues["in"] == pipes["em2"] and queues["out"] == pipes["em2"] + len(pipes)
    commands = {(h, name): cmd for h, name, cmd, _ in host_commands.recorders(net, generators)}
    argv = shlex.split(commands["R", "ipfw_sampler"])
    # The shipped sampler, from the host's own folder.
    shipped = remote_dir(net.hosts["R"].workdir)
    assert argv[:2] == ["python3", f"{shipped}/recorders/ipfw_sampler.py"]
    # The rio link with its pipe and its IN and OUT queues, the drop-tail one as always.
    assert argv[-2:] == [
        f"em1={pipes['em1']}",
        f"em2={pipes['em2']}/{queues['in']},{queues['out']}",
    ]
    assert argv[2:6] == ["--interval-ms", "10", "--out", IPFW_SAMPLES]
    # core.hostside's own form of it.
    own = ipfw_sampler_command(shipped, {"em2": 10002, "em1": 10001}, rio_queues={"em2": queues})
    assert own.split()[-2:] == ["em1=10001", f"em2=10002/{queues['in']},{queues['out']}"]
    assert ipfw_sampler_command(shipped, {"em1": 10001}).endswith(" em1=10001")  # as before


def test_a_rio_links_queue_over_time_is_its_two_queues_summed(tmp_path):
    texts = [queue_show(Q_IN, Q_OUT, PIPE, i, o) for i, o in SEQUENCE]
    ipfw = fake_ipfw(tmp_path, {"queue": texts})
    command = ipfw_sampler_command(
        HOSTSIDE, {"em2": PIPE}, rio_queues={"em2": {"in": Q_IN, "out": Q_OUT}}
    )
    records = sample(command, ipfw, tmp_path, lines=len(SEQUENCE) + 2)
    # Only `ipfw queue show IN OUT`: the pipe's own queue stays empty on a rio link.
    calls = set((tmp_path / "ipfw_data" / "calls.log").read_text().splitlines())
    assert calls == {f"queue show {Q_IN} {Q_OUT}"}
    first = records[0]
    assert first["rio"] == {"em2": {"pipe": PIPE, "in": Q_IN, "out": Q_OUT}}
    assert first["devs"] == {} and first["text"] == "" and first["queue_text"] == texts[0]

    df = read_ipfw_samples(tmp_path / IPFW_SAMPLES)
    tc = tmp_path / "tc_samples.jsonl"
    tc.write_text("")
    assert list(df.columns) == list(read_tc_samples(tc).columns)  # the Linux router's table
    n = len(SEQUENCE)
    leaf = leaf_samples(df, "em2").head(n)  # the link's queue: one row a sample
    assert set(leaf.kind) == {"dummynet"} and set(leaf.handle) == {str(PIPE)}
    want_pkts = [occupancy(i)[0] + occupancy(o)[0] for i, o in SEQUENCE]
    want_bytes = [occupancy(i)[1] + occupancy(o)[1] for i, o in SEQUENCE]
    assert leaf.qlen.tolist() == want_pkts == [0, 2, 8, 15, 1]
    assert leaf.backlog.tolist() == want_bytes == [0, 3000, 12000, 22500, 1500]
    assert leaf.drops.tolist() == [0, 0, 1, 6, 11]  # both queues' drops
    assert leaf.packets.tolist() == [0, 10, 52, 120, 161]  # both queues' arrivals
    # Each queue on its own rows, under the pipe.
    per_queue = rio_queue_samples(df, "em2").head(n)
    assert list(per_queue.columns) == ["ts_ns", *RIO_COLUMNS]
    assert per_queue.ts_ns.tolist() == leaf.ts_ns.tolist()
    assert per_queue.tc_in_packets.tolist() == [occupancy(i)[0] for i, _ in SEQUENCE]
    assert per_queue.tc_out_bytes.tolist() == [occupancy(o)[1] for _, o in SEQUENCE]
    assert per_queue.tc_out_drops.tolist() == [0, 0, 0, 2, 7]
    rows = df[df.kind == RIO_KINDS["out"]]
    assert set(rows.handle) == {str(Q_OUT)} and set(rows.parent) == {str(PIPE)}
    # The samples after the sequence repeat its last one.
    assert leaf_samples(df, "em2").qlen.tolist()[n:] == [1] * (len(leaf_samples(df, "em2")) - n)


def test_a_rio_link_beside_a_drop_tail_pipe(tmp_path):
    """Both kinds on one router: `ipfw pipe show` for the pipe, `ipfw queue show` for the rio
    link's queues, one line a sample spanning both calls."""
    ipfw = fake_ipfw(
        tmp_path,
        {
            "pipe": [pipe_block(10001, 10, [(5, 7500, 2, 3000, 0)])],
            "queue": [queue_show(Q_IN, Q_OUT, PIPE, *SEQUENCE[3])],
        },
    )
    command = ipfw_sampler_command(
        HOSTSIDE, {"em1": 10001, "em2": PIPE}, rio_queues={"em2": {"in": Q_IN, "out": Q_OUT}}
    )
    records = sample(command, ipfw, tmp_path, lines=3)
    calls = set((tmp_path / "ipfw_data" / "calls.log").read_text().splitlines())
    assert calls == {"pipe show 10001", f"queue show {Q_IN} {Q_OUT}"}
    assert records[0]["devs"] == {"10001": "em1"}
    df = read_ipfw_samples(tmp_path / IPFW_SAMPLES)
    em1, em2 = leaf_samples(df, "em1"), leaf_samples(df, "em2")
    assert len(em1) == len(em2) == len(records)
    assert set(em1.qlen) == {2} and set(em2.qlen) == {15} and set(em2.backlog) == {22500}


def recorded(tmp_path: Path, sequence: list, devs: dict | None = None, text: str = "") -> Path:
    """An ipfw_samples.jsonl as the sampler writes it for em2's rio link, a sample every 10 ms
    from t = 1 s."""
    lines = [
        {
            "ts_ns": 1_000_000_000 + k * 10_000_000,
            "spread_ns": 300_000,
            "devs": devs or {},
            "rio": {"em2": {"pipe": PIPE, "in": Q_IN, "out": Q_OUT}},
            "text": text,
            "queue_text": queue_show(Q_IN, Q_OUT, PIPE, i, o),
        }
        for k, (i, o) in enumerate(sequence)
    ]
    path = tmp_path / IPFW_SAMPLES
    path.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"end": true}\n')
    return path


def test_the_queue_over_time_table_of_a_rio_link(tmp_path):
    """The bottleneck's table (analysis.bottleneck.tc_cross_check: `queue_tc`): tc_packets and
    tc_bytes are the two queues summed, each queue's in columns beside them."""
    recorded(tmp_path, SEQUENCE)
    samples = queue_samples(tmp_path)
    assert samples is not None
    # The queue reconstructed from the captures: 2 packets at 1.005 s, 8 at 1.015 s, 1 at 1.045 s.
    queue = pd.DataFrame(
        {
            "ts_ns": np.array([1_005_000_000, 1_015_000_000, 1_045_000_000], np.int64),
            "event": ["arrival", "arrival", "departure"],
            "packets": [2, 8, 1],
            "bytes": [3000, 12000, 1500],
        }
    )
    check, cmp = tc_cross_check(queue, samples, "em2")
    assert cmp.ts_ns.tolist() == [1_010_000_000, 1_020_000_000, 1_030_000_000, 1_040_000_000]
    assert cmp.tc_packets.tolist() == [2, 8, 15, 1]
    assert cmp.tc_bytes.tolist() == [3000, 12000, 22500, 1500]
    assert (cmp.tc_packets == cmp.tc_in_packets + cmp.tc_out_packets).all()
    assert (cmp.tc_bytes == cmp.tc_in_bytes + cmp.tc_out_bytes).all()
    assert cmp.tc_in_packets.tolist() == [2, 5, 9, 0]
    assert cmp.tc_out_bytes.tolist() == [0, 4500, 9000, 1500]
    # Drops since the first sample, as tc_drops counts them.
    assert (cmp.tc_drops == cmp.tc_in_drops + cmp.tc_out_drops).all()
    assert cmp.tc_drops.tolist() == [0, 1, 6, 11]
    assert cmp.diff_packets.tolist() == [0, 0, -7, 7]
    assert check["tc_samples"] == 4 and check["tc_drops"] == 11

    # Another link of the router (a drop-tail pipe) keeps the table as it was.
    plain = pipe_block(10001, 10, [(5, 7500, 2, 3000, 0)])
    recorded(tmp_path, SEQUENCE, devs={"10001": "em1"}, text=plain)
    samples = queue_samples(tmp_path)
    assert samples is not None
    em1 = compare_with_samples(queue, leaf_samples(samples, "em1"))
    assert with_rio_queues(em1, samples, "em1") is em1
    assert list(tc_cross_check(queue, samples, "em1")[1].columns) == list(em1.columns)
    assert rio_queue_samples(samples, "em1").empty


def test_a_rio_sample_missing_a_queue_gives_no_row(tmp_path):
    """ipfw printed only one of the two queues (not configured yet): no occupancy rather than
    half of it; the samples around it are read."""
    path = recorded(tmp_path, SEQUENCE[2:4])
    lines = path.read_text().splitlines()
    broken = json.loads(lines[0])
    broken["queue_text"] = broken["queue_text"].split(f"q{Q_OUT:05d}")[0]
    path.write_text("\n".join([json.dumps(broken), *lines[1:]]) + "\n")
    df = read_ipfw_samples(path)
    assert leaf_samples(df, "em2").qlen.tolist() == [15]
    assert len(rio_queue_samples(df, "em2")) == 1
