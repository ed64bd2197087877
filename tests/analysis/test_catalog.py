"""The results catalog (analysis/dataset.py, analysis/query.py) on generated results
directories, the results of format version 1 (tests/data/results_v1) and a real smoke batch
(tests/data/report_smoke): what lands where, one row per trial, a flow per row, queries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import analysis
from analysis.dataset import add_batch, add_trial, backfill
from analysis.query import CatalogMissing, listing
from core.layout import CATALOG_ENV, BatchDir, CatalogDir, catalog_dir

from . import resultsgen

DATA = Path(__file__).resolve().parents[1] / "data"
CELLS = [{"traffic[0].cc": "reno"}, {"traffic[0].cc": "cubic"}]


def goodput(overrides: dict, rep: int) -> dict[str, float]:
    base = 100.0 if overrides.get("traffic[0].cc") == "reno" else 120.0
    return {"goodput_kBps": base + rep, "retransmitted_packets": 3 * rep, "queue_drops": 2.0}


@pytest.fixture(autouse=True)
def _catalog_beside_results(monkeypatch):
    monkeypatch.delenv(CATALOG_ENV, raising=False)


def nights(results: Path, days: list[str], **kw) -> list[Path]:
    return [
        resultsgen.batch(results / "nightly" / "smoke" / day, CELLS, 3, goodput, **kw)
        for day in days
    ]


def test_backfill_writes_one_file_per_batch_in_its_experiment_and_date(tmp_path: Path):
    results = tmp_path / "results"
    made = nights(results, ["2026-12-01", "2026-12-02"])
    made.append(resultsgen.batch(results / "20261203T101500Z-smoke", CELLS[:1], 2, goodput))
    done = backfill(results)
    assert [b for b, _ in done] == sorted(made)  # nightly batches two levels down found
    cat = CatalogDir(results / "catalog")
    assert {c for _, c in done} == {cat} and catalog_dir(made[0]) == cat
    files = [f.relative_to(cat.path).parent.as_posix() for f in cat.files("trials")]
    assert files == [
        "trials.parquet/experiment=smoke/date=2026-12-01",
        "trials.parquet/experiment=smoke/date=2026-12-02",
        "trials.parquet/experiment=smoke/date=2026-12-03",
    ]
    assert len(cat.files("flows")) == 3
    # analysis.load finds the same batches at any depth; the catalog is no batch
    assert sorted(analysis.load(results).batch.unique()) == sorted(b.name for b in made)


def test_the_trials_view_has_a_row_per_trial_with_factors_provenance_and_metrics(tmp_path):
    results = tmp_path / "results"
    (night,) = nights(results, ["2026-12-01"], commit="abc123", dirty=True)
    backfill(results)
    trials = analysis.catalog(root=results / "catalog")
    assert len(trials) == 6 and trials.trial.is_unique
    assert set(trials.batch) == {"nightly/smoke/2026-12-01"}
    assert set(trials.batch_dir) == {str(night.resolve())}
    assert set(trials.experiment) == {"smoke"}
    assert set(trials.date.astype(str)) == {"2026-12-01"}
    assert sorted(set(trials["factor:traffic[0].cc"])) == ["cubic", "reno"]
    assert set(trials.cell) == {"traffic[0].cc=reno", "traffic[0].cc=cubic"}
    assert set(trials.commit) == {"abc123"} and trials.dirty.all()
    assert set(trials.kernel) == {resultsgen.KERNEL}
    assert set(trials.rack) == {resultsgen.INVENTORY}
    assert set(trials.cc_impl) == {"cubic=module"}
    assert set(trials.qdisc_impl) == {"downstream=droptail:tc fifo"}
    assert set(trials.delay_backend) == {"netem"}
    assert set(trials.status) == {"complete"} and trials.analysed.all()
    by_trial = trials.set_index("trial")
    for name in by_trial.index:
        stored = json.loads((night / "trials" / name / "analysis/summary.json").read_text())
        assert by_trial.loc[name, "tcp.goodput_kBps"] == stored["generators"]["tcp"]["goodput_kBps"]
        assert by_trial.loc[name, "queue[downstream].drops"] == 2.0
    assert "tcp.flow_goodput_kBps" not in trials  # lists: per flow, in flows
    flows = analysis.catalog("SELECT * FROM flows", root=results / "catalog")
    assert len(flows) == 12 and set(flows["table"]) == {"flows"}
    assert set(flows.src) == {"198.18.1.10", "198.18.1.11"}
    joined = flows.groupby("trial").steady_goodput_bps.sum() / 8000
    pd.testing.assert_series_equal(
        joined.sort_index(), by_trial["tcp.goodput_kBps"].sort_index(), check_names=False
    )


def test_a_grouped_query_answers_what_pandas_computes(tmp_path: Path):
    results = tmp_path / "results"
    nights(results, ["2026-12-01", "2026-12-02", "2026-12-03"])
    backfill(results)
    got = analysis.catalog(
        'SELECT date, "factor:traffic[0].cc" AS cc, avg("tcp.goodput_kBps") AS mean, '
        "count(*) AS n FROM trials WHERE status = 'complete' GROUP BY ALL ORDER BY date, cc",
        root=results / "catalog",
    )
    assert len(got) == 6 and set(got.n) == {3}
    assert got[got.cc == "reno"]["mean"].tolist() == [102.0] * 3  # 100 + mean(1, 2, 3)
    assert got[got.cc == "cubic"]["mean"].tolist() == [122.0] * 3
    listed = listing(results / "catalog")
    assert listed.batch.tolist() == [f"nightly/smoke/2026-12-0{d}" for d in (1, 2, 3)]
    assert listed.trials.tolist() == [6, 6, 6] and listed.complete.tolist() == [6, 6, 6]


def test_a_trial_analysed_again_replaces_its_own_rows_only(tmp_path: Path):
    results = tmp_path / "results"
    (night,) = nights(results, ["2026-12-01"])
    add_batch(night)
    trial = night / "trials" / "cc-reno_r1"
    summary_path = trial / "analysis" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["generators"]["tcp"]["goodput_kBps"] = 55.0
    summary["generators"]["tcp"]["new_metric"] = 1.5  # a metric the code did not write before
    summary_path.write_text(json.dumps(summary))
    add_trial(trial)
    trials = analysis.catalog(root=results / "catalog").set_index("trial")
    assert len(trials) == 6
    assert trials.loc["cc-reno_r1", "tcp.goodput_kBps"] == 55.0
    assert trials.loc["cc-reno_r2", "tcp.goodput_kBps"] == 102.0
    assert trials["tcp.new_metric"].notna().sum() == 1
    assert len(analysis.catalog("SELECT * FROM flows", root=results / "catalog")) == 12
    assert add_trial(night / "attempts" / "cc-reno_r1" / "1-failed") is None  # not current


def test_the_catalog_lives_where_the_environment_says(tmp_path: Path, monkeypatch):
    (night,) = nights(tmp_path / "results", ["2026-12-01"])
    monkeypatch.setenv(CATALOG_ENV, str(tmp_path / "elsewhere"))
    add_batch(night)
    assert not (tmp_path / "results" / "catalog").exists()
    assert len(analysis.catalog()) == 6  # the default catalog follows the variable too


def test_an_empty_or_missing_catalog(tmp_path: Path):
    with pytest.raises(CatalogMissing, match="no results catalog"):
        analysis.catalog(root=tmp_path / "none")
    (tmp_path / "empty").mkdir()
    assert analysis.catalog(root=tmp_path / "empty").empty
    assert listing(tmp_path / "empty").empty


def test_results_of_format_version_1_and_a_real_smoke_batch(tmp_path: Path):
    results = tmp_path / "results"
    v1 = shutil.copytree(DATA / "results_v1" / "20261206T195014Z-smoke", results / "v1-smoke")
    smoke = shutil.copytree(DATA / "report_smoke", results / "nightly" / "smoke" / "2026-11-22")
    backfill(results)
    trials = analysis.catalog(root=results / "catalog").set_index(["batch", "trial"])
    assert sorted(trials.index) == [
        ("nightly/smoke/2026-11-22", "r1"),
        ("nightly/smoke/2026-11-22", "r2"),
        ("nightly/smoke/2026-11-22", "r3"),
        ("v1-smoke", "r1"),
    ]
    for batch, directory in (("v1-smoke", v1), ("nightly/smoke/2026-11-22", smoke)):
        for name in ("r1",):
            record = json.loads(BatchDir(Path(directory)).trial(name).record.read_text())
            summary = json.loads(BatchDir(Path(directory)).trial(name).summary.read_text())
            row = trials.loc[(batch, name)]
            assert row["commit"] == record["git"]["commit"]
            assert row["dirty"] == record["git"]["dirty"]
            assert row["status"] == record["status"]
            assert row["kernel"] == record["hosts"]["R"]["kernel"]
            assert row["tcp.goodput_kBps"] == summary["generators"]["tcp"]["goodput_kBps"]
            assert row["voip.owd_median_ms"] == summary["generators"]["voip"]["owd_median_ms"]
            assert row["experiment"] == "smoke"
    assert str(trials.loc[("v1-smoke", "r1"), "date"])[:10] == "2026-12-06"  # batch.json's


def test_the_command_line_backfills_lists_and_queries(tmp_path: Path, capsys, monkeypatch):
    from trials.__main__ import main

    monkeypatch.setenv("COLUMNS", "200")
    results = tmp_path / "results"
    nights(results, ["2026-12-01", "2026-12-02"])
    assert main(["results", "backfill", str(results)]) == 0
    assert "2 batch(es) written into the catalog" in capsys.readouterr().out
    cat = str(results / "catalog")
    assert main(["results", "list", "--catalog", cat]) == 0
    listed = capsys.readouterr().out
    assert "nightly/smoke/2026-12-01" in listed and "nightly/smoke/2026-12-02" in listed
    sql = 'SELECT date, count(*) AS n, max("tcp.goodput_kBps") AS top FROM trials GROUP BY date'
    assert main(["results", "query", sql + " ORDER BY date", "--catalog", cat, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "date,n,top",
        "2026-12-01,6,123.0",
        "2026-12-02,6,123.0",
    ]
    assert main(["results", "query", "SELECT nope FROM trials", "--catalog", cat]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["results", "list", "--catalog", str(tmp_path / "none")]) == 2
    assert "no results catalog" in capsys.readouterr().err
    assert main(["results", "backfill", str(tmp_path / "missing")]) == 2
    assert "no such batch directory" in capsys.readouterr().err


def test_a_metric_that_is_text_in_one_trial_and_a_number_in_another(tmp_path: Path):
    """A summary key whose type changed between two trials of a batch (a newer analysis) is
    text in the batch's file; the other trials' rows stay."""
    results = tmp_path / "results"
    (night,) = nights(results, ["2026-12-01"])
    add_batch(night)
    for name, value in (("cc-reno_r1", "unknown"), ("cc-reno_r2", 3.5)):
        path = night / "trials" / name / "analysis" / "summary.json"
        summary = json.loads(path.read_text())
        summary["generators"]["tcp"]["epochs"] = value
        path.write_text(json.dumps(summary))
        add_trial(path.parent.parent)
    trials = analysis.catalog(root=results / "catalog").set_index("trial")
    assert len(trials) == 6
    assert trials.loc["cc-reno_r1", "tcp.epochs"] == "unknown"
    assert trials.loc["cc-reno_r2", "tcp.epochs"] == "3.5"


def test_a_web_flow_keeps_its_own_status_beside_the_trials(tmp_path: Path):
    results = tmp_path / "results"
    (night,) = nights(results, ["2026-12-01"])
    trial = BatchDir(night).trial("cc-reno_r1")
    # Seed 004's per-flow table has a `status` of its own (ok, error), as a trial has.
    web = pd.DataFrame({"sport": [40000, 40001], "status": ["ok", "error"], "bytes": [119, 948]})
    web.to_parquet(trial.table("web_flows"))
    add_batch(night)
    flows = analysis.catalog(
        "SELECT trial, status, flow_status, bytes FROM flows WHERE \"table\" = 'web_flows'",
        root=results / "catalog",
    )
    assert flows.to_dict("records") == [
        {"trial": "cc-reno_r1", "status": "complete", "flow_status": "ok", "bytes": 119},
        {"trial": "cc-reno_r1", "status": "complete", "flow_status": "error", "bytes": 948},
    ]
