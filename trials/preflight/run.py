"""preflight(): read every selected trial through each check of checks.CHECKS, ask every host
that a check wants something of (reachable over SSH, then its facts, once), let each check
judge, and raise SpecError with every problem found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.rack import Rack, RackError
from trials.network import host_settings, resolve_network
from trials.plan import Trial
from trials.preflight.checks import CHECKS
from trials.preflight.context import Context, TrialView, Wants
from trials.preflight.facts import available, host_facts
from trials.preflight.reach import reachability
from trials.spec import SpecError
from trials.watch import watch_timeout_s


def preflight(
    trials: list[Trial],
    rack: Rack,
    source: str,
    results: Path | None = None,
    static: dict[str, dict[str, Any]] | None = None,
    plan_trials: list[Trial] | None = None,
) -> dict[str, dict[str, Any]]:
    """Raise SpecError listing every problem of the selected trials on this rack (and, given
    the results directory, on the controller's disk that receives their captures); return
    the facts of the hosts asked. `plan_trials`: every trial of their plan (the runner
    configures the congestion controls the whole plan selects on a host; default: the
    selected ones). `static`: host_facts' cache of unchanging facts, filled here for the
    trials that follow."""
    watch_timeout_s(rack)  # a malformed rack setting stops here, before any host is asked
    ctx = Context(rack, source, trials, plan_trials or trials, results)
    wants: dict[str, Wants] = {check.name: {} for check in CHECKS}
    problems: list[str] = []
    for trial in trials:
        try:
            net = resolve_network(trial.experiment, rack, source)
            settings = host_settings(trial.experiment, net, source)
        except RackError as exc:
            problems.append(str(exc))
            continue
        view = TrialView(trial, net, settings)
        ctx.views.append(view)
        for check in CHECKS:
            if check.need is not None:
                problems += check.need(ctx, view, wants[check.name])

    hosts = sorted({host for wanted in wants.values() for host in wanted})
    answered, unreachable = reachability(rack, hosts)
    problems += unreachable
    for wanted in wants.values():  # nothing more can be asked of a host that did not answer
        for gone in set(hosts) - set(answered):
            wanted.pop(gone, None)
    route_to = {
        host: sorted(addresses)
        for check in CHECKS
        if check.asks_routes
        for host, addresses in wants[check.name].items()
    }
    ctx.facts = host_facts(rack, answered, static=static, route_to=route_to) if answered else {}
    for check in CHECKS:
        if check.judge is not None:
            problems += check.judge(ctx, wants[check.name])

    if problems:
        have = "\n".join(f"  {line}" for line in available(ctx.facts))
        said = "\n".join(dict.fromkeys(problems))
        raise SpecError(said + (f"\nWhat the hosts have:\n{have}" if ctx.facts else ""))
    return ctx.facts
