"""`ipfw pipe show` samples parsed into the Linux router's queue-over-time table. The samples
are written with the printf formats of sbin/ipfw/dummynet.c (FreeBSD 13/14), which ipfw(8)
does not spell out: list_pipes() prints the link line "%05d: %s %4d ms burst %s" (bandwidth
"%7.3f Mbit/s"), print_flowset_parms() the flowset line "q%05d %s%s %d flows (%d buckets)
sched %d weight %d lmax %d pri %d %s" (a queue in bytes >= 8192 as "%d KB"; RED on its own
line "\\n\\t %cRED w_q %f min_th %d max_th %d max_p %f"), the scheduler line " sched %d type
%s flags 0x%x %d buckets %d active", print_header() the column line, and list_flow() each flow:
"%3u%c" "%-4s " "%15s/%-5d " "%15s/%-5d " then pr_u64's "%*llu " (width 4: total packets,
width 8: total bytes) and "%2u %4u %3u" (queued packets, queued bytes, drops). No FreeBSD host
produced these: they are written from that source."""

# ruff: noqa: UP031  (printf-style on purpose: the C formats of dummynet.c, copied as they are)
from __future__ import annotations

import json

from analysis.bottleneck import IPFW_SAMPLES, queue_drops_counted, queue_samples
from analysis.ipfw_samples import parse_pipe_show, pipe_drops, read_ipfw_samples
from analysis.tc_samples import leaf_samples, read_tc_samples

DN_MAX_ID = 65536
HEADER = "BKT Prot ___Source IP/port____ ____Dest. IP/port____ Tot_pkt/bytes Pkt/Byte Drp"


def pipe_block(
    nr: int, delay_ms: int, flows: list[tuple[int, int, int, int, int]], red: str = ""
) -> str:
    """One pipe as `ipfw pipe show` prints it: 1 Mbit/s, a 60 000-byte queue, FIFO."""
    lines = [
        "%05d: %s %4d ms burst %s" % (nr % DN_MAX_ID, "%7.3f Mbit/s" % 1.0, delay_ms, "0"),
        "q%05d %s%s %d flows (%d buckets) sched %d weight %d lmax %d pri %d %s"
        % (
            nr + 2 * DN_MAX_ID,
            "%d KB" % (60000 // 1024),
            "",
            len(flows),
            1,
            nr + DN_MAX_ID,
            0,
            0,
            0,
            red or "droptail",
        ),
        " sched %d type %s flags 0x%x %d buckets %d active"
        % (nr + DN_MAX_ID, "FIFO", 0, 1, len(flows)),
    ]
    if flows:
        lines.append(HEADER)
    for tot_pkts, tot_bytes, pkts, queued, drops in flows:
        lines.append(
            "%3u%c" % (0, " ")
            + "%-4s " % "ip"
            + "%15s/%-5d " % ("0.0.0.0", 0)
            + "%15s/%-5d " % ("0.0.0.0", 0)
            + "%*u " % (4, tot_pkts)  # pr_u64: "%*llu "
            + "%*u " % (8, tot_bytes)
            + "%2u %4u %3u" % (pkts, queued, drops)
        )
    return "\n".join(lines) + "\n"


def test_one_pipe_show_per_pipe_counters():
    red = "\n\t  RED w_q 0.002000 min_th 6666 max_th 20000 max_p 0.100000"
    text = pipe_block(10001, 25, [(7489, 10803048, 21, 31500, 3)]) + pipe_block(
        10002, 25, [], red=red
    )
    assert parse_pipe_show(text) == {
        10001: {
            "packets": 7489,
            "bytes": 10803048,
            "qlen": 21,
            "backlog": 31500,
            "drops": 3,
            "delay_ms": 25,
        },
        # No packet yet: no flow line, all zero (the RED line is not a flow).
        10002: {"packets": 0, "bytes": 0, "qlen": 0, "backlog": 0, "drops": 0, "delay_ms": 25},
    }


def test_masked_pipe_sums_its_flows():
    text = pipe_block(10001, 50, [(10, 15000, 2, 3000, 0), (5, 900, 1, 186, 1)])
    got = parse_pipe_show(text)[10001]
    assert (got["packets"], got["bytes"], got["qlen"], got["backlog"], got["drops"]) == (
        15,
        15900,
        3,
        3186,
        1,
    )


def test_samples_read_into_the_tc_table(tmp_path):
    samples = tmp_path / "ipfw_samples.jsonl"
    devs = {"10001": "em1", "10002": "em2"}
    lines = []
    for i, (queued_pkts, queued_bytes) in enumerate([(0, 0), (20, 30000), (40, 60000)]):
        text = pipe_block(10001, 25, [(100 * i, 150000 * i, queued_pkts, queued_bytes, i)])
        text += pipe_block(10002, 25, [(3 * i, 200 * i, 0, 0, 0)])
        lines.append(
            {
                "ts_ns": 1_000_000_000 + i * 10_000_000,
                "spread_ns": 400_000,
                "devs": devs,
                "text": text,
            }
        )
    body = "\n".join(json.dumps(x) for x in lines) + '\n{"end": true, "samples": 3}\n{"ts_ns": 5'
    samples.write_text(body)  # the last line cut short, as by a killed sampler
    df = read_ipfw_samples(samples)
    # The same columns and types as a Linux router's samples.
    tc = tmp_path / "tc_samples.jsonl"
    tc.write_text("")
    assert list(df.columns) == list(read_tc_samples(tc).columns)
    ints = ["ts_ns", "spread_ns", "bytes", "packets", "drops", "backlog", "qlen"]
    assert (df[ints].dtypes == "int64").all()
    assert len(df) == 6
    em1 = leaf_samples(df, "em1")
    assert em1.ts_ns.tolist() == [1_000_000_000, 1_010_000_000, 1_020_000_000]
    assert em1.backlog.tolist() == [0, 30000, 60000]
    assert em1.qlen.tolist() == [0, 20, 40]
    assert em1.drops.tolist() == [0, 1, 2]
    assert set(em1.handle) == {"10001"} and set(em1.kind) == {"dummynet"}
    assert leaf_samples(df, "em2").packets.tolist() == [0, 3, 6]


def test_a_freebsd_routers_snapshots_and_samples_feed_the_trial_analysis(tmp_path):
    """The runner's snapshots of a FreeBSD router (`## pipes` line, then `ipfw pipe show`) give
    the drops its pipe counted during the trial; its ipfw samples are the router's queue
    samples, as a Linux router's tc samples are."""
    header = "## pipes em1=10001 em2=10002\n"
    (tmp_path / "ipfw_before.txt").write_text(
        header + pipe_block(10001, 25, [(5, 900, 0, 0, 0)]) + pipe_block(10002, 25, [])
    )
    (tmp_path / "ipfw_after.txt").write_text(
        header
        + pipe_block(10001, 25, [(7489, 10803048, 0, 0, 2)])
        + pipe_block(10002, 25, [(900, 50000, 0, 0, 31)])
    )
    assert queue_drops_counted(tmp_path, "em2") == 31
    assert queue_drops_counted(tmp_path, "em1") == 2
    assert queue_drops_counted(tmp_path, "em0") == 0  # not a shaped interface
    assert queue_samples(tmp_path) is None
    text = pipe_block(10002, 25, [(3, 4500, 2, 3000, 0)])
    rec = {"ts_ns": 1, "spread_ns": 2, "devs": {"10002": "em2"}, "text": text}
    (tmp_path / IPFW_SAMPLES).write_text(json.dumps(rec) + "\n")
    samples = queue_samples(tmp_path)
    assert samples is not None and leaf_samples(samples, "em2").backlog.tolist() == [3000]
    assert pipe_drops("no pipes line\n" + text, "em2") == 0
