"""Batches: a plan run unattended into one results directory, which is the batch's whole state.

    results/<batch>/
      batch.json              the plan: experiment, --set, --only, every trial (seeded order)
      experiment.yml          the experiment file as it was when the batch began
      trials/<name>/          the current (or last) attempt of each trial
      attempts/<name>/<n>-<status>/   earlier attempts, kept: interrupted (partial) or failed
      claims/<name>.json      which worker runs the trial now (pid, host, rack, since)
      events.jsonl            one line per claim, end of a trial, failure, takeover
      workers/<rack>.log      each worker's log

A trial is done when its trial.json says complete and its manifest verifies; it is never run
again. Each rack gets one worker process; workers claim trials one at a time (an exclusive
file create), so two racks share a plan and no trial runs twice. A claim whose process is
gone (SIGKILL, reboot) is taken over: the attempt it left is moved to attempts/ as partial.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from collect.fetch import manifest_entries, verify_manifest, write_whole
from core.layout import (
    ATTEMPT_LABEL,
    BATCH_META,
    RECORD,
    BatchDir,
    attempt_number,
    ended_attempts,
    pruned_files,
)
from trials.locks import HEARTBEAT, create_new, describe, now_iso, stale_holder, taking_over
from trials.plan import Plan, Trial, load_plan
from trials.record import git_state
from trials.spec import SpecError

# A batch's name names a directory on every host (and in shell commands there).
BATCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def batch_name_problem(name: str, given_as: str) -> str | None:
    """Why ``name`` cannot name a batch (``given_as`` says where it came from), or None."""
    if BATCH_NAME.fullmatch(name):
        return None
    return (
        f"{given_as}: the batch's name {name!r} may hold only letters, digits and . _ + - "
        "(not first: . + -), because it names a directory on every host"
    )


# -- the batch directory ----------------------------------------------------------------------


class Batch:
    """A batch directory's state: its plan (batch.json), trials, attempts, claims and events."""

    def __init__(self, path: Path):
        self.path = path
        self.layout = BatchDir(path)
        self.meta: dict[str, Any] = json.loads(self.layout.meta.read_text())

    @classmethod
    def create_or_resume(
        cls, path: Path, plan: Plan, trials: list[Trial], sets: list[str], only: list[str] | None
    ) -> tuple[Batch, bool]:
        """A new batch directory for the plan, or the existing one if it holds the same plan
        (same trial ids); anything else there is an error, not overwritten."""
        wanted = [
            {"name": t.name, "id": t.id, "duration_s": t.experiment.duration / 1e9} for t in trials
        ]
        meta_file = BatchDir(path).meta
        if meta_file.exists():
            batch = cls(path)
            have = {t["id"] for t in batch.meta["trials"]}
            if have != {t["id"] for t in wanted}:
                raise SpecError(batch.other_plan(wanted))
            return batch, True
        if path.exists() and any(path.iterdir()):
            raise SpecError(f"{path}: exists and is not a batch directory (no {BATCH_META})")
        path.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plan.source, BatchDir(path).experiment)
        meta = {
            "experiment": str(plan.source),
            "sets": sets,
            "only": only or [],
            "seed": plan.base.seed,
            "created": now_iso(),
            "code": git_state()["commit"],  # trial ids hash parameters as this code resolves them
            "trials": wanted,
        }
        write_whole(meta_file, json.dumps(meta, indent=2) + "\n")
        return cls(path), False

    def other_plan(self, wanted: list[dict[str, Any]]) -> str:
        """Why the plan asked for is not this batch's: other trials, or the same trials whose
        parameters now resolve otherwise (an edited file, or the code's defaults)."""
        had = self.meta["trials"]
        missing = sorted({t["name"] for t in wanted if t["id"] not in {h["id"] for h in had}})
        said = (
            f"{self.path}: this batch holds another plan ({self.meta['experiment']}, "
            f"{len(had)} trials; not in it: {', '.join(missing[:5]) or '-'}"
            f"{' ...' if len(missing) > 5 else ''}). "
        )
        began, now = self.meta.get("code"), git_state()["commit"]
        if {t["name"] for t in had} == {t["name"] for t in wanted}:
            said += (
                "The same trials' parameters resolve otherwise now: the experiment file (or "
                "--set) was edited, or the code's defaults changed"
            )
            if began and now and began != now:
                said += (
                    f" (the batch began with commit {began[:12]}, this is {now[:12]}: run it "
                    f"from a checkout of {began[:12]}, e.g. git worktree add ../at-{began[:7]} "
                    f"{began[:12]})"
                )
            said += ". "
        return said + (
            "Use the same experiment, --set and --only as when it began, or another BATCH "
            "directory."
        )

    def plan(self) -> tuple[Plan, list[Trial]]:
        """The batch's plan, from its own copy of the experiment file."""
        plan = load_plan(self.layout.experiment, self.meta["sets"])
        plan.source = Path(self.meta["experiment"])
        by_id = {t.id: t for t in plan.trials}
        trials = []
        for t in self.meta["trials"]:
            if t["id"] not in by_id:
                raise SpecError(
                    f"{self.path}: trial {t['name']} ({t['id']}) is no longer in its plan"
                )
            trials.append(by_id[t["id"]])
        return plan, trials

    @property
    def name(self) -> str:
        return self.path.name

    def trial_dir(self, name: str) -> Path:
        return self.layout.trial(name).path

    def status(self, name: str) -> str:
        """complete, failed, interrupted, partial (a run that never ended) or todo."""
        record = self.layout.trial(name).record
        if not record.exists():
            return "partial" if self.trial_dir(name).exists() else "todo"
        status = json.loads(record.read_text()).get("status", "partial")
        return "partial" if status == "running" else status

    def done(self, name: str) -> bool:
        """Complete, with a manifest that lists its record (an empty or cut-short manifest,
        a disk that filled while it was written, is not done)."""
        if self.status(name) != "complete" or not self.layout.trial(name).manifest.exists():
            return False
        return RECORD in manifest_entries(self.trial_dir(name))

    def failed_attempts(self, name: str) -> int:
        """Attempts that count against --retries: kept ones that failed or whose worker died
        (partial: a trial that kills its worker must not be run for ever), and the current
        one if it failed. Interrupted ones (the user stopped the batch) do not count."""
        return len(ended_attempts(self.path, name)) + (self.status(name) == "failed")

    def out_of_retries(self, name: str, retries: int) -> bool:
        """Not done, and never run again with this many retries."""
        return not self.done(name) and self.failed_attempts(name) > retries

    def ran_on(self, name: str) -> list[str]:
        """The inventory of the rack the trial's current attempt ran on (its record says)."""
        with contextlib.suppress(OSError, ValueError, LookupError, TypeError, AttributeError):
            return list(json.loads(self.layout.trial(name).record.read_text())["inventory"])
        return []

    def next_attempt(self, name: str) -> int:
        """The number the trial's next attempt gets: on from the highest kept, so that a
        removed attempt cannot make the next one collide with a kept one."""
        kept = self.layout.attempts(name).glob("*")
        return 1 + max((attempt_number(d) for d in kept), default=0)

    def set_aside(self, name: str) -> Path | None:
        """Move the trial's last attempt to attempts/<name>/<n>-<status>/ (kept, labelled)."""
        current = self.trial_dir(name)
        if not current.exists():
            return None
        status, ran_on = self.status(name), self.ran_on(name)
        target = self.layout.attempts(name) / f"{self.next_attempt(name)}-{status}"
        target.parent.mkdir(parents=True, exist_ok=True)
        current.rename(target)
        # "pending" until the files it left on the hosts have joined it (collect_leftovers):
        # a worker stopped or killed meanwhile leaves the label, and the next one finishes it.
        label = {"status": status, "set_aside": now_iso(), "trial": name}
        label |= {"ran_on": ran_on, "leftovers": "pending"}
        write_whole(target / ATTEMPT_LABEL, json.dumps(label, indent=2) + "\n")
        return target

    def pending_leftovers(self, name: str) -> list[tuple[Path, list[str]]]:
        """Kept attempts of the trial whose files on the hosts were not brought back yet, with
        the inventory of the rack each ran on."""
        out = []
        for kept in sorted(self.layout.attempts(name).glob("*"), key=attempt_number):
            with contextlib.suppress(OSError, json.JSONDecodeError):
                label = json.loads((kept / ATTEMPT_LABEL).read_text())
                if label.get("leftovers") == "pending":
                    out.append((kept, list(label.get("ran_on") or [])))
        return out

    def leftovers_collected(self, kept: Path) -> None:
        label = json.loads((kept / ATTEMPT_LABEL).read_text())
        label["leftovers"] = "collected"
        write_whole(kept / ATTEMPT_LABEL, json.dumps(label, indent=2) + "\n")

    def verify(self) -> dict[str, list[str]]:
        """Complete trials whose files no longer match their manifest: they run again."""
        broken = {}
        pruned = pruned_files(self.path)  # retention removed them: not "changed"
        for t in self.meta["trials"]:
            if self.done(t["name"]):
                bad = verify_manifest(self.trial_dir(t["name"]))
                bad = [n for n in bad if f"trials/{t['name']}/{n}" not in pruned]
                if bad:
                    broken[t["name"]] = bad
        return broken

    def event(self, **fields: Any) -> None:
        line = json.dumps({"time": now_iso(), **fields}) + "\n"
        with self.layout.events.open("a") as f:
            f.write(line)

    def events(self) -> Iterator[dict[str, Any]]:
        path = self.layout.events
        if path.exists():
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    yield json.loads(line)


class Claims:
    """A trial is run by whoever creates claims/<name>.json first."""

    def __init__(self, batch: Batch, holder: dict[str, Any], warn: Callable[[str], None]):
        self.batch, self.holder, self.warn = batch, holder, warn
        self.dir = batch.layout.claims
        self.dir.mkdir(exist_ok=True)

    def claim(self, name: str) -> bool:
        path = self.dir / f"{name}.json"
        fd = create_new(path)
        if fd is None:
            with taking_over(path):
                stale, other = stale_holder(path)
                if not stale:
                    return False  # held by a live worker, or being written right now
                said = describe(other) if other else "a claim never written"
                self.warn(f"{name}: taking over from a worker that is gone ({said})")
                self.batch.event(
                    event="takeover", trial=name, rack=self.holder["rack"], previous=other
                )
                path.unlink(missing_ok=True)
                fd = create_new(path)
                if fd is None:
                    return False  # a worker claimed it afresh meanwhile
        self._write(fd)
        HEARTBEAT.hold(path)
        return True

    def _write(self, fd: int) -> None:
        with os.fdopen(fd, "w") as f:
            json.dump({**self.holder, "since": now_iso()}, f)

    def release(self, name: str) -> None:
        HEARTBEAT.drop(self.dir / f"{name}.json")
        (self.dir / f"{name}.json").unlink(missing_ok=True)


def claim_holders(batch: Batch) -> dict[str, dict[str, Any]]:
    """trial -> the worker that has claimed it."""
    out = {}
    for path in batch.layout.claims.glob("*.json"):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            out[path.stem] = json.loads(path.read_text())
    return out


def matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)
