"""Which UDP packets crossed the router while it was measurably not run (a stall)."""

from __future__ import annotations

import numpy as np

from analysis.stalls import crossed_a_stall, stall_windows


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
