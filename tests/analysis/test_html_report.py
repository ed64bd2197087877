"""The HTML report (analysis/html_report) on recorded batches (tests/data/report_*: a real
batch's records and analysis tables, without its captures): files, numbers against
analysis.load, notes for missing data, the comparison with a previous batch, and the page in
headless Chromium (no console error, nothing loaded but the file, a screenshot)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analysis
from analysis.families import startup as startup_family
from analysis.families.common import trimmed
from analysis.html_report import configured_by, write_report
from analysis.html_report.__main__ import main
from analysis.html_report.collateral_damage import aqm_note
from analysis.html_report.compare import compare_batches, previous_batch
from tests.analysis.headless import chromium, load_page

DATA = Path(__file__).parent.parent / "data"
SMOKE = DATA / "report_smoke"  # collateral_damage, cubic, 1 flow, 3 x 8 s, one interrupted attempt
SAMPLE = DATA / "report_sample"  # collateral_damage, reno/cubic, 1-2 flows, 60 s, cwnd recorded
STARTUP = DATA / "report_startup"  # startup (LS-WAN), one trial
PNG = b"\x89PNG\r\n\x1a\n"


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke batch's report (made once for the module)."""
    batch = copy(SMOKE, tmp_path_factory.mktemp("results") / "smoke")
    write_report(batch, previous=None)
    return batch


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample batch's report (made once for the module)."""
    batch = copy(SAMPLE, tmp_path_factory.mktemp("results") / "sample")
    write_report(batch, previous=None)
    return batch


def figures(page: str) -> list[str]:
    return re.findall(r'href="([^"]+\.png)"', page)


def test_every_figure_and_table_is_written(smoke: Path) -> None:
    out = smoke / "report"
    page = (out / "index.html").read_text()
    names = figures(page)
    assert {"fig3_owd_cdf.png", "fig4_queue_full_events.png", "fig5_retransmitted_packets.png"} <= (
        set(names)
    )
    assert any(n.startswith("fig2_cubic_") for n in names)
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    # Every figure is embedded too: the page stands alone.
    assert page.count('src="data:image/png;base64,') == len(names)
    for name in ("table1_goodput.csv", "table2_owd.csv", "trials.csv", "trial_length.csv"):
        assert (out / name).stat().st_size > 0
    # No URL other than data: and the files beside the page.
    for url in re.findall(r'(?:src|href)="([^"]+)"', page):
        assert url.startswith(("data:", "#")) or re.fullmatch(r"[\w.-]+\.(png|csv)", url), url
    for text in ("highest and the lowest are dropped", "Provenance", "f91b8fd8b589", "nfqueue"):
        assert text in page


def test_table_1_and_2_hold_the_numbers_of_analysis_load(smoke: Path) -> None:
    trials = analysis.load(smoke)
    ok = trials[trials.status == "complete"]
    t1 = pd.read_csv(smoke / "report" / "table1_goodput.csv")
    assert len(t1) == ok.groupby(["cc", "rtt_ms", "flows"]).ngroups == 1
    kept = trimmed(ok.goodput_kBps)
    assert t1.runs.tolist() == [3] and t1.used.tolist() == [3]
    assert t1.mean_kBps[0] == pytest.approx(kept.mean(), rel=1e-12)
    assert t1.std_kBps[0] == pytest.approx(kept.std(ddof=1), rel=1e-12)

    owd = analysis.load_table(smoke, "owd")
    owd = owd[owd.trial.isin(ok.trial) & (owd.generator == "voip") & ~owd.lost]
    ms = owd.owd_ns / 1e6
    t2 = pd.read_csv(smoke / "report" / "table2_owd.csv")
    assert t2.median_ms[0] == pytest.approx(ms.median())
    assert t2.mean_ms[0] == pytest.approx(ms.mean())
    assert t2.std_ms[0] == pytest.approx(ms.std(ddof=1))
    assert t2.trials[0] == 3 and t2.lost[0] == 0
    # The page shows the same numbers (rounded).
    page = (smoke / "report" / "index.html").read_text()
    assert f">{kept.mean():.1f}<" in page and f">{ms.median():.1f}<" in page

    listed = pd.read_csv(smoke / "report" / "trials.csv")
    assert listed.trial.tolist() == trials.trial.tolist()
    np.testing.assert_allclose(listed.goodput_kBps, trials.goodput_kBps)


def test_five_repetitions_drop_the_highest_and_lowest(tmp_path: Path) -> None:
    batch = copy(SMOKE, tmp_path / "five")
    for n, goodput in ((4, 50.0), (5, 500.0)):  # two more runs, far off either way
        src, dst = batch / "trials" / "r1", batch / "trials" / f"r{n}"
        shutil.copytree(src, dst)
        record = json.loads((dst / "trial.json").read_text())
        record.update(trial=f"r{n}", repetition=n)
        (dst / "trial.json").write_text(json.dumps(record))
        summary = json.loads((dst / "analysis" / "summary.json").read_text())
        summary.update(trial=f"r{n}", goodput_kBps=goodput)
        (dst / "analysis" / "summary.json").write_text(json.dumps(summary))
    write_report(batch, previous=None)
    t1 = pd.read_csv(batch / "report" / "table1_goodput.csv")
    middle = analysis.load(batch).goodput_kBps.sort_values().iloc[1:-1]
    assert t1.runs[0] == 5 and t1.used[0] == 3
    assert t1.mean_kBps[0] == pytest.approx(middle.mean())
    assert t1.std_kBps[0] == pytest.approx(middle.std(ddof=1))


def test_missing_data_gives_notes_not_a_crash(tmp_path: Path) -> None:
    batch = copy(SMOKE, tmp_path / "partial")
    # r2 failed (no analysis), r3 lost its queue table; no trial has cwnd.
    shutil.rmtree(batch / "trials" / "r2" / "analysis")
    record = json.loads((batch / "trials" / "r2" / "trial.json").read_text())
    record.update(status="failed", errors=["host A unreachable"])
    (batch / "trials" / "r2" / "trial.json").write_text(json.dumps(record))
    (batch / "trials" / "r1" / "analysis" / "queue.parquet").unlink()
    (batch / "trials" / "r3" / "analysis" / "queue.parquet").unlink()
    page = write_report(batch, previous=None).read_text()
    t1 = pd.read_csv(batch / "report" / "table1_goodput.csv")
    assert t1.runs[0] == 2  # the failed trial is not averaged in
    assert "Left out of every table and figure" in page
    assert "r2 (failed, not analysed: host A unreachable)" in page
    assert "no cwnd and no queue occupancy recorded for this trial" in page
    assert "Trials without a cwnd recording" in page
    listed = pd.read_csv(batch / "report" / "trials.csv")
    assert listed.set_index("trial")["in tables"].to_dict() == {"r1": True, "r2": False, "r3": True}

    single = copy(SMOKE, tmp_path / "single")
    for t in ("r2", "r3"):
        shutil.rmtree(single / "trials" / t)
    page = write_report(single, previous=None).read_text()
    assert "One repetition per combination" in page
    assert "single complete repetition" in page
    assert pd.read_csv(single / "report" / "table1_goodput.csv").std_kBps.isna().all()


def test_a_trial_whose_analysis_fails_is_named(tmp_path: Path) -> None:
    batch = copy(SMOKE, tmp_path / "broken")
    shutil.rmtree(batch / "trials" / "r3" / "analysis")  # complete, but no captures here
    page = write_report(batch, previous=None).read_text()
    assert "Trial r3 (complete): its analysis failed: " in page
    assert pd.read_csv(batch / "report" / "table1_goodput.csv").runs[0] == 2


def test_a_trial_record_cut_short_is_named_and_the_rest_reported(tmp_path, capsys) -> None:
    batch = copy(SMOKE, tmp_path / "cut")
    record = batch / "trials" / "r3" / "trial.json"
    record.write_bytes(record.read_bytes()[:40])  # the disk filled as it was written
    assert main([str(batch), "--previous", "none"]) == 1
    said = capsys.readouterr().err
    assert f"report: left out: {record}: not JSON (" in said
    page = (batch / "report" / "index.html").read_text()
    assert "Trial r3: left out of every table and figure: " in page
    assert f"{record}: not JSON (" in page
    table = pd.read_csv(batch / "report" / "table1_goodput.csv")
    assert table.runs[0] == 2  # r1 and r2


def test_comparison_with_the_previous_nightly_batch(tmp_path: Path) -> None:
    nightly = tmp_path / "results" / "nightly" / "collateral_damage"
    before = copy(SMOKE, nightly / "2026-11-21")
    tonight = copy(SMOKE, nightly / "2026-11-22")
    copy(SMOKE, nightly / "2026-11-23")  # later: never the previous one
    assert previous_batch(tonight) == before.resolve()
    assert previous_batch(before) is None
    for t in ("r1", "r2", "r3"):  # tonight's OWD 40 ms higher, far beyond its spread
        f = tonight / "trials" / t / "analysis" / "summary.json"
        summary = json.loads(f.read_text())
        summary["owd_median_ms"] += 40
        f.write_text(json.dumps(summary))
    assert main([str(tonight)]) == 0
    table = pd.read_csv(tonight / "report" / "compare_previous_collateral_damage.csv")
    moved = table.set_index("metric").moved
    assert moved["UDP OWD median (ms)"] and not moved["aggregate goodput (KB/s)"]
    median = table.set_index("metric").loc["UDP OWD median (ms)"]
    assert median.difference == pytest.approx(40)
    page = (tonight / "report" / "index.html").read_text()
    assert "1 metric(s) moved beyond their run-to-run spread" in page
    assert str(before.resolve()) in page


def test_several_batches_in_one_report(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Two batches whose trials have the same names (two nights of one experiment, or a
    family's files run as batches of their own): every table holds both, named by batch."""
    first = copy(SMOKE, tmp_path / "night1")
    second = copy(SMOKE, tmp_path / "night2")
    for t in ("r1", "r2", "r3"):  # the second night's goodput 10 KB/s and OWD 40 ms higher
        f = second / "trials" / t / "analysis" / "summary.json"
        summary = json.loads(f.read_text())
        summary["goodput_kBps"] += 10
        f.write_text(json.dumps(summary))
        f = second / "trials" / t / "analysis" / "owd.parquet"
        owd = pd.read_parquet(f)
        owd["owd_ns"] += 40_000_000
        owd.to_parquet(f)
    assert main([str(first), str(second)]) == 2  # where would it go?
    assert "2 batches: say where their report goes (--out DIR" in capsys.readouterr().err
    out = tmp_path / "both"
    assert main([str(first), str(second), "--out", str(out)]) == 0
    both = analysis.load([first, second])
    ok = both[both.status == "complete"]
    t1 = pd.read_csv(out / "table1_goodput.csv")
    kept = trimmed(ok.goodput_kBps)  # six runs: the highest and the lowest dropped
    assert t1.runs.tolist() == [len(ok)] == [6] and t1.used.tolist() == [4]
    assert t1.mean_kBps[0] == pytest.approx(kept.mean(), rel=1e-12)
    # Table 2 reads each trial's OWD from its own batch.
    owd = analysis.load_table([first, second], "owd")
    owd = owd[(owd.generator == "voip") & ~owd.lost]
    t2 = pd.read_csv(out / "table2_owd.csv")
    assert t2.trials[0] == 6 and t2.median_ms[0] == pytest.approx(owd.owd_ns.median() / 1e6)
    assert t2.mean_ms[0] == pytest.approx(owd.owd_ns.mean() / 1e6)
    listed = pd.read_csv(out / "trials.csv")
    assert listed.trial.tolist() == (both.batch + "/" + both.trial).tolist()
    assert {"night1/r1", "night2/r1"} <= set(listed.trial)
    page = (out / "index.html").read_text()
    assert "no comparison with a previous batch" in page
    assert f"{first}, {second}" in page
    assert not (first / "report").exists() and not (second / "report").exists()


def test_compare_flags_only_beyond_the_spread() -> None:
    group = ["cc"]
    this = pd.DataFrame({"cc": ["reno"] * 3 + ["cubic"], "x": [10.0, 11.0, 12.0, 5.0]})
    before = pd.DataFrame({"cc": ["reno"] * 3 + ["cubic"], "x": [10.5, 11.5, 12.5, 9.0]})
    table = compare_batches(this, before, group, {"x": "x"}).set_index("cc")
    assert table.loc["reno", "spread"] == pytest.approx(1.0)
    assert table.loc["reno", "moved"] is False or not table.loc["reno", "moved"]
    assert table.loc["cubic", "moved"] is None  # one run each: no spread, no verdict


def test_startup_batch_has_its_tables(tmp_path: Path) -> None:
    """The recorded trial was analysed before the table counted from the first data SYN: its
    summary holds only the sums from T0 (``delivered_<c>``). It still loads and renders; the
    table leaves those out and the page says why and what to run (the numbers since the first
    data SYN: tests/analysis/test_startup_origin.py)."""
    batch = copy(STARTUP, tmp_path / "startup")
    page = write_report(batch, previous=None).read_text()
    assert "Effective throughput vs elapsed time since the first data SYN" in page
    table = pd.read_csv(batch / "report" / "startup_throughput.csv")
    (summary,) = [json.loads(p.read_text()) for p in batch.glob("trials/*/analysis/summary.json")]
    assert "delivered_5s" in summary and "delivered_since_first_syn_5s" not in summary
    assert table["runs"].tolist() == [1]
    assert table[[c for c in table if c.endswith((" KB", " %"))]].isna().all().all()
    assert startup_family.legacy_trials(analysis.load(batch)) == 1
    assert "analysed before the table counted the bytes that reached the receivers" in " ".join(
        page.split()
    )
    assert (batch / "report" / "startup_utilization.png").read_bytes().startswith(PNG)


def test_not_a_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    assert "not a batch directory" in capsys.readouterr().err


@pytest.mark.skipif(chromium() is None, reason="no chromium (scripts/setup.sh installs it)")
@pytest.mark.parametrize("batch", ["smoke", "sample"])
def test_page_loads_in_headless_chromium(batch: str, request: pytest.FixtureRequest) -> None:
    page = request.getfixturevalue(batch) / "report" / "index.html"
    loaded = load_page(page)
    assert loaded.console_errors == []
    assert loaded.requests[0] == page.resolve().as_uri()
    assert all(u.startswith("data:image/png;base64,") for u in loaded.requests[1:])
    assert loaded.images == len(figures(page.read_text())) and loaded.broken_images == 0
    for text in ("Table 1", "Table 2", "Fig. 2", "Fig. 3", "Fig. 4", "Fig. 5", "Provenance"):
        assert text in loaded.text
    assert loaded.screenshot.startswith(PNG) and len(loaded.screenshot) > 100_000
    (page.parent / "screenshot.png").write_bytes(loaded.screenshot)


def test_sample_batch_tables_and_figures(sample: Path) -> None:
    out = sample / "report"
    trials = analysis.load(sample)
    assert (trials.status == "complete").all() and len(trials) == 6
    t1 = pd.read_csv(out / "table1_goodput.csv")
    expected = trials.groupby(["cc", "rtt_ms", "flows"]).goodput_kBps.mean().reset_index()
    assert len(t1) == len(expected) == 6
    np.testing.assert_allclose(t1.mean_kBps, expected.goodput_kBps, rtol=1e-12)
    assert t1.std_kBps.isna().all()  # one repetition each
    owd = analysis.load_table(sample, "owd")
    owd = owd[(owd.generator == "voip") & ~owd.lost].merge(
        trials[["trial", "cc", "rtt_ms", "flows"]]
    )
    ms = (owd.owd_ns / 1e6).groupby([owd.cc, owd.rtt_ms, owd.flows])
    t2 = pd.read_csv(out / "table2_owd.csv")
    np.testing.assert_allclose(t2.median_ms, ms.median().to_numpy())
    np.testing.assert_allclose(t2.mean_ms, ms.mean().to_numpy())
    np.testing.assert_allclose(t2.std_ms, ms.std(ddof=1).to_numpy())
    page = (out / "index.html").read_text()
    # Fig. 2: one trial per CC, one flow, shortest RTT, over three epochs from its cwnd.
    for cc in ("cubic", "reno"):
        name = f"fig2_{cc}_cc-{cc}_delay-25ms_flows-1_r1.png"
        assert (out / name).stat().st_size > 50_000
    captions = re.findall(r"<figcaption>(Fig\. 2 [^<]*)", page)
    assert len(captions) == 2
    assert all("3 congestion epochs (ssthresh reductions of flow 1" in c for c in captions)
    # Fig. 3: a panel per RTT and flow count; RTT 100 ms with 2 flows has no trial here.
    assert (out / "fig3_owd_cdf.png").stat().st_size > 50_000
    length = pd.read_csv(out / "trial_length.csv").set_index("trial")
    epochs = trials.set_index("trial")["tcp.congestion_epochs"].map(json.loads)
    for trial, flows in epochs.items():
        assert length.loc[trial, "epochs_per_flow"] == ", ".join(map(str, flows))
        assert "too short" in length.loc[trial, "verdict"]  # 60 s < 3 min
    bounds = pd.read_csv(out / "owd_bounds.csv")
    assert bounds.within.all() and (bounds.min_ms >= bounds.rtt_half_ms).all()


def test_fig2_window_spans_three_epochs_around_the_middle() -> None:
    from analysis.html_report.collateral_damage import fig2_window

    s = 10**9
    epochs = np.array([1, 12, 22, 32, 42, 52], dtype=np.int64) * s
    lo, hi, shown = fig2_window(epochs, 5 * s, 60 * s)
    assert shown == 3
    assert (lo, hi) == (22 * s - 3 * s, 52 * s + 3 * s)  # epochs at 22..52 s, 10 % padding
    # Fewer than four epoch starts after the warm-up: the whole span, no epoch count.
    assert fig2_window(epochs[:3], 5 * s, 60 * s) == (5 * s, 60 * s, 1)


def test_epochs_from_the_queue_without_cwnd() -> None:
    from analysis.html_report.collateral_damage import epoch_starts

    s = 10**9
    events = ["arrival", "drop", "drop", "departure", "arrival", "drop", "arrival", "drop"]
    ts = np.array([0, 1 * s, s + 1, s + 2, s + 3, s + 5, 5 * s, 5 * s + 1], dtype=np.int64)
    queue = pd.DataFrame({"ts_ns": ts, "event": events})
    starts, source = epoch_starts(None, queue)
    assert starts.tolist() == [1 * s, 5 * s + 1]  # runs at 1 s (two, merged) and at 5 s
    assert "queue-full" in source


def test_the_timing_table_says_how_each_trial_was_configured() -> None:
    assert configured_by({"recap": {}, "tags": "all", "hosts": ["A"]}) == "playbook (all)"
    both = {"recap": {}, "tags": ["shaping"], "cc_switched": {"A": "reno", "B": "reno"}}
    assert configured_by(both) == "playbook (shaping) + cc switch (2 hosts)"
    assert configured_by({"cc_switched": {"A": "reno"}}) == "cc switch (1 host)"
    switched = {"cc_switched": {"A": "reno", "B": "reno"}, "shaping_switched": {"R": 1}}
    assert configured_by(switched) == "cc switch (2 hosts) + shaping switch (R)"
    assert configured_by({"skipped": True, "same_as": "r1"}) == "kept (r1)"


def test_fig4_says_what_it_counts_under_an_aqm():
    assert aqm_note(pd.DataFrame({"queue_qdisc": ["droptail", "droptail"]})) == ""
    assert aqm_note(pd.DataFrame({"trial": ["a"]})) == ""
    note = aqm_note(pd.DataFrame({"queue_qdisc": ["droptail", "fq_codel", "codel", None]}))
    assert "codel, fq_codel" in note and "runs of drops" in note


def test_a_report_that_fails_leaves_the_last_one_and_the_users_files(tmp_path, monkeypatch):
    from analysis import html_report

    batch = copy(STARTUP, tmp_path / "startup")
    out = batch / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # a file the report did not write
    write_report(batch, previous=None)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "index.html" in before and len(before) > 3

    def broken(*args, **kwargs):
        raise RuntimeError("a figure failed")

    monkeypatch.setattr(html_report.provenance, "sections", broken)
    with pytest.raises(RuntimeError, match="a figure failed"):
        write_report(batch, previous=None)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not list(batch.glob(".report-*"))  # its half-drawn files went
    monkeypatch.undo()
    write_report(batch, previous=None)
    assert (out / "notes.txt").read_text() == "mine"


def test_a_trial_given_up_is_named_in_the_report_and_its_summary(tmp_path: Path) -> None:
    """r2's worker died mid-trial (after an interrupted attempt) and the batch gave it up: its
    attempts are kept and it has no trials/r2 (it was missing from the summary and read as
    'not run' in the report)."""
    from analysis.report import analyse_batch

    batch = copy(SMOKE, tmp_path / "given_up")
    (batch / "trials" / "r2").rename(batch / "attempts" / "r2" / "2-partial")
    page = write_report(batch, previous=None).read_text()
    assert "1 of the 3 planned trials have no current attempt" in page
    assert "r2 (1 attempt)" in page  # the partial one: an interrupted attempt does not count
    assert "have not run" not in page  # r2 ran, twice
    table = analyse_batch(batch).set_index("trial")
    assert table.loc["r2", "status"] == "failed"
    assert table.loc["r2", "error"] == (
        "no current attempt: 1 failed or died mid-trial (the last partial); kept in attempts/r2/"
    )
    assert table.loc["r2", "family"] == "collateral_damage"
    assert table.loc[["r1", "r3"], "status"].tolist() == ["complete", "complete"]


# Strings a results directory can hold, each of which a page would run, load or break out of
# if it were written as markup: a description, a commit, an error, a kernel, a factor.
HOSTILE = {
    "description": "<script>document.title='pwned'</script>",
    "commit": '<img src="x" onerror="document.title=\'pwned\'">',
    "error": '</td></tr></table><iframe src="x"></iframe><b>',
    "kernel": "<svg onload=\"document.title='pwned'\"></svg>",
    "factor": '" onmouseover="document.title=\'pwned\'" x="',
}


@pytest.mark.skipif(chromium() is None, reason="no chromium (scripts/setup.sh installs it)")
def test_strings_from_the_results_are_text_in_the_browser(tmp_path: Path) -> None:
    """A batch whose experiment file and trial records hold markup: the report's page, loaded
    in headless Chromium, shows each string as the text it is; nothing of them runs (the
    title is the page's), loads (no request but the page and its figures) or becomes an
    element (no script, frame, svg or on* attribute in the page)."""
    batch = copy(SMOKE, tmp_path / "smoke")
    experiment = batch / "experiment.yml"
    text = experiment.read_text().replace(
        "description: smoke test of the collateral-damage setup",
        f"description: {json.dumps(HOSTILE['description'])}",
    )
    assert HOSTILE["description"] in text
    experiment.write_text(text)
    record_file = batch / "trials/r1/trial.json"
    record = json.loads(record_file.read_text())
    record["git"]["commit"] = HOSTILE["commit"]
    record["errors"] = [HOSTILE["error"]]
    record["hosts"]["A"]["kernel"] = HOSTILE["kernel"]
    record["overrides"] = {"traffic[tcp].cc": HOSTILE["factor"]}
    record_file.write_text(json.dumps(record))
    write_report(batch, previous=None)
    page = batch / "report" / "index.html"
    loaded = load_page(page)
    assert loaded.console_errors == []
    assert loaded.active == [], loaded.active
    assert "pwned" not in loaded.title and loaded.title
    assert loaded.requests[0] == page.resolve().as_uri()
    assert all(u.startswith("data:image/png;base64,") for u in loaded.requests[1:])
    for where, value in HOSTILE.items():
        assert value in loaded.all_text, f"{where}: {value!r} is not shown as text"
    for where in ("commit", "error", "kernel", "factor"):  # in tables, on the page itself
        assert HOSTILE[where] in loaded.text, where
