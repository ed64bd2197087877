"""Reproduction records (analysis/reproduction.py, `trialbed record`, `make record`) of recorded
batches (tests/data/report_*: a real batch's records and analysis, without captures):
summary.csv holds a row per planned trial with what each trial's summary.json holds, the
record is the same when written again, the report shows the paper's values labelled beside
ours, and a path that cannot be a batch or a record is refused by name."""

from __future__ import annotations

import csv
import html
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.families import FAMILIES
from analysis.families import startup as startup_family
from analysis.families.published import published
from analysis.html_report.paper import AVERAGED, PAPER, TIE
from analysis.reproduction import (
    FILE_LIST,
    NOT_RUN,
    PROVENANCE,
    README,
    REPORT,
    SUMMARY,
    Planned,
    record_rows,
    write_record,
)
from core.layout import ATTEMPT_LABEL, RECORD, BatchDir
from core.layout import SUMMARY as TRIAL_SUMMARY

DATA = Path(__file__).parent.parent / "data"
SMOKE = DATA / "report_smoke"  # collateral_damage, cubic, 1 flow, 3 x 8 s, one interrupted attempt
SAMPLE = DATA / "report_sample"  # collateral_damage, reno/cubic, 1-2 flows, 60 s
STARTUP = DATA / "report_startup"  # startup (LS-WAN), one trial, no batch.json
# The columns issue 48 asks of a collateral-damage record's summary.csv, each with the trial
# summary's key it holds (the family's keys and metrics; repetition and status from the record).
COLLATERAL = {
    "cc": "cc",
    "rtt_ms": "rtt_ms",
    "flows": "flows",
    "repetition": None,
    "status": None,
    "goodput_kBps": "goodput_kBps",
    "owd_median_ms": "owd_median_ms",
    "owd_max_ms": "owd_max_ms",
    "queue_full_per_min": "queue_full_events_per_min",
    "retransmissions": "retransmitted_packets",
}


def rows(record: Path) -> list[dict[str, str]]:
    with (record / SUMMARY).open(newline="") as f:
        return list(csv.DictReader(f))


def field_of(text: str):
    """A summary.csv field as the value it was written from."""
    if text in ("", "True", "False"):
        return None if text == "" else text == "True"
    try:
        return json.loads(text)
    except ValueError:
        return text


def records_of(batch: Path) -> dict[str, dict]:
    return {t.name: json.loads(t.record.read_text()) for t in BatchDir(batch).trial_dirs()}


def summary_of(batch: Path, name: str) -> dict | None:
    f = BatchDir(batch).trial(name).summary
    return json.loads(f.read_text()) if f.exists() else None


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """report_sample with what a batch leaves besides complete, analysed trials: one failed
    (its analysis gone), one given up (only a failed attempt kept), one stopped by the user
    (only an interrupted attempt kept), one complete without analysis, one planned and never
    run."""
    batch = shutil.copytree(SAMPLE, tmp_path / "results" / "sample")
    layout = BatchDir(batch)
    failed = layout.trial("cc-reno_delay-25ms_flows-2_r1")
    record = json.loads(failed.record.read_text())
    record.update(status="failed", errors=["host A unreachable"])
    failed.record.write_text(json.dumps(record))
    shutil.rmtree(failed.analysis)
    given_up = layout.trial("cc-cubic_delay-25ms_flows-2_r1")
    kept = layout.attempts(given_up.name) / "1-failed"
    kept.parent.mkdir(parents=True)
    given_up.path.rename(kept)
    (kept / ATTEMPT_LABEL).write_text(json.dumps({"status": "failed", "trial": given_up.name}))
    stopped = layout.trial("cc-reno_delay-50ms_flows-1_r1")
    kept = layout.attempts(stopped.name) / "1-interrupted"
    kept.parent.mkdir(parents=True)
    stopped.path.rename(kept)
    shutil.rmtree(layout.trial("cc-cubic_delay-50ms_flows-1_r1").analysis)
    meta = json.loads(layout.meta.read_text())
    meta["trials"].append({"name": "cc-reno_delay-25ms_flows-1_r2", "id": "x", "duration_s": 60})
    layout.meta.write_text(json.dumps(meta))
    return batch


def test_summary_has_a_row_per_planned_trial_with_what_each_summary_holds(
    sample: Path, tmp_path: Path
) -> None:
    first = records_of(sample)["cc-reno_delay-25ms_flows-1_r1"]
    planned = [Planned(t["name"]) for t in json.loads(BatchDir(sample).meta.read_text())["trials"]]
    planned[-1] = Planned(planned[-1].name, 2, first["overrides"])  # the one never run
    record = write_record(sample, tmp_path / "record", planned=planned)
    got = rows(record)
    header = (record / SUMMARY).read_text().splitlines()[0].split(",")
    assert header[0] == "trial" and header[1 : 1 + len(COLLATERAL)] == list(COLLATERAL)
    assert sorted(r["trial"] for r in got) == sorted(p.name for p in planned)
    status = {r["trial"]: r["status"] for r in got}
    assert status.pop("cc-reno_delay-25ms_flows-2_r1") == "failed"
    assert status.pop("cc-cubic_delay-25ms_flows-2_r1") == "failed"  # given up
    assert status.pop("cc-reno_delay-25ms_flows-1_r2") == NOT_RUN
    assert status.pop("cc-reno_delay-50ms_flows-1_r1") == "interrupted"
    assert set(status.values()) == {"complete"}

    measured = {c: k for c, k in COLLATERAL.items() if k}
    for r in got:
        summary = summary_of(sample, r["trial"])
        if summary is not None:
            for column, key in measured.items():
                assert field_of(r[column]) == summary[key], (r["trial"], column)
            assert int(r["repetition"]) == records_of(sample)[r["trial"]]["repetition"]
        else:  # no metric but a complete trial's
            assert all(r[c] == "" for c in measured if c not in ("cc", "rtt_ms", "flows")), r
    by_name = {r["trial"]: r for r in got}
    # The given-up trial's keys from its attempt's record; the failed one's from its own; the
    # never-run one's from the record of the repetition of its cell, its repetition the plan's.
    assert by_name["cc-cubic_delay-25ms_flows-2_r1"]["flows"] == "2"
    assert (
        "attempts/cc-cubic_delay-25ms_flows-2_r1/"
        in by_name["cc-cubic_delay-25ms_flows-2_r1"]["note"]
    )
    assert by_name["cc-reno_delay-25ms_flows-2_r1"]["note"] == "host A unreachable"
    assert by_name["cc-cubic_delay-50ms_flows-1_r1"]["note"].startswith("not analysed")
    assert by_name["cc-reno_delay-50ms_flows-1_r1"]["flows"] == "1"  # its attempt's record
    never = by_name["cc-reno_delay-25ms_flows-1_r2"]
    sibling = by_name["cc-reno_delay-25ms_flows-1_r1"]
    assert [never[k] for k in ("cc", "rtt_ms", "flows")] == [
        sibling[k] for k in ("cc", "rtt_ms", "flows")
    ]
    assert never["repetition"] == "2"
    # In key order: cc, then RTT, then flows.
    keys = [(r["cc"], float(r["rtt_ms"]), int(r["flows"]), int(r["repetition"])) for r in got]
    assert keys == sorted(keys)


def test_the_record_is_the_same_when_written_again(sample: Path, tmp_path: Path) -> None:
    one = write_record(sample, tmp_path / "one", command="make record BATCH=x RECORD=y")
    two = write_record(sample, tmp_path / "two", command="make record BATCH=x RECORD=y")
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert {SUMMARY, PROVENANCE, README, FILE_LIST, f"{REPORT}/index.html"} <= {
        str(f) for f in files
    }
    assert files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    for f in files:
        assert (one / f).read_bytes() == (two / f).read_bytes(), f
    # Written again over itself: the same bytes; a file of the user's stays.
    (one / "NOTES.md").write_text("ours\n")
    before = (one / SUMMARY).read_bytes()
    write_record(sample, one, command="make record BATCH=x RECORD=y")
    assert (one / SUMMARY).read_bytes() == before
    assert (one / "NOTES.md").read_text() == "ours\n"
    assert "make record BATCH=x RECORD=y" in (one / README).read_text()


def test_the_record_reads_the_batch_only(sample: Path, tmp_path: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in sample.rglob("*")}
    write_record(sample, tmp_path / "record")
    assert {p: p.stat().st_mtime_ns for p in sample.rglob("*")} == before
    assert not (sample / "report").exists() and not (sample.parent / "catalog").exists()


def test_provenance_says_what_the_records_say(sample: Path, tmp_path: Path) -> None:
    record = write_record(sample, tmp_path / "record")
    rack = json.loads((record / PROVENANCE).read_text())
    recs = records_of(sample)
    assert rack["trials"] == len(recs)
    commits = {(r["git"]["commit"], r["git"]["dirty"]) for r in recs.values()}
    assert {(c["commit"], c["dirty"]) for c in rack["code"]} == commits
    assert sum(c["trials"] for c in rack["code"]) == len(recs)
    kernels = {(h, f["kernel"]) for r in recs.values() for h, f in r["hosts"].items()}
    assert {(k["host"], k["kernel"]) for k in rack["kernels"]} == kernels
    queues = {(e["link"], e["qdisc"]) for r in recs.values() for e in r["network"]["egress"]}
    assert {(q["link"], q["qdisc"]) for q in rack["queues"]} == queues
    backends = {d["backend"] for r in recs.values() for d in r["delay"].values()}
    assert {d["backend"] for d in rack["delay"]} == backends
    starts = sorted(r["times"]["started"] for r in recs.values())
    assert rack["first_started"] == starts[0]


def test_the_report_shows_the_papers_values_labelled(sample: Path, tmp_path: Path) -> None:
    record = write_record(sample, tmp_path / "record")
    report = record / REPORT
    page = (report / "index.html").read_text()
    pub = published("collateral_damage")
    keys = ["cc", "rtt_ms", "flows"]
    for name, ours_csv in (("table1", "table1_goodput.csv"), ("table2", "table2_owd.csv")):
        table = pub.tables[name]
        beside = pd.read_csv(report / f"{name}_vs_{PAPER}.csv")
        for v in table.values:
            assert f"<th>{PAPER} {v}</th>" in page and f"<th>{v}</th>" in page
        # The paper's columns hold the data file's values, ours our table's, cell by cell.
        theirs = table.rows.set_index(keys).sort_index()
        shown = beside.set_index(keys).sort_index()
        for v in table.values:
            pd.testing.assert_series_equal(
                shown.loc[theirs.index, f"{PAPER} {v}"],
                theirs[v],
                check_names=False,
                check_index_type=False,
            )
        ours = pd.read_csv(report / ours_csv).set_index(keys).sort_index()
        for v in table.values:
            pd.testing.assert_series_equal(shown.loc[ours.index, v], ours[v])
    orderings = pd.read_csv(report / f"orderings_vs_{PAPER}.csv")
    assert set(orderings.figure) == {o.figure for o in pub.orderings}
    assert f"Orderings the paper states ({pub.citation})" in page
    for o in pub.orderings:
        assert html.escape(o.says[:60]) in page


def test_a_startup_record_has_the_factors_and_the_table_metrics(tmp_path: Path) -> None:
    batch = shutil.copytree(STARTUP, tmp_path / "startup")  # `make trial`: no batch.json
    record = write_record(batch, tmp_path / "record")
    (row,) = rows(record)
    trial = BatchDir(batch).trial(row["trial"])
    recorded = json.loads(trial.record.read_text())
    summary = json.loads(trial.summary.read_text())
    for factor, level in recorded["overrides"].items():
        assert field_of(row[factor]) == level
    metrics = FAMILIES["startup"].RECORD_METRICS
    assert list(row)[-len(metrics) - 1 : -1] == list(metrics)
    for column, key in metrics.items():
        assert field_of(row[column]) == summary.get(key), column
    assert row["status"] == recorded["status"]
    page = (record / REPORT / "index.html").read_text()
    assert "is of its high-speed WAN" in page  # an LS-WAN batch: the paper's Fig. 3 not beside


def test_a_startup_record_beside_the_papers_fig3(tmp_path: Path) -> None:
    """A generated startup trial (two pairs behind iperf3's control connections), its record
    saying it ran on the paper's high-speed WAN: summary.csv holds the figures since the first
    data SYN as its summary does, and the report the paper's Fig. 3 beside its own."""
    from analysis.trial import analyse_trial
    from tests.analysis.trialgen import write_trial

    batch = tmp_path / "startup"
    trial = write_trial(
        batch / "trials" / "t1", packets=2200, family="startup", flows=2, iperf3=True,
        duration_ns=12 * 10**9, delay_ns=66_666_666, rate_bps=1_500_000,
    )  # fmt: skip
    recorded = json.loads((trial.dir / RECORD).read_text())
    rate = next(iter(published("startup").tables["fig3"].applies.values()))
    recorded["parameters"]["network"] = {"links": [{"name": "bottleneck", "rate": rate}]}
    (trial.dir / RECORD).write_text(json.dumps(recorded))
    summary = analyse_trial(trial.dir)
    record = write_record(batch, tmp_path / "record")
    (row,) = rows(record)
    for column, key in FAMILIES["startup"].RECORD_METRICS.items():
        assert field_of(row[column]) == summary.get(key), column
    table = (startup_family.TRANSFERRED, startup_family.SINCE_SYN)
    assert field_of(row[startup_family.bytes_key(*table, "1s")]) > 0
    beside = pd.read_csv(record / REPORT / f"fig3_vs_{PAPER}.csv").set_index("elapsed")
    fig3 = published("startup").tables["fig3"].rows.set_index("cutoff")
    assert beside[f"{PAPER} effective throughput %"].to_dict() == fig3.utilization_pct.to_dict()
    (ours,) = [c for c in beside if c.startswith("ours %")]
    (runs,) = [c for c in beside if c.startswith("ours used")]  # the one trial, where it has t
    for cut, value in beside[ours].items():
        got = summary.get(startup_family.share_key(*table, cut))
        assert value == pytest.approx(got * 100) if got is not None else pd.isna(value), cut
        assert beside[runs][cut] == (got is not None), cut


def test_make_trial_batch_given_to_the_command_line(tmp_path: Path, capsys) -> None:
    from trials.__main__ import main

    batch = shutil.copytree(STARTUP, tmp_path / "startup")
    assert main(["record", str(batch), str(tmp_path / "rec")]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert f"record: {tmp_path / 'rec'}/ (1 planned trials in {SUMMARY}: 1 complete)" in said


def test_a_trial_never_run_gets_its_plans_factors_from_the_command_line(
    tmp_path: Path, capsys
) -> None:
    """The batch's plan, rebuilt from its batch.json and experiment.yml, names a repetition
    that never ran: its row has its repetition and the keys its cell's records say."""
    from trials.__main__ import main
    from trials.batch import Batch
    from trials.plan import load_plan

    sets = ["duration=8s", "warmup=2s", "repetitions=4"]
    plan = load_plan(Path("experiments/smoke.yml"), sets)
    batch = tmp_path / "results" / "smoke"
    Batch.create_or_resume(batch, plan, plan.trials, sets, None)
    for name in ("r1", "r2", "r3"):
        shutil.copytree(SMOKE / "trials" / name, batch / "trials" / name)
    assert main(["record", str(batch), str(tmp_path / "rec")]) == 0
    got = {r["trial"]: r for r in rows(tmp_path / "rec")}
    assert list(got) == ["r1", "r2", "r3", "r4"]
    assert got["r4"]["status"] == NOT_RUN and got["r4"]["repetition"] == "4"
    assert [got["r4"][k] for k in ("cc", "rtt_ms", "flows")] == [
        got["r1"][k] for k in ("cc", "rtt_ms", "flows")
    ]
    readme = (tmp_path / "rec" / README).read_text()
    assert f"make record BATCH={batch} RECORD={tmp_path / 'rec'}" in readme
    assert "Code that wrote this record: `" in readme


def test_bad_paths_are_refused_by_name(tmp_path: Path, capsys) -> None:
    from trials.__main__ import main

    batch = shutil.copytree(SMOKE, tmp_path / "smoke")
    (tmp_path / "file").write_text("")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "thesis.tex").write_text("")
    refused = {
        (tmp_path, tmp_path / "r1"): f"{tmp_path}: not a batch directory (no trials/ in it); "
        "batches in it: smoke",
        (tmp_path / "missing", tmp_path / "r2"): f"{tmp_path / 'missing'}: no such batch",
        (batch, tmp_path / "file"): f"{tmp_path / 'file'}: not a directory (a file)",
        (batch, batch / "record"): f"{batch / 'record'}: inside the batch {batch}",
        (batch, tmp_path / "busy"): f"{tmp_path / 'busy'}: holds files that no record wrote "
        "(thesis.tex",
    }
    for (b, r), message in refused.items():
        capsys.readouterr()
        assert main(["record", str(b), str(r)]) == 2, (b, r)
        said = " ".join(capsys.readouterr().err.split())
        assert message in said, said
        assert not (r / SUMMARY).exists()
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["thesis.tex"]
    assert not (batch / "record").exists()
    assert not list(tmp_path.glob(".record-*"))  # no staging left


def listed_trials(record: Path) -> set[str]:
    return set(pd.read_csv(record / REPORT / "trials.csv").trial)


def test_a_record_of_two_batches_holds_each_as_its_own_record_does(
    sample: Path, tmp_path: Path
) -> None:
    """Seed 004's files run as batches of their own make one record: summary.csv holds each
    batch's rows as a record of that batch alone does, a `batch` column first, the batches in
    the order given; the report lists the trials of both, provenance covers both."""
    smoke = shutil.copytree(SMOKE, tmp_path / "results" / "smoke")
    first = records_of(sample)["cc-reno_delay-25ms_flows-1_r1"]
    planned = [Planned(t["name"]) for t in json.loads(BatchDir(sample).meta.read_text())["trials"]]
    planned[-1] = Planned(planned[-1].name, 2, first["overrides"])  # the one never run
    before = {p: p.stat().st_mtime_ns for b in (sample, smoke) for p in b.rglob("*")}
    both = write_record(
        sample, tmp_path / "both", more=[smoke], planned={sample: planned},
        command='make record BATCH="a b" RECORD=c',
    )  # fmt: skip
    assert {p: p.stat().st_mtime_ns for b in (sample, smoke) for p in b.rglob("*")} == before
    alone = {
        sample.name: write_record(sample, tmp_path / "sample", planned=planned),
        smoke.name: write_record(smoke, tmp_path / "smoke"),
    }
    header = (both / SUMMARY).read_text().splitlines()[0]
    assert header == "batch," + (alone[sample.name] / SUMMARY).read_text().splitlines()[0]
    assert rows(both) == [{"batch": b, **r} for b, rec in alone.items() for r in rows(rec)]
    assert {r["status"] for r in rows(both)} >= {"complete", "failed", NOT_RUN, "interrupted"}
    assert listed_trials(both) == {
        f"{b}/{t}" for b, rec in alone.items() for t in listed_trials(rec)
    } | {f"{smoke.name}/{t}" for t in ("r1", "r2", "r3")}
    rack = json.loads((both / PROVENANCE).read_text())
    recs = [*records_of(sample).values(), *records_of(smoke).values()]
    assert rack["trials"] == len(recs)
    named = {n for c in rack["code"] for n in c["names"]}
    assert named == {f"{b.name}/{t}" for b in (sample, smoke) for t in records_of(b)}
    assert rack["first_started"] == min(r["times"]["started"] for r in recs)
    assert rack["last_stopped"] == max(r["times"]["stopped"] for r in recs)
    readme = (both / README).read_text()
    for b in (sample, smoke):
        meta = json.loads(BatchDir(b).meta.read_text())
        said = f"- `{b.name}` (`{b}`): experiment `{meta['experiment']}`"
        assert said in readme and meta["created"] in readme
    assert "only `cc-reno_*_r1` `cc-cubic_*_r1`" in readme  # the sample's --only
    assert f"({len(rows(both))} in all)" in readme and 'make record BATCH="a b" RECORD=c' in readme


def test_a_record_of_two_batches_is_the_same_when_written_again(
    sample: Path, tmp_path: Path
) -> None:
    smoke = shutil.copytree(SMOKE, tmp_path / "results" / "smoke")
    one = write_record(sample, tmp_path / "one", more=[smoke])
    two = write_record(sample, tmp_path / "two", more=[smoke])
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    for f in files:
        assert (one / f).read_bytes() == (two / f).read_bytes(), f


def test_batches_of_two_families_have_the_columns_of_both(sample: Path, tmp_path: Path) -> None:
    startup = shutil.copytree(STARTUP, tmp_path / "startup")
    columns, got = record_rows([sample, startup], [None, None])
    assert columns[:5] == ["batch", "trial", "cc", "rtt_ms", "flows"]
    (started,) = [r for r in got if r["batch"] == "startup"]
    factors = records_of(startup)[started["trial"]]["overrides"]
    assert set(factors) < set(columns) and started["cc"] is None
    assert all(r[f] is None for r in got if r["batch"] == "sample" for f in factors)
    assert columns.index("status") < columns.index("goodput_kBps") < columns.index("note")
    with pytest.raises(TypeError, match="mapping of each batch"):
        write_record(sample, tmp_path / "r", more=[startup], planned=[Planned("x")])


def test_two_batches_given_to_the_command_line(tmp_path: Path, capsys) -> None:
    from trials.__main__ import main
    from trials.batch import Batch
    from trials.plan import load_plan

    batches = []
    for name, repetitions in (("smoke4", 4), ("smoke3", 3)):
        sets = ["duration=8s", "warmup=2s", f"repetitions={repetitions}"]
        plan = load_plan(Path("experiments/smoke.yml"), sets)
        batches.append(tmp_path / "results" / name)
        Batch.create_or_resume(batches[-1], plan, plan.trials, sets, None)
        for t in ("r1", "r2", "r3"):
            shutil.copytree(SMOKE / "trials" / t, batches[-1] / "trials" / t)
    record = tmp_path / "rec"
    assert main(["record", *map(str, batches), str(record)]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert f"(7 planned trials of 2 batches in {SUMMARY}: 6 complete, 1 not run)" in said
    got = [(r["batch"], r["trial"], r["status"]) for r in rows(record)]
    assert got == [
        *[("smoke4", f"r{i}", "complete") for i in (1, 2, 3)], ("smoke4", "r4", NOT_RUN),
        *[("smoke3", f"r{i}", "complete") for i in (1, 2, 3)],
    ]  # fmt: skip
    assert (
        f'make record BATCH="{batches[0]} {batches[1]}" RECORD={record}'
        in (record / README).read_text()
    )
    elsewhere = shutil.copytree(SMOKE, tmp_path / "other" / "smoke3")
    new, inside = tmp_path / "new", batches[1] / "rec"
    refused = [
        ([batches[0], tmp_path / "missing"], new, f"{tmp_path / 'missing'}: no such batch"),
        (batches, inside, f"{inside}: inside the batch {batches[1]}"),
        ([batches[1], elsewhere], new, f"{elsewhere}: named as the batch {batches[1]} is"),
    ]
    for given, target, message in refused:
        capsys.readouterr()
        assert main(["record", *map(str, given), str(target)]) == 2, given
        assert message in " ".join(capsys.readouterr().err.split())
        assert not target.exists()


def test_the_published_tables_are_keyed_like_ours() -> None:
    """The paper's layout (a row per RTT and algorithm, a column pair per flow count) read as
    one row per cell, with our names of the congestion controls."""
    pub = published("collateral_damage")
    for name in ("table1", "table2"):
        table = pub.tables[name]
        assert table.keys == ["rtt_ms", "cc", "flows"]
        assert len(table.rows) == len(table.rows.drop_duplicates(table.keys))
        assert set(table.rows.cc) <= {n for names in pub.cc.values() for n in names}
        assert table.rows[table.values].notna().all().all()
    assert published("no_such_family") is None


def test_record_dir_file_list_names_what_it_writes(sample: Path, tmp_path: Path) -> None:
    record = write_record(sample, tmp_path / "record")
    assert (record / FILE_LIST).read_text().split() == [README, SUMMARY, PROVENANCE, REPORT]
    assert RECORD not in {p.name for p in record.rglob("*")}  # no trial's files copied
    assert TRIAL_SUMMARY not in {p.name for p in record.rglob("*")}


def test_the_eft_orderings_beside_our_means(tmp_path: Path) -> None:
    """Each ordering the EFT paper states, per group of ours it is about: our levels in the
    order of their means over the runs, and whether that order is the paper's."""
    from analysis.html_report import eft
    from analysis.html_report.page import Page

    runs = []
    for rate, protocol, workload, send, values in (
        (100.0, "tcp", "filetransf_long", 1460, [90.0, 92.0]),
        (100.0, "udp", "filetransf_long", 1460, [95.0, 97.0]),  # not the paper's order
        (10.0, "tcp", "filetransf_long", 1460, [9.0, 9.2]),
        (10.0, "tcp", "filetransf_long", 1461, [7.5, 7.7]),
        (100.0, "tcp", "eft_short", 100, [0.40, 0.42]),
        (100.0, "tcp", "eft_long", 100, [0.20, 0.22]),
    ):
        metric = "throughput_median_mbps" if workload == "filetransf_long" else "response_mean_ms"
        for rep, v in enumerate(values, 1):
            runs.append(
                {"trial": f"{rate}-{protocol}-{workload}-{send}-{rep}", "status": "complete",
                 "analysed": True, "rate_mbps": rate, "protocol": protocol, "workload": workload,
                 "send_bytes": send, "request_bytes": 1460000, "pairs": 1, metric: v}
            )  # fmt: skip
    ok = pd.DataFrame(runs)
    for column in FAMILIES["eft"].RECORD_METRICS:  # what the family's tables read: unknown
        ok[column] = ok.get(column, float("nan"))
    page = Page("eft", tmp_path)
    eft.sections(page, tmp_path, ok)
    got = pd.read_csv(tmp_path / f"orderings_vs_{PAPER}.csv")
    pub = published("eft")
    assert list(got.figure) == [o.figure for o in pub.orderings if o.figure in set(got.figure)]
    for _, row in got.iterrows():
        o = next(o for o in pub.orderings if o.figure == row.figure)
        mine = ok[ok[o.metric].notna()]
        for k, levels in o.where.items():
            mine = mine[mine[k].isin(levels)]
        means = mine.groupby(o.by)[o.metric].mean()
        have = all(level in means for level in [*o.more, *o.than])
        expected = min(means[o.more]) > max(means[o.than]) if have else None
        assert (None if pd.isna(row[f"ours as the {PAPER}"]) else row[f"ours as the {PAPER}"]) == (
            expected
        ), row.figure
    holds = dict(zip(got.figure, got[f"ours as the {PAPER}"], strict=True))
    assert sorted(map(str, holds.values())) == ["False", "True", "True", "nan"]  # Fig. 11: no UDP


FIGS_7_9 = ("Fig. 7", "Fig. 9")


def test_the_startup_orderings_beside_our_means(tmp_path: Path) -> None:
    """Figs. 7 and 9 as the startup paper's text orders them, per group of our other factors:
    every sender's 5 s after the late joiner's SYN by rto_min on the low-speed WAN (one group
    in the paper's order, one not, one within the spread), the satellite's first 5 s by
    pacing; trials of another network or scenario are left out of a statement."""
    from analysis.html_report import startup
    from analysis.html_report.page import Page

    rto, pacing, start = (
        "factor:hosts.senders.rto_min", "factor:traffic[*].pacing", "factor:traffic[pair2].start"
    )  # fmt: skip
    initcwnd, delay = "factor:hosts.senders.initcwnd", "param:network.links[bottleneck].delay"
    launch = "param:traffic[pair2].start"  # what the statement selects by (every batch has it)
    runs = []
    for net, late, window, rto_min, paced, values in (
        ("50ms", "15s", 3, "200ms", False, [300e3, 310e3, 320e3]),
        ("50ms", "15s", 3, "1s", False, [200e3, 210e3, 220e3]),  # the paper's order
        ("50ms", "15s", 10, "200ms", False, [200e3, 205e3, 210e3]),
        ("50ms", "15s", 10, "1s", False, [250e3, 260e3, 270e3]),  # not the paper's order
        ("50ms", "15s", 1, "200ms", False, [300e3, 310e3, 320e3]),
        ("50ms", "15s", 1, "1s", False, [305e3, 315e3, 325e3]),  # a tie: 5 KB apart, sd 10 KB
        ("50ms", "0s", 3, "200ms", False, [1.0, 1.0, 1.0]),  # no late joiner: not Fig. 7's
        ("50ms", "0s", 3, "1s", False, [9.0, 9.0, 9.0]),
        ("290ms", "0s", 4, "200ms", True, [0.5, 0.6, 0.7]),
        ("290ms", "0s", 4, "200ms", False, [0.2, 0.3, 0.4]),
    ):
        for rep, v in enumerate(values, 1):
            late_joiner = late != "0s"
            runs.append(
                {"trial": f"{net}-{late}-{window}-{rto_min}-{paced}-{rep}", "status": "complete",
                 "analysed": True, delay: net, start: late, launch: late, initcwnd: window,
                 rto: rto_min, pacing: paced,
                 "late_window_utilization": v if late_joiner else float("nan"),
                 "utilization_transferred_since_first_syn_5s": v if net == "290ms" else 0.1}
            )  # fmt: skip
    ok = pd.DataFrame(runs)
    for column in FAMILIES["startup"].RECORD_METRICS:  # what the family's tables read: unknown
        ok[column] = ok.get(column, float("nan"))
    startup.sections(Page("startup", tmp_path), tmp_path, ok)
    got = pd.read_csv(tmp_path / f"orderings_vs_{PAPER}.csv")
    fig7, fig9 = (o.figure for o in published("startup").orderings if o.figure[:6] in FIGS_7_9)
    holds, ours = f"ours as the {PAPER}", f"ours ({AVERAGED})"
    seven = got[got.figure == fig7].set_index(initcwnd)
    assert sorted(seven.index) == [1, 3, 10]  # the 0 s scenario's trials are not Fig. 7's
    assert list(seven[holds][[1, 3, 10]]) == [False, True, False]
    assert list(seven[TIE][[1, 3, 10]]) == [True, False, False]  # 5 KB apart, the sd 10 KB
    assert seven[ours][3] == "200ms 3.1e+05 (3 of 3) > 1s 2.1e+05 (3 of 3)"
    nine = got[got.figure == fig9]
    assert list(nine[holds]) == [True]
    assert len(got) == 4  # Figs. 8 and 10: no trial of the high-speed WAN
