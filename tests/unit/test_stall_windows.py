"""Which UDP packets crossed the router while it was measurably not run (a stall, recorded by
the delay line), and how much service a shaper lost while a packet waited (from packets)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.queue import queue_occupancy
from analysis.stalls import crossed_a_stall, lost_service_ns, stall_windows


def test_overlapping_stalls_merge_into_disjoint_windows():
    stats = {"stalls": {"events": [[10_000_000, 5000], [12_000_000, 4000], [50_000_000, 3000]]}}
    assert stall_windows(stats).tolist() == [[5_000_000, 12_000_000], [47_000_000, 50_000_000]]
    assert stall_windows({}).shape == (0, 2)


def test_transit_overlapping_a_window_is_flagged():
    windows = np.array([[5_000_000, 12_000_000], [47_000_000, 50_000_000]])
    ts_in = np.array([0, 0, 13_000_000, 40_000_000, 49_000_000, 60_000_000, 1_000_000])
    ts_out = np.array([4_000_000, 6_000_000, 20_000_000, 48_000_000, 70_000_000, 61_000_000, -1])
    flagged = crossed_a_stall(ts_in, ts_out, windows)
    assert flagged.tolist() == [False, True, False, True, True, False, False]


RATE = 1_000_000
FRAME = 1514
SERIALIZE_NS = FRAME * 8 * 10**9 // RATE  # 12.112 ms
DELAY_NS = 25_000_000


def fifo(enter_ns: list[int], stall: tuple[int, int] | None, limit: int = 1000) -> np.ndarray:
    """Departure times of a FIFO shaper at RATE for full-size frames entering its queue at
    `enter_ns` (-1: dropped, more than `limit` waiting), sending nothing during `stall`."""
    out, free_at, waiting = [], 0, []
    for e in enter_ns:
        waiting = [d for d in waiting if d > e]
        if len(waiting) >= limit:
            out.append(-1)
            continue
        leave = max(e, free_at)
        if stall and stall[0] <= leave < stall[1]:
            leave = stall[1]  # nothing is sent until the machine runs again
        free_at = leave + SERIALIZE_NS
        waiting.append(leave)
        out.append(leave)
    return np.array(out)


def lost_in(enter_ns: list[int], stall: tuple[int, int] | None, limit: int = 1000):
    ts_in = np.array(enter_ns) - DELAY_NS  # seen before the router: the delay comes first
    ts_out = fifo(enter_ns, stall, limit)
    n = len(enter_ns)
    matched = pd.DataFrame(
        {
            "ts_ns": ts_in, "ts_out_ns": ts_out, "forwarded": ts_out >= 0,
            "ip_len": np.full(n, FRAME - 14), "src": np.full(n, 1, np.uint32),
            "dst": np.full(n, 2, np.uint32), "proto": np.full(n, 17),
            "sport": np.full(n, 5000), "dport": np.full(n, 5001),
        }
    )  # fmt: skip
    queue = queue_occupancy(matched, delay_ns=DELAY_NS, max_delay_ns=10**10)
    return lost_service_ns(queue, ts_in, ts_out, DELAY_NS, RATE), ts_out


def test_a_faithful_shaper_loses_no_service_backlogged_or_idle():
    enter = [i * 6_000_000 for i in range(40)] + [10**9 + i * 30_000_000 for i in range(10)]
    lost, _ = lost_in(enter, None)
    assert np.abs(lost).max() <= 1  # ns: rounding of the serialization time


def test_packets_waiting_through_a_stall_lost_its_length_and_the_others_none():
    enter = [i * 6_000_000 for i in range(60)]  # twice the rate: a standing queue
    stall = (200_000_000, 250_000_000)
    lost, out = lost_in(enter, stall)
    # The frame due in the stall left when it ended: every packet waiting then lost as much,
    # one that came during the stall only the part it waited through.
    shift = stall[1] - next(d for d in fifo(enter, None) if d >= stall[0])
    enter_a = np.array(enter)
    waited = (enter_a < stall[1]) & (out > stall[0])
    assert waited.sum() > 10 and (~waited).sum() > 10
    expected = np.minimum(shift, stall[1] - enter_a[waited])
    assert (expected == shift).sum() > 5 and (expected < shift).sum() > 5
    assert np.all(np.abs(lost[waited] - expected) <= 1)
    assert np.all(np.abs(lost[~waited]) <= 1)


def test_dropped_packets_lose_nothing():
    enter = [i * 3_000_000 for i in range(40)]  # four times the rate into 5 packets of queue
    lost, out = lost_in(enter, None, limit=5)
    assert (out < 0).sum() > 10
    assert np.all(lost[out < 0] == 0)
    assert np.abs(lost).max() <= 1


def test_packets_served_late_are_judged_apart_beside_the_delay_lines_stalls():
    """With a delay line's stalls, a packet the shaper served over 2 ms late (a softirq the
    delay line does not see) is judged apart too; with no router records, only those."""
    from analysis.traffic.cbr_udp import judge_lost_service

    owd_ms = [100.0, 130.0, 140.0, 110.0, 0.0]
    owd = pd.DataFrame(
        {
            "owd_ns": [int(x * 1e6) for x in owd_ms],
            "lost": [False, False, False, False, True],
            "delay_path_stalled": [False, True, False, False, False],  # the delay line's
        }
    )
    lost_ns = np.array([0, 0, 3_000_000, 1_000_000, 0])
    both = judge_lost_service(owd.copy(), lost_ns, "delay line")
    assert both["udp_served_late"] == 1 and both["udp_delay_path_stalled"] == 2
    assert both["router_stalls_from"] == "delay line and lost service"
    assert both["owd_max_ms_unstalled"] == 110.0
    alone = judge_lost_service(owd.copy(), lost_ns, None)
    assert alone["router_stalls_from"] == "lost service" and alone["router_stalls"] is None
    assert alone["udp_delay_path_stalled"] == 1 and alone["owd_max_ms_unstalled"] == 130.0
    on_time = judge_lost_service(owd.copy(), np.zeros(5, np.int64), "delay line")
    assert "router_stalls_from" not in on_time  # the delay line's judgement stands


def test_the_report_says_which_packets_the_bound_left_out():
    """The collateral-damage report names what the max OWD was judged without: the delay
    line's stalls, and the packets that left over 2 ms late where they were judged apart too
    (in the stalls' row when there were stalls, else in the lost service's)."""
    from analysis.families.collateral_damage import trial_rows

    base = {
        "flow_goodput_kBps": [110.0], "goodput_kBps": 110.0, "goodput_kBps_lifetime": 109.0,
        "retransmitted_packets": 40, "owd_min_ms": 25.0, "owd_median_ms": 430.0,
        "owd_mean_ms": 420.0, "owd_p99_ms": 500.0, "owd_max_ms": 530.0,
        "owd_max_ms_unstalled": 505.0, "udp_delay_path_stalled": 7,
        "udp_lost_service_median_ms": 0.001, "udp_lost_service_p99_ms": 0.5,
        "udp_lost_service_max_ms": 4.0, "udp_served_late": 2, "udp_lost": 0,
        "udp_packets": 1500, "queue_drops_capture": 26, "queue_drops_tc": 26,
        "queue_full_events": 9, "queue_window_s": 60.0, "queue_full_events_per_min": 9.0,
        "delay_backend": "delay line", "owd_min_excess_ms": 0.07, "delayline_lateness_us": {},
    }  # fmt: skip

    def said(**kw) -> dict[str, str]:
        rows = trial_rows(pd.Series({**base, **kw}))
        return {name: text for name, text in rows if name in ("router stalls", "service lost")}

    stalls = {"router_stalls": 3, "router_stalled_ms": 40.0}
    only = said(**stalls, router_stalls_from="delay line")
    assert "during one; max OWD without them 505.0 ms" in only["router stalls"]
    assert "max OWD" not in only["service lost"]
    both = said(**stalls, router_stalls_from="delay line and lost service")
    assert "or left over 2 ms later than the rate allows; max OWD" in both["router stalls"]
    assert "max OWD" not in both["service lost"]
    late = said(
        router_stalls=0, router_stalled_ms=0.0, router_stalls_from="delay line and lost service"
    )
    assert "router stalls" not in late
    assert late["service lost"].endswith("2 over 2 ms; max OWD of the others 505.0 ms")
    netem = said(router_stalls=None, router_stalled_ms=None, router_stalls_from="lost service")
    assert netem["service lost"].endswith("; max OWD of the others 505.0 ms")
