"""The one trial loop. `trials run`, a batch's workers and the nightly run all run their trials
through `run_trials` (lock the rack, run one trial after another, give the network back on
every exit path) and each trial through `run_trial`; a batch adds only planning, claiming,
retries and resume around it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from core.layout import BatchDir, new_batch_path
from core.rack import Rack
from trials.interrupts import Interrupted, ignore_signals, interruptible
from trials.locks import RackLock
from trials.plan import Plan, Trial
from trials.preflight import available, preflight
from trials.record import failed_record
from trials.runner import TrialRunner

Result = TypeVar("Result")


class TrialFailed(RuntimeError):
    """A trial ran to its end but its record does not say complete: the record says why."""


def run_trial(runner: TrialRunner, trial: Trial) -> tuple[dict[str, Any], Exception | None]:
    """Run one trial; return its record and, when it did not complete, what ended it (the
    runner's exception, or TrialFailed with the record's errors). Only an interruption
    (Interrupted) goes past: every other failure is the trial's own, and the loop goes on."""
    try:
        record = runner.run(trial)
    except Interrupted:
        raise
    except Exception as exc:  # recorded in its trial.json; the others go on
        return failed_record(runner.trial_dir(trial), trial, exc), exc
    if record.get("status") != "complete":
        return record, TrialFailed("; ".join(record.get("errors") or []) or record["status"])
    return record, None


def run_trials(
    runner: TrialRunner,
    trials: Iterable[Trial],
    attempt: Callable[[Trial], Result],
    lock_label: str,
    restore_stem: Path,
    log: Callable[[str], None] = print,
    keep_network: Callable[[list[Result]], bool] = lambda _: False,
) -> list[Result]:
    """With the rack locked, `attempt` each trial as `trials` yields it (a batch claims them
    one at a time) and return what each attempt returned. Ctrl-C and SIGTERM stop the loop
    cleanly (Interrupted). The network is restored (teardown.yml, its log at `restore_stem`)
    on every exit path, except when `keep_network(results)` says to leave the last trial's
    configuration on the rack."""
    results: list[Result] = []
    keep = False
    with RackLock.for_rack(runner.rack, runner.batch_id, lock_label, warn=log):
        try:
            with interruptible():
                for trial in trials:
                    results.append(attempt(trial))
            keep = keep_network(results)
        finally:
            if not keep:
                with ignore_signals():
                    runner.config.restore(restore_stem)
    return results


def run_plan(
    plan: Plan,
    trials: list[Trial],
    rack: Rack,
    results: Path,
    log: Callable[[str], None] = print,
    keep_network: bool = False,
) -> tuple[Path, list[dict[str, Any]]]:
    """`trials run`: check the selected trials against the rack (read-only), then run them into
    a new batch directory; return it and the trial records. With `keep_network`, once every
    trial completed, the last one's configuration stays on the rack, to be looked at or run by
    hand (teardown.yml removes it)."""
    # What does not change (kernel, modules, tools) as preflight reads it: the first trial
    # reads only the rest (measured on the VM rack: 6 s instead of 26 s for five hosts).
    static: dict[str, dict[str, Any]] = {}
    checked = preflight(trials, rack, str(plan.source), results, static, plan.trials)
    for line in available(checked):
        log(f"preflight: {line}")
    batch = BatchDir(new_batch_path(results, plan.source))
    batch.path.mkdir(parents=True, exist_ok=False)
    batch.experiment.write_text(plan.source.read_text())
    runner = TrialRunner(plan, rack, batch.path, log=log)
    runner.static_facts = static

    def attempt(trial: Trial) -> dict[str, Any]:
        record, failure = run_trial(runner, trial)
        if failure is not None and not isinstance(failure, TrialFailed):
            log(f"[{trial.name}] failed: {failure}")
        return record

    def keep(records: list[dict[str, Any]]) -> bool:
        if not (keep_network and records and all(r.get("status") == "complete" for r in records)):
            return False
        log(
            f"the last trial's configuration stays on the rack (keep network): its "
            f"variables are {batch.trial(records[-1]['trial']).ansible / 'trial_vars.yml'}; "
            f"teardown.yml (make teardown) removes it"
        )
        return True

    records = run_trials(
        runner, trials, attempt, "trial", batch.ansible / "teardown", log, keep_network=keep
    )
    return batch.path, records
