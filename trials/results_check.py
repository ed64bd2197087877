"""`trials report`: a results directory's files checked against what was collected, then its
trials analysed again and printed. Each trial's files are compared with its MANIFEST.sha256
(written when they came back, sha256-verified): one line per file that is missing, cut short
or replaced, naming it, in that trial's row; the other trials are reported as ever. Files
retention removed (PRUNED.json) are not missing."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from analysis.batches import NotABatch, batch_trials
from analysis.report import analyse_batch, print_batch
from core.layout import MANIFEST, BatchDir, TrialDir, pruned_files, sha256_file
from core.trial_record import UNREADABLE

_LINE = re.compile(r"([0-9a-f]{64})  (.+)")
# A manifest lists a trial's files: some hundred lines. A larger file is not one.
MAX_MANIFEST_BYTES = 16 << 20


def report(batch_dir: Path, console: Console) -> int:
    """Check, analyse and print the batch: 0 when every file is as collected, 1 when some
    are not (each named in its trial's row) or a trial's record cannot be read, 2 when the
    path is not a batch."""
    try:
        batch_trials(batch_dir)
    except NotABatch as exc:  # before any trial is read
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    # The files are checked while the trials are analysed (sha256 lets go of the GIL, and
    # the analysis leaves a CPU idle for some of its time); a trial's row waits for them.
    with ThreadPoolExecutor(1, thread_name_prefix="manifest") as pool:
        checked = pool.submit(file_problems, batch_dir)
        table = analyse_batch(batch_dir, _Checked(checked))
        problems = dict(checked.result())
    for line in problems.pop("", []):
        console.print(f"[red]error:[/red] {escape(line)}", highlight=False)
    print_batch(table)
    analysed = {t.name for t in batch_trials(batch_dir)}
    for name, lines in problems.items():
        if name not in analysed:  # no record: no row of its own
            for line in lines:
                console.print(f"[red]error:[/red] {escape(line)}", highlight=False)
    unreadable = int((table["status"] == UNREADABLE).sum()) if "status" in table else 0
    damaged = sum(map(len, problems.values()))
    if damaged or unreadable:
        console.print(
            f"[red]not as collected:[/red] {damaged} file(s) in {len(problems)} trial(s), "
            f"{unreadable} record(s) unreadable; each is named in its trial above",
            highlight=False,
        )
        return 1
    return 0


class _Checked(Mapping[str, list[str]]):
    """file_problems' answer as a mapping, waited for on first use."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def _found(self) -> dict[str, list[str]]:
        return self._future.result()

    def __getitem__(self, trial: str) -> list[str]:
        return self._found()[trial]

    def __iter__(self) -> Iterator[str]:
        return iter(self._found())

    def __len__(self) -> int:
        return len(self._found())


def file_problems(batch_dir: Path) -> dict[str, list[str]]:
    """Per trial (its directory's name), what is wrong with its files; trials whose files
    are all as collected are left out; under "", what is wrong with the batch's own."""
    try:
        pruned = pruned_files(batch_dir)
    except (OSError, ValueError, AttributeError) as exc:
        pruned = set()
        problems = {"": [f"{batch_dir / 'PRUNED.json'}: unreadable ({exc}); read as empty"]}
    else:
        problems = {}
    layout = BatchDir(batch_dir)
    for path in sorted(layout.trials.iterdir()):
        if path.is_dir() and not TrialDir(path).record.exists():
            problems[path.name] = [f"{TrialDir(path).record}: missing; the trial is not analysed"]
    trials = layout.trial_dirs()
    workers = max(1, min(len(trials), len(os.sched_getaffinity(0))))
    with ThreadPoolExecutor(workers) as pool:  # sha256 lets go of the GIL
        found = pool.map(lambda t: _trial_problems(batch_dir, t.path, pruned), trials)
        for trial, lines in zip(trials, found, strict=True):
            if lines:
                problems[trial.path.name] = lines
    return problems


def _trial_problems(batch_dir: Path, trial_dir: Path, pruned: set[str]) -> list[str]:
    manifest = trial_dir / MANIFEST
    entries, problems = _entries(manifest)
    derived = TrialDir(trial_dir).analysis.name  # rewritten by the report itself
    for name, digest in entries.items():
        path = trial_dir / name
        if str(path.relative_to(batch_dir)) in pruned or Path(name).parts[0] == derived:
            continue
        if not path.is_file():
            problems.append(f"{path}: missing (listed in {MANIFEST})")
        elif sha256_file(path) != digest:
            size = path.stat().st_size
            problems.append(
                f"{path}: not the file collected ({size} bytes, its sha256 differs from "
                f"{MANIFEST}'s): cut short, changed or replaced"
            )
    return problems


def _entries(manifest: Path) -> tuple[dict[str, str], list[str]]:
    """{file: sha256} of a manifest, and what is wrong with the manifest itself."""
    if not manifest.exists():
        return {}, [f"{manifest}: missing; the trial's files cannot be checked"]
    with manifest.open("rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        return {}, [f"{manifest}: not a manifest (not text at byte {exc.start}); the trial's "
                    "files cannot be checked"]  # fmt: skip
    entries, bad = {}, []
    for number, line in enumerate(text.splitlines(), 1):
        match = _LINE.fullmatch(line)
        if match and ".." not in Path(match[2]).parts and not match[2].startswith("/"):
            entries[match[2]] = match[1]
        elif line:
            bad.append(number)
    if bad or len(data) > MAX_MANIFEST_BYTES:
        where = f"line {bad[0]}" if bad else f"past {MAX_MANIFEST_BYTES >> 20} MB"
        return entries, [f"{manifest}: not a manifest ({where} is not '<sha256>  <file>'); "
                         "the files it does list are checked"]  # fmt: skip
    return entries, []
