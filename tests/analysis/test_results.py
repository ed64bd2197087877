"""analysis.load / load_table on batch directories laid out as trials/runner.py writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import analysis


def trial(batch: Path, name: str, rate: str, status: str, goodput: float | None) -> None:
    d = batch / "trials" / name
    d.mkdir(parents=True)
    record = {
        "trial": name,
        "id": name[-4:],
        "status": status,
        "family": "collateral_damage",
        "repetition": 1,
        "overrides": {"network.links[downstream].rate": rate},
        "parameters": {
            "duration": "60s",
            "network": {"links": [{"name": "downstream", "rate": rate, "buffer": "60000B"}]},
            "hosts": {"all": {"cc": "cubic"}},
        },
        "git": {"commit": "abc", "dirty": False},
        "times": {"started": "2026-11-22T06:00:00+00:00", "t0_ns": 1},
        "errors": [] if status == "complete" else ["interrupted (SIGINT)"],
    }
    (d / "trial.json").write_text(json.dumps(record))
    if goodput is None:
        return
    (d / "analysis").mkdir()
    summary = {
        "trial": name,
        "status": status,
        "generators": {"tcp": {"type": "bulk_tcp", "goodput_kBps": goodput, "flow_kBps": [1, 2]}},
        "queues": {"downstream": {"link": "downstream", "queue_drops_capture": 7}},
        "capture_drops": {"in": 0},
    }
    (d / "analysis" / "summary.json").write_text(json.dumps(summary))
    flows = pd.DataFrame({"src": ["198.18.1.1"], "dst": ["198.18.2.2"], "bytes": [goodput]})
    flows.to_parquet(d / "analysis" / "flows.parquet")


def test_load_one_row_per_trial_across_batches(tmp_path: Path) -> None:
    night1, night2 = tmp_path / "results" / "night-1", tmp_path / "results" / "night-2"
    trial(night1, "rate-1mbit_r1", "1mbit", "complete", 100.0)
    trial(night1, "rate-2mbit_r1", "2mbit", "interrupted", None)
    trial(night2, "rate-1mbit_r1", "1mbit", "complete", 110.0)
    one = analysis.load(night1)
    assert one["trial"].tolist() == ["rate-1mbit_r1", "rate-2mbit_r1"]
    assert one["status"].tolist() == ["complete", "interrupted"]
    assert one["analysed"].tolist() == [True, False]
    assert one["param:duration"].tolist() == ["60s", "60s"]
    assert one["param:network.links[downstream].rate"].tolist() == ["1mbit", "2mbit"]
    assert one["param:hosts.all.cc"].tolist() == ["cubic", "cubic"]
    assert one["factor:network.links[downstream].rate"].tolist() == ["1mbit", "2mbit"]
    assert one.loc[0, "tcp.goodput_kBps"] == 100.0 and pd.isna(one.loc[1, "tcp.goodput_kBps"])
    assert one.loc[0, "queue[downstream].drops_capture"] == 7
    assert one.loc[0, "tcp.flow_kBps"] == "[1, 2]"
    both = analysis.load([night1, night2])
    assert both["batch"].tolist() == ["night-1", "night-1", "night-2"]
    everything = analysis.load(tmp_path / "results")  # a directory of batches
    pd.testing.assert_frame_equal(everything, both)
    flows = analysis.load_table(tmp_path / "results", "flows")
    assert flows[["batch", "trial", "bytes"]].values.tolist() == [
        ["night-1", "rate-1mbit_r1", 100.0],
        ["night-2", "rate-1mbit_r1", 110.0],
    ]
    with pytest.raises(FileNotFoundError, match="no such batch"):
        analysis.load(tmp_path / "missing")


def test_a_path_that_is_not_one_batch_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`trials report` (and the report and results API) names what it was given and, for a
    directory of batches, the batches in it; it never prints an empty table for a typo."""
    from trials.__main__ import main

    results = tmp_path / "results"
    trial(results / "night-1", "rate-1mbit_r1", "1mbit", "complete", 100.0)
    trial(results / "night-2", "rate-1mbit_r1", "1mbit", "complete", 110.0)
    (tmp_path / "file").write_text("")
    refused = {
        results: f"{results}: not a batch directory (no trials/ in it); "
        "batches in it: night-1, night-2",
        tmp_path / "missing": f"{tmp_path / 'missing'}: no such batch directory",
        tmp_path / "file": f"{tmp_path / 'file'}: not a batch directory (a file)",
        results / "night-1" / "trials": f"{results / 'night-1' / 'trials'}: not a batch "
        "directory (no trials/ in it, nor a batch under it)",
    }
    for path, message in refused.items():
        with pytest.raises(analysis.NotABatch) as caught:
            analysis.batch_trials(path)
        assert str(caught.value) == message
        capsys.readouterr()
        assert main(["report", str(path)]) == 2
        out = capsys.readouterr()
        assert message in " ".join((out.out + out.err).split()), path
    trials = analysis.batch_trials(results / "night-1")
    assert trials == [results / "night-1" / "trials" / "rate-1mbit_r1"]
    assert analysis.summary_file(trials[0]).exists()
