"""trialbed command line: `python -m trials run EXPERIMENT.yml` (what `make trial` calls)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from analysis.report import analyse_batch, print_batch
from trials.ansible import PlaybookError
from trials.rack import PROJECT_DIR, Rack, RackError
from trials.runner import Interrupted, run_experiment
from trials.spec import SpecError, load_experiment

console = Console(stderr=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trials", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the trials of an experiment file and print results")
    run.add_argument("experiment", type=Path)
    run.add_argument(
        "-i",
        "--inventory",
        type=Path,
        action="append",
        help="inventory (default: inventory/virtual/hosts.yml)",
    )
    run.add_argument("--results", type=Path, default=PROJECT_DIR / "results")
    run.add_argument("--only", action="append", help="run only this trial (name), repeatable")
    check = sub.add_parser("check", help="validate an experiment file (no host is touched)")
    check.add_argument("experiment", type=Path)
    report = sub.add_parser("report", help="analyse a results/<batch> directory again and print it")
    report.add_argument("batch", type=Path)
    args = parser.parse_args(argv)

    try:
        if args.command == "check":
            exp = load_experiment(args.experiment)
            console.print(f"{args.experiment}: ok, {len(exp.trials())} trial(s)")
            return 0
        if args.command == "report":
            print_batch(analyse_batch(args.batch))
            return 0
        exp = load_experiment(args.experiment)
        rack = Rack.load(args.inventory)
        try:
            batch_dir, _ = run_experiment(
                exp,
                args.experiment,
                rack,
                args.results,
                log=lambda m: console.print(f"[dim]{m}[/dim]"),
                only=set(args.only) if args.only else None,
            )
        finally:
            rack.close()
        print_batch(analyse_batch(batch_dir))
        console.print(f"results: {batch_dir}")
        return 0
    except (SpecError, RackError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 2
    except PlaybookError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        console.print("the network was restored; collected files are kept under results/")
        return 1
    except Interrupted:
        console.print(
            "[yellow]interrupted: the network was restored; collected files are kept "
            "under results/[/yellow]"
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
