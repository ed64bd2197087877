"""analysis/implementations.py on batches written here: trials whose record says which
implementation of H-TCP ran, with a summary and a cwnd table from a model of the sender (AIMD
with H-TCP's alpha(D), or NewReno's one segment per RTT), each trial with its own noise.
Two implementations of one model agree; H-TCP against NewReno does not, on the epoch's length
and its shape; what cannot be judged is said, with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.implementations import (
    GRID,
    METRICS,
    TOLERANCE_SDS,
    batch_metrics,
    compare,
    epoch_shapes,
    main,
)
from analysis.tcp_probe import epoch_counts, epoch_starts

RTT_S = 0.1  # one step of the model: an RTT
BETA = 0.5


def alpha_htcp(since_s: float) -> float:
    """H-TCP's increase per RTT (segments) D seconds after a congestion event, RTT-scaled as
    with use_rtt_scaling at an RTTmin of 50 ms (times 0.5)."""
    if since_s <= 1:
        return 1.0
    d = since_s - 1
    return 0.5 * (1 + 10 * d + (d / 2) ** 2)


def sender(rng: np.random.Generator, alpha, seconds: float = 60) -> pd.DataFrame:
    """tcp_probe's rows of one flow: cwnd grows by alpha(D) per RTT until it reaches the
    path's capacity (its own per epoch: the noise), then falls to BETA of it (ssthresh)."""
    ts, cwnd, ssthresh, sent = [], [], [], []
    t, since, window, thresh = 0.0, 0.0, 10.0, 2**31 - 1
    capacity = 48 + rng.normal(0, 1.5)
    while t < seconds:
        ts.append(t)
        cwnd.append(int(window))
        ssthresh.append(thresh)
        sent.append(int(window) * 1448)  # a window per RTT, acked by the next one
        t += RTT_S * (1 + rng.normal(0, 0.02))
        since += RTT_S
        window += alpha(since) if thresh < 2**31 - 1 else window  # slow start: doubling
        if window >= capacity:
            thresh = int(window * BETA)
            window, since = thresh, 0.0
            capacity = 48 + rng.normal(0, 1.5)
    n = len(ts)
    nxt = np.cumsum(sent) % 2**32
    return pd.DataFrame({
        "snd_nxt": nxt.astype(np.uint32), "snd_una": np.r_[0, nxt[:-1]].astype(np.uint32),
        "ts_ns": (np.array(ts) * 1e9).astype(np.int64), "src": ["198.18.1.10"] * n,
        "sport": np.full(n, 40000, np.uint16), "dst": ["198.18.2.10"] * n,
        "dport": np.full(n, 5201, np.uint16), "snd_cwnd": np.array(cwnd, np.uint32),
        "ssthresh": np.array(ssthresh, np.uint32),
    })  # fmt: skip


def write_trial(
    batch: Path, name: str, ran: str, rng: np.random.Generator, alpha=alpha_htcp,
    asked: str | None = None, status: str = "complete",
) -> None:  # fmt: skip
    trial = batch / "trials" / name
    (trial / "analysis").mkdir(parents=True)
    impl = {"cc": "htcp", "implementation": ran, "asked": asked or ran}
    record = {"trial": name, "status": status, "cc_implementation": {"A": {"htcp": impl}}}
    (trial / "trial.json").write_text(json.dumps(record))
    summary = {"goodput_kBps": 110 + rng.normal(0, 0.3), "owd_median_ms": 348 + rng.normal(0, 1)}
    (trial / "analysis" / "summary.json").write_text(json.dumps(summary))
    flow = sender(rng, alpha)
    control = flow.head(3).assign(sport=np.uint16(40001), ssthresh=np.uint32(2**31 - 1))
    pd.concat([control, flow]).to_parquet(trial / "analysis" / "cwnd.parquet")


def batch_of(tmp_path: Path, bpf_alpha=alpha_htcp, runs: int = 5, seed: int = 1) -> Path:
    rng = np.random.default_rng(seed)
    batch = tmp_path / "batch"
    for r in range(1, runs + 1):
        write_trial(batch, f"cc_implementation-module_r{r}", "module", rng)
        write_trial(batch, f"cc_implementation-bpf_r{r}", "bpf", rng, alpha=bpf_alpha)
    return batch


def table(cwnd, ssthresh, una_lag: int = 1) -> pd.DataFrame:
    """A flow's samples 0.1 s apart: snd_nxt grows by 1000 a sample, and each sample acks
    what was sent `una_lag` samples before (a recovery lasts that long)."""
    n = len(cwnd)
    nxt = np.arange(1, n + 1) * 1000
    return pd.DataFrame({
        "ts_ns": np.arange(n) * 10**8, "src": "a", "sport": 1, "dst": "b", "dport": 2,
        "snd_cwnd": cwnd, "ssthresh": ssthresh, "snd_nxt": nxt,
        "snd_una": np.r_[[0] * una_lag, nxt[:-una_lag]],
    })  # fmt: skip


def test_an_epoch_on_its_own_axis():
    """cwnd climbs one segment per 0.1 s from 20 to 39 and falls back to 20 at each loss
    (samples 20, 40 and 60; ssthresh 20 each time: only the first fall shows in ssthresh),
    recovered at the next sample: two whole epochs of 2 s, each at GRID (from 2.1 s to the
    next loss) (21 + 19 u) / 39, the last sample at or before."""
    i = np.arange(61)
    flow = table(20 + i % 20, np.where(i < 20, 2**31 - 1, 20))
    starts, ended = epoch_starts(flow)
    assert (starts.tolist(), ended.tolist()) == ([20, 40, 60], [21, 41, -1])
    lengths, shapes = epoch_shapes(flow)
    assert lengths == pytest.approx([2.0, 2.0])
    expected = (21 + np.floor(np.round(GRID * 19, 6))) / 39
    assert shapes == pytest.approx(np.vstack([expected, expected]))


def test_a_loss_with_the_same_ssthresh_is_an_epoch_and_a_reduction_is_one():
    """Slow start, a loss (ssthresh falls), growth to 48, a second loss whose ssthresh is 24
    again, cwnd coming down over its recovery (PRR: 46, 41, a step up, 33, 24; it ends when
    what was sent at the loss is acked, 5 samples on), growth, a third loss the same way."""
    cwnd = [10, 20, 40, 30, 24, 30, 40, 48, 46, 41, 42, 33, 24, 30, 48, 40, 24, 25, 26]
    ss = [2**31 - 1] * 3 + [24] * 16
    starts, ended = epoch_starts(table(cwnd, ss, una_lag=5))
    assert (starts.tolist(), ended.tolist()) == ([3, 8, 15], [8, 13, -1])


def test_a_trials_epoch_count_is_every_loss_of_each_flow():
    """The trial summary's congestion_epochs (the paper's 20-epoch rule): two flows, one with
    three losses at one ssthresh (ssthresh falls once), one with one; without sequence numbers
    (SIFTR) a flow's count falls back to its ssthresh reductions."""
    cwnd = [10, 20, 40, 30, 24, 30, 40, 48, 46, 41, 42, 33, 24, 30, 48, 40, 24, 25, 26]
    ss = [2**31 - 1] * 3 + [24] * 16
    first = table(cwnd, ss, una_lag=5)
    i = np.arange(30)
    second = table(20 + i % 20, np.where(i < 20, 2**31 - 1, 20)).assign(sport=2)
    both = pd.concat([first, second], ignore_index=True)
    assert epoch_counts(both, [1, 2]) == [3, 1]
    assert epoch_counts(both.assign(snd_nxt=0, snd_una=0), [1, 2]) == [1, 1]


def test_two_implementations_of_one_algorithm_agree(tmp_path, capsys):
    batch = batch_of(tmp_path)
    rows = batch_metrics(batch)
    assert rows.problem.isna().all() and (rows.epochs >= 8).all(), rows
    names, verdicts = compare(rows)
    assert names == ("htcp/bpf", "htcp/module")
    assert {v.metric for v in verdicts} >= {"goodput_kBps", "owd_median_ms", "epoch_s"}
    assert all(v.agree for v in verdicts), [v for v in verdicts if not v.agree]
    assert all(v.n == (5, 5) for v in verdicts)
    assert all(v.tolerance > 0 for v in verdicts if v.metric in METRICS)
    # H-TCP's curve is convex: more than half the epoch's growth comes in its second half.
    late = next(v for v in verdicts if v.metric == "late_growth")
    assert min(late.mean) > 0.5
    assert main([str(batch)]) == 0
    out = capsys.readouterr().out
    assert "DISAGREE" not in out and f"<= {TOLERANCE_SDS:g} pooled sd" in out


def test_htcp_against_newreno_disagrees_on_the_epoch_and_its_shape(tmp_path, capsys):
    batch = batch_of(tmp_path, bpf_alpha=lambda since: 1.0)
    _, verdicts = compare(batch_metrics(batch))
    by = {v.metric: v for v in verdicts}
    assert not by["epoch_s"].agree and by["epoch_s"].mean[0] > by["epoch_s"].mean[1]
    assert not by["late_growth"].agree
    assert by["goodput_kBps"].agree  # the summaries were drawn alike
    assert main([str(batch)]) == 1
    assert "DISAGREE" in capsys.readouterr().out


def test_a_trial_that_ran_another_implementation_than_asked_is_left_out(tmp_path, capsys):
    batch = batch_of(tmp_path, runs=3)
    write_trial(batch, "cc_implementation-bpf_r4", "module", np.random.default_rng(9), asked="bpf")
    write_trial(batch, "cc_implementation-bpf_r5", "bpf", np.random.default_rng(9), status="failed")
    rows = batch_metrics(batch).set_index("trial")
    assert rows.loc["cc_implementation-bpf_r4", "problem"] == "htcp: asked bpf, ran module"
    assert rows.loc["cc_implementation-bpf_r5", "problem"] == "status failed"
    _, verdicts = compare(rows.reset_index())
    assert all(v.n == (3, 3) for v in verdicts)
    main([str(batch)])
    assert (
        "cc_implementation-bpf_r4: left out: htcp: asked bpf, ran module" in capsys.readouterr().out
    )


def test_one_implementation_or_one_run_cannot_be_judged(tmp_path, capsys):
    rng = np.random.default_rng(3)
    only = tmp_path / "only"
    for r in (1, 2):
        write_trial(only, f"r{r}", "bpf", rng)
    with pytest.raises(
        ValueError, match="exactly two implementations; the usable trials ran htcp/bpf"
    ):
        compare(batch_metrics(only))
    assert main([str(only)]) == 2
    one = batch_of(tmp_path / "one", runs=1)
    assert main([str(one)]) == 2
    assert "not judged" in capsys.readouterr().out
