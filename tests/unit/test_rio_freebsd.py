"""qdisc rio on a FreeBSD router (the lab rack's R): approximated by roles/freebsd_router with
two dummynet RED queues on the link's pipe. Preflight lets it through where dummynet is; the
runner snapshots both queues (`ipfw queue show IN OUT`) before and after a trial and writes
trial.json's rio record from them: thresholds in packets only, the queue numbers, the label,
and the counters under "0" (IN) and "1" (OUT) as GRED's VQs are, which the seed-004 analysis
reads as it reads GRED's and labels.

The `ipfw queue show` samples are written with the printf formats of sbin/ipfw/dummynet.c
(FreeBSD 13/14), which ipfw(8) does not spell out: print_flowset_parms() without a pending link
line prints "q%05d %s%s %d flows (%d buckets) sched %d weight %d lmax %d pri %d %s" (a queue in
slots "%3d sl."; RED on its own line "\\n\\t %cRED w_q %f min_th %d max_th %d max_p %f"),
print_header() the column line once before the listing's first flow, and list_flow() each flow:
"%3u%c" "%-4s " "%15s/%-5d " "%15s/%-5d " then pr_u64's "%*llu " (width 4: total packets, width
8: total bytes) and "%2u %4u %3u" (queued packets, queued bytes, drops). No FreeBSD host
produced these: they are written from that source. Nothing is contacted."""

# ruff: noqa: UP031  (printf-style on purpose: the C formats of dummynet.c, copied as they are)
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis.families import diffserv
from analysis.ipfw_samples import parse_queue_show, rio_queue_counters
from analysis.trial import queue_drops_counted
from core.rack import Rack
from tests.unit import test_host_facts_freebsd as lab
from trials import host_commands
from trials import record as trial_record
from trials.host_vars import host_vars
from trials.network import host_settings, resolve_network
from trials.plan import load_plan
from trials.spec import SpecError

PROJECT = Path(__file__).resolve().parents[2]
LAB = PROJECT / "inventory/lab.example/hosts.yml"
# RIO towards C (em2), drop-tail back towards A (em1).
EXPERIMENT = """\
experiment: diffserv
network:
  links:
    - {name: downstream, from: R, to: C, rate: 1500kbit, buffer: 60000B, delay: 10ms, qdisc: rio}
    - {name: upstream, from: R, to: A, rate: 10mbit, buffer: 60000B, delay: 10ms}
traffic:
  - {type: cbr_udp, name: in_flow, from: A, to: C, packet_bytes: 1500, interval: 12ms, dscp: af11}
duration: 10s
"""
HEADER = "BKT Prot ___Source IP/port____ ____Dest. IP/port____ Tot_pkt/bytes Pkt/Byte Drp"
LABEL = "approximated by two dummynet RED queues (IN, OUT) on one pipe"


def flowset(nr: int, sched: int, slots: int, red: tuple[float, int, int, float]) -> list[str]:
    """A RED queue of `slots` slots on pipe `sched`, weight 1, no mask: one flow at most.
    w_q and max_p as dummynet keeps them, (int)(x * 2^16) / 2^16."""
    w_q, min_th, max_th, max_p = red
    return [
        "q%05d %s%s %d flows (%d buckets) sched %d weight %d lmax %d pri %d %s"
        % (nr, "%3d sl." % slots, "", 1, 1, sched, 1, 0, 0, "")
        + "\n\t %cRED w_q %f min_th %d max_th %d max_p %f"
        % (" ", int(w_q * 2**16) / 2**16, min_th, max_th, int(max_p * 2**16) / 2**16)
    ]


def flow(tot_pkts: int, tot_bytes: int, pkts: int, queued: int, drops: int) -> str:
    return (
        "%3u%c" % (0, " ")
        + "%-4s " % "ip"
        + "%15s/%-5d " % ("0.0.0.0", 0)
        + "%15s/%-5d " % ("0.0.0.0", 0)
        + "%*u " % (4, tot_pkts)
        + "%*u " % (8, tot_bytes)
        + "%2u %4u %3u" % (pkts, queued, drops)
    )


def queue_show(q_in: int, q_out: int, pipe: int, counted_in: tuple, counted_out: tuple) -> str:
    """`ipfw queue show IN OUT` for the seed-004 defaults (IN 9/27/0.1, OUT 2/6/0.2, w_q
    0.0012), 40 slots each; a queue's flow line only once a packet came (none: no flow)."""
    lines = flowset(q_in, pipe, 40, (0.0012, 9, 27, 0.1))
    if counted_in:
        lines += [HEADER, flow(*counted_in)]
    lines += flowset(q_out, pipe, 40, (0.0012, 2, 6, 0.2))
    if counted_out:
        lines += ([] if counted_in else [HEADER]) + [flow(*counted_out)]
    return "\n".join(lines) + "\n"


def lab_net(tmp_path: Path):
    path = tmp_path / "exp.yml"
    path.write_text(EXPERIMENT)
    trial = load_plan(path).trials[0]
    net = resolve_network(trial.experiment, Rack.load([LAB]), str(path))
    return trial, net


def test_queue_show_counters_per_queue():
    text = queue_show(10002, 10004, 10002, (2771, 4156500, 3, 4500, 66), (354, 531000, 0, 0, 122))
    assert "\n\t  RED w_q 0.001190 min_th 9 max_th 27 max_p 0.099991\n" in text
    assert parse_queue_show(text) == {
        10002: {"packets": 2771, "bytes": 4156500, "qlen": 3, "backlog": 4500, "drops": 66},
        10004: {"packets": 354, "bytes": 531000, "qlen": 0, "backlog": 0, "drops": 122},
    }
    # No packet yet: the queues are listed without flows, zeros.
    empty = parse_queue_show(queue_show(10002, 10004, 10002, (), ()))
    assert empty[10002] == empty[10004] == dict.fromkeys(empty[10002], 0)
    snapshot = "## queues in=10002 out=10004\n" + text
    assert rio_queue_counters(snapshot)["out"]["drops"] == 122  # type: ignore[index]
    assert rio_queue_counters(text) is None  # no numbers line
    # ipfw printed nothing of a queue (not configured): no counters rather than zeros.
    assert rio_queue_counters("## queues in=10002 out=10004\nipfw: no such queue\n") is None


def _plugin(name: str):
    path = PROJECT / "playbooks/filter_plugins" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.FilterModule().filters()


def test_rio_record_of_a_freebsd_router_from_its_queue_snapshots(tmp_path):
    trial, net = lab_net(tmp_path)
    assert net.runs_freebsd("R")
    links = host_vars(trial, net, host_settings(trial.experiment, net, "x"))["R"][
        "linux_router_links"
    ]
    # The router's record, as roles/freebsd_router writes it into delay_backend.json.
    backend = _plugin("trialbed_dummynet")["trialbed_dummynet_rio_record"](links, 10000)
    assert list(backend) == ["em2"]
    queues = host_commands.dummynet_rio_queues(net, "R")
    assert queues == {"em2": backend["em2"]["queues"]}  # numbered as the role numbers them
    q_in, q_out = queues["em2"]["in"], queues["em2"]["out"]
    pipe = net.dummynet_pipes("R")["em2"]
    assert backend["em2"]["pipe"] == pipe

    # The snapshot writes both queues, after their numbers, beside the pipes'.
    daemons = SimpleNamespace(remote={h: f"/w/{h}" for h in "ABCDR"})
    command = host_commands.snapshot_commands(net, daemons, "after")["R"]  # type: ignore[arg-type]
    assert (
        f"{{ echo '## queues in={q_in} out={q_out}'; ipfw queue show {q_in} {q_out}; }} "
        "> /w/R/ipfw_queues_em2_after.txt 2>&1; "
    ) in command
    assert "ipfw_after.txt" in command and "tc " not in command and "gred_" not in command

    host = tmp_path / "R"
    host.mkdir()
    for tag, counted_in, counted_out in (
        ("before", (100, 150000, 0, 0, 1), (10, 15000, 0, 0, 2)),
        ("after", (2871, 4306500, 3, 4500, 67), (364, 546000, 0, 0, 124)),
    ):
        (host / f"ipfw_queues_em2_{tag}.txt").write_text(
            f"## queues in={q_in} out={q_out}\n"
            + queue_show(q_in, q_out, pipe, counted_in, counted_out)
        )
    record = trial_record.rio_record(tmp_path, net, {"R": {"backend": "dummynet", "rio": backend}})
    entry = record["R:em2"]
    assert entry["approximation"] == LABEL == backend["em2"]["rio"]
    assert entry["queues"] == {"in": q_in, "out": q_out} and entry["pipe"] == pipe
    assert entry["counters"] == {
        "0": {"packets": 2771, "bytes": 4156500, "drops": 66},
        "1": {"packets": 354, "bytes": 531000, "drops": 122},
    }
    vq_in, vq_out = entry["virtual_queues"]
    assert (vq_in["min_packets"], vq_in["max_packets"], vq_in["pmax"]) == (9, 27, 0.1)
    assert (vq_out["min_packets"], vq_out["max_packets"], vq_out["pmax"]) == (2, 6, 0.2)
    assert (vq_in["queue"], vq_out["queue"]) == (q_in, q_out)
    assert vq_in["limit_packets"] == backend["em2"]["queue_slots"] == 40
    assert vq_in["w_q_effective"] == backend["em2"]["in"]["w_q_effective"] == 78 / 2**16
    # Packets only: dummynet's queues count slots, nothing converted to bytes.
    assert not any("bytes" in k or k in ("burst", "wlog", "limit") for k in vq_in)
    json.dumps(record)  # as trial.json takes it

    # Without the router's record (no delay on the link): the same numbers and a fixed label.
    alone = trial_record.rio_record(tmp_path, net)["R:em2"]
    assert alone["approximation"] == LABEL and alone["counters"] == entry["counters"]
    # The analysis's drop count at the bottleneck: both queues' drops (the pipe's own queue
    # stays empty), (67 - 1) + (124 - 2).
    assert queue_drops_counted(host, "em2") == 188
    # A snapshot missing: an error naming the command, no counters.
    (host / "ipfw_queues_em2_before.txt").unlink()
    missing = trial_record.rio_record(tmp_path, net)["R:em2"]
    assert "counters" not in missing
    assert missing["error"] == (
        f"no dummynet queue counters (ipfw queue show {q_in} {q_out}) came back"
    )

    # The seed-004 analysis reads these counters as GRED's, and says what they are.
    s = diffserv.trial_summary(
        {"parameters": {"duration": "10s", "warmup": "0s"}, "rio": record, "traffic": {}},
        {"generators": {}},
    )
    assert s["in_packets"] == 2771 and s["out_packets"] == 354
    assert s["in_share"] == 2771 / 3125 and s["drop_in"] == 66 / 2771
    assert s["rio_approximation"] == LABEL
    what, said = diffserv.trial_rows(pd.Series(s))[1]
    assert what == "RIO approximation (dummynet queues)" and said.endswith(f"not RIO: {LABEL}")


def test_preflight_lets_rio_through_on_a_freebsd_router_with_dummynet(
    tmp_path, monkeypatch, capsys
):
    path = tmp_path / "exp.yml"
    path.write_text(EXPERIMENT)
    monkeypatch.setattr(lab, "EXPERIMENT", path)
    facts = lab.lab_preflight(tmp_path, monkeypatch, capsys)
    assert "rio" in facts["R"]["qdiscs"]
    # Without dummynet there is none of it, rio included.
    with pytest.raises(SpecError, match="qdisc 'rio' is not available on the FreeBSD host R"):
        lab.lab_preflight(tmp_path / "none", monkeypatch, capsys, dummynet=False)


def test_a_third_rio_level_is_refused_on_a_freebsd_router_before_any_host_is_touched(
    tmp_path, monkeypatch, capsys
):
    path = tmp_path / "exp.yml"
    path.write_text(EXPERIMENT.replace("qdisc: rio}", "qdisc: rio, rio: {high: {min: 2}}}"))
    monkeypatch.setattr(lab, "EXPERIMENT", path)
    with pytest.raises(SpecError) as refused:
        lab.lab_preflight(tmp_path, monkeypatch, capsys)
    assert (
        "key 'network.links[downstream].rio.high': host R is a FreeBSD router, whose "
        "approximation of RIO has two dummynet queues (IN, OUT); a third drop level needs a "
        "Linux router (GRED)"
    ) in str(refused.value)
    # The role refuses it too, for a playbook run by hand.
    problems = _plugin("trialbed_dummynet")["trialbed_dummynet_problems"](
        {"iface": "em2", "rate": "1500kbit", "buffer": "60000B", "qdisc": "rio",
         "rio": {"high": {}}}
    )  # fmt: skip
    assert any(p.startswith("rio.high: the dummynet approximation") for p in problems)


def test_the_html_report_says_the_table_is_not_rio(tmp_path):
    from analysis.html_report import diffserv as html
    from analysis.html_report.page import Page

    row = {
        "trial": "t1", "status": "complete", "analysed": True, "marker": "APM",
        "rio_in_min_pkt": 9, "rio_out_min_pkt": 2, "in_share": 0.5, "drop_total": 0.01,
        "drop_in": 0.0, "drop_out": 0.02, "goodput_bps": 1e6, "utilization": 0.6,
        "transit_mean_ms": 20.0, "delay_normalized": 1.2, "rio_approximation": LABEL,
        **{f"fct_{p}pkt_mean_ms": float(p) for p in diffserv.FCT_CLASSES},
    }  # fmt: skip
    page = Page("t", tmp_path)
    html.sections(page, tmp_path, pd.DataFrame([row]))
    warned = [p for p in page.parts if p.startswith('<div class="warn">')]
    assert any(f"NOT RIO: a FreeBSD router&#x27;s rio is {LABEL}" in p for p in warned)
