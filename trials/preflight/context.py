"""What every preflight check is given: a selected trial as resolved on the rack (TrialView),
the run with what the hosts answered (Context), and the shape of a row of the table (Check)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from core.rack import Rack
from trials.network import ResolvedNetwork
from trials.plan import Trial
from trials.preflight.cc import own_ccs
from trials.preflight.facts import runs_freebsd
from trials.rack_kind import vm_max_rate
from trials.spec import Experiment, HostSettings

# What a check wants of each host, gathered from every selected trial: host -> the check's
# own record (which tools and why, which rates out of which interface, ...). Hosts that do not
# answer over SSH are dropped from every check's wants before the checks judge.
Wants = dict[str, Any]


@dataclass(frozen=True)
class TrialView:
    """One selected trial as the checks read it: its network resolved on the rack and each
    node's merged host settings."""

    trial: Trial
    net: ResolvedNetwork
    settings: dict[str, HostSettings]

    @property
    def exp(self) -> Experiment:
        return self.trial.experiment


@dataclass
class Context:
    """One preflight run: the rack, the experiment file named in messages, the selected trials
    and their plan, the results directory (None: not checked), the trials resolved so far,
    and, once asked, the facts of every host that answered."""

    rack: Rack
    source: str
    trials: list[Trial]
    plan_trials: list[Trial]
    results: Path | None
    views: list[TrialView] = field(default_factory=list)
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    _reported: set[Hashable] = field(default_factory=set)

    def freebsd(self, host: str) -> bool:
        return runs_freebsd(self.rack, host)

    @cached_property
    def host_ccs(self) -> dict[str, set[str]]:
        """Per node, the congestion controls the whole plan selects as its host's own (the
        runner configures all of them on a host, with their module parameters)."""
        return own_ccs(self.plan_trials, self.rack, self.source)

    @cached_property
    def rate_limit(self) -> tuple[str | None, str]:
        """The fastest rate the rack carries faithfully, and where that figure comes from:
        the VM rack's calibration, else the inventory's trialbed_max_rate (None: no limit)."""
        if measured := vm_max_rate(self.rack):
            return measured, f"{measured}, measured by the VM rack's calibration at rack-up"
        max_rate = self.rack.vars.get("trialbed_max_rate")
        return max_rate, f"trialbed_max_rate {max_rate}, measured"

    @cached_property
    def marker_capacities(self) -> tuple[str, Any]:
        """The inventory's variable that says how many packets/s the rack's edge markers
        carry, per implementation, and its value (None: not given): trialbed_marker_max_pps,
        on the VM rack trialbed_vm_marker_max_pps (the virtual inventory serves both kinds)."""
        vm = self.rack.vars.get("trialbed_rack_kind") == "vm"
        var = "trialbed_vm_marker_max_pps" if vm else "trialbed_marker_max_pps"
        return var, self.rack.vars.get(var)

    def first_time(self, key: Hashable) -> bool:
        """True the first time `key` is asked in this run: a problem that several trials (or
        flows) would each find is said once."""
        seen = key in self._reported
        self._reported.add(key)
        return not seen


@dataclass(frozen=True)
class Check:
    """One row of the table. `need(context, trial, wants)` reads one selected trial: it
    records what the trial wants of each host in `wants` (this check's own, keyed by host),
    and returns the problems the trial shows by itself. `judge(context, wants)` runs once
    every host that any check wants something of has answered (context.facts), and returns
    the problems. `asks_routes`: its wants are host -> address -> ..., and the facts read the
    route each host's kernel picks to those addresses."""

    name: str
    need: Callable[[Context, TrialView, Wants], list[str]] | None = None
    judge: Callable[[Context, Wants], list[str]] | None = None
    asks_routes: bool = False
