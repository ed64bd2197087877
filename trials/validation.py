"""What `trialbed validate-htcp` and `trialbed validate-rio` share: an experiment whose factor
runs two implementations of one mechanism on a rack whose kernel has the kernel's own (the VM
rack by default), as one batch (trials/commands.py's run_batch: resumable, N repetitions),
then the comparison of its trials (analysis/agreement.py's rule, through the analysis module
that measures them), said line by line, and the exit code. The command line's options and its
refusals before anything runs are here too."""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.layout import PROJECT_DIR, VALIDATION_TABLE, new_batch_path
from trials import rack_kind

DEFAULT_REPETITIONS = 5


@dataclass(frozen=True)
class Validation:
    """A command (its name in what it says), the experiment it runs, the analysis module (its
    batch_metrics and JUDGED: analysis/agreement.py's Judged) that measures the batch's
    trials, the kernel module the kernel's own implementation is (the namespace rack runs on
    this machine's kernel), and the command's help."""

    command: str
    experiment: Path
    analysis: str
    module: str
    help: str
    only: str = "BPF"  # the one implementation a kernel without the module runs


EXPERIMENTS = PROJECT_DIR / "experiments"
VALIDATIONS = {
    v.command: v
    for v in (
        Validation(
            "validate-htcp", EXPERIMENTS / "htcp_validation.yml", "analysis.implementations",
            "tcp_htcp", "H-TCP's kernel module against its BPF implementation: one batch, then "
            "the table",
        ),
        Validation(
            "validate-rio", EXPERIMENTS / "rio_validation.yml", "analysis.rio_validation",
            "sch_gred", "RIO as GRED in RIO mode against its BPF implementation: one batch, then "
            "the table",
        ),
    )
}  # fmt: skip


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Each command's options: repetitions, the batch, where results go, racks and retries,
    and the virtual rack (default vm: Debian's stock kernel, which has the module)."""
    for v in VALIDATIONS.values():
        _add_parser(sub, v)


def _add_parser(sub: argparse._SubParsersAction, v: Validation) -> None:
    p = sub.add_parser(v.command, help=v.help)
    p.add_argument(
        "--repetitions", type=int, default=DEFAULT_REPETITIONS,
        help=f"trials of each implementation (default {DEFAULT_REPETITIONS})",
    )  # fmt: skip
    p.add_argument("--batch", type=Path, help="the batch directory (again: resume it, or compare)")
    p.add_argument("--results", type=Path, default=PROJECT_DIR / "results")
    p.add_argument("--rack", dest="racks", action="append", metavar="INVENTORY[,INVENTORY]")
    p.add_argument("--retries", type=int, default=2)
    p.add_argument(
        "--rack-kind", choices=rack_kind.KINDS, default="vm",
        help="the virtual rack when no --rack is given (default vm: Debian's stock kernel, "
        f"which has {v.module}; this machine's kernel may not)",
    )  # fmt: skip


def this_kernel_has(module: str) -> bool:
    """Whether this machine's kernel (the namespace rack's) has a module: loaded (or built in
    with parameters), or one to load."""
    if (Path("/sys/module") / module).is_dir():
        return True
    modules = Path("/lib/modules") / os.uname().release
    return any(modules.rglob(f"{module}.ko*")) if modules.is_dir() else False


def refusal(v: Validation, args: argparse.Namespace) -> str | None:
    """Why this rack cannot compare the two (None: it may; a lab rack's preflight decides):
    too few repetitions, or the namespace rack on a kernel without the module."""
    if args.repetitions < 2:
        return (
            f"--repetitions {args.repetitions}: the run-to-run spread needs at least 2 trials "
            "of each implementation"
        )
    kind = args.rack_kind if not args.racks else None
    if kind in ("namespaces", "auto") and not this_kernel_has(v.module):
        return (
            f"--rack-kind {kind}: the namespace rack runs on this machine's kernel "
            f"({os.uname().release}), which has no {v.module} module, so only the {v.only} "
            f"implementation could run there. Use the VM rack (RACK=vm, the default), or a lab "
            f"rack whose kernel has {v.module} (--rack INVENTORY)"
        )
    return None


def validate(
    v: Validation,
    args: argparse.Namespace,
    run_batch: Callable[[argparse.Namespace], int],
    say: Callable,
) -> int:
    """The refusal, the batch (run_batch: trials/commands.py's), then the comparison; its exit
    code: 0 every metric agrees, 1 one disagrees or a trial failed, 2 refused or not judged."""
    # (imported here: the command line parses its options without pandas or the plan's models)
    from trials.spec import SpecError

    if problem := refusal(v, args):
        raise SpecError(f"{v.command}: {problem}")
    analysis = importlib.import_module(v.analysis)
    from analysis.agreement import compare, format_verdicts, judged

    path = args.batch or new_batch_path(args.results, v.experiment)
    batch = argparse.Namespace(
        experiment=v.experiment,
        sets=[f"repetitions={args.repetitions}"],
        only=None,
        batch=path,
        results=args.results,
        racks=args.racks,
        retries=args.retries,
        rack_kind=args.rack_kind,
    )
    code = run_batch(batch)
    rows = analysis.batch_metrics(path)
    for r in rows[rows.problem.notna()].itertuples():
        say(f"{r.trial}: left out of the comparison: {r.problem}")
    try:
        names, verdicts = compare(rows, analysis.JUDGED)
    except ValueError as exc:
        say(f"{v.command}: {path}: cannot compare: {exc}")
        return 2
    table = "\n".join(format_verdicts(names, verdicts, analysis.JUDGED))
    say(table)
    if not judged(verdicts):
        say(f"{v.command}: fewer than two usable trials of an implementation: not judged")
        return 2
    agree = all(x.agree for x in verdicts)
    verdict = f"{v.command}: {names[0]} and {names[1]} {'agree' if agree else 'DISAGREE'}"
    say(f"{verdict} ({path})")
    # kept with the batch: the table is the validation's result, to cite and to commit
    (path / VALIDATION_TABLE).write_text(f"{table}\n{verdict}\n")
    return 0 if agree and code == 0 else 1
