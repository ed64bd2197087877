"""trialbed command line: `python -m trials run EXPERIMENT.yml` (what `make trial` calls).

run EXPERIMENT [--set KEY=VALUE]... [--only NAME|GLOB]... [-i INVENTORY]...
check EXPERIMENT [--set ...] [--only ...]     the plan; no host is touched
report results/<batch>                        analyse again and print
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.report import analyse_batch, print_batch
from core.rack import DEFAULT_INVENTORY, PROJECT_DIR, Rack, RackError
from trials.ansible import PlaybookError, run_playbook
from trials.plan import Plan, Trial, load_plan
from trials.runner import Interrupted, run_plan
from trials.spec import SpecError

console = Console(stderr=True)
# Per trial beyond its traffic: configure, arm, start lead, drain, collect (measured: ~15 s).
OVERHEAD_S = 15


def ensure_virtual_rack(topology: str) -> None:
    """Bring up the virtual rack the experiment needs, replacing a rack of another topology."""
    running = None
    if DEFAULT_INVENTORY.exists():
        data = yaml.safe_load(DEFAULT_INVENTORY.read_text()) or {}
        running = (data.get("all", {}).get("vars") or {}).get("trialbed_topology")
    if running == topology:
        return
    if running:
        console.print(f"taking down the {running} rack to bring up {topology}")
    else:
        console.print(f"bringing up the {topology} rack")
    log = PROJECT_DIR / ".state" / "rack-up.log"
    run_playbook("rack.yml", [], log, ("-e", f"virtual_rack_topology_name={topology}"))


def plan_table(plan: Plan, trials: list[Trial]) -> Table:
    table = Table(title=f"{plan.source}: {len(trials)} of {len(plan.trials)} trial(s)")
    for col in ("#", "trial", "id", "varies", "duration"):
        table.add_column(col, justify="right" if col in ("#", "duration") else "left")
    for i, t in enumerate(trials, 1):
        varies = ", ".join(f"{k}={v}" for k, v in t.overrides.items()) or "-"
        table.add_row(str(i), t.name, t.id, escape(varies), f"{t.experiment.duration / 1e9:g} s")
    total = sum(t.experiment.duration / 1e9 + OVERHEAD_S for t in trials)
    table.caption = f"estimated {total / 60:.0f} min on the rack (traffic + ~{OVERHEAD_S} s each)"
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trials",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the trials of an experiment file and print results")
    check = sub.add_parser("check", help="validate an experiment file and print its plan")
    for p in (run, check):
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
    run.add_argument(
        "-i",
        "--inventory",
        type=Path,
        action="append",
        help="inventory (default: the virtual rack, brought up for the experiment's topology)",
    )
    run.add_argument("--results", type=Path, default=PROJECT_DIR / "results")
    report = sub.add_parser("report", help="analyse a results/<batch> directory again and print it")
    report.add_argument("batch", type=Path)
    args = parser.parse_args(argv)

    try:
        if args.command == "report":
            print_batch(analyse_batch(args.batch))
            return 0
        plan = load_plan(args.experiment, args.sets)
        trials = plan.select(args.only)
        if args.command == "check":
            # Wide enough that a trial's row stays on one line when piped.
            Console(width=None if sys.stdout.isatty() else 160).print(plan_table(plan, trials))
            return 0
        if not args.inventory:
            ensure_virtual_rack(plan.base.topology)
        rack = Rack.load(args.inventory)
        try:
            batch_dir, _ = run_plan(
                plan,
                trials,
                rack,
                args.results,
                log=lambda m: console.print(f"[dim]{escape(m)}[/dim]"),
            )
        finally:
            rack.close()
        print_batch(analyse_batch(batch_dir))
        console.print(f"results: {batch_dir}")
        return 0
    except (SpecError, RackError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    except PlaybookError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
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
