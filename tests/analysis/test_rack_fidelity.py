"""scripts/rack_fidelity.py on a recorded startup trial (tests/data/report_startup) whose
records are given known figures: the delay line's lateness, stalls and NFQUEUE losses over two
routers, the bottleneck's drops by its qdisc and by the captures, drops at another shaped
queue, capture losses, the senders' and receivers' CPU and the machine's vmstat lines."""

from __future__ import annotations

import importlib.util
import json
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from core.layout import BatchDir
from core.units import parse_duration_ns

PROJECT = Path(__file__).resolve().parents[2]
DATA = PROJECT / "tests" / "data" / "report_startup"
NAME = "start-0s_initcwnd-10_r1"


def script():
    spec = importlib.util.spec_from_file_location(
        "rack_fidelity", PROJECT / "scripts/rack_fidelity.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tc(iface_drops: dict[str, int]) -> str:
    return "".join(
        f"## {iface}\nqdisc htb 1: root refcnt 2 r2q 10 default 0x10\n"
        f" Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0) \n"
        f"qdisc bfifo 10: parent 1:10 limit 30000b\n"
        f" Sent 0 bytes 0 pkt (dropped {d}, overlimits 0 requeues 0) \n"
        for iface, d in iface_drops.items()
    )


def queue(p99: int, worst: int, lost: int) -> dict:
    lateness = {"count": 100, "mean": p99 / 2, "p50": p99 / 3, "p99": p99, "max": worst}
    return {"lateness_us": lateness, "kernel": {"queue_dropped": lost, "user_dropped": 1}}


@pytest.fixture
def trial(tmp_path: Path) -> Path:
    batch = shutil.copytree(DATA, tmp_path / "batch")
    t = BatchDir(batch).trial(NAME)
    record = json.loads(t.record.read_text())
    record["delay"]["R1"]["delayline_stats"].update(
        queues=[queue(300, 9000, 2)], stalls={"count": 3, "total_us": 12_000}
    )
    record["delay"]["R2"]["delayline_stats"].update(
        queues=[queue(100, 20_000, 0)], stalls={"count": 1, "total_us": 2_500}
    )
    record["capture"]["sender1"]["dropped_by_kernel"] = 4
    t.record.write_text(json.dumps(record))
    summary = json.loads(t.summary.read_text())
    summary["queues"]["bottleneck"].update(queue_drops_tc=10, queue_drops_capture=13)
    t.summary.write_text(json.dumps(summary))
    (t.path / "R1").mkdir(exist_ok=True)
    (t.path / "R1" / "tc_before.txt").write_text(tc({"core": 0, "a1": 1}))
    (t.path / "R1" / "tc_after.txt").write_text(tc({"core": 67, "a1": 3}))  # core: bottleneck
    (t.path / "S1").mkdir(exist_ok=True)
    (t.path / "S1" / "tc_before.txt").write_text(tc({"a1": 2}))
    (t.path / "S1" / "tc_after.txt").write_text(tc({"a1": 7}))
    for host, name, side, cpu in (("S1", "pair1", "client", 1.5), ("S2", "pair2", "client", 0.5),
                                  ("D1", "pair1", "server", 3.0)):  # fmt: skip
        (t.path / host).mkdir(exist_ok=True)
        used = {"user": cpu * 0.25, "system": cpu * 0.75}  # as hostside/traffic/bulk_socket.py
        (t.path / host / f"{name}_{side}.json").write_text(json.dumps({"cpu_s": used}))
    return t.path


def vmstat_lines(start: float, idle: list[int]) -> str:
    head = "procs ---memory--- -cpu- -----timestamp-----\n r  b us sy id wa st     UTC\n"
    rows = []
    for i, value in enumerate(idle):
        when = datetime.fromtimestamp(start + i).strftime("%Y-%m-%d %H:%M:%S")
        rows.append(f" 1 0 {90 - value} {10} {value} 0 0 {when}\n")
    return head + "".join(rows)


def test_each_figure_is_what_the_records_say(trial: Path, tmp_path: Path) -> None:
    fidelity = script()
    record = json.loads((trial / "trial.json").read_text())
    t0 = record["times"]["t0_ns"] / 1e9
    warmup, duration = (
        parse_duration_ns(record["parameters"][k]) / 1e9 for k in ("warmup", "duration")
    )
    # Two lines before the warmup's end, three within the traffic, two after it.
    idle = [99, 99, 10, 20, 30, 98, 98]
    times = [t0 + 1, t0 + 2, t0 + warmup + 1, t0 + 12, t0 + duration - 1, t0 + 40, t0 + 41]
    lines = "".join(
        vmstat_lines(when, [value]).split("\n", 2)[2]
        for when, value in zip(times, idle, strict=True)
    )
    vmstat = tmp_path / "vmstat.txt"
    vmstat.write_text(vmstat_lines(0, []) + lines)
    (row,) = fidelity.rows_of([trial.parent.parent], vmstat)
    assert row["trial"] == NAME and row["rack"] == ",".join(record["inventory"])
    assert (row["late_p99_us"], row["late_max_us"]) == (300, 20_000)  # worst of each
    assert (row["stalls"], row["stalled_ms"]) == (4, 14.5)
    assert row["nfq_drops"] == 2 + 1 + 0 + 1
    assert (row["bn_tc"], row["bn_cap"], row["lost_out"]) == (10, 13, 3)
    assert row["other_q"] == (3 - 1) + (7 - 2)  # R1's a1 and S1's a1, not R1's core
    assert row["cap_drops"] == 4
    assert row["snd_cpu"] == pytest.approx((1.5 + 0.5) / duration)
    assert row["rcv_cpu"] == pytest.approx(3.0 / duration)
    assert row["idle"] == pytest.approx(20) and row["sys"] == pytest.approx(10)
    summary = json.loads((trial / "analysis" / "summary.json").read_text())
    goodput = sum(g["goodput_kBps"] for g in summary["generators"].values())
    assert row["share"] == pytest.approx(goodput * 8000 / summary["payload_capacity_bps"])


def test_a_trial_that_is_not_complete_or_not_analysed_has_no_row(trial: Path) -> None:
    fidelity = script()
    shutil.rmtree(trial / "analysis")
    assert fidelity.rows_of([trial.parent.parent]) == []
    assert fidelity.main([str(trial.parent.parent)]) == 1


def test_netem_reports_no_lateness() -> None:
    record = {"delay": {"R": {"backend": "netem"}}}
    assert script().delay_line(record) == {}


def test_a_late_joiner_counts_over_its_own_window() -> None:
    """Two generators, the second joining halfway: the link is full all along when the first
    carries the whole capacity alone and then half of it (the sum of their rates would say
    1.5)."""
    capacity = 8_000_000  # 1000 kB/s of payload
    summary = {
        "payload_capacity_bps": capacity,
        "generators": {
            "first": {"goodput_kBps": 750.0, "steady_window_s": [0.0, 20.0]},
            "late": {"goodput_kBps": 500.0, "steady_window_s": [10.0, 20.0]},
        },
    }
    assert script().steady_share(summary) == pytest.approx(1.0)
    summary["generators"]["late"]["steady_window_s"] = None  # an older summary: one window
    assert script().steady_share(summary) == pytest.approx(1.25)
