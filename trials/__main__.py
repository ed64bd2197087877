"""trialbed command line: `trialbed run EXPERIMENT.yml` (what `make trial` calls; also
`python -m trials ...`).

run EXPERIMENT [--set KEY=VALUE]... [--only NAME|GLOB]... [-i INVENTORY]...
batch EXPERIMENT [--set ...] [--only ...] [--batch DIR] [--rack INV[,INV]]... [--retries N]
                                              unattended, resumable; one worker per rack
check EXPERIMENT [--set ...] [--only ...]     the plan; no host is touched
preflight EXPERIMENT [--set ...] [--only ...] [-i INVENTORY]... [--results DIR]
                                              can the rack (and the results disk) run it?
                                              (reads only; one line per problem with its fix)
report results/<batch>                        analyse again and print
results list|query SQL|backfill               the results catalog (trials/cli_results.py)
record results/<batch>... docs/reproductions/<family>
                                              the reproduction record of one or more batches
                                              (make record)
nightly install|remove|status|run EXPERIMENT  nightly batches (exit 3: ran, a change found)
status [-i INVENTORY]... [--json]             what every rack host is doing now (reads only)
validate-htcp [--repetitions N] [--batch DIR] H-TCP's kernel module against its BPF implementation
validate-rio [--repetitions N] [--batch DIR]  RIO as GRED against its BPF implementation
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.markup import escape

from analysis.regressions import NIGHTS
from analysis.workers import jobs_setting
from core.layout import RESULTS_DIR
from trials import cli_record, cli_results, rack_kind, validation
from trials.console import console

# What the commands do is in trials/commands.py, imported for them alone: `trials report`
# (trials/results_check.py) starts without the rack, plan and Ansible machinery.


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trialbed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the trials of an experiment file and print results")
    check = sub.add_parser("check", help="validate an experiment file and print its plan")
    pre = sub.add_parser(
        "preflight", help="check that the rack can run an experiment (reads only, changes nothing)"
    )
    for p in (run, check, pre):
        p.add_argument("experiment", type=Path)
        p.add_argument(
            "--set",
            dest="sets",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a key of the file (dotted, e.g. duration=20s, traffic[0].flows=2)",
        )
        p.add_argument(
            "--only", action="append", metavar="NAME", help="run only trials matching (glob)"
        )
    for p in (run, pre):
        p.add_argument(
            "-i",
            "--inventory",
            type=Path,
            action="append",
            help="inventory (default: the virtual rack, brought up for the experiment's topology)",
        )
    for p in (run, pre):
        p.add_argument(
            "--results",
            type=Path,
            default=RESULTS_DIR,
            help="where the trials' files are brought back (preflight: checks its free disk)",
        )
    run.add_argument(
        "--keep-network",
        action="store_true",
        help="when every trial completed, leave the last one's configuration on the rack "
        "(to look at it, or run playbooks by hand with its variables); make teardown removes it",
    )
    batch = sub.add_parser("batch", help="run a plan unattended into a resumable batch directory")
    batch.add_argument("experiment", type=Path)
    batch.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    batch.add_argument("--only", action="append", metavar="NAME")
    batch.add_argument(
        "--batch", type=Path, help="the batch directory (again: resume it); default a new one"
    )
    batch.add_argument("--results", type=Path, default=RESULTS_DIR)
    batch.add_argument(
        "--rack",
        dest="racks",
        action="append",
        metavar="INVENTORY[,INVENTORY]",
        help="a rack's inventory; give --rack once per rack to share the plan between them",
    )
    batch.add_argument("--retries", type=int, default=2, help="runs after a failed attempt")
    night = sub.add_parser("nightly", help="schedule, run and list nightly batches")
    for p in (run, batch, pre, night):
        p.add_argument(
            "--rack-kind",
            choices=rack_kind.KINDS,
            default=os.environ.get("RACK", "auto"),
            help="the virtual rack to run on when no rack is given: namespaces on this "
            "machine, vm (the same inside a qemu VM with Debian's stock kernel), or auto "
            "(namespaces when this machine's kernel has what the experiment needs; default, "
            "or $RACK)",
        )
    worker = sub.add_parser("worker", help="(internal) run a batch's trials on one rack")
    worker.add_argument("batch", type=Path)
    worker.add_argument("-i", "--inventory", type=Path, action="append", required=True)
    worker.add_argument("--label", required=True)
    worker.add_argument("--retries", type=int, default=2)
    night.add_argument("action", choices=["install", "remove", "status", "run"])
    night.add_argument("experiment", type=Path, nargs="?")
    night.add_argument("--at", default="02:00", help="time of day, HH:MM (install)")
    night.add_argument(
        "--keep-captures", type=int, default=14, help="days a batch keeps its captures"
    )
    night.add_argument(
        "--make-vars", default="", help="further make variables for the nightly run (install)"
    )
    night.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    night.add_argument("--only", action="append", metavar="NAME")
    night.add_argument("--rack", dest="racks", action="append")
    night.add_argument("--retries", type=int, default=2)
    night.add_argument(
        "--baseline-nights",
        type=int,
        default=NIGHTS,
        help=f"run: test tonight against this many nights before it (default {NIGHTS})",
    )
    night.add_argument("--baseline", help="run: test tonight against this batch instead")
    guard = sub.add_parser(
        "rack-guard",
        help="(the virtual_rack role, before it takes a rack down) refuse to remove a rack in use",
    )
    guard.add_argument("--inventory", type=Path, help="the rack's (default: make rack-up's)")
    guard.add_argument("--why", help="what would take it down (for the message)")
    status = sub.add_parser("status", help="what every rack host is doing now (changes nothing)")
    status.add_argument("-i", "--inventory", type=Path, action="append")
    status.add_argument("--json", action="store_true", help="print it as JSON")
    report = sub.add_parser("report", help="analyse a results/<batch> directory again and print it")
    report.add_argument("batch", type=Path)
    cli_results.add_parser(sub)
    cli_record.add_parser(sub)
    validation.add_parsers(sub)
    args = parser.parse_args(argv)
    try:  # the analysis at the end runs on this setting: refused before any host is touched
        jobs_setting()
    except ValueError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    if args.command == "report":
        from trials.results_check import report

        return report(args.batch, console)
    from trials import commands

    return commands.run(args)


if __name__ == "__main__":
    sys.exit(main())
