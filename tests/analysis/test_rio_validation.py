"""analysis/rio_validation.py on batches written here: trials whose record says which RIO
implementation ran, with the summary and the queue table the analysis would write for them,
from a model of the queue: Poisson arrivals at 3 Mbit/s, alternately 1.6 and 0.4 times the
link's rate, 80 % of them IN (AF11) and the rest OUT (AF12), through RIO's early drop
(analysis/rio_model.py, the reference of the BPF program, with the paper's thresholds) and a
work-conserving FIFO; each trial its own seed. Two implementations with one behaviour agree;
one whose OUT level drops less (OUT min 20 instead of 2) does not, on OUT's drop share; what
cannot count or be judged is said, with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.agreement import compare
from analysis.queue import EVENT_NAMES
from analysis.rio_model import RioModel, level_of_dscp
from analysis.rio_validation import (
    JUDGED,
    QUANTILES,
    TRAJECTORY,
    batch_metrics,
    drop_counts,
    main,
    trial_metrics,
)
from core import rio_bpf
from core.dscp import DSCP_NAMES, dscp_name
from core.link_rules import ETHERNET_HEADER

T0_NS = 1_765_000_000 * 10**9
SECONDS, WARMUP = 40, 5
RATE_BPS = 3_000_000
PACKET = 1500  # IP bytes
PAYLOAD = 1448
IN, OUT = DSCP_NAMES["af11"], DSCP_NAMES["af12"]
WHERE = "R2:b1"
POINTS = ("before_bottleneck", "after_bottleneck")
GENERATORS = ("web1", "web2")


def link(out_min: int = 2) -> dict:
    """The bottleneck as role linux_router takes it: seed 004's RIO (IN min 40 here)."""
    rio = {"mean_packet": "1500B", "in": {"min": 40}, "out": {"min": out_min}}
    return {"rate": "3mbit", "buffer": "1000pkt", "qdisc": "rio", "rio": rio}


def arrivals(rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals (ns after T0), 1.6 then 0.4 times the link's packet rate, 4 s each."""
    pps = RATE_BPS / ((PACKET + ETHERNET_HEADER) * 8)
    t, out = 0.0, []
    while t < SECONDS:
        t += rng.exponential(1 / (pps * (1.6 if int(t // 4) % 2 == 0 else 0.4)))
        out.append(t)
    return (np.array(out[:-1]) * 1e9).astype(np.int64)


def queue_of(ts: np.ndarray, dropped: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """The queue table (analysis/bottleneck.py's columns that the comparison reads) of a FIFO
    serving the accepted packets at RATE_BPS, and each accepted one's departure."""
    service = (PACKET + ETHERNET_HEADER) * 8 * 10**9 // RATE_BPS
    kept = ts[~dropped]
    k = np.arange(len(kept))
    left = (k + 1) * service + np.maximum.accumulate(kept - k * service)
    when = np.r_[left, kept, ts[dropped]]
    event = np.r_[np.zeros(len(left)), np.ones(len(kept)), np.full(int(dropped.sum()), 2)]
    order = np.lexsort((event, when))  # at one instant a departure before an arrival
    step = np.array([-1, 1, 0])[event[order].astype(int)]
    table = pd.DataFrame({
        "ts_ns": T0_NS + when[order], "packets": np.cumsum(step),
        "bytes": np.cumsum(step) * (PACKET + ETHERNET_HEADER),
        "event": pd.Categorical.from_codes(event[order].astype(int), list(EVENT_NAMES)),
        "link": "bottleneck",
    })  # fmt: skip
    return table, left


def write_trial(
    batch: Path, name: str, ran: str, seed: int, *, out_min: int = 2, asked: str | None = None,
    capture_drops: int = 0, undecided: int = 0,
) -> dict:  # fmt: skip
    """One trial's record, summary and queue table; the truth returned: per level the
    packets offered and dropped, and the queue's occupancy every millisecond."""
    rng = np.random.default_rng(seed)
    cfg = rio_bpf.from_link(link(out_min))
    model = RioModel(cfg)
    ts = arrivals(rng)
    dscp = np.where(rng.random(len(ts)) < 0.8, IN, OUT)
    gen = rng.integers(0, len(GENERATORS), len(ts))
    rnd = rng.integers(0, 2**32, len(ts))
    dropped = np.array(
        [
            model.arrive(int(t), PACKET, level_of_dscp(cfg, int(d)), int(r)).dropped
            for t, d, r in zip(ts, dscp, rnd, strict=True)
        ]
    )
    queue, left = queue_of(ts, dropped)
    trial = batch / "trials" / name
    (trial / "analysis").mkdir(parents=True)
    queue.to_parquet(trial / "analysis" / "queue.parquet")
    bottleneck = {"link": "bottleneck", "host": "R2", "iface": "b1", "rate_bps": RATE_BPS}
    record = {
        "trial": name, "status": "complete", "times": {"t0_ns": T0_NS},
        "parameters": {"duration": f"{SECONDS}s", "warmup": f"{WARMUP}s"},
        "rio": {WHERE: {"link": "bottleneck", "direction": "forward", "asked": asked or ran,
                        "implementation": ran, "in_dscp": [10, 18, 26, 34]}},
        "traffic": {g: {"type": "web_poisson", "path": {"bottleneck": bottleneck}}
                    for g in GENERATORS},
    }  # fmt: skip
    (trial / "trial.json").write_text(json.dumps(record))
    generators = {}
    for i, g in enumerate(GENERATORS):
        mine = gen == i
        seen = [
            {dscp_name(c): int((mine & (dscp == c) & keep).sum()) for c in (IN, OUT)}
            for keep in (np.ones(len(ts), bool), ~dropped)
        ]
        generators[g] = {"dscp": dict(zip(POINTS, seen, strict=True))}
    steady = left[(ts[~dropped] >= WARMUP * 10**9) & (left < SECONDS * 10**9)]
    summary = {
        "generators": generators,
        "queues": {
            "bottleneck": {
                "captures_before": [POINTS[0]],
                "captures_after": [POINTS[1]],
                "queue_undecided_at_end": undecided,
            }
        },
        "capture_drops": {POINTS[0]: capture_drops, POINTS[1]: 0},
        "goodput_bps": len(steady) * PAYLOAD * 8 / (SECONDS - WARMUP),
        "transit_mean_ms": float((left - ts[~dropped]).mean() / 1e6),
    }
    (trial / "analysis" / "summary.json").write_text(json.dumps(summary))
    grid = T0_NS + np.arange(WARMUP * 1000, SECONDS * 1000) * 10**6
    at = np.searchsorted(queue.ts_ns.to_numpy(), grid, side="right") - 1
    return {
        "offered": {lv: int((dscp == c).sum()) for lv, c in (("in", IN), ("out", OUT))},
        "dropped": {lv: int((dropped & (dscp == c)).sum()) for lv, c in (("in", IN), ("out", OUT))},
        "occupancy": queue.packets.to_numpy()[at],
    }


def batch_of(tmp_path: Path, bpf_out_min: int = 2, runs: int = 5) -> Path:
    batch = tmp_path / "batch"
    for r in range(1, runs + 1):
        write_trial(batch, f"implementation-gred_r{r}", "gred", seed=r)
        write_trial(batch, f"implementation-bpf_r{r}", "bpf", seed=100 + r, out_min=bpf_out_min)
    return batch


def test_a_trials_drop_shares_are_the_queues_and_its_quantiles_the_occupancys(tmp_path):
    """IN and OUT dropped % from the counts by DSCP on either side are the model's drops; the
    queue's mean and quantiles over the steady window are those of its occupancy read every
    millisecond (within a packet: the samples miss what lasts less)."""
    truth = write_trial(tmp_path, "t", "gred", seed=7)
    row = trial_metrics(tmp_path / "trials" / "t")
    assert row["problem"] is None and row["implementation"] == "gred"
    for level in ("in", "out"):
        share = 100 * truth["dropped"][level] / truth["offered"][level]
        assert row[f"{level}_drop_pct"] == pytest.approx(share)
    assert 5 < row["in_drop_pct"] < 40 and row["out_drop_pct"] > 50  # both levels at work
    offered = sum(truth["offered"].values())
    assert row["in_share_pct"] == pytest.approx(100 * truth["offered"]["in"] / offered)
    occupancy = truth["occupancy"]
    assert row["queue_mean_pkt"] == pytest.approx(occupancy.mean(), abs=0.5)
    sampled = np.quantile(occupancy, QUANTILES)
    assert [row[p] for p in TRAJECTORY] == pytest.approx(sampled.tolist(), abs=1)
    assert row["goodput_mbps"] < RATE_BPS / 1e6 and row["transit_ms"] > 0


def test_two_implementations_of_one_behaviour_agree(tmp_path, capsys):
    batch = batch_of(tmp_path)
    rows = batch_metrics(batch)
    assert rows.problem.isna().all(), rows
    names, verdicts = compare(rows, JUDGED)
    assert names == ("bpf", "gred")
    assert {v.metric for v in verdicts} == {*JUDGED.metrics, *TRAJECTORY} - {"high_drop_pct"}
    assert all(v.n == (5, 5) for v in verdicts)
    assert all(v.agree for v in verdicts), [v for v in verdicts if not v.agree]
    assert main([str(batch)]) == 0
    out = capsys.readouterr().out
    assert "DISAGREE" not in out and "OUT dropped % (captures)" in out
    assert "queue quantiles (worst pt)" in out and "queue@p90" in out


def test_an_out_level_that_drops_less_disagrees_on_out(tmp_path, capsys):
    batch = batch_of(tmp_path, bpf_out_min=20)
    _, verdicts = compare(batch_metrics(batch), JUDGED)
    out = next(v for v in verdicts if v.metric == "out_drop_pct")
    assert not out.agree and out.mean[0] < out.mean[1] - 10  # bpf's OUT lost fewer
    assert main([str(batch)]) == 1
    assert "DISAGREE" in capsys.readouterr().out


def test_what_cannot_count_is_left_out_and_one_implementation_is_not_judged(tmp_path, capsys):
    batch = batch_of(tmp_path, runs=3)
    write_trial(batch, "implementation-bpf_r4", "gred", seed=9, asked="bpf")
    write_trial(batch, "implementation-bpf_r5", "bpf", seed=10, capture_drops=3)
    write_trial(batch, "implementation-gred_r4", "gred", seed=11, undecided=2)
    rows = batch_metrics(batch).set_index("trial")
    assert rows.loc["implementation-bpf_r4", "problem"] == f"{WHERE}: asked bpf, ran gred"
    assert "before_bottleneck 3" in rows.loc["implementation-bpf_r5", "problem"]
    assert "2 packets may have been in the queue" in rows.loc["implementation-gred_r4", "problem"]
    _, verdicts = compare(rows.reset_index(), JUDGED)
    assert all(v.n == (3, 3) for v in verdicts)
    only = tmp_path / "only"
    for r in (1, 2):
        write_trial(only, f"r{r}", "bpf", seed=r)
    with pytest.raises(ValueError, match="exactly two implementations; the usable trials ran bpf"):
        compare(batch_metrics(only), JUDGED)
    assert main([str(only)]) == 2
    assert main([str(batch_of(tmp_path / "one", runs=1))]) == 2
    assert "not judged" in capsys.readouterr().out


def test_counts_by_level_take_every_generator_through_the_queue(tmp_path):
    """drop_counts sums the generators' counts at the queue's captures; a generator without
    counts there is an error that names it."""
    write_trial(tmp_path, "t", "bpf", seed=3)
    record = json.loads((tmp_path / "trials" / "t" / "trial.json").read_text())
    summary = json.loads((tmp_path / "trials" / "t" / "analysis" / "summary.json").read_text())
    counts = drop_counts(record, summary)
    for level, name in (("in", "af11"), ("out", "af12")):
        before = sum(summary["generators"][g]["dscp"][POINTS[0]][name] for g in GENERATORS)
        assert counts[level][0] == before and counts[level][1] <= before
    del summary["generators"]["web2"]["dscp"][POINTS[1]]
    with pytest.raises(ValueError, match="web2: no DSCP counts at after_bottleneck"):
        drop_counts(record, summary)


def test_validate_rio_runs_its_batch_then_judges_it(tmp_path):
    """`trialbed validate-rio`'s steps (trials/validation.py) with the batch run stubbed: the
    experiment and repetitions it hands the batch, the verdict it says last, and the exit code
    (a failed trial makes it 1 even where the rest agree)."""
    from argparse import Namespace

    from core.layout import VALIDATION_TABLE
    from trials.validation import VALIDATIONS, validate

    batch, asked, said = batch_of(tmp_path), [], []
    args = Namespace(
        repetitions=5, batch=batch, results=tmp_path, racks=["lab.yml"], retries=2, rack_kind="vm"
    )
    rio = VALIDATIONS["validate-rio"]
    assert validate(rio, args, lambda ns: asked.append(ns) or 0, said.append) == 0
    assert asked[0].experiment.name == "rio_validation.yml" and asked[0].batch == batch
    assert asked[0].sets == ["repetitions=5"]
    assert said[-1] == f"validate-rio: bpf and gred agree ({batch})"
    # the table stays with the batch, as said
    kept = (batch / VALIDATION_TABLE).read_text()
    assert kept == f"{said[-2]}\nvalidate-rio: bpf and gred agree\n"
    assert validate(rio, args, lambda ns: 1, said.append) == 1
    planted = batch_of(tmp_path / "planted", bpf_out_min=20)
    assert (
        validate(rio, Namespace(**{**vars(args), "batch": planted}), lambda ns: 0, said.append) == 1
    )
    assert said[-1] == f"validate-rio: bpf and gred DISAGREE ({planted})"
    assert (planted / VALIDATION_TABLE).read_text().endswith("bpf and gred DISAGREE\n")
