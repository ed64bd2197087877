"""RIO lockout from GRED's tc samples (analysis.gred_lockout) on samples with a known answer."""

from __future__ import annotations

import json
from pathlib import Path

from analysis.gred_lockout import gred_lockout

S = 10**9


def sample(t_s: float, qave_in: int, qave_out: int, backlog: int, dev: str = "right") -> str:
    vqs = [
        {"vq": 0, "prio": 1, "max": 40500, "qave": qave_in},
        {"vq": 1, "prio": 2, "max": 9000, "qave": qave_out},
    ]
    gred = {"kind": "gred", "backlog": backlog, "options": {"grio": True, "vqs": vqs}}
    return json.dumps({"ts_ns": int(t_s * S), "dev": dev, "qdiscs": [{"kind": "htb"}, gred]})


def test_locked_while_the_in_average_is_above_max_and_the_queue_empty(tmp_path: Path):
    lines = [
        sample(0, 3000, 0, 0),  # idle, average low
        sample(1, 45000, 0, 200000),  # full queue: dropping, but the link is busy
        sample(2, 44000, 90000, 0),  # locked (OUT's own average does not count for IN)
        sample(3, 42000, 0, 0),  # locked
        sample(4, 41000, 0, 0),  # locked
        sample(5, 30000, 0, 0),  # below max: free again
        sample(6, 41000, 0, 0),  # locked again, for one interval
        sample(7, 41000, 0, 0),
        sample(6, 41000, 0, 0, dev="left"),  # another device
        '{"end": true}',
    ]
    path = tmp_path / "tc_samples.jsonl"
    path.write_text("\n".join(lines) + "\n")
    found = gred_lockout(path, "right", 0, 10 * S)
    assert found == {"locked_s": 4.0, "longest_s": 3.0, "samples": 8}
    # Only the trial's span counts.
    assert gred_lockout(path, "right", int(2.5 * S), int(6.5 * S))["locked_s"] == 0.5 + 1 + 1 + 0.5
    assert gred_lockout(path, "eth9", 0, 10 * S) is None
