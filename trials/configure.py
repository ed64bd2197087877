"""Bringing each trial's host variables onto the rack, as little as it takes, and giving the rack
back afterwards: the runner's memory of what configure.yml applied where."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.command import Command, and_then, command
from core.layout import TrialDir
from core.link_rules import CONFIGURE_INPUT_CHECKS_TAG
from core.rack import Rack
from trials.ansible import configure_tags, run_playbook, write_host_vars
from trials.host_vars import SwitchChoices, cc_switchable, shaping_switchable, switch_choices
from trials.plan import Plan


class RackConfiguration:
    """What configure.yml last applied per host, while nothing else is known to have touched
    the rack, and the steps that change it: `apply` (a trial's variables) and `restore`."""

    def __init__(self, plan: Plan, rack: Rack, log: Callable[[str], None] = print):
        self.plan, self.rack, self.log = plan, rack, log
        self.last_vars: dict[str, dict[str, Any]] | None = None
        self.applied: dict[str, dict[str, Any]] = {}
        self.applied_by = ""
        self._choices: SwitchChoices | None = None

    def forget(self) -> None:
        """A trial failed or was interrupted: the next one configures everything again."""
        self.applied = {}

    @property
    def choices(self) -> SwitchChoices:
        """The plan's switch choices (host_vars.switch_choices), scanned once."""
        if self._choices is None:
            self._choices = switch_choices(self.plan, self.rack)
        return self._choices

    def apply(
        self, trial_dir: Path, variables: dict[str, dict[str, Any]], trial: str = ""
    ) -> dict[str, Any]:
        """configure.yml for the hosts whose variables differ from what this runner applied
        last, and of it only the tags of the variables that differ (all of it on a host it
        has not configured yet); nothing at all when no host's differ (a repetition right
        after its twin). The record says which hosts and tags ran, or which trial's
        configuration was kept."""
        overlay = write_host_vars(TrialDir(trial_dir).ansible / "trial_vars.yml", variables)
        self.last_vars = {**(self.last_vars or {}), **variables}
        changed = sorted(h for h in variables if self.applied.get(h) != variables[h])
        if not changed:
            self.log(f"[{trial}] configure: nothing differs from {self.applied_by}'s")
            return {"overlay": overlay.name, "skipped": True, "same_as": self.applied_by}
        # A congestion control or a router's link settings the roles rendered for the batch
        # are switched to by the host's trialbed-select-cc / trialbed-select-shaping, which
        # set what the playbook would (one SSH round trip instead of 4-35 s of Ansible); the
        # playbook runs only where something else differs, with the tags of that.
        switch = {
            h: variables[h]["testbed_host_cc"]
            for h in changed
            if cc_switchable(self.applied.get(h), variables[h])
        }
        shaping = {
            h: variables[h]["linux_router_links_choices"].index(variables[h]["linux_router_links"])
            for h in changed
            if shaping_switchable(self.applied.get(h), variables[h])
        }
        commands = switch_commands(self.rack, switch, shaping)
        if commands:
            said = [f"{h} to {cc}" for h, cc in switch.items()]
            said += [f"{h}'s shaping to choice {i}" for h, i in shaping.items()]
            self.log(f"[{trial}] configure: switch {', '.join(said)}")
            self.rack.run_parallel(commands)
            for h, cc in switch.items():
                self.applied[h] = {
                    **self.applied[h],
                    "testbed_host_cc": cc,
                    "testbed_host_cc_params": variables[h].get("testbed_host_cc_params", {}),
                }
            for h in shaping:
                self.applied[h] = {
                    **self.applied[h],
                    "linux_router_links": variables[h]["linux_router_links"],
                }
            changed = [h for h in changed if self.applied[h] != variables[h]]
        switched = {
            **({"cc_switched": switch} if switch else {}),
            **({"shaping_switched": shaping} if shaping else {}),
        }
        if not changed:
            self.applied_by = trial
            return {"overlay": overlay.name, **switched}
        needed = [configure_tags(self.applied.get(h), variables[h]) for h in changed]
        tags = None if None in needed else sorted(set().union(*needed))
        # Only the trial's hosts (and the controller, for the virtual rack): a rack of 18
        # hosts where a trial uses 6 would otherwise spend most of its configure time idle.
        # The experiment schema checked every value before any host was touched, and each
        # role checks its own again before it changes its host: the play that checks every
        # host's inputs first is for playbooks run by hand (~2.5 s of each configure here).
        args = [
            "--limit",
            ",".join(["localhost", *changed]),
            "--skip-tags",
            CONFIGURE_INPUT_CHECKS_TAG,
        ]
        if tags is not None:
            args += ["--tags", ",".join(tags)]
        self.log(
            f"[{trial}] configure: ansible-playbook configure.yml on {', '.join(changed)}"
            + (f" (tags {', '.join(tags)})" if tags is not None else "")
        )
        recap = run_playbook(
            "configure.yml",
            [*self.rack.inventory, overlay],
            TrialDir(trial_dir).ansible / "configure.log",
            tuple(args),
        )
        self.applied.update({h: variables[h] for h in changed})
        self.applied_by = trial
        done = {"overlay": overlay.name, "recap": recap, "hosts": changed, "tags": tags or "all"}
        return {**done, **switched}

    def restore(self, log_stem: Path) -> None:
        """Take the last trial's shaping and delay line off the rack (teardown.yml), on the hosts
        this runner's trials named (and the controller): on a rack of 18 hosts where the trials
        used 6, the other 12 were not touched and their teardown would take most of the time. A
        rack a killed runner left is restored by teardown.yml by hand, on every host."""
        if self.last_vars is None:
            self.log("restore: no trial configured a host; nothing to give back")
            return
        hosts = sorted(self.last_vars)
        self.log(f"restore the network (ansible-playbook teardown.yml on {', '.join(hosts)})")
        variables = {
            h: {k: v for k, v in hv.items() if k.startswith("linux_router")}
            for h, hv in self.last_vars.items()
        }
        try:
            overlay = write_host_vars(log_stem.with_name(log_stem.name + "_vars.yml"), variables)
        except OSError as exc:  # the results disk is full: the rack is restored all the same
            log_stem = Path(tempfile.mkdtemp(prefix="trialbed-restore-")) / log_stem.name
            self.log(
                f"restore: cannot write under the results ({exc}); its files go to "
                f"{log_stem.parent}"
            )
            overlay = write_host_vars(log_stem.with_name(log_stem.name + "_vars.yml"), variables)
        recap = run_playbook(
            "teardown.yml",
            [*self.rack.inventory, overlay],
            log_stem.with_suffix(".log"),
            ("--limit", ",".join(["localhost", *hosts])),
            unreachable_ok=True,
        )
        for host in sorted(h for h, r in recap.items() if r["unreachable"]):
            self.log(
                f"restore: {host} did not answer; it stays as the trial left it (shaping, "
                f"settings, processes): run teardown.yml (make teardown) once it answers"
            )


def switch_commands(rack: Rack, cc: dict[str, str], shaping: dict[str, int]) -> dict[str, Command]:
    """Per host, the switch scripts that select its congestion control (`cc`: host -> name)
    and its router's link settings (`shaping`: host -> choice), in one round trip."""
    commands: dict[str, list[Command]] = {}
    for h, name in cc.items():
        select_cc = f"{rack.host(h).workdir}/trialbed-select-cc"
        commands.setdefault(h, []).append(command(select_cc, name))
    for h, index in shaping.items():
        select = f"{rack.host(h).workdir}/router/trialbed-select-shaping"
        commands.setdefault(h, []).append(command(select, index))
    return {h: and_then(*c) for h, c in commands.items()}
