"""`make status` (trials/status.py) on a FreeBSD dummynet router, here on stand-in commands (no
FreeBSD host can run here): hostside/probes/status_probe.py, as status.py sends it (`python3
-c`), run with platform.system() saying FreeBSD and small shell scripts named ipfw, sysctl and
ps first (and alone) on PATH, as tests/unit/test_host_facts_freebsd.py does for the facts. Their
outputs are written from the manuals of FreeBSD 13/14 and from what sbin/ipfw/dummynet.c prints
where ipfw(8) shows no example, each sample naming its source. The rendered tables of the lab
rack's R (two pipes) and of a Debian host A (tc, unchanged) are then checked."""

from __future__ import annotations

import io
import json
import os
import platform
import re
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from core.rack import Rack
from tests.hostside import load
from trials import status

status_probe = load("probes/status_probe.py")

PROJECT = Path(__file__).resolve().parents[2]
LAB = PROJECT / "inventory/lab.example/hosts.yml"


def flow(tot_pkts: int, tot_bytes: int, pkts: int, queued: int, drops: int) -> str:
    """A flow line of `ipfw pipe|sched|queue show`, as dummynet.c's list_flow() prints it:
    "%3u%c" bucket, "%-4s " protocol, "%15s/%-5d " source and destination, then pr_u64's
    "%4ju " total packets, "%8ju " total bytes, "%2u %4u %3u" queued packets, queued bytes,
    drops."""
    return (
        f"{0:3d} {'ip':<4} {'0.0.0.0':>15}/{0:<5d} {'0.0.0.0':>15}/{0:<5d} "
        f"{tot_pkts:4d} {tot_bytes:8d} {pkts:2d} {queued:4d} {drops:3d}"
    )


BKT = "BKT Prot ___Source IP/port____ ____Dest. IP/port____ Tot_pkt/bytes Pkt/Byte Drp"
# ipfw(8) "LIST OF RULES AND PREPROCESSING" / `ipfw list`: one rule a line, its number
# (%05u) first, then the rule as ipfw shows it; the rules of roles/freebsd_router's
# ipfw.rules.j2 for seed 000 (em1 and em2 shaped, management on em0), and rc.firewall's
# `open` type last.
RULES = """\
10000 allow ip from any to any via em0
10001 pipe 10001 ip from any to any out xmit em1
10002 pipe 10002 ip from any to any out xmit em2
65000 allow ip from any to any
65535 deny ip from any to any
"""
# ipfw(8) "PIPE, QUEUE AND SCHEDULER CONFIGURATION" and dummynet(4); the layout is
# list_pipes() of sbin/ipfw/dummynet.c: per pipe a link line "%05d: %s %4d ms burst %s"
# (bandwidth "%7.3f Mbit/s"), the pipe's own flowset "q%05d %s%s %d flows (%d buckets) sched
# %d weight %d lmax %d pri %d %s" (number N+131072, its queue size "%d KB" from 8192 bytes
# on, else "%d B", or "%3d sl." in slots; then droptail, or on the next line "\t  RED w_q
# ..." / "\t GRED ..."), its FIFO scheduler " sched %d type FIFO flags 0x%x %d buckets %d
# active" (N+65536), the header of the flows and one line per flow.
#   pipe 10001 config bw 1Mbit/s delay 25 queue 60000bytes  (seed 000, 60000 B = 58 KB)
#   pipe 10002 config bw 10Mbit/s delay 40 queue 50 red 0.002/5/15/0.1
PIPES = "\n".join([
    "10001:   1.000 Mbit/s   25 ms burst 0",
    "q141073 58 KB 0 flows (1 buckets) sched 75537 weight 0 lmax 0 pri 0 droptail",
    " sched 75537 type FIFO flags 0x0 0 buckets 1 active",
    BKT,
    flow(7489, 10803048, 21, 31500, 0),
    "10002:  10.000 Mbit/s   40 ms burst 0",
    "q141074  50 sl. 0 flows (1 buckets) sched 75538 weight 0 lmax 0 pri 0 ",  # RED: "\n\t ..."
    "\t  RED w_q 0.002000 min_th 5 max_th 15 max_p 0.100000",
    " sched 75538 type FIFO flags 0x0 0 buckets 1 active",
    BKT,
    flow(912, 1036480, 3, 4542, 17),
    "",
])  # fmt: skip
# fq_codel on em2 (ipfw(8) "CONFIGURING CODEL, PIE, FQ-CODEL and FQ-PIE AQM": `pipe 10002
# config bw 10Mbit/s delay 40`, `sched 10002 config pipe 10002 type fq_codel limit 40
# noecn`, `queue 10002 config sched 10002`, `add 10002 queue 10002 ... out xmit em2`).
# `ipfw sched show`: the scheduler's link line, its internal flowset, " sched %d type
# FQ_CODEL ...", get_extra_parms()'s " FQ_CODEL target %s interval %s quantum %jd limit %jd
# flows %jd NoECN", "   Children flowsets: " and the flows of its instance; `ipfw queue
# show`: the flowset alone ("q%05d ...", its sched).
FQ_RULES = RULES.replace("10002 pipe 10002", "10002 queue 10002")
FQ_PIPES = PIPES.split("10002:")[0] + (
    "10002:  10.000 Mbit/s   40 ms burst 0\n"
    "q141074  50 sl. 0 flows (1 buckets) sched 75538 weight 0 lmax 0 pri 0 droptail\n"
    " sched 75538 type FIFO flags 0x0 0 buckets 0 active\n"
)
FQ_SCHEDS = "\n".join([
    "10002:  10.000 Mbit/s   40 ms burst 0",
    "q75538  50 sl. 0 flows (1 buckets) sched 10002 weight 0 lmax 0 pri 0 droptail",
    " sched 10002 type FQ_CODEL flags 0x0 0 buckets 1 active",
    " FQ_CODEL target 5ms interval 100ms quantum 1514 limit 40 flows 1024 NoECN",
    "   Children flowsets: 10002 ",  # "%u " per child
    BKT,
    flow(5123, 7412680, 12, 17916, 9),
    "",
])  # fmt: skip
FQ_QUEUES = "q10002  50 sl. 0 flows (1 buckets) sched 10002 weight 0 lmax 0 pri 0 droptail\n"
# roles/freebsd_router's record (delay_backend.json): the rules and pipes it owns.
RECORD = {
    "backend": "dummynet",
    "links": [{"iface": "em1"}, {"iface": "em2"}],
    "owned": {"rules": [10000, 10001, 10002], "pipes": [10001, 10002], "scheds": [],
              "queues": []},
}  # fmt: skip


def script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\nPATH=/usr/bin:/bin\n" + textwrap.dedent(body))
    path.chmod(0o755)


def standins(tmp_path: Path, monkeypatch, ipfw: dict[str, str] | None) -> Path:
    """ipfw answering `list`, `pipe show`, `sched show`, `queue show` from `ipfw` (each one
    absent fails, as ipfw does without the firewall loaded; ipfw None: no ipfw at all);
    sysctl(8) -n net.inet.tcp.cc.algorithm (mod_cc(4)) saying htcp; ps(1) -o state= -p PID
    saying S (sleeping, a daemon that runs). Returns the working directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if ipfw is not None:
        cases = ""
        for words, text in ipfw.items():
            (tmp_path / words.replace(" ", "_")).write_text(text)
            cases += f'  "{words}") cat {tmp_path / words.replace(" ", "_")} ;;\n'
        script(bin_dir / "ipfw", f'case "$*" in\n{cases}  *) exit 71 ;;\nesac\n')
    script(bin_dir / "sysctl", 'test "$2" = net.inet.tcp.cc.algorithm && echo htcp\n')
    script(bin_dir / "ps", "echo S\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(status_probe, "FREEBSD_COMMAND_DIRS", [])
    monkeypatch.setattr(platform, "system", lambda: "FreeBSD")
    work = tmp_path / "work"
    (work / "router").mkdir(parents=True)
    (work / "router" / "delay_backend.json").write_text(json.dumps(RECORD))
    return work


def probe(work: Path, interfaces: list[str], monkeypatch, capsys) -> dict:
    """The probe's source as status.py sends it, run as `python3 -c SOURCE WORKDIR IFACE...`
    would run it (its __main__ part), with FREEBSD_COMMAND_DIRS empty (the stand-ins alone)."""
    source, found = re.subn(
        r"^FREEBSD_COMMAND_DIRS = \[.*\]$",
        "FREEBSD_COMMAND_DIRS = []",
        status.probe_source(),
        flags=re.M,
    )
    assert found == 1
    monkeypatch.setattr(sys, "argv", ["-c", str(work), *interfaces])
    exec(compile(source, "<status_probe>", "exec"), {"__name__": "__main__"})
    return json.loads(capsys.readouterr().out)


# Facts as hostside/probes/host_facts.py gives them (its FreeBSD branch for R, tests/unit/
# test_host_facts_freebsd.py; its Linux branch for A).
R_FACTS = {
    "sysctls": {"net.inet.tcp.cc.algorithm": "htcp", "net.inet.tcp.cc.htcp.rtt_scaling": "1",
                "net.inet.tcp.cc.htcp.adaptive_backoff": "0"},
    "cc_params": {},
    "offloads": {"em1": {"TSO4": False, "TSO6": False, "LRO": True},
                 "em2": {"TSO4": True, "TSO6": True, "LRO": False}},
    "mtu": {"em1": 1500, "em2": 9000},
    "routes": [{"type": "unicast", "dst": "198.18.1.0/24", "dev": "em1", "table": "main",
                "metrics": {}}],
}  # fmt: skip
A_FACTS = {
    "sysctls": {"net.ipv4.tcp_congestion_control": "cubic"},
    "cc_params": {"cubic": {"beta": "717"}},
    "offloads": {"enp2s0": {"tcp-segmentation-offload": False,
                            "generic-segmentation-offload": True,
                            "generic-receive-offload": True}},
    "mtu": {"enp2s0": 1500},
    "routes": [{"dst": "198.18.0.0/16", "dev": "enp2s0", "metrics": {"initcwnd": 10}}],
}  # fmt: skip
# What the Linux probe gives for A's port (`tc -s -j qdisc show`, `tc class show`): HTB, netem,
# then bfifo, as roles/linux_router shapes (tc-htb(8), tc-netem(8), tc-bfifo(8) JSON keys).
A_STATE = {
    "qdiscs": {"enp2s0": [
        {"kind": "htb", "handle": "1:", "root": True, "options": {"r2q": 10, "default": "0x1"},
         "bytes": 10867000, "packets": 7520, "drops": 0, "backlog": 0, "qlen": 0},
        {"kind": "netem", "handle": "10:", "parent": "1:1",
         "options": {"limit": 1000, "delay": {"delay": 0.025, "jitter": 0, "correlation": 0}},
         "bytes": 10867000, "packets": 7520, "drops": 0, "backlog": 0, "qlen": 0},
        {"kind": "bfifo", "handle": "20:", "parent": "10:1", "options": {"limit": 60000},
         "bytes": 10800000, "packets": 7480, "drops": 12, "backlog": 1514, "qlen": 1},
    ]},
    "classes": {"enp2s0": "class htb 1:1 root leaf 10: prio 0 rate 1Mbit ceil 1Mbit burst "
                          "1600b cburst 1600b \n"},
    "delay_backend": None,
    "nfqueue_rules": 0,
    "daemons": [{"name": "tcp_client", "pid": 4242, "dir": "/var/lib/trialbed/trials/x/y"}],
    "leftover_trials": [],
    "own_settings": {"sysctls": {"net.ipv4.tcp_congestion_control": "cubic",
                                 "net.ipv4.tcp_no_metrics_save": "0"}},
}  # fmt: skip


def rows(table_text: str, host: str) -> list[list[str]]:
    """The cells of `host`'s rows in a rich table printed without colours (│-separated)."""
    out = []
    for line in table_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells and cells[0] == host:
            out.append(cells)
    return out


def render(states: dict) -> str:
    console = Console(file=io.StringIO(), record=True, width=400, color_system=None)
    rack = Rack.load([LAB])
    status.render(rack, states, console)
    return console.export_text()


def test_freebsd_router_with_two_pipes_and_a_linux_host(tmp_path, monkeypatch, capsys):
    work = standins(tmp_path, monkeypatch, {"list": RULES, "pipe show": PIPES})
    trial = work / "trials" / "seed000" / "t1"  # left behind, a daemon running in it
    trial.mkdir(parents=True)
    # trialbed-daemon's pid file: pid, then the start time from /proc, which FreeBSD lacks.
    (trial / "bottleneck_in.tcpdump.pid").write_text(f"{os.getpid()} \n")
    (work / "router" / "baseline.json").write_text(json.dumps({
        "sysctls": {"net.inet.ip.dummynet.io_fast": "1"}, "offloads": {"em1": ["LRO"], "em2": []},
    }))  # fmt: skip
    state = probe(work, ["em1", "em2"], monkeypatch, capsys)
    assert state["platform"] == "FreeBSD" and state["cc"] == "htcp"
    assert state["daemons"] == [
        {"name": "bottleneck_in.tcpdump", "pid": os.getpid(), "dir": str(trial)}
    ]
    text = render({"A": {**A_STATE, "facts": A_FACTS}, "R": {**state, "facts": R_FACTS}})
    assert "Experiment interfaces (tc, dummynet)" in text
    assert rows(text, "R")[:2] == [
        ["R", "em1", "dummynet pipe 10001 → droptail", "1Mbit/s", "58KB", "25 ms (dummynet)",
         "7489", "0", "31500B/21p"],
        ["R", "em2", "dummynet pipe 10002 → red", "10Mbit/s", "50pkt", "40 ms (dummynet)",
         "912", "17", "4542B/3p"],
    ]  # fmt: skip
    # The Linux host as before: tc's chain, HTB's rate, bfifo's limit, netem's delay.
    assert rows(text, "A")[0] == [
        "A", "enp2s0", "htb → netem → bfifo", "1Mbit", "60000B", "25 ms (netem)", "7480", "12",
        "1514B/1p",
    ]  # fmt: skip
    assert rows(text, "A")[1] == [
        "A", "cubic", "beta=717", "enp2s0 tso off gso on gro on", "enp2s0 1500",
        "198.18.0.0/16 initcwnd 10", "tcp_client (4242)", "-", "cc cubic; 1 other sysctl",
    ]  # fmt: skip
    assert rows(text, "R")[2] == [
        "R", "htcp", "rtt_scaling=1, adaptive_backoff=0",
        "em1 tso4 off tso6 off lro on; em2 tso4 on tso6 on lro off", "em1 1500, em2 9000", "-",
        f"bottleneck_in.tcpdump ({os.getpid()})", "trials/seed000/t1",
        "1 other sysctl; em1 settings",
    ]  # fmt: skip
    linux_only = render({"A": {**A_STATE, "facts": A_FACTS}})
    assert "Experiment interfaces (tc)" in linux_only
    summary = status.summary(Rack.load([LAB]), {"R": {**state, "facts": R_FACTS}})["R"]
    assert summary["cc"] == "htcp"
    assert summary["cc_params"] == {"rtt_scaling": "1", "adaptive_backoff": "0"}
    assert summary["interfaces"]["em2"]["dropped"] == 17


def test_fq_codel_through_its_queue_scheduler_and_pipe(tmp_path, monkeypatch, capsys):
    outputs = {"list": FQ_RULES, "pipe show": FQ_PIPES, "sched show": FQ_SCHEDS,
               "queue show": FQ_QUEUES}  # fmt: skip
    work = standins(tmp_path, monkeypatch, outputs)
    state = probe(work, ["em1", "em2", "em3"], monkeypatch, capsys)
    assert status.shaping_of(state, "em2") == {
        "chain": "dummynet queue 10002 → sched 10002 fq_codel",
        "rate": "10Mbit/s",
        "limit": "40pkt",
        "delay": "40 ms (dummynet)",
        "sent": 5123,
        "dropped": 9,
        "backlog": "17916B/12p",
    }
    assert status.shaping_of(state, "em1")["chain"] == "dummynet pipe 10001 → droptail"
    # em3 has no rule of trialbed's.
    assert status.shaping_of(state, "em3") == {
        "chain": "no dummynet rule", "rate": "-", "limit": "-", "delay": "-", "sent": "-",
        "dropped": "-", "backlog": "-",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("outputs", "chain"),
    [
        (None, "-"),  # no ipfw at all
        ({}, "-"),  # ipfw fails (firewall not loaded, not root)
        ({"list": RULES}, "dummynet pipe 10001"),  # rules read, pipes not
        ({"list": RULES, "pipe show": "garbage\n"}, "dummynet pipe 10001"),
    ],
)
def test_what_cannot_be_read_shows_a_dash(tmp_path, monkeypatch, capsys, outputs, chain):
    work = standins(tmp_path, monkeypatch, outputs)
    (work / "router" / "delay_backend.json").write_text("{not json")
    state = probe(work, ["em1"], monkeypatch, capsys)
    assert status.shaping_of(state, "em1") == {
        "chain": chain, "rate": "-", "limit": "-", "delay": "-", "sent": "-", "dropped": "-",
        "backlog": "-",
    }  # fmt: skip
    assert state["delay_backend"] is None and state["own_settings"] is None


def test_aqms_and_queue_units_as_list_pipes_prints_them():
    # print_flowset_parms() (dummynet.c): "%d B" below 8192 bytes; get_extra_parms()'s
    # " AQM type PIE ..." and " AQM CoDel ..." follow "pri %d " on the flowset's line; GRED
    # on the next line ("\t GRED w_q ..."); an unlimited pipe prints "unlimited".
    text = "\n".join([
        "10003:   1.000 Mbit/s   25 ms burst 0",
        "q141075 4000 B 0 flows (1 buckets) sched 75539 weight 0 lmax 0 pri 0  AQM type PIE "
        "target 15ms tupdate 15ms alpha 0.125 beta 1.25 max_burst 150ms max_ecnth 0.99 NoECN "
        "CapDrop TS NoDerand",
        "10004:   1.000 Mbit/s   25 ms burst 0",
        "q141076 58 KB 0 flows (1 buckets) sched 75540 weight 0 lmax 0 pri 0  AQM CoDel target "
        "5ms interval 100ms NoECN",
        "10005:  10.000 Mbit/s   25 ms burst 0",
        "q141077  30 sl. 0 flows (1 buckets) sched 75541 weight 0 lmax 0 pri 0 ",
        "\t GRED w_q 0.002000 min_th 3 max_th 10 max_p 0.100000",
        "10006: unlimited         40 ms burst 0",
        "q141078  50 sl. 0 flows (1 buckets) sched 75542 weight 0 lmax 0 pri 0 droptail",
    ])  # fmt: skip
    links = status_probe.parse_dummynet(text)["links"]
    assert {n: (ln["flowset"]["aqm"], ln["flowset"]["queue"], ln["flowset"]["queue_unit"])
            for n, ln in links.items()} == {
        10003: ("pie", 4000, "B"), 10004: ("codel", 58, "KB"), 10005: ("gred", 30, "pkt"),
        10006: ("droptail", 50, "pkt"),
    }  # fmt: skip
    assert "packets" not in links[10003]  # no flow line yet: no counters
    assert status.dummynet_rate(links[10006]["rate"]) == "unlimited"
    assert status.dummynet_rate("  2.500 Gbit/s") == "2.5Gbit/s"


def test_the_linux_probe_is_unchanged(monkeypatch, capsys, tmp_path):
    """On Linux the probe asks tc and iptables, as before, and says no platform."""
    calls = []

    class Done:
        def __init__(self, stdout):
            self.stdout = stdout

    def fake_run(argv, **_):
        calls.append(argv[0])
        return Done("[]" if argv[0] == "tc" and "-j" in argv else "")

    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(status_probe.subprocess, "run", fake_run)
    status_probe.main(str(tmp_path), ["eth1"])
    state = json.loads(capsys.readouterr().out)
    assert set(state) == {"qdiscs", "classes", "delay_backend", "nfqueue_rules", "daemons",
                          "leftover_trials", "own_settings"}  # fmt: skip
    assert state["qdiscs"] == {"eth1": []} and sorted(set(calls)) == ["iptables", "tc"]
