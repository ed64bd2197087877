"""`make status` on a FreeBSD router with qdisc rio: roles/freebsd_router approximates it with
two dummynet RED queues (IN and OUT) on the link's pipe, each fed by its own ipfw rule (the
same rule number; IN matches the IN DSCPs, OUT `not dscp` the same list). The probe reads both
rules, both queues with their RED settings and counters and the pipe's rate and delay; the
table shows one row per queue, each labelled as the dummynet RED approximation of RIO.

Stand-in commands as in tests/unit/test_status_freebsd.py. `ipfw list` prints a rule's DSCP
match as sbin/ipfw/ipfw2.c print_dscp() does (" dscp" then the codes by name, comma-separated,
"not" before a negated option); `ipfw queue show` as tests/unit/test_rio_freebsd.py writes it
(print_flowset_parms() of sbin/ipfw/dummynet.c, RED's w_q and max_p as dummynet keeps them, in
16 bits); `ipfw sched show` lists the pipe's WF2Q+ scheduler (ip_dummynet.c config_sched: a
pipe's own scheduler is WF2Q+) with its children flowsets, as the fq_codel sample there does.
No FreeBSD host is contacted."""

from __future__ import annotations

import json

from core.rack import Rack
from tests.unit.test_rio_freebsd import LABEL, queue_show
from tests.unit.test_status_freebsd import (
    A_FACTS,
    A_STATE,
    LAB,
    PIPES,
    R_FACTS,
    probe,
    render,
    rows,
    standins,
)
from trials import status

# em1 a drop-tail pipe (seed 000's, PIPES' first block), em2 rio: pipe 10002, IN queue 10002,
# OUT queue 10004 (base 10000, two links: core/link_rules.py dummynet_numbers).
RIO_RULES = """\
10000 allow ip from any to any via em0
10001 pipe 10001 ip from any to any out xmit em1
10002 queue 10002 ip from any to any dscp af11,af21 out xmit em2
10002 queue 10004 ip from any to any not dscp af11,af21 out xmit em2
65000 allow ip from any to any
65535 deny ip from any to any
"""
# `pipe 10002 config bw 1500Kbit/s delay 10`: no rule sends to the pipe itself, its own FIFO
# queue (50 slots, the default) stays empty: no flow line.
RIO_PIPES = PIPES.split("10002:")[0] + (
    "10002:   1.500 Mbit/s   10 ms burst 0\n"
    "q141074  50 sl. 0 flows (1 buckets) sched 75538 weight 0 lmax 0 pri 0 droptail\n"
    " sched 75538 type FIFO flags 0x0 0 buckets 0 active\n"
)
RIO_SCHEDS = (
    "10002:   1.500 Mbit/s   10 ms burst 0\n"
    " sched 10002 type WF2Q+ flags 0x0 0 buckets 1 active\n"
    "   Children flowsets: 10004 10002 \n"
)
RIO_QUEUES = queue_show(10002, 10004, 10002, (2771, 4156500, 3, 4500, 66), (354, 531000, 0, 0, 122))
# roles/freebsd_router's record: what it owns, and its rio record (trialbed_dummynet_rio_record).
RIO_RECORD = {
    "backend": "dummynet",
    "links": [{"iface": "em1"}, {"iface": "em2", "qdisc": "rio"}],
    "owned": {"rules": [10000, 10001, 10002], "pipes": [10001, 10002], "scheds": [],
              "queues": [10002, 10004]},
    "rio": {"em2": {"rio": LABEL, "pipe": 10002, "queues": {"in": 10002, "out": 10004}}},
}  # fmt: skip
OUTPUTS = {"list": RIO_RULES, "pipe show": RIO_PIPES, "queue show": RIO_QUEUES,
           "sched show": RIO_SCHEDS}  # fmt: skip
IN_ROW = [
    "R", "em2",
    "dummynet RED approximation of RIO, IN: queue 10002 → pipe 10002 (WF2Q+); "
    "dscp af11,af21; red 0.00119/9/27/0.099991",
    "1.5Mbit/s", "40pkt", "10 ms (dummynet)", "2771", "66", "4500B/3p",
]  # fmt: skip
OUT_ROW = [
    "R", "em2",
    "dummynet RED approximation of RIO, OUT: queue 10004 → pipe 10002 (WF2Q+); "
    "not dscp af11,af21; red 0.00119/2/6/0.199997",
    "1.5Mbit/s", "40pkt", "10 ms (dummynet)", "354", "122", "0B/0p",
]  # fmt: skip


def test_both_queues_of_a_rio_link_with_their_red_settings(tmp_path, monkeypatch, capsys):
    work = standins(tmp_path, monkeypatch, OUTPUTS)
    (work / "router" / "delay_backend.json").write_text(json.dumps(RIO_RECORD))
    state = probe(work, ["em1", "em2"], monkeypatch, capsys)
    em2 = state["dummynet"]["em2"]
    assert em2["chain"] == ["queue 10002", "queue 10004", "pipe 10002"]
    assert (em2["rate"], em2["delay_ms"], em2["aqm"]) == ("1.500 Mbit/s", 10, "rio")
    # The link's counters: both queues summed.
    assert (em2["packets"], em2["drops"], em2["qlen"], em2["backlog"]) == (3125, 188, 3, 4500)
    rio = em2["rio"]
    assert (rio["approximation"], rio["pipe"], rio["sched"]) == (LABEL, 10002, "wf2q+")
    assert rio["in"] == {
        "rule": 10002, "number": 10002, "match": "dscp af11,af21", "queue": 40,
        "queue_unit": "pkt", "aqm": "red",
        "red": {"w_q": 0.00119, "min_th": 9, "max_th": 27, "max_p": 0.099991},
        "packets": 2771, "bytes": 4156500, "qlen": 3, "backlog": 4500, "drops": 66,
    }  # fmt: skip
    assert rio["out"]["match"] == "not dscp af11,af21" and rio["out"]["number"] == 10004
    assert rio["out"]["red"] == {"w_q": 0.00119, "min_th": 2, "max_th": 6, "max_p": 0.199997}
    assert (rio["out"]["packets"], rio["out"]["drops"]) == (354, 122)
    # em1 as before: one pipe, its own queue.
    assert "rio" not in state["dummynet"]["em1"]

    text = render({"A": {**A_STATE, "facts": A_FACTS}, "R": {**state, "facts": R_FACTS}})
    got = rows(text, "R")
    assert got[0] == [
        "R", "em1", "dummynet pipe 10001 → droptail", "1Mbit/s", "58KB", "25 ms (dummynet)",
        "7489", "0", "31500B/21p",
    ]  # fmt: skip
    assert got[1:3] == [IN_ROW, OUT_ROW]
    assert f"R:em2 qdisc rio {LABEL}: not RIO" in text
    # The Linux host's row as ever.
    assert rows(text, "A")[0] == [
        "A", "enp2s0", "htb → netem → bfifo", "1Mbit", "60000B", "25 ms (netem)", "7480", "12",
        "1514B/1p",
    ]  # fmt: skip

    summary = status.summary(Rack.load([LAB]), {"R": {**state, "facts": R_FACTS}})["R"]
    link = summary["interfaces"]["em2"]
    assert link["chain"] == (
        "dummynet RED approximation of RIO: queue 10002 (IN) + queue 10004 (OUT) → pipe 10002 "
        "(WF2Q+)"
    )
    assert (link["sent"], link["dropped"], link["backlog"]) == (3125, 188, "4500B/3p")
    assert link["limit"] == "40pkt each" and link["rio"]["approximation"] == LABEL
    assert link["rio"]["in"]["dropped"] == 66 and link["rio"]["out"]["dropped"] == 122


def test_without_the_routers_record_the_rules_dscp_tells_in_from_out(tmp_path, monkeypatch, capsys):
    """delay_backend.json unreadable: every rule counts, and the two queue rules of em2 are
    told apart by their DSCP match (`not dscp`: OUT), whatever their order."""
    swapped = RIO_RULES.replace(
        "10002 queue 10002 ip from any to any dscp af11,af21 out xmit em2\n"
        "10002 queue 10004 ip from any to any not dscp af11,af21 out xmit em2\n",
        "10002 queue 10004 ip from any to any not dscp af11,af21 out xmit em2\n"
        "10002 queue 10002 ip from any to any dscp af11,af21 out xmit em2\n",
    )
    work = standins(tmp_path, monkeypatch, {**OUTPUTS, "list": swapped})
    (work / "router" / "delay_backend.json").write_text("{not json")
    state = probe(work, ["em1", "em2"], monkeypatch, capsys)
    rio = state["dummynet"]["em2"]["rio"]
    assert (rio["in"]["number"], rio["out"]["number"]) == (10002, 10004)
    assert rio["approximation"] == LABEL  # the role's label, which the probe knows
    assert rows(render({"R": {**state, "facts": R_FACTS}}), "R")[1:3] == [IN_ROW, OUT_ROW]


def test_a_rio_link_whose_queues_cannot_be_read(tmp_path, monkeypatch, capsys):
    """`ipfw queue show` and `sched show` fail: both rows still, their rules' matches, dashes
    for what ipfw did not say; the pipe's rate and delay from `ipfw pipe show`."""
    work = standins(tmp_path, monkeypatch, {"list": RIO_RULES, "pipe show": RIO_PIPES})
    (work / "router" / "delay_backend.json").write_text(json.dumps(RIO_RECORD))
    state = probe(work, ["em2"], monkeypatch, capsys)
    shaping = status.shaping_of(state, "em2")
    assert (shaping["rate"], shaping["delay"]) == ("1.5Mbit/s", "10 ms (dummynet)")
    assert (shaping["sent"], shaping["dropped"], shaping["backlog"]) == ("-", "-", "-")
    assert shaping["rio"]["in"] == {
        "chain": "dummynet RED approximation of RIO, IN: queue 10002 → pipe 10002; "
        "dscp af11,af21; ?",
        "limit": "-", "sent": "-", "dropped": "-", "backlog": "-",
    }  # fmt: skip
    assert shaping["rio"]["out"]["chain"].startswith(
        "dummynet RED approximation of RIO, OUT: queue 10004 → pipe 10002; not dscp af11,af21"
    )


def test_a_single_queue_rule_is_not_rio(tmp_path, monkeypatch, capsys):
    """fq_codel's one queue rule (a DSCP match or not) stays a queue → sched chain."""
    from tests.unit.test_status_freebsd import FQ_PIPES, FQ_QUEUES, FQ_RULES, FQ_SCHEDS

    outputs = {"list": FQ_RULES, "pipe show": FQ_PIPES, "sched show": FQ_SCHEDS,
               "queue show": FQ_QUEUES}  # fmt: skip
    work = standins(tmp_path, monkeypatch, outputs)
    state = probe(work, ["em2"], monkeypatch, capsys)
    assert "rio" not in state["dummynet"]["em2"]
    assert status.shaping_of(state, "em2")["chain"] == (
        "dummynet queue 10002 → sched 10002 fq_codel"
    )
