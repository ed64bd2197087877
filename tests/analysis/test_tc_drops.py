"""The router's own drop counter at a bottleneck is its leaf queue's, whatever the queue: a
drop-tail fifo or an AQM. The snapshots are a VM-rack trial's (`tc -s qdisc show` before and
after, netem → htb → codel on R's right; 132 drops, as many as the captures on both sides of R
showed missing)."""

from __future__ import annotations

from pathlib import Path

from analysis.bottleneck import queue_drops_counted, tc_drops

SNAPSHOTS = Path(__file__).parents[1] / "data" / "tc_snapshots"

FIFO = """\
## right
qdisc htb 1: root refcnt 2 r2q 10 default 0x10 direct_packets_stat 0 direct_qlen 1000
 Sent 3051960 bytes 2893 pkt (dropped 5, overlimits 2301 requeues 0)
 backlog 0b 0p requeues 0
qdisc bfifo 10: parent 1:10 limit 60000b
 Sent 3051960 bytes 2893 pkt (dropped 71, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
## left
qdisc bfifo 10: parent 1:10 limit 60000b
 Sent 1 bytes 1 pkt (dropped 9, overlimits 0 requeues 0)
"""


def test_the_leaf_counts_not_the_shaper_above_it():
    assert tc_drops(FIFO, "right") == 71  # not htb's 5
    assert tc_drops(FIFO, "left") == 9
    assert tc_drops(FIFO, "eth9") == 0


def test_an_aqm_leaf_counts_its_drops(tmp_path):
    after = (SNAPSHOTS / "codel_vm_after.txt").read_text()
    assert "qdisc codel 10: parent 2:10" in after
    assert tc_drops(after, "right") == 132
    for when in ("before", "after"):
        (tmp_path / f"tc_{when}.txt").write_text((SNAPSHOTS / f"codel_vm_{when}.txt").read_text())
    assert queue_drops_counted(tmp_path, "right") == 132
    assert queue_drops_counted(tmp_path, "left") == 0
