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

import pytest

from analysis.families import FAMILIES
from analysis.families import startup as startup_family
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
