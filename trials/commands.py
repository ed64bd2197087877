"""What each command of the command line (trials/__main__.py) does but `report`: run, check,
preflight, batch, nightly, status, results, worker and rack-guard, with the rack, plan and
Ansible machinery they import (`trials report` starts without it)."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.families import FAMILIES
from analysis.regressions import judge
from analysis.report import analyse_batch, print_batch
from core.layout import BatchDir, new_batch_path
from core.rack import DEFAULT_INVENTORY, PROJECT_DIR, Rack, RackError
from trials import cli_record, cli_results, nightly, rack_kind
from trials.ansible import PlaybookError, run_playbook
from trials.batch import Batch, batch_name_problem
from trials.batch_watch import watch
from trials.batch_worker import progress, rack_labels, run_worker, spawn_workers
from trials.collections import controller_problems
from trials.console import console
from trials.interrupts import Interrupted
from trials.locks import RackBusy, RackLock, describe, now_iso, rack_in_use
from trials.loop import run_plan
from trials.network import virtual_topology_problems
from trials.plan import Plan, Trial, load_plan
from trials.preflight import available, preflight
from trials.preflight.disk import batch_capture_line
from trials.spec import SpecError
from trials.validation import VALIDATIONS, validate

# Per trial beyond its traffic: configure, arm, start lead, drain, collect (measured on the
# 2-core namespace rack: 3 s when only cc changes, 7-8 s when the router's shaping changes,
# 30 s for the first trial's full configure; README "Time per trial").
OVERHEAD_S = 10
# The same on the VM rack under TCG (configure runs every Ansible task in the emulated CPU):
# 217-332 s measured per seed-000 trial on the 2-core machine.
OVERHEAD_S_VM = 240


def overhead_s(racks: list[list[Path]]) -> int:
    """Per-trial overhead of the slowest of the racks (by the kind its inventory says)."""
    kinds = {rack_kind.running_kind(inv) for rack in racks for inv in rack}
    return OVERHEAD_S_VM if "vm" in kinds else OVERHEAD_S


def refuse_misspelt_family(plan: Plan) -> None:
    """SpecError when `experiment:` names no family with a report module but is close to
    one (a typo would lose the batch's family tables without a word). Families without a
    module of their own (dscp_marking, web_poisson) run with the generic tables."""
    name = plan.base.experiment
    families = sorted(FAMILIES)
    close = difflib.get_close_matches(name, families, n=1, cutoff=0.8)
    if name not in families and close:
        raise SpecError(
            f"{plan.source}: key 'experiment': {name!r} has no report module; did you mean "
            f"{close[0]!r}? (the families with one: {', '.join(families)}; a new family's "
            "module goes in analysis/families/)"
        )


def refuse_beyond_virtual_topology(trials: list[Trial], source: str) -> None:
    """SpecError when a trial needs what its virtual rack's topology does not have: checked
    from the topology file, before a rack is brought up or replaced."""
    problems = [
        p for t in trials if t.experiment for p in virtual_topology_problems(t.experiment, source)
    ]
    if problems:
        raise SpecError("\n".join(dict.fromkeys(problems)))


def refuse_before_a_rack(
    plan: Plan, trials: list[Trial], *, virtual: bool, batch: Path | None = None
) -> None:
    """The checks of a plan that need no host, before any rack is touched: the batch's name
    (``batch``, else the one made from the experiment file's), a misspelt family, and on the
    virtual rack (``virtual``) what its topology file lacks."""
    if batch is not None:
        problem = batch_name_problem(batch.name, f"BATCH={batch}")
    else:
        made = new_batch_path(Path("results"), plan.source).name
        problem = batch_name_problem(made, f"{plan.source} (its name makes the batch's)")
        if problem:
            problem += "; rename the file, or give the batch a name (BATCH=results/NAME)"
    if problem:
        raise SpecError(problem)
    refuse_misspelt_family(plan)
    if virtual:
        refuse_beyond_virtual_topology(trials, str(plan.source))


def refuse_removing_a_rack_in_use(why: str, inventory: Path | None = None) -> None:
    """RackBusy when the virtual rack (of ``inventory``, default the one `make rack-up`
    wrote) is up and a batch or trial holds its lock: taking it down deletes its hosts' work
    directories, with a running trial's files not yet brought back."""
    inventory = inventory or DEFAULT_INVENTORY
    if not inventory.exists():
        return
    holder = rack_in_use(Rack.load([inventory]))
    if holder is not None:
        said = describe(holder) if holder else "a holder still writing its lock"
        raise RackBusy(
            f"the virtual rack is in use ({said}); {why}, with its trial's files. Wait for "
            "it, or stop that process."
        )


def ensure_virtual_rack(topology: str, kind: str = "namespaces") -> None:
    """Bring up the virtual rack the experiment needs (namespaces on this machine, or inside
    the VM), replacing a rack of another topology or kind."""
    running = None
    if DEFAULT_INVENTORY.exists():
        data = yaml.safe_load(DEFAULT_INVENTORY.read_text()) or {}
        running = (data.get("all", {}).get("vars") or {}).get("trialbed_topology")
    running_kind = rack_kind.running_kind(DEFAULT_INVENTORY)
    if running == topology and running_kind == kind:
        return
    what = f"{topology} rack{' in the VM' if kind == 'vm' else ''}"
    if running or running_kind:
        refuse_removing_a_rack_in_use(f"bringing up the {what} would take it down")
    if running:
        console.print(f"taking down the {running} {running_kind} rack to bring up the {what}")
    else:
        console.print(f"bringing up the {what}")
    log = PROJECT_DIR / ".state" / "rack-up.log"
    extra = ["-e", f"virtual_rack_topology_name={topology}", "-e", f"virtual_rack_kind={kind}"]
    # make RACK_PREFIX=/RACK_SUBNET=: a rack beside another checkout's (its own prefix, bridges
    # and management subnet).
    for env, var in (
        ("TRIALBED_RACK_PREFIX", "virtual_rack_namespace_prefix"),
        ("TRIALBED_RACK_SUBNET", "virtual_rack_management_subnet"),
    ):
        if os.environ.get(env):
            extra += ["-e", f"{var}={os.environ[env]}"]
    run_playbook("rack.yml", [], log, tuple(extra))


def plan_table(
    plan: Plan,
    trials: list[Trial],
    status: dict[str, str] | None = None,
    overhead: int = OVERHEAD_S,
    racks: int = 1,
) -> Table:
    table = Table(title=f"{plan.source}: {len(trials)} of {len(plan.trials)} trial(s)")
    cols = ["#", "trial", "id", "varies", "duration", *(["status"] if status else [])]
    for col in cols:
        table.add_column(col, justify="right" if col in ("#", "duration") else "left")
    for i, t in enumerate(trials, 1):
        varies = ", ".join(f"{k}={v}" for k, v in t.overrides.items()) or "-"
        row = [str(i), t.name, t.id, escape(varies), f"{t.experiment.duration / 1e9:g} s"]
        table.add_row(*row, *([status[t.name]] if status else []))
    left = [t for t in trials if not status or status[t.name] != "complete"]
    total = sum(t.experiment.duration / 1e9 + overhead for t in left)
    # Racks share one plan: each claims the next trial, so the wall time divides (at most
    # one trial per rack at a time; the last round may leave racks idle).
    rounds = -(-len(left) // racks) if left else 0
    wall = total * rounds / len(left) if left else 0
    where = "one rack" if racks == 1 else f"{racks} racks"
    table.caption = (
        f"estimated {wall / 60:.0f} min on {where} for {len(left)} trial(s) "
        f"(traffic + ~{overhead} s each)"
    )
    return table


def run(args: argparse.Namespace) -> int:
    """The command ``args`` names (parsed by trials/__main__.py), but `report`; its exit
    status."""
    try:
        if args.command == "status":
            from trials.status import show

            width = None if sys.stdout.isatty() else 200
            return show(args.inventory, Console(width=width), as_json=args.json)
        if args.command == "results":
            return cli_results.run(args, console)
        if args.command == "record":
            return cli_record.run(args, console)
        if args.command == "worker":
            run_worker(args.batch, args.inventory, args.label, args.retries, log=print_flush)
            return 0
        if args.command == "rack-guard":
            why = args.why or "make rack-down would take it down"
            try:
                refuse_removing_a_rack_in_use(why, args.inventory)
            except RackBusy as exc:  # its own code: the role tells "in use" from "cannot tell"
                console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
                return 3
            return 0
        if args.command == "batch":
            return run_batch(args)
        if args.command == "nightly":
            return run_nightly(args)
        if args.command in VALIDATIONS:
            return validate(
                VALIDATIONS[args.command], args, run_batch, lambda m: print(m, flush=True)
            )
        plan = load_plan(args.experiment, args.sets)
        trials = plan.select(args.only)
        refuse_before_a_rack(plan, trials, virtual=args.command == "check" or not args.inventory)
        if args.command == "check":
            # Wide enough that a trial's row stays on one line when piped.
            Console(width=None if sys.stdout.isatty() else 160).print(plan_table(plan, trials))
            return 0
        if not args.inventory:
            kind, why = rack_kind.choose(trials, args.rack_kind)
            console.print(f"rack: {why}", highlight=False)
            ensure_virtual_rack(plan.base.topology, kind)
        if args.command == "preflight":
            inventory = args.inventory or [DEFAULT_INVENTORY]
            return run_preflight(plan, trials, inventory, args.results)
        rack = Rack.load(args.inventory)
        try:
            batch_dir, records = run_plan(
                plan,
                trials,
                rack,
                args.results,
                log=lambda m: console.print(f"[dim]{escape(m)}[/dim]"),
                keep_network=args.keep_network,
            )
        finally:
            rack.close()
        try:
            print_batch(analyse_batch(batch_dir))
        except (OSError, ValueError) as exc:  # e.g. the results disk full: causes follow
            console.print(f"[red]analysis not written:[/red] {escape(str(exc))}", highlight=False)
        console.print(f"results: {batch_dir}")
        failed = [r for r in records if r.get("status") != "complete"]
        for r in failed:
            causes = "; ".join(r.get("errors") or []) or r.get("status", "?")
            console.print(
                f"[red]trial {r['trial']} failed:[/red] {escape(causes)}", highlight=False
            )
        return 1 if failed else 0
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


def run_preflight(plan: Plan, trials: list[Trial], inventory: list[Path], results: Path) -> int:
    """Every check a run makes before it touches a host, on the controller (its results disk
    too) and on every host of the selected trials; 0 when the rack can run them, 1 with one
    line per problem."""
    problems = controller_problems(PROJECT_DIR)
    rack = Rack.load(inventory)
    try:
        facts = preflight(trials, rack, str(plan.source), results, plan_trials=plan.trials)
    except SpecError as exc:
        problems += str(exc).splitlines()
        facts = None
    finally:
        rack.close()
    where = ", ".join(map(str, inventory))
    if problems:
        console.print(f"[red]preflight: {len(trials)} trial(s) on {where}:[/red]")
        for line in problems:
            console.print(f"  {escape(line)}", highlight=False)
        return 1
    console.print(f"preflight: {len(trials)} trial(s) can run on {where}")
    for line in available(facts or {}):
        console.print(f"  {escape(line)}", highlight=False)
    return 0


def print_flush(message: str) -> None:
    print(f"{now_iso()} {message}", flush=True)


def run_batch(args: argparse.Namespace) -> int:
    """Plan, preflight on every rack, one worker process per rack, a progress bar until they
    end, then the batch's tables."""
    plan = load_plan(args.experiment, args.sets)
    trials = plan.select(args.only)
    refuse_before_a_rack(plan, trials, virtual=not args.racks, batch=args.batch)
    path = args.batch or new_batch_path(args.results, args.experiment)
    batch, resumed = Batch.create_or_resume(path, plan, trials, args.sets, args.only)
    if resumed:
        for name, bad in batch.verify().items():
            console.print(f"[yellow]{name}: files changed since it ran ({', '.join(bad)})[/]")
            batch.set_aside(name)
    if args.racks:
        racks = [[Path(p) for p in r.split(",")] for r in args.racks]
    else:
        kind, why = rack_kind.choose(trials, args.rack_kind)
        console.print(f"rack: {why}", highlight=False)
        ensure_virtual_rack(plan.base.topology, kind)
        racks = [[DEFAULT_INVENTORY]]
    labels = rack_labels(racks)
    status = {t.name: batch.status(t.name) for t in trials}
    for name in status:  # given up (its worker kept dying): no trials/<name> says so
        if batch.out_of_retries(name, args.retries):
            status[name] = f"failed ({batch.failed_attempts(name)} attempts)"
    out = Console(width=None if sys.stdout.isatty() else 200)
    out.print(plan_table(plan, trials, status, overhead_s(racks), len(racks)))
    out.print(f"batch: {batch.path}" + (" (resumed)" if resumed else ""))
    todo = [t for t in trials if not batch.done(t.name)]
    if problems := controller_problems(PROJECT_DIR):
        raise SpecError("\n".join(problems))
    for i, (inventory, label) in enumerate(zip(racks, labels, strict=True)):
        rack = Rack.load(inventory)
        try:
            # The results disk once: every rack's captures come back to the one batch.
            preflight(
                todo,
                rack,
                str(plan.source),
                batch.path if i == 0 else None,
                plan_trials=plan.trials,
            )
            if i == 0 and todo:
                console.print(batch_capture_line(todo, rack, str(plan.source), batch.path))
            with RackLock.for_rack(rack, batch.name, label, warn=console.print):
                pass  # free now (a stale holder is replaced); the worker takes it for real
        finally:
            rack.close()
    workers = spawn_workers(batch, racks, labels, args.retries)
    code = watch(batch, workers, len(trials), args.retries, out, overhead_s(racks), console)
    table = analyse_batch(batch.path)
    print_batch(table)
    final = progress(batch, args.retries)
    out.print(
        f"batch {batch.path}: {final.done} complete, {final.failed} failed after retries, "
        f"{final.todo} not run"
    )
    if final.failed:  # they are never run again with the same RETRIES: say how
        most = max(batch.failed_attempts(t.name) for t in trials if not batch.done(t.name))
        out.print(
            f"the failed trials run again when the batch is run again with RETRIES={most} "
            f"(--retries {most}) or more: same EXPERIMENT, SET, ONLY and BATCH={batch.path}"
        )
    if code == 0 and (final.failed or final.todo):  # a trial left unrun is no success either
        code = 1
    return code


def run_nightly(args: argparse.Namespace) -> int:
    out = Console(width=None if sys.stdout.isatty() else 200, soft_wrap=not sys.stdout.isatty())
    if args.action in ("install", "run") and not args.experiment:
        raise SpecError(f"nightly {args.action}: which experiment? (EXPERIMENT=...)")
    if args.keep_captures < 1:  # 0 would prune tonight's batch right after its report
        raise SpecError(
            f"nightly {args.action}: KEEP_CAPTURES={args.keep_captures}: keep the captures at "
            "least 1 day (their tables are kept whatever it is)"
        )
    if args.action == "install":
        load_plan(args.experiment)  # a broken file is refused now, not at 02:00
        schedule = nightly.Schedule(args.experiment, args.at, args.keep_captures, args.make_vars)
        for path in schedule.install():
            out.print(f"installed {path}")
        out.print(escape(f"every day at {args.at}: {schedule.command()}"), highlight=False)
        out.print(f"log: {schedule.log_file()}")
        return 0
    if args.action == "remove":
        removed = nightly.remove(args.experiment)
        out.print("\n".join(f"removed {p}" for p in removed) or "no nightly schedule installed")
        return 0
    if args.action == "status":
        for path in nightly.installed():
            lines = path.read_text().strip().splitlines()  # a cron entry's last; a timer's when
            line = next((x for x in lines if x.startswith("OnCalendar=")), lines[-1])
            command = nightly.scheduled_command(path)  # brackets of SET items are no markup
            out.print(escape(f"schedule {path}: {line}\n  runs: {command}"), highlight=False)
        if not nightly.installed():
            out.print("no nightly schedule installed")
        table = Table(title="last nightly batches")
        for col in ("experiment", "date", "trials", "status", "captures", "batch"):
            table.add_column(col)
        for r in nightly.last_runs():
            status = ", ".join(f"{n} {s}" for s, n in sorted(r["status"].items()))
            captures = "pruned" if r["pruned"] else "kept"
            table.add_row(
                r["experiment"], r["date"], str(r["trials"]), status, captures, r["batch"]
            )
        out.print(table)
        return 0
    # run: today's batch (resumed if it exists), its report and the regressions' verdict
    # against the last nights (report.txt, the page, the exit status), then retention.
    args.batch = nightly.dated_batch(args.experiment)
    args.results = args.batch.parent
    code = run_batch(args)
    report = BatchDir(args.batch).report_text
    table = analyse_batch(args.batch)  # and the batch into the results catalog
    verdict = judge(args.batch, nights=args.baseline_nights, baseline=args.baseline)
    with report.open("w") as f:
        print_batch(table, Console(file=f, width=200))
        print("\n".join(verdict.lines()), file=f)
    out.print(escape("\n".join(verdict.lines())), highlight=False)
    out.print(f"report: {report}")
    from analysis.html_report import write_report  # matplotlib: only where a page is drawn

    page = write_report(args.batch, nights=args.baseline_nights, baseline=args.baseline)
    out.print(f"report: {page}")
    for batch in nightly.prune(args.experiment, args.keep_captures):
        out.print(f"captures removed from {batch} (older than {args.keep_captures} days)")
    if code == 0 and verdict.found:
        out.print(f"exit {nightly.CHANGE_FOUND}: the batch ran; the test found a change")
        return nightly.CHANGE_FOUND
    return code
