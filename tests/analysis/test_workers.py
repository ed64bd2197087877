"""analysis.workers without a rack: how many workers, and failures coming back per trial
from worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.workers import DATA_ERRORS, JOBS_ENV, analyse_trials, analysis_jobs
from core.trial_record import RecordError


def test_jobs_are_the_cpus_at_most_and_never_more_than_the_trials(monkeypatch) -> None:
    monkeypatch.delenv(JOBS_ENV, raising=False)
    cpus = len(os.sched_getaffinity(0))
    assert 1 <= analysis_jobs(100) <= cpus
    assert analysis_jobs(1) == 1 and analysis_jobs(0) == 1
    monkeypatch.setenv(JOBS_ENV, "3")
    assert analysis_jobs(100) == 3 and analysis_jobs(2) == 2


@pytest.mark.parametrize("value", ["two", "0", "-1", "1.5"])
def test_a_bad_jobs_setting_is_refused_naming_it(monkeypatch, value: str) -> None:
    monkeypatch.setenv(JOBS_ENV, value)
    with pytest.raises(ValueError, match=rf"{JOBS_ENV}='{value}': expected .*worker process"):
        analysis_jobs(4)


def test_each_trial_gets_its_own_failure_back_from_the_workers(tmp_path: Path) -> None:
    """Trials whose files are missing or broken, analysed by two workers: each one's error,
    in the order given, with the worker's trace as its cause; the data errors are the kinds a
    batch reports per trial."""
    missing, garbled, empty = tmp_path / "missing", tmp_path / "garbled", tmp_path / "empty"
    garbled.mkdir()
    (garbled / "trial.json").write_text("{not json")
    empty.mkdir()
    (empty / "trial.json").write_text("{}")
    got = list(analyse_trials([missing, garbled, empty], jobs=2))
    assert [d for d, _ in got] == [missing, garbled, empty]
    (_, no_file), (_, bad_json), (_, no_key) = got
    assert all(isinstance(e, RecordError) for _, e in got)  # each naming its trial.json
    assert f"{missing}/trial.json: cannot be read (No such file or directory)" in str(no_file)
    assert f"{garbled}/trial.json: not JSON (Expecting property name" in str(bad_json)
    assert f"{empty}/trial.json: key 'trial': Field required" in str(no_key)
    assert all(isinstance(e, DATA_ERRORS) for _, e in got)
    assert all("Traceback" in str(e.__cause__) for _, e in got)  # they came from a worker


def test_workers_share_the_cpus() -> None:
    """Each of two analysis workers on two CPUs runs its compiled passes (two halves of a
    capture, of a queue) in one thread, not two threads each (four threads on two CPUs);
    one worker alone, or a process that is not a worker, may use two."""
    from analysis import resources
    from analysis.workers import _pool

    cpus = len(os.sched_getaffinity(0))
    with _pool(2) as pool:
        assert pool.submit(resources.cpus).result() == max(min(2, cpus // 2), 1)
    with _pool(1) as pool:
        assert pool.submit(resources.cpus).result() == min(2, cpus)
    assert resources.cpus() == min(2, cpus)  # this process: not a worker


def test_a_bad_jobs_setting_stops_the_command_before_it_starts() -> None:
    """The analysis runs after the trials: its setting is checked when the command starts."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "trials", "check", str(root / "experiments" / "smoke.yml")],
        cwd=root, env={**os.environ, JOBS_ENV: "two"}, capture_output=True, text=True,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{JOBS_ENV}='two': expected a whole number" in done.stdout + done.stderr


def test_an_analysis_replaces_the_earlier_one_only_whole(tmp_path, monkeypatch) -> None:
    """analysis/ of a trial analysed before stays as it was when a new analysis fails half-way
    (summary and tables of one run), and is replaced whole when it succeeds (no table of
    older code left beside the new ones)."""
    from analysis import trial as trial_mod

    trial = tmp_path / "t1"
    earlier = trial / "analysis"
    earlier.mkdir(parents=True)
    (earlier / "summary.json").write_text('{"run": 1}\n')
    (earlier / "old_kind.parquet").write_bytes(b"PAR1 1")
    (trial / "trial.json").write_text('{"trial": "t1"}')

    def half_way(trial_dir, record, out_dir):
        (out_dir / "flows.parquet").write_bytes(b"PAR1 2")
        raise RuntimeError("the disk filled")

    monkeypatch.setattr(trial_mod, "_analyse_into", half_way)
    with pytest.raises(RuntimeError):
        trial_mod.analyse_trial(trial)
    assert sorted(p.name for p in trial.iterdir()) == ["analysis", "trial.json"]
    assert sorted(p.name for p in earlier.iterdir()) == ["old_kind.parquet", "summary.json"]
    assert (earlier / "summary.json").read_text() == '{"run": 1}\n'

    def whole(trial_dir, record, out_dir):
        (out_dir / "flows.parquet").write_bytes(b"PAR1 2")
        (out_dir / "summary.json").write_text('{"run": 2}\n')
        return {"run": 2}

    monkeypatch.setattr(trial_mod, "_analyse_into", whole)
    assert trial_mod.analyse_trial(trial) == {"run": 2}
    assert sorted(p.name for p in trial.iterdir()) == ["analysis", "trial.json"]
    assert sorted(p.name for p in earlier.iterdir()) == ["flows.parquet", "summary.json"]
