"""`trialbed record` (make record) of batches of the papers' protocols: a results directory as
`make batch` leaves it (batch.json and experiment.yml of a shipped experiments/*_paper_*.yml
plan, trials/<name>/ of some of its trials, generated and analysed: tests/analysis/trialgen.py
for seed 001, tests/analysis/eftgen.py for seed 003). summary.csv has a row per planned trial
with the plan's factor levels, complete trials' metrics as their summary.json holds them, and
every other trial's status; the report holds the family's tables."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.families import FAMILIES
from analysis.families import startup as startup_family
from analysis.families.common import TRIMMED_MEAN
from analysis.families.published import published
from analysis.html_report.paper import AVERAGED, PAPER
from analysis.reproduction import NOT_RUN, REPORT, SUMMARY
from analysis.trial import analyse_trial
from core.layout import RECORD, BatchDir
from trials.batch import Batch
from trials.plan import Plan, Trial, load_plan

from .eftgen import write_eft_trial
from .test_reproduction import field_of
from .trialgen import write_trial

PROJECT = Path(__file__).resolve().parents[2]
STARTUP = sorted((PROJECT / "experiments").glob("startup_paper_*.yml"))
EFT = sorted((PROJECT / "experiments").glob("eft_paper_*.yml"))


def batch_of(path: Path, where: Path) -> tuple[Path, Plan]:
    """A batch directory of the file's whole plan, as `make batch` begins it."""
    plan = load_plan(path)
    batch = where / "results" / path.stem
    Batch.create_or_resume(batch, plan, plan.trials, [], None)
    return batch, plan


def cells(plan: Plan, n: int) -> list[Trial]:
    """The first ``n`` planned trials of distinct factor levels."""
    seen, out = set(), []
    for t in plan.trials:
        key = json.dumps(t.overrides, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out[:n]


def as_planned(trial_dir: Path, t: Trial, **changes) -> None:
    """The generated trial's record names the planned trial (its levels and repetition)."""
    record = json.loads((trial_dir / RECORD).read_text())
    record.update(trial=t.name, overrides=t.overrides, repetition=t.repetition, **changes)
    (trial_dir / RECORD).write_text(json.dumps(record))


def record_rows(batch: Path, out: Path, capsys) -> tuple[list[str], list[dict[str, str]], str]:
    from trials.__main__ import main

    capsys.readouterr()
    assert main(["record", str(batch), str(out)]) == 0
    said = " ".join(capsys.readouterr().err.split())
    with (out / SUMMARY).open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader), said


def check_rows(
    plan: Plan, header: list[str], rows: list[dict[str, str]], batch: Path, family: str
) -> dict[str, dict]:
    """Every planned trial once, its factors the plan's; complete trials' metrics their
    summary's; the others' empty. Returns the complete trials' summaries by name."""
    metrics = FAMILIES[family].RECORD_METRICS
    factors = list(plan.trials[0].overrides)
    assert header == ["trial", *factors, "repetition", "status", *metrics, "note"]
    assert sorted(r["trial"] for r in rows) == sorted(t.name for t in plan.trials)
    planned = {t.name: t for t in plan.trials}
    summaries = {}
    for r in rows:
        t = planned[r["trial"]]
        assert {f: field_of(r[f]) for f in factors} == t.overrides, r["trial"]
        assert int(r["repetition"]) == t.repetition
        f = BatchDir(batch).trial(t.name).summary
        if r["status"] == "complete":
            summary = summaries[t.name] = json.loads(f.read_text())
            for column, key in metrics.items():
                assert field_of(r[column]) == summary.get(key), (t.name, column)
        else:
            assert all(r[c] == "" for c in metrics), r
    return summaries


@pytest.mark.parametrize("path", STARTUP, ids=[p.stem for p in STARTUP])
def test_a_startup_paper_batch_is_recorded_trial_by_trial(
    path: Path, tmp_path: Path, capsys
) -> None:
    batch, plan = batch_of(path, tmp_path)
    done, failed = cells(plan, 3)[:2], cells(plan, 3)[2]
    for t in [*done, failed]:
        pairs = len(t.experiment.traffic)
        write_trial(
            BatchDir(batch).trial(t.name).path, packets=600 * pairs, family="startup",
            flows=pairs, socket=True, duration_ns=12 * 10**9, delay_ns=50_000_000,
            rate_bps=1_500_000,
        )  # fmt: skip
    for t in done:
        as_planned(BatchDir(batch).trial(t.name).path, t)
        analyse_trial(BatchDir(batch).trial(t.name).path, catalog=False)
    as_planned(
        BatchDir(batch).trial(failed.name).path, failed, status="failed", errors=["host S1 gone"]
    )
    header, rows, said = record_rows(batch, tmp_path / "record", capsys)
    summaries = check_rows(plan, header, rows, batch, "startup")
    assert sorted(summaries) == sorted(t.name for t in done)
    status = {r["trial"]: r["status"] for r in rows}
    assert status.pop(failed.name) == "failed"
    assert set(status.values()) == {"complete", NOT_RUN}
    n = len(plan.trials)
    assert f"({n} planned trials in {SUMMARY}: 2 complete, 1 failed, {n - 3} not run)" in said
    # The table's first cut-off, from the first data SYN, is in the record and not empty.
    first = startup_family.bytes_key(startup_family.TRANSFERRED, startup_family.SINCE_SYN, "1s")
    for r in rows:
        if r["status"] == "complete":
            assert field_of(r[first]) > 0, r["trial"]
    page = (tmp_path / "record" / REPORT / "index.html").read_text()
    assert startup_family.THROUGHPUT_TITLE.split(" (")[0] in page


@pytest.mark.parametrize("path", EFT, ids=[p.stem for p in EFT])
def test_an_eft_paper_batch_is_recorded_trial_by_trial(path: Path, tmp_path: Path, capsys) -> None:
    batch, plan = batch_of(path, tmp_path)
    done = cells(plan, 2) if len(plan.trials) > 1 else plan.trials[:1]
    for i, t in enumerate(done):
        spec, link = t.experiment.traffic[0], t.experiment.network.links[0]
        write_eft_trial(
            BatchDir(batch).trial(t.name).path, spec, link.rate, seed=i + 1,
            overrides=t.overrides, repetition=t.repetition,
        )  # fmt: skip
        analyse_trial(BatchDir(batch).trial(t.name).path, catalog=False)
    header, rows, said = record_rows(batch, tmp_path / "record", capsys)
    summaries = check_rows(plan, header, rows, batch, "eft")
    assert sorted(summaries) == sorted(t.name for t in done)
    n = len(plan.trials)
    rest = f", {n - len(done)} not run" if n > len(done) else ""
    assert f"({n} planned trials in {SUMMARY}: {len(done)} complete{rest})" in said
    by_name = {r["trial"]: r for r in rows}
    for t in done:  # what the plan resolved: the link's rate, the generator's sizes
        spec, r = t.experiment.traffic[0], by_name[t.name]
        assert field_of(r["rate_mbps"]) == t.experiment.network.links[0].rate / 1e6
        assert (field_of(r["send_bytes"]), field_of(r["request_bytes"])) == (
            spec.send_bytes,
            spec.request_bytes,
        )
        assert (r["workload"], r["protocol"]) == (spec.workload, spec.protocol)
        assert field_of(r["capture_response_median_ms"]) > 0
    files = {p.name for p in (tmp_path / "record" / REPORT).iterdir()}
    workloads = {t.experiment.traffic[0].workload for t in done}
    if workloads & {"eft_short", "eft_long"}:
        assert "eft_response.csv" in files
    if "filetransf_long" in workloads:
        assert "eft_throughput.csv" in files


def trimmed_by_hand(values: list[float]) -> float:
    """Seed 000's statistic, written out: of five runs the middle three averaged."""
    assert len(values) == 5
    return sum(sorted(values)[1:-1]) / 3


# Per file: the figure whose ordering sets TCP against UDP at 100 Mbit/s, and how much slower
# than TCP's every UDP transaction is made (the trimmed means then in the paper's order; a
# file transfer's time is nearly all the wire's, a short transaction's all the generator's
# 100-300 us, so a small factor orders files and a larger one transactions).
TCP_MEETS_UDP = {"eft_paper_throughput": ("Fig. 4", 1.1), "eft_paper_response": ("Fig. 11", 1.5)}
OUTLIER = 10  # one TCP repetition this many times slower: plain means would reverse the order


@pytest.mark.parametrize("name", sorted(TCP_MEETS_UDP))
def test_tcp_meets_udp_in_the_papers_orderings(name: str, tmp_path: Path, capsys) -> None:
    """Both protocols ran at 100 Mbit/s, each with its own send size (the plan's: TCP 32 767
    bytes, UDP 8 863), five repetitions each, one TCP repetition an outlier: the record's
    ordering of the paper's TCP-vs-UDP figure puts them in one group, in the order of their
    trimmed means (the middle 3 of 5, the outlier dropped), and the family's table averages
    the same way, saying how many repetitions each row averages."""
    figure_prefix, udp_slower = TCP_MEETS_UDP[name]
    pub = published("eft")
    (o,) = [o for o in pub.orderings if o.figure.startswith(figure_prefix)]
    batch, plan = batch_of(PROJECT / "experiments" / f"{name}.yml", tmp_path)
    ran = [
        t
        for t in plan.trials
        if t.experiment.network.links[0].rate == 100_000_000
        and t.experiment.traffic[0].workload in o.where["workload"]
    ]
    spec_of = {t.name: t.experiment.traffic[0] for t in ran}
    assert {s.protocol for s in spec_of.values()} == {"tcp", "udp"}
    assert len({s.send_bytes for s in spec_of.values()}) == 2  # each protocol its own
    for i, t in enumerate(ran):
        spec = spec_of[t.name]
        slower = udp_slower if spec.protocol == "udp" else OUTLIER if t.repetition == 3 else 1
        write_eft_trial(
            BatchDir(batch).trial(t.name).path, spec, t.experiment.network.links[0].rate,
            seed=i + 1, overrides=t.overrides, repetition=t.repetition, slower=slower,
        )  # fmt: skip
        analyse_trial(BatchDir(batch).trial(t.name).path, catalog=False)
    record = tmp_path / "record"
    record_rows(batch, record, capsys)
    runs: dict[str, list[float]] = {"tcp": [], "udp": []}
    for t in ran:
        summary = json.loads(BatchDir(batch).trial(t.name).summary.read_text())
        runs[spec_of[t.name].protocol].append(summary[o.metric])
    trimmed = {p: trimmed_by_hand(v) for p, v in runs.items()}
    plain = {p: sum(v) / len(v) for p, v in runs.items()}
    more, than = o.more[0], o.than[0]
    assert trimmed[more] > trimmed[than] and plain[more] < plain[than]  # the outlier matters
    got = pd.read_csv(record / REPORT / f"orderings_vs_{PAPER}.csv")
    (ours,) = got[got.figure == o.figure].to_dict("records")  # one group: TCP and UDP in it
    assert ours[f"ours as the {PAPER}"] is True
    order = ours[f"ours ({AVERAGED})"]
    for p in (more, than):
        assert f"{trimmed[p]:.3g} (3 of 5)" in order, order
    assert order.index(more) < order.index(than)
    assert f"{plain['tcp']:.3g}" not in order
    # The family's table: the same trimmed means, 3 of 5 repetitions used, the statistic named.
    table, column = (
        ("eft_throughput.csv", "median_mbps")
        if o.metric == "throughput_median_mbps"
        else ("eft_response.csv", "mean_ms")
    )
    rows_ = pd.read_csv(record / REPORT / table).set_index("protocol")
    for p in ("tcp", "udp"):
        assert (rows_.runs[p], rows_.used[p]) == (5, 3)
        assert rows_[column][p] == pytest.approx(trimmed[p], rel=1e-9)
    page = " ".join((record / REPORT / "index.html").read_text().split())
    assert TRIMMED_MEAN in page


def test_a_startup_cell_is_averaged_over_its_middle_three_repetitions(
    tmp_path: Path, capsys
) -> None:
    """Five repetitions of one cell of the low-speed WAN's paper batch, the third sending five
    times as fast (an outlier): the record's effective-throughput table holds, per cut-off,
    the mean of the middle three of the five trials' figures, not the mean of all five, says
    it averaged three, and its caption names the statistic."""
    batch, plan = batch_of(PROJECT / "experiments" / "startup_paper_lswan.yml", tmp_path)
    cell = cells(plan, 1)[0]
    reps = sorted(
        (t for t in plan.trials if t.overrides == cell.overrides), key=lambda t: t.repetition
    )
    assert sorted(t.repetition for t in reps) == [1, 2, 3, 4, 5]
    for t in reps:
        pairs, faster = len(t.experiment.traffic), 5 if t.repetition == 3 else 1
        write_trial(
            BatchDir(batch).trial(t.name).path, packets=600 * pairs * faster, seed=t.repetition,
            family="startup", flows=pairs, socket=True,
            duration_ns=12 * 10**9, delay_ns=50_000_000, rate_bps=1_500_000,
        )  # fmt: skip
        as_planned(BatchDir(batch).trial(t.name).path, t)
        analyse_trial(BatchDir(batch).trial(t.name).path, catalog=False)
    record = tmp_path / "record"
    record_rows(batch, record, capsys)
    summaries = [json.loads(BatchDir(batch).trial(t.name).summary.read_text()) for t in reps]
    (row,) = pd.read_csv(record / REPORT / "startup_throughput.csv").to_dict("records")
    assert row["runs"] == 5
    table = (startup_family.TRANSFERRED, startup_family.SINCE_SYN)
    checked = []
    for c in startup_family.CUTOFFS:
        got = [s.get(startup_family.bytes_key(*table, c)) for s in summaries]
        if None in got:  # past the trials' 12 s: no repetition has it
            assert got == [None] * 5 and row[f"{c} used"] == 0 and pd.isna(row[f"{c} KB"])
            continue
        assert got[2] == max(got)  # the outlier
        assert row[f"{c} used"] == 3
        assert row[f"{c} KB"] == pytest.approx(trimmed_by_hand(got) / 1000, rel=1e-9)
        assert row[f"{c} KB"] < 0.9 * sum(got) / 5 / 1000  # the plain mean: far above
        shares = [s[startup_family.share_key(*table, c)] for s in summaries]
        assert row[f"{c} %"] == pytest.approx(trimmed_by_hand(shares) * 100, rel=1e-9)
        checked.append(c)
    assert checked == ["1s", "5s", "10s"]
    page = " ".join((record / REPORT / "index.html").read_text().split())
    assert startup_family.STATISTIC in page
