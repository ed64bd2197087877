"""`trialbed validate-htcp` (make validate-htcp): H-TCP's two implementations, the kernel's
tcp_htcp module and hostside/bpf_cc's BPF one, run as one batch of experiments/htcp_validation.yml
(its factor hosts.all.cc_implementation: module, bpf; N repetitions of each), then compared
(analysis/implementations.py): the table, and exit 1 when a metric disagrees. A rack whose
kernel lacks the module is refused before anything runs."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from core.layout import PROJECT_DIR, new_batch_path
from trials import rack_kind

EXPERIMENT = PROJECT_DIR / "experiments" / "htcp_validation.yml"
DEFAULT_REPETITIONS = 5
# Where a kernel's own H-TCP is: loaded (or built in), or a module to load.
MODULE_LOADED = Path("/sys/module/tcp_htcp")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate-htcp",
        help="H-TCP's kernel module against its BPF implementation: one batch, then the table",
    )
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
        "which has tcp_htcp; this machine's kernel may not)",
    )  # fmt: skip


def this_kernel_has_htcp() -> bool:
    """Whether this machine's kernel has its own H-TCP (the namespace rack shares it)."""
    if MODULE_LOADED.is_dir():
        return True
    modules = Path("/lib/modules") / os.uname().release
    return any(modules.rglob("tcp_htcp.ko*")) if modules.is_dir() else False


def refusal(args: argparse.Namespace) -> str | None:
    """Why this rack cannot compare the two (None: it may; a lab rack's preflight decides)."""
    if args.repetitions < 2:
        return (
            f"--repetitions {args.repetitions}: the run-to-run spread needs at least 2 trials "
            "of each implementation"
        )
    kind = args.rack_kind if not args.racks else None
    if kind in ("namespaces", "auto") and not this_kernel_has_htcp():
        return (
            f"--rack-kind {kind}: the namespace rack runs on this machine's kernel "
            f"({os.uname().release}), which has no tcp_htcp module, so only the BPF "
            "implementation could run there. Use the VM rack (RACK=vm, the default), or a lab "
            "rack whose kernel has tcp_htcp (--rack INVENTORY)"
        )
    return None


def validate(
    args: argparse.Namespace, run_batch: Callable[[argparse.Namespace], int], say: Callable
) -> int:
    """The batch (run_batch: trials/commands.py's), then the comparison; its exit code: 0
    every metric agrees, 1 one disagrees or a trial failed, 2 refused or not judged."""
    # (imported here: the command line parses its options without pandas or the plan's models)
    from analysis.implementations import batch_metrics, compare, format_verdicts
    from trials.spec import SpecError

    if problem := refusal(args):
        raise SpecError(f"validate-htcp: {problem}")
    path = args.batch or new_batch_path(args.results, EXPERIMENT)
    batch = argparse.Namespace(
        experiment=EXPERIMENT,
        sets=[f"repetitions={args.repetitions}"],
        only=None,
        batch=path,
        results=args.results,
        racks=args.racks,
        retries=args.retries,
        rack_kind=args.rack_kind,
    )
    code = run_batch(batch)
    rows = batch_metrics(path)
    for r in rows[rows.problem.notna()].itertuples():
        say(f"{r.trial}: left out of the comparison: {r.problem}")
    try:
        names, verdicts = compare(rows)
    except ValueError as exc:
        say(f"validate-htcp: {path}: cannot compare: {exc}")
        return 2
    say("\n".join(format_verdicts(names, verdicts)))
    if any(v.n[0] < 2 or v.n[1] < 2 for v in verdicts):
        say("validate-htcp: fewer than two usable trials of an implementation: not judged")
        return 2
    agree = all(v.agree for v in verdicts)
    say(f"validate-htcp: {names[0]} and {names[1]} {'agree' if agree else 'DISAGREE'} ({path})")
    return 0 if agree and code == 0 else 1
