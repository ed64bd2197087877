"""The web_poisson schedule: a Poisson arrival process at the offered load and flow sizes from
seed 004's 15-group table, checked with proper tests at fixed seeds (Kolmogorov-Smirnov on the
inter-arrival times, chi-square on the groups, dispersion of per-second counts), plus the
spec's refusals of bad values."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from trials.generators.web_poisson import (
    FLOW_GROUPS,
    MEAN_FLOW_BYTES,
    WebPoissonSpec,
    arrival_rate,
    flow_schedule,
)
from trials.plan import load_plan
from trials.spec import SpecError

RATE = 6_000_000
LOAD = 0.64
SECONDS = 20_000  # about 400 000 flows at 64 % of 6 Mbit/s
ALPHA = 0.001  # significance of each test (fixed seeds: the outcome is deterministic)


def ks_pvalue(samples: np.ndarray, cdf) -> float:
    """Two-sided one-sample Kolmogorov-Smirnov test, asymptotic Kolmogorov distribution."""
    x = np.sort(samples)
    n = len(x)
    f = cdf(x)
    d = max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return min(1.0, max(0.0, p))


def chi2_pvalue_even_df(stat: float, df: int) -> float:
    """Upper tail of chi-square with an even number of degrees of freedom (closed form)."""
    assert df % 2 == 0
    half = stat / 2
    return math.exp(-half) * sum(half**j / math.factorial(j) for j in range(df // 2))


@pytest.fixture(scope="module")
def long_schedule() -> dict[str, np.ndarray]:
    return flow_schedule(LOAD, RATE, SECONDS * 10**9, seed=4)


def test_arrival_rate_is_the_offered_load() -> None:
    lam = arrival_rate(LOAD, RATE)
    assert pytest.approx(sum(b for b, _ in FLOW_GROUPS) / 15) == MEAN_FLOW_BYTES
    assert lam * 8 * MEAN_FLOW_BYTES == pytest.approx(LOAD * RATE)


def test_arrival_count_within_poisson_bounds(long_schedule) -> None:
    expected = arrival_rate(LOAD, RATE) * SECONDS
    n = len(long_schedule["t_ns"])
    print(f"arrivals: {n} over {SECONDS} s, expected {expected:.0f} ({n / SECONDS:.3f}/s)")
    assert abs(n - expected) < 4 * math.sqrt(expected)


def test_inter_arrival_times_are_exponential(long_schedule) -> None:
    lam = arrival_rate(LOAD, RATE)
    gaps = np.diff(long_schedule["t_ns"]) / 1e9
    p = ks_pvalue(gaps, lambda x: 1 - np.exp(-lam * x))
    print(f"KS inter-arrivals vs Exp({lam:.3f}/s): p = {p:.3f}")
    assert p > ALPHA
    # the test has power: 5 % off in rate is rejected outright
    assert ks_pvalue(gaps, lambda x: 1 - np.exp(-1.05 * lam * x)) < 1e-6


def test_counts_per_second_have_poisson_dispersion(long_schedule) -> None:
    counts = np.bincount(long_schedule["t_ns"] // 10**9, minlength=SECONDS)[:SECONDS]
    dispersion = (len(counts) - 1) * counts.var(ddof=1) / counts.mean()  # ~ chi2(n - 1)
    z = (dispersion - (len(counts) - 1)) / math.sqrt(2 * (len(counts) - 1))
    print(f"index of dispersion {counts.var(ddof=1) / counts.mean():.4f}, z = {z:.2f}")
    assert abs(z) < 3.3


def test_groups_are_equally_likely(long_schedule) -> None:
    groups = long_schedule["group"]
    counts = np.bincount(groups, minlength=16)[1:]
    expected = len(groups) / 15
    stat = float(((counts - expected) ** 2 / expected).sum())
    p = chi2_pvalue_even_df(stat, 14)
    print(f"chi-square of 15 groups: {stat:.2f}, p = {p:.3f}")
    assert p > ALPHA
    assert set(np.unique(long_schedule["bytes"])) == {b for b, _ in FLOW_GROUPS}
    assert (long_schedule["bytes"] == np.array([b for b, _ in FLOW_GROUPS])[groups - 1]).all()


def test_offered_bytes_match_the_load(long_schedule) -> None:
    sizes = np.array([b for b, _ in FLOW_GROUPS], dtype=float)
    lam_t = arrival_rate(LOAD, RATE) * SECONDS
    total = float(long_schedule["bytes"].sum())
    # compound Poisson: variance lambda*T*E[X^2]
    sigma = math.sqrt(lam_t * float((sizes**2).mean()))
    print(f"offered {total * 8 / SECONDS / RATE:.4f} of the link (asked {LOAD})")
    assert abs(total - lam_t * MEAN_FLOW_BYTES) < 4 * sigma


def test_seeded_schedule_repeats_and_extends() -> None:
    a = flow_schedule(0.9, RATE, 60 * 10**9, seed=7)
    b = flow_schedule(0.9, RATE, 60 * 10**9, seed=7)
    c = flow_schedule(0.9, RATE, 60 * 10**9, seed=8)
    longer = flow_schedule(0.9, RATE, 600 * 10**9, seed=7)
    assert all((a[k] == b[k]).all() for k in a)
    assert len(c["t_ns"]) != len(a["t_ns"]) or (c["t_ns"] != a["t_ns"]).any()
    n = len(a["t_ns"])
    assert all((longer[k][:n] == a[k]).all() for k in a)
    assert (np.diff(a["t_ns"]) >= 0).all() and a["t_ns"][-1] < 60 * 10**9


def test_load_accepts_fraction_and_percent() -> None:
    base = {"type": "web_poisson", "from": "S1", "to": "D1"}
    assert WebPoissonSpec(**base, load="64%").load == 0.64
    assert WebPoissonSpec(**base, load=0.9).load == 0.9
    for bad in (0, 1.5, "150%", "lots"):
        with pytest.raises(ValidationError, match=r"load .*allowed a fraction"):
            WebPoissonSpec(**base, load=bad)


EXPERIMENT = """\
experiment: diffserv
topology: dumbbell
network:
  links:
    - {name: bottleneck, from: R, to: C, rate: 6mbit, buffer: 60pkt, delay: 40ms}
traffic:
  - {type: web_poisson, name: web, from: A, to: C, load: LOAD, seed: 3}
duration: 30s
"""


def test_experiment_file_errors_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "exp.yml"
    path.write_text(EXPERIMENT.replace("LOAD", "64%"))
    plan = load_plan(path)
    assert plan.base.traffic[0].load == 0.64 and plan.base.traffic[0].seed == 3
    good = EXPERIMENT.replace("LOAD", "0.5")
    for text, said in (
        (EXPERIMENT.replace("LOAD", "1.2"), "key 'traffic[0].load': load 1.2: allowed a fraction"),
        (good.replace(", load: 0.5", ""), "key 'traffic[0].load' is required"),
        (good.replace("seed: 3", "seed: -1"), "key 'traffic[0].seed': Input should be"),
        (good.replace("seed: 3", "sead: 3"), "unknown key 'traffic[0].sead'"),
    ):
        path.write_text(text)
        with pytest.raises(SpecError) as exc:
            load_plan(path)
        message = " ".join(str(exc.value).split())
        assert str(path) in message and said in message, message


def test_generators_sharing_a_seed_draw_their_own_streams() -> None:
    a = flow_schedule(0.5, RATE, 60 * 10**9, seed=1, stream=0)
    b = flow_schedule(0.5, RATE, 60 * 10**9, seed=1, stream=1)
    n = min(len(a["t_ns"]), len(b["t_ns"]))
    assert (a["t_ns"][:n] != b["t_ns"][:n]).all()
