"""A batch's workers, one per rack, and their coordinator: claim the next trial, clean up what
an earlier attempt left on the hosts, run the trial through the one trial loop (trials.loop),
label failures, retry."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collect.fetch import CollectError, pull_host
from core.command import command, script
from core.layout import BatchDir, remote_trial_dir
from core.rack import Rack, RackError
from trials.batch import Batch, Claims, claim_holders
from trials.interrupts import Interrupted
from trials.locks import rack_key, this_process
from trials.loop import run_trial, run_trials
from trials.network import resolve_network
from trials.plan import Trial
from trials.preflight.disk import results_disk_problems, trial_capture_bytes
from trials.record import failed_record, record_failure
from trials.runner import TrialRunner

# Stops every daemon whose pid file is in $1, through the helper $2, as a trial's stop would.
_STOP_ALL_IN = (
    'for p in "$1"/*.pid; do [ -e "$p" ] || continue; '
    'n=$(basename "$p" .pid); "$2" stop "$n" --dir "$1" --signal INT; done; true'
)


def stop_leftovers(rack: Rack, batch: str, trial: str, keep_into: Path | None = None) -> list[str]:
    """Stop daemons an earlier, killed attempt of this trial left on the rack's hosts; with
    ``keep_into`` (that attempt's kept directory), bring the files it left on each host into
    keep_into/leftovers/<host>/ (sha256-verified, as a trial's own) before they are removed
    there. A host that does not answer keeps its files; what went wrong is returned."""
    remotes = {
        name: remote_trial_dir(host.workdir, batch, trial) for name, host in rack.hosts.items()
    }
    commands = {
        name: script(_STOP_ALL_IN, remote, f"{rack.hosts[name].workdir}/bin/trialbed-daemon")
        for name, remote in remotes.items()
    }
    with contextlib.suppress(RackError):
        rack.run_parallel(commands, check=False)
    problems = []
    for name, remote in remotes.items():
        try:
            if keep_into is not None:
                local = keep_into / "leftovers" / name
                local.mkdir(parents=True, exist_ok=True)
                if not pull_host(rack, name, remote, local) and not any(local.iterdir()):
                    local.rmdir()  # the attempt left nothing there
            rack.run(name, command("rm", "-rf", remote), check=False)
        except (RackError, CollectError, OSError) as exc:
            problems.append(f"{name}: {exc}")
    return problems


def collect_leftovers(
    rack: Rack, ran_on: list[str], batch: str, trial: str, kept: Path, log: Callable[[str], None]
) -> tuple[list[str], bool]:
    """stop_leftovers on the rack the attempt ran on: this one, or another rack sharing the
    batch (whose worker died there and whose trial this rack now takes over). Returns what
    went wrong, and whether that was on this rack (where the next attempt would find it)."""
    other = None
    mine = [str(Path(p).resolve()) for p in rack.inventory]
    if ran_on and [str(Path(p).resolve()) for p in ran_on] != mine:
        try:
            other = Rack.load([Path(p) for p in ran_on])
        except RackError as exc:
            return [f"its rack ({', '.join(ran_on)}): {exc}"], False
        if rack_key(other) == rack_key(rack):
            other.close()
            other = None
    try:
        problems = stop_leftovers(other or rack, batch, trial, keep_into=kept)
    finally:
        if other is not None:
            other.close()
    for problem in problems:
        log(f"[{trial}] the earlier attempt's files on {problem}")
    return problems, other is None


# -- one worker per rack ----------------------------------------------------------------------


def run_worker(
    batch_dir: Path,
    inventory: list[Path],
    label: str,
    retries: int,
    log: Callable[[str], None] = print,
) -> int:
    """Claim and run the batch's trials on one rack until none is left; return how many
    this worker completed. The network is restored on every exit path. (The coordinator ran
    preflight for this rack before it started the worker.)"""
    batch = Batch(batch_dir)
    plan, trials = batch.plan()
    rack = Rack.load(inventory)
    holder = {**this_process(), "rack": label, "batch": batch.name}
    try:
        runner = TrialRunner(plan, rack, batch_dir, log=log)
        claims = Claims(batch, holder, warn=log)

        def claimed() -> Iterator[Trial]:
            while (trial := next_trial(batch, claims, trials, retries)) is not None:
                if full := results_disk_full(batch_dir, rack, trial):
                    # Not a failure of the trial: it stays to run when the batch is resumed.
                    log(f"[{trial.name}] not run: {full}; resume with BATCH={batch_dir}")
                    batch.event(event="stopped", trial=trial.name, rack=label, error=full)
                    claims.release(trial.name)
                    return
                yield trial

        def attempt(trial: Trial) -> int:
            return run_one(batch, claims, runner, trial, label, retries, log)

        stem = BatchDir(batch_dir).ansible / f"teardown-{label}"
        return sum(run_trials(runner, claimed(), attempt, label, stem, log))
    finally:
        rack.close()


def results_disk_full(batch_dir: Path, rack: Rack, trial: Trial) -> str | None:
    """Why the disk under the batch cannot take `trial`'s captures now, or None."""
    exp = trial.experiment
    net = resolve_network(exp, rack, str(BatchDir(batch_dir).experiment))
    volume = trial_capture_bytes(net, exp.duration + exp.drain)
    return next(iter(results_disk_problems(batch_dir, volume, trial.name)), None)


def next_trial(batch: Batch, claims: Claims, trials: list[Trial], retries: int) -> Trial | None:
    """The first trial in plan order that is neither done nor out of retries; a trial that
    failed waits until every untried one has run (a passing fault may have cleared by then)."""
    failures = {t.name: batch.failed_attempts(t.name) for t in trials}
    for trial in sorted(trials, key=lambda t: failures[t.name] > 0):
        if batch.done(trial.name) or failures[trial.name] > retries:
            continue
        if claims.claim(trial.name):
            # Claimed: check again (another worker may have finished it meanwhile).
            if batch.done(trial.name) or batch.failed_attempts(trial.name) > retries:
                claims.release(trial.name)
                continue
            return trial
    return None


def run_one(
    batch: Batch,
    claims: Claims,
    runner: TrialRunner,
    trial: Trial,
    label: str,
    retries: int,
    log: Callable[[str], None],
) -> int:
    """One claimed trial: what earlier attempts left cleaned up, then run_trial, with the
    batch's events and the claim released on every path; 1 when it completed."""
    try:
        refused = earlier_attempts(batch, runner.rack, trial.name, retries, log)
    except Interrupted:
        batch.event(event="interrupted", trial=trial.name, rack=label)
        claims.release(trial.name)
        raise
    if refused:
        log(f"[{trial.name}] failed: {refused}")
        batch.event(event="failed", trial=trial.name, rack=label, error=refused)
        claims.release(trial.name)
        return 0
    attempt = batch.next_attempt(trial.name)
    batch.event(event="start", trial=trial.name, id=trial.id, rack=label, attempt=attempt)
    started = time.monotonic()
    try:
        _, exc = run_trial(runner, trial)
    except Interrupted:
        batch.event(event="interrupted", trial=trial.name, rack=label, attempt=attempt)
        claims.release(trial.name)
        raise
    if exc is not None:  # recorded; the batch goes on with the next trial
        # The runner's record says more than its exception when it got that far: the watch's
        # finding and the tools' own words (iperf3's "unable to connect to server").
        typed = f"{type(exc).__name__}: {exc}"
        said = failed_record(batch.trial_dir(trial.name), trial, exc)["errors"]
        if said == [str(exc)]:
            said = []  # the runner wrote nothing of it: the exception is all there is
        if str(exc) not in "; ".join(said):
            record_failure(batch.trial_dir(trial.name), trial.name, typed)
            said.append(typed)
        cause = "; ".join(said)
        log(f"[{trial.name}] failed: {cause}")
        batch.event(
            event="failed", trial=trial.name, rack=label, attempt=attempt, error=cause[-2000:]
        )
        claims.release(trial.name)
        return 0
    seconds = time.monotonic() - started
    batch.event(
        event="done", trial=trial.name, rack=label, attempt=attempt, seconds=round(seconds, 1)
    )
    claims.release(trial.name)
    return 1


def earlier_attempts(
    batch: Batch, rack: Rack, name: str, retries: int, log: Callable[[str], None]
) -> str | None:
    """Before a trial runs again: its last attempt kept (labelled), and the files every kept
    attempt left on the hosts (its worker died, a host stopped answering) brought into it and
    removed there, so that the next attempt does not collect them as its own. Returns why the
    trial must not run now, or None."""
    earlier = batch.status(name)
    if earlier != "todo":
        log(f"[{name}] earlier attempt ({earlier}) kept in {batch.set_aside(name)}")
    for kept, ran_on in batch.pending_leftovers(name):
        problems, here = collect_leftovers(rack, ran_on, batch.name, name, kept, log)
        if not problems:
            batch.leftovers_collected(kept)
        elif here:  # still on this rack's hosts, where the next attempt would write
            cause = f"the files of its attempt {kept.name} are still on {'; '.join(problems)}"
            record_failure(batch.trial_dir(name), name, cause)
            return cause
    if (attempts := batch.failed_attempts(name)) > retries:  # its worker died too often
        return (
            f"given up after {attempts} attempts (retries {retries}); the "
            f"last one's worker died mid-trial ({earlier}; kept in attempts/{name}/)"
        )
    return None


def install_parent_death_signal() -> None:
    """In a worker: SIGTERM when the coordinator dies (even by SIGKILL), so that the worker
    restores the network and labels its trial instead of running on unobserved."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# -- the coordinator --------------------------------------------------------------------------


def rack_labels(racks: list[list[Path]]) -> list[str]:
    """A short, unique name per rack: its inventory's directory (virtual, lab, a, b...)."""
    labels: list[str] = []
    for inventory in racks:
        base = inventory[0].resolve().parent.name if inventory else "virtual"
        label, n = base, 2
        while label in labels:
            label, n = f"{base}{n}", n + 1
        labels.append(label)
    return labels


@dataclass
class Progress:
    """What the batch directory says: done, failed out, running, to do."""

    done: int
    failed: int
    running: dict[str, str]  # rack -> trial
    todo: int


def progress(batch: Batch, retries: int) -> Progress:
    names = [t["name"] for t in batch.meta["trials"]]
    done = sum(batch.done(n) for n in names)
    failed = sum(batch.out_of_retries(n, retries) for n in names)
    running = {h.get("rack", "?"): n for n, h in claim_holders(batch).items()}
    return Progress(done, failed, running, len(names) - done - failed)


def spawn_workers(
    batch: Batch, racks: list[list[Path]], labels: list[str], retries: int
) -> list[tuple[str, Any]]:
    import subprocess
    import sys

    batch.layout.workers.mkdir(exist_ok=True)
    procs = []
    for inventory, label in zip(racks, labels, strict=True):
        cmd = [sys.executable, "-m", "trials", "worker", str(batch.path), "--label", label]
        cmd += ["--retries", str(retries)]
        for inv in inventory:
            cmd += ["-i", str(inv)]
        log = batch.layout.worker_log(label).open("a")
        procs.append(
            (
                label,
                subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=install_parent_death_signal,
                ),
            )
        )
    return procs
