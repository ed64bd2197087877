"""Which UDP packets crossed the router while the delay line was measurably late."""

from __future__ import annotations

import numpy as np

from analysis.trial import due_in_a_stall, stall_windows


def test_overlapping_events_merge_into_disjoint_windows():
    stats = {
        "queues": [
            {"late_events": [[10_000_000, 5000], [12_000_000, 4000]]},
            {"late_events": [[50_000_000, 3000]]},
        ]
    }
    assert stall_windows(stats).tolist() == [[5_000_000, 12_000_000], [47_000_000, 50_000_000]]
    assert stall_windows({}).shape == (0, 2)


def test_packets_due_inside_a_window_are_flagged():
    windows = np.array([[5_000_000, 12_000_000], [47_000_000, 50_000_000]])
    due = np.array(
        [3_000_000, 4_500_000, 8_000_000, 12_900_000, 14_000_000, 46_000_000, 60_000_000]
    )
    flagged = due_in_a_stall(due, windows, slack_ns=1_000_000)
    assert flagged.tolist() == [False, True, True, True, False, True, False]
