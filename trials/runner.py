"""Run the trials of an experiment on a rack: configure, arm, run, stop, collect.

The runner knows the network, the capture points and the generators only through their
resolved forms (trials.network, trials.generators): it loops over them. Every exit path
(success, failure, Ctrl-C, SIGTERM) stops the traffic and captures, brings back what was
captured, records the trial's status and restores the network.
"""

from __future__ import annotations

import errno
import json
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Container, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analysis.ipfw_samples import rio_queue_deltas
from collect.fetch import CollectError, pull_host, write_manifest, write_whole
from collect.pcap_count import pcap_packets
from collect.remote import (
    ipfw_sampler_command,
    siftr_command,
    tc_sampler_command,
    tcp_probe_command,
)
from core.daemons import Daemons
from core.dscp import counter_delta, nft_rule_counters, parse_dscp
from core.rack import PROJECT_DIR, Rack, RackError
from core.rio import counters_delta, gred_counters
from core.rio import high_dscp as rio_high_dscp
from core.units import format_duration, format_rate
from trials import adaptive_marking
from trials.ansible import configure_tags, run_playbook, write_host_vars
from trials.generators import GENERATOR_TYPES, TrafficGenerator
from trials.generators.base import TrialContext
from trials.network import Egress, ResolvedNetwork, host_settings, resolve_network
from trials.plan import Plan, Trial
from trials.preflight import available, host_facts, preflight
from trials.rack_kind import vm_record
from trials.spec import HostSettings, SpecError, dump_json
from trials.watch import (
    ENDS_EARLY_SLACK_S,
    UNTIL_STOPPED,
    TrialWatch,
    WatchFailure,
    watch_timeout_s,
)

# Between launching the senders and their common start time T0: the launches (one SSH
# round trip per sending host, all hosts at once) must be done by then. Measured: 0.1-0.3 s
# on the namespace rack, 3.9-5.4 s on the VM rack under TCG (two senders). The runner lengthens
# the lead to twice the slowest launch it has seen (`TrialRunner.lead_s`).
START_LEAD_S = 1.0
START_LEAD_S_VM = 10.0
FINISH_GRACE_S = 60.0  # how long past its end a sender may take before it is stopped
# The nftables table of role dscp_marker (its default dscp_marker_table): per-rule counters.
DSCP_TABLE = "inet trialbed_dscp"
# Kernel defaults of the TCP buffer limits: a trial that sets none gets these back.
TCP_RMEM = (4096, 131072, 6291456)
TCP_WMEM = (4096, 16384, 4194304)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; the runner cleans up and records the trial as interrupted.

    A BaseException, as KeyboardInterrupt is: the handler raises it wherever the main thread
    is, often inside an SSH call whose ``except Exception`` would turn it into a host error
    (a Ctrl-C during the watch's check read as "C stopped answering (SIGINT)", failing the
    trial instead of interrupting it)."""


@contextmanager
def interruptible():
    """Turn SIGTERM into the same clean stop as Ctrl-C."""

    def handler(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def ignore_signals():
    """Cleanup must not be cut short by a second Ctrl-C."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


Step = tuple[str, str, Callable[[], None]]  # (host, what, action)


def per_host(steps: Sequence[Step]) -> list[str]:
    """Run the steps, every host's in their order, the hosts at once (a trial's SSH round
    trips are its overhead: five hosts cost one round trip, not five). Every step is tried;
    returns the failures as 'what: error'."""
    hosts: dict[str, list[tuple[str, Callable[[], None]]]] = {}
    for host, what, action in steps:
        hosts.setdefault(host, []).append((what, action))

    def run(todo: list[tuple[str, Callable[[], None]]]) -> list[str]:
        failed = []
        for what, action in todo:
            try:
                action()
            except Exception as exc:
                failed.append(f"{what}: {type(exc).__name__}: {exc}")
        return failed

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        return [f for failed in pool.map(run, hosts.values()) for f in failed]


def must(failures: list[str]) -> None:
    """Before T0 a failed step fails the trial (the first failure is the cause)."""
    if failures:
        raise RuntimeError("; ".join(failures))


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(PROJECT_DIR), *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _tcp_buffer(limits: tuple[int, int, int], largest: int | None) -> str:
    low, default, high = limits
    if largest is not None:
        default, high = min(default, largest), largest
    return f"{low} {default} {high}"


def host_vars(
    trial: Trial,
    net: ResolvedNetwork,
    settings: dict[str, HostSettings],
    cc_choices: dict[str, dict[str, dict[str, Any]]] | None = None,
    shaping_choices: dict[str, list[list[dict[str, Any]]]] | None = None,
) -> dict[str, dict[str, Any]]:
    """The trial's variables for every host (the roles' inputs), from the resolved network;
    `cc_choices`: per host, the congestion controls its batch selects there, each with the
    module parameters every trial gives it ({} where they differ); `shaping_choices`: per
    router, the link settings its batch's trials switch between."""
    exp = trial.experiment
    flow_cc: dict[str, list[str]] = {}
    for gen in exp.traffic:
        if getattr(gen, "cc", None):
            flow_cc.setdefault(net.host_of(gen.from_), []).append(gen.cc)
            flow_cc.setdefault(net.host_of(gen.to), []).append(gen.cc)
    out: dict[str, dict[str, Any]] = {}
    for node, host in net.nodes.items():
        s = settings[node]
        v: dict[str, Any] = {
            "testbed_host_sysctls": {
                "net.ipv4.tcp_no_metrics_save": 1
                if s.tcp_no_metrics_save is None
                else s.tcp_no_metrics_save,
                "net.ipv4.tcp_rmem": _tcp_buffer(TCP_RMEM, s.rcvbuf),
                "net.ipv4.tcp_wmem": _tcp_buffer(TCP_WMEM, s.sndbuf),
                # Only when asked: configure gives a sysctl no longer set its own value back.
                **(
                    {"net.ipv4.tcp_timestamps": s.tcp_timestamps}
                    if s.tcp_timestamps is not None
                    else {}
                ),
            },
            "testbed_host_mtu": {
                iface: net.mtu.get((host, iface), 1500) for iface in net.hosts[host].interfaces
            },
            "testbed_host_route_metrics": {
                **({"initcwnd": s.initcwnd} if s.initcwnd else {}),
                **({"rto_min": format_duration(s.rto_min)} if s.rto_min else {}),
            },
            "trialbed_flow_cc": sorted(set(flow_cc.get(host, []))),
            # Always set, so that the next trial without pacing takes fq away again.
            "testbed_host_pacing_interfaces": sorted(net.hosts[host].interfaces)
            if s.pacing
            else [],
        }
        if s.cc:
            v["testbed_host_cc"] = s.cc
            v["testbed_host_cc_params"] = s.cc_params.get(s.cc, {})
            if choices := (cc_choices or {}).get(host):
                v["testbed_host_cc_choices"] = sorted(choices)
                if params := {cc: p for cc, p in choices.items() if p}:
                    v["testbed_host_cc_choice_params"] = params
        links = [e for e in net.egress if e.host == host]
        if links or node in net.routers:
            v["linux_router_forwarding"] = node in net.routers
            v["linux_router_links"] = [
                {
                    "iface": e.iface,
                    "rate": format_rate(e.shaping.rate) if e.shaping.rate else None,
                    "buffer": str(e.shaping.buffer) if e.shaping.buffer else None,
                    "delay_ms": e.shaping.delay / 1e6,
                    "qdisc": e.shaping.qdisc,
                    **({"rio": e.shaping.rio.settings()} if e.shaping.rio else {}),
                }
                for e in links
            ]
            if choices := (shaping_choices or {}).get(host):
                v["linux_router_links_choices"] = choices
        # Always set, so that the next trial without marking takes the table away again.
        v["dscp_marker_rules"] = net.marking.get(host, [])
        points = [c for c in net.captures if c.host == host]
        v["capture_points"] = [{"name": c.name, "iface": c.iface} for c in points]
        out[host] = v
    return out


def cc_switchable(applied: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    """Whether a host's congestion control goes from `applied`'s to `wanted`'s by a switch: it
    differs, the configure that applied `applied` made the new one available
    (testbed_host_cc_choices) and set its module parameters (testbed_host_cc_choice_params:
    module-wide, so set while another was selected), and those are the ones wanted."""
    if applied is None or "testbed_host_cc" not in wanted:
        return False
    cc = wanted["testbed_host_cc"]
    choice_params = wanted.get("testbed_host_cc_choice_params", {})
    return (
        applied.get("testbed_host_cc") != cc
        and cc in applied.get("testbed_host_cc_choices", [])
        and applied.get("testbed_host_cc_choices") == wanted.get("testbed_host_cc_choices")
        and applied.get("testbed_host_cc_choice_params", {}) == choice_params
        and wanted.get("testbed_host_cc_params", {}) == choice_params.get(cc, {})
    )


def shaping_switchable(applied: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    """Whether a router's links go from `applied`'s to `wanted`'s by its trialbed-select-shaping:
    they differ, and the configure that applied `applied` rendered the wanted ones among the
    same choices (linux_router_links_choices)."""
    if applied is None or "linux_router_links" not in wanted:
        return False
    choices = wanted.get("linux_router_links_choices", [])
    return (
        applied.get("linux_router_links") != wanted["linux_router_links"]
        and wanted["linux_router_links"] in choices
        and applied.get("linux_router_links_choices") == choices
    )


def shaping_shape(links: list[dict[str, Any]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The interfaces a link list shapes and those it delays: a switch keeps both (the role
    refuses choices that differ in them)."""
    delayed = tuple(x["iface"] for x in links if (x.get("delay_ms") or 0) > 0)
    return tuple(x["iface"] for x in links), delayed


class TrialRunner:
    def __init__(self, plan: Plan, rack: Rack, batch_dir: Path, log: Callable[[str], None] = print):
        self.plan, self.rack, self.batch_dir, self.log = plan, rack, batch_dir, log
        self.batch_id = batch_dir.name
        self.last_vars: dict[str, dict[str, Any]] | None = None
        # What configure.yml last applied per host, while nothing else is known to have
        # touched the rack (emptied when a trial fails or is interrupted).
        self.applied: dict[str, dict[str, Any]] = {}
        self.applied_by = ""
        self.static_facts: dict[str, dict[str, Any]] = {}  # per host, read on its first trial
        self._cc_choices: dict[str, dict[str, dict[str, Any]]] | None = None
        self._shaping_choices: dict[str, list[list[dict[str, Any]]]] | None = None
        self.watching: TrialWatch | None = None  # the running trial's watch
        self.pacing: dict[str, list[str]] = {}  # the running trial's fq hosts: their interfaces
        self.watch_timeout_s = watch_timeout_s(rack)
        on_vm = rack.vars.get("trialbed_rack_kind") == "vm"
        self.lead_s = START_LEAD_S_VM if on_vm else START_LEAD_S

    # -- steps on the rack ----------------------------------------------------------------------

    def configure(
        self, trial_dir: Path, variables: dict[str, dict[str, Any]], trial: str = ""
    ) -> dict[str, Any]:
        """configure.yml for the hosts whose variables differ from what this runner applied
        last, and of it only the tags of the variables that differ (all of it on a host it
        has not configured yet); nothing at all when no host's differ (a repetition right
        after its twin). The record says which hosts and tags ran, or which trial's
        configuration was kept."""
        overlay = write_host_vars(trial_dir / "ansible" / "trial_vars.yml", variables)
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
        commands: dict[str, list[str]] = {}
        for h, cc in switch.items():
            script = shlex.quote(f"{self.rack.host(h).workdir}/trialbed-select-cc")
            commands.setdefault(h, []).append(f"{script} {shlex.quote(cc)}")
        for h, index in shaping.items():
            script = shlex.quote(f"{self.rack.host(h).workdir}/router/trialbed-select-shaping")
            commands.setdefault(h, []).append(f"{script} {index}")
        if commands:
            said = [f"{h} to {cc}" for h, cc in switch.items()]
            said += [f"{h}'s shaping to choice {i}" for h, i in shaping.items()]
            self.log(f"[{trial}] configure: switch {', '.join(said)}")
            self.rack.run_parallel({h: " && ".join(c) for h, c in commands.items()})
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
        args = ["--limit", ",".join(["localhost", *changed]), "--skip-tags", "input_checks"]
        if tags is not None:
            args += ["--tags", ",".join(tags)]
        self.log(
            f"[{trial}] configure: ansible-playbook configure.yml on {', '.join(changed)}"
            + (f" (tags {', '.join(tags)})" if tags is not None else "")
        )
        recap = run_playbook(
            "configure.yml",
            [*self.rack.inventory, overlay],
            trial_dir / "ansible" / "configure.log",
            tuple(args),
        )
        self.applied.update({h: variables[h] for h in changed})
        self.applied_by = trial
        done = {"overlay": overlay.name, "recap": recap, "hosts": changed, "tags": tags or "all"}
        return {**done, **switched}

    def cc_choices(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per Linux host, the congestion controls the plan's trials select there, where they
        select more than one, each with its module parameters where every trial gives it the
        same ({} where they differ): configured once (testbed_host_cc_choices and
        testbed_host_cc_choice_params), so that a trial that differs from the last only in
        them switches instead of running configure.yml."""
        if self._cc_choices is None:
            self._scan_plan()
        return self._cc_choices or {}

    def shaping_choices(self) -> dict[str, list[list[dict[str, Any]]]]:
        """Per Linux router, the link settings (linux_router_links) of the plan's trials, where
        they take more than one and every one shapes and delays the same interfaces:
        rendered once (linux_router_links_choices), so that a trial that differs from the
        last only in them (a delay, rate, buffer or queue factor) switches."""
        if self._shaping_choices is None:
            self._scan_plan()
        return self._shaping_choices or {}

    def _scan_plan(self) -> None:
        """What the plan's trials set on each host that a switch can change: congestion
        controls with their module parameters, and routers' link settings."""
        cc_found: dict[str, dict[str, list[dict[str, Any]]]] = {}
        links_found: dict[str, dict[str, list[dict[str, Any]]]] = {}
        source = str(self.plan.source)
        for t in self.plan.trials:
            if t.error:
                continue
            try:
                net = resolve_network(t.experiment, self.rack, source)
                settings = host_settings(t.experiment, net, source)
            except (SpecError, RackError):
                continue  # preflight named it; that trial fails on its own
            for node, s in settings.items():
                host = net.host_of(node)
                if s.cc and not net.runs_freebsd(host):
                    given = cc_found.setdefault(host, {}).setdefault(s.cc, [])
                    given.append(s.cc_params.get(s.cc, {}))
            for host, v in host_vars(t, net, settings).items():
                if v.get("linux_router_links") and not net.runs_freebsd(host):
                    key = json.dumps(v["linux_router_links"], sort_keys=True)
                    links_found.setdefault(host, {})[key] = v["linux_router_links"]
        self._cc_choices = {
            h: {
                cc: params[0] if all(p == params[0] for p in params) else {}
                for cc, params in sorted(choices.items())
            }
            for h, choices in cc_found.items()
            if len(choices) > 1
        }
        self._shaping_choices = {
            h: [found[k] for k in sorted(found)]
            for h, found in links_found.items()
            if len(found) > 1 and len({shaping_shape(x) for x in found.values()}) == 1
        }

    def run_on(self, commands: dict[str, str], skip: Container[str] = ()) -> None:
        """One command per host, the hosts at once, but those in `skip` (not answering)."""
        todo = {h: c for h, c in commands.items() if h not in skip}
        if todo:
            self.rack.run_parallel(todo)

    def shaping_snapshot(
        self, net: ResolvedNetwork, daemons: Daemons, tag: str, skip: Container[str] = ()
    ) -> None:
        """`tc -s` of every shaped interface and the NFQUEUE counters, per host (but those
        in `skip`)."""
        self.run_on(self.snapshot_commands(net, daemons, tag), skip)

    @staticmethod
    def snapshot_commands(net: ResolvedNetwork, daemons: Daemons, tag: str) -> dict[str, str]:
        """Per shaping host: the command that writes its snapshot into the trial directory."""
        commands = {}
        for host in sorted({e.host for e in net.egress}):
            ifaces = [e.iface for e in net.egress if e.host == host]
            if net.runs_freebsd(host):  # dummynet: the pipes' counters, after their numbers
                pipes = " ".join(f"{i}={n}" for i, n in net.dummynet_pipes(host).items())
                d = shlex.quote(daemons.remote[host])
                # qdisc rio: its IN and OUT queues' counters (analysis.ipfw_samples
                # .rio_queue_deltas), as GRED's per VQ on Linux.
                queues = "".join(
                    f"{{ echo '## queues in={q['in']} out={q['out']}'; "
                    f"ipfw queue show {q['in']} {q['out']}; }} "
                    f"> {d}/ipfw_queues_{i}_{tag}.txt 2>&1; "
                    for i, q in TrialRunner.dummynet_rio_queues(net, host).items()
                )
                commands[host] = (
                    f"{{ echo '## pipes {pipes}'; ipfw pipe show; }} > {d}/ipfw_{tag}.txt 2>&1; "
                    f"{queues}true"
                )
                continue
            show = "; ".join(
                f"echo '## {i}'; tc -s qdisc show dev {i}; tc -s class show dev {i}" for i in ifaces
            )
            d = shlex.quote(daemons.remote[host])
            # RIO's GRED counters per VQ, exact (the text form rounds sizes).
            gred = "".join(
                f"tc -s -j qdisc show dev {e.iface} > {d}/gred_{e.iface}_{tag}.json; "
                for e in net.egress
                if e.host == host and e.shaping.qdisc == "rio"
            )
            commands[host] = (
                f"{{ {show}; }} > {d}/tc_{tag}.txt; {gred}"
                f"cat /proc/net/netfilter/nfnetlink_queue > {d}/nfqueue_{tag}.txt 2>/dev/null; true"
            )
        return commands

    @staticmethod
    def dummynet_rio_queues(net: ResolvedNetwork, host: str) -> dict[str, dict[str, int]]:
        """A FreeBSD router's rio interfaces and their queue numbers, as roles/freebsd_router
        numbers them (trialbed_dummynet_rio_queues): IN base+i, OUT base+N+i, with base+i the
        link's pipe (net.dummynet_pipes) and N the number of the host's links."""
        links = [e for e in net.egress if e.host == host]
        pipes = net.dummynet_pipes(host)
        return {
            e.iface: {"in": pipes[e.iface], "out": pipes[e.iface] + len(links)}
            for e in links
            if e.shaping.qdisc == "rio"
        }

    @staticmethod
    def marking_commands(net: ResolvedNetwork, daemons: Daemons, tag: str) -> dict[str, str]:
        """Per marking host: the command that writes its rules' counters (nft -j) into the
        trial directory."""
        return {
            host: f"nft -j list table {DSCP_TABLE} > "
            f"{shlex.quote(daemons.remote[host])}/dscp_counters_{tag}.json"
            for host in sorted(net.marking)
        }

    @staticmethod
    def pacing_commands(pacing: dict[str, list[str]], daemons: Daemons, tag: str) -> dict[str, str]:
        """Per pacing host: the command that writes the root qdisc of each of its interfaces
        (`tc -s -j`: fq and its counters) into the trial directory."""
        return {
            host: "; ".join(
                f"tc -s -j qdisc show dev {i} root > "
                f"{shlex.quote(daemons.remote[host])}/pacing_{i}_{tag}.json"
                for i in ifaces
            )
            for host, ifaces in pacing.items()
        }

    @staticmethod
    def pacing_record(trial_dir: Path, pacing: dict[str, list[str]]) -> dict[str, Any]:
        """Per pacing host and interface: its root qdisc during the trial and the packets and
        bytes that went through it (after minus before): that the flows were paced by fq."""
        out: dict[str, Any] = {}
        for host, ifaces in pacing.items():
            for iface in ifaces:
                files = [trial_dir / host / f"pacing_{iface}_{t}.json" for t in ("before", "after")]
                if not all(f.exists() for f in files):
                    continue
                before, after = ((json.loads(f.read_text()) or [{}])[0] for f in files)
                out.setdefault(host, {})[iface] = {
                    "qdisc": after.get("kind"),
                    "packets": after.get("packets", 0) - before.get("packets", 0),
                    "bytes": after.get("bytes", 0) - before.get("bytes", 0),
                }
        return out

    @staticmethod
    def rio_record(
        trial_dir: Path, net: ResolvedNetwork, delay: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Per RIO egress (host:iface): its virtual queues as configured (thresholds in packets
        and in bytes, the mean packet size that converted them, w_q asked and used) and what
        each VQ counted during the trial (GRED's counters, after minus before). On a FreeBSD
        router, the dummynet approximation instead (rio_record_dummynet); `delay`: trial.json's
        delay record (the routers' delay_backend.json), which labels it."""
        out: dict[str, Any] = {}
        for e in net.egress:
            if e.shaping.qdisc != "rio":
                continue
            entry: dict[str, Any] = {
                "link": e.link,
                "direction": e.direction,
                "in_dscp": [parse_dscp(d) for d in e.shaping.rio.in_dscp],  # type: ignore[union-attr]
            }
            if high := rio_high_dscp(e.shaping.rio.settings()):  # type: ignore[union-attr]
                entry["high_dscp"] = high
            if net.runs_freebsd(e.host):
                backend = ((delay or {}).get(e.host) or {}).get("rio") or {}
                entry.update(
                    TrialRunner.rio_record_dummynet(trial_dir, net, e, backend.get(e.iface) or {})
                )
                out[f"{e.host}:{e.iface}"] = entry
                continue
            entry["virtual_queues"] = [vq.record() for vq in e.shaping.virtual_queues()]
            files = [trial_dir / e.host / f"gred_{e.iface}_{t}.json" for t in ("before", "after")]
            if all(f.exists() and f.stat().st_size for f in files):
                before, after = (gred_counters(f.read_text()) for f in files)
                entry["counters"] = {str(dp): c for dp, c in counters_delta(before, after).items()}
            else:
                entry["error"] = "no GRED counters (tc -s -j qdisc show) came back"
            out[f"{e.host}:{e.iface}"] = entry
        return out

    @staticmethod
    def rio_record_dummynet(
        trial_dir: Path, net: ResolvedNetwork, e: Egress, backend: dict[str, Any]
    ) -> dict[str, Any]:
        """A rio egress of a FreeBSD router: the approximation's label (the router's record,
        `backend`: its delay_backend.json's rio entry of the interface), the virtual queues as
        configured in packets (dummynet's queues count slots: no bytes), the IN and OUT queue
        numbers, and what each queue counted during the trial (`ipfw queue show`, after minus
        before), under "0" (IN) and "1" (OUT) as GRED's VQs are."""
        queues = TrialRunner.dummynet_rio_queues(net, e.host)[e.iface]
        vqs = e.shaping.virtual_queues()
        slots = backend.get("queue_slots") or vqs[0].limit // vqs[0].mean_packet
        entry: dict[str, Any] = {
            "approximation": backend.get("rio")
            or "approximated by two dummynet RED queues (IN, OUT) on one pipe",
            "virtual_queues": [
                {
                    "dp": vq.dp,
                    "precedence": vq.precedence,
                    "queue": queues[vq.precedence],
                    "min_packets": vq.min_packets,
                    "max_packets": vq.max_packets,
                    "pmax": vq.pmax,
                    "w_q": vq.w_q,
                    # dummynet keeps w_q as (int)(w_q * 2^16) (dummynet.c, SCALE_RED 16)
                    "w_q_effective": int(vq.w_q * 2**16) / 2**16,
                    "limit_packets": slots,
                }
                for vq in vqs
            ],
            "pipe": net.dummynet_pipes(e.host)[e.iface],
            "queues": queues,
        }
        listed = f"ipfw queue show {queues['in']} {queues['out']}"
        if backend.get("queues") not in (None, queues):
            entry["error"] = (
                f"the router's record numbers the queues {backend['queues']}, the runner "
                f"{queues}: no counters read"
            )
            return entry
        deltas = rio_queue_deltas(trial_dir / e.host, e.iface)
        if deltas is None:
            entry["error"] = f"no dummynet queue counters ({listed}) came back"
            return entry
        entry["counters"] = {"0": deltas["in"], "1": deltas["out"]}
        return entry

    @staticmethod
    def marking_record(trial_dir: Path, net: ResolvedNetwork) -> dict[str, Any]:
        """Per marking host and rule: what its counter counted during the trial (after minus
        before) and the DSCP it sets; a host whose listings did not come back says so."""
        out: dict[str, Any] = {}
        for host in sorted(net.marking):
            files = [trial_dir / host / f"dscp_counters_{t}.json" for t in ("before", "after")]
            if not all(f.exists() and f.stat().st_size for f in files):
                out[host] = {"error": "no counters (nft -j list table) came back"}
                continue
            before, after = (nft_rule_counters(f.read_text()) for f in files)
            out[host] = counter_delta(before, after)
        return out

    def delay_backends(self, net: ResolvedNetwork) -> dict[str, Any]:
        out = {}
        for host in sorted({e.host for e in net.egress if e.shaping.delay}):
            text = self.rack.run(
                host, f"cat {self.rack.host(host).workdir}/router/delay_backend.json"
            )
            out[host] = json.loads(text)
        return out

    def delayline_stats(self, daemons: Daemons, host: str, out: str | None = None) -> None:
        """The delay line's counters since the last call (SIGUSR1 writes and resets them),
        copied to `out` when given."""
        router = f"{self.rack.host(host).workdir}/router"
        stats = f"{router}/delayline.stats.json"
        daemons.signal(host, "delayline", "USR1", directory=router, wait_file=stats)
        if out:
            self.rack.run(host, f"cp {shlex.quote(stats)} {shlex.quote(out)}")

    @staticmethod
    def bottlenecks(net: ResolvedNetwork, generators: list[TrafficGenerator]) -> dict[str, list]:
        """host -> interfaces of the bottlenecks the generators cross."""
        out: dict[str, list[str]] = {}
        for g in generators:
            b = net.path_summary(g.spec.from_, g.spec.to)["bottleneck"]
            if b and b["iface"] not in out.setdefault(b["host"], []):
                out[b["host"]].append(b["iface"])
        return out

    @staticmethod
    def tcp_senders(generators: list[TrafficGenerator]) -> dict[str, list[str]]:
        """Sender host -> both addresses of each of its TCP flows whose cwnd is recorded."""
        out: dict[str, list[str]] = {}
        for g in generators:
            if g.records_cwnd and g.record().get("proto") == 6:
                addrs = out.setdefault(g.sender, [])
                addrs += [a for a in (str(g.src), str(g.dst)) if a not in addrs]
        return out

    def recorders(self, net: ResolvedNetwork, generators: list[TrafficGenerator], tag: str = ""):
        """(host, daemon, command, log line that says it records) of the measurements taken
        during the trial: every bottleneck's queue every 10 ms (`tc -s` on Linux, `ipfw pipe
        show` on a FreeBSD router, `ipfw queue show` of the two queues of a rio link there),
        and cwnd, ssthresh and srtt on every TCP sender (the tcp_probe tracepoint on Linux,
        SIFTR on FreeBSD)."""
        interval = float(self.rack.vars.get("trialbed_tc_sample_ms", 10))
        for host, ifaces in self.bottlenecks(net, generators).items():
            if net.runs_freebsd(host):
                pipes = {i: n for i, n in net.dummynet_pipes(host).items() if i in ifaces}
                # qdisc rio: its packets wait in the IN and OUT queues, sampled instead of
                # the pipe's own (empty) queue.
                rio = {i: q for i, q in self.dummynet_rio_queues(net, host).items() if i in pipes}
                command = ipfw_sampler_command(pipes, interval_ms=interval, rio_queues=rio)
                yield host, "ipfw_sampler", command, None
            else:
                yield host, "tc_sampler", tc_sampler_command(ifaces, interval_ms=interval), None
        for host, addrs in self.tcp_senders(generators).items():
            if net.runs_freebsd(host):  # SIFTR logs every flow of the host; analysis picks
                yield host, "siftr", siftr_command(), "recording siftr"
            else:
                command = tcp_probe_command(addrs, tag=tag)
                yield host, "tcp_probe", command, "recording tcp_probe"

    def recorder_names(self, net: ResolvedNetwork, generators: list[TrafficGenerator]):
        return [(host, name) for host, name, _, _ in self.recorders(net, generators)]

    # -- one trial --------------------------------------------------------------------------------

    def run(self, trial: Trial) -> dict[str, Any]:
        exp = trial.experiment
        source = str(self.plan.source)
        net = resolve_network(exp, self.rack, source)
        settings = host_settings(exp, net, source)
        hosts = sorted(set(net.nodes.values()))
        trial_dir = self.batch_dir / "trials" / trial.name
        trial_dir.mkdir(parents=True, exist_ok=True)
        remote = {
            h: f"{self.rack.host(h).workdir}/trials/{self.batch_id}/{trial.name}" for h in hosts
        }
        daemons = Daemons(self.rack, remote)
        self.pacing = {
            net.nodes[n]: sorted(net.hosts[net.nodes[n]].interfaces)
            for n, s in settings.items()
            if s.pacing
        }
        ctx = TrialContext(self.rack, net, daemons, exp.duration)
        generators: list[TrafficGenerator] = [
            GENERATOR_TYPES[spec.type](spec, name, i, ctx)
            for i, (spec, name) in enumerate(zip(exp.traffic, exp.generator_names(), strict=True))
        ]
        self.watching = None
        record: dict[str, Any] = {
            "trial": trial.name,
            "id": trial.id,
            "batch": self.batch_id,
            "status": "running",
            "experiment_file": source,
            "experiment_digest": exp.digest(),
            "family": exp.experiment,
            "overrides": trial.overrides,
            "repetition": trial.repetition,
            "parameters": trial.parameters(),
            "git": git_state(),
            # Absolute: a batch resumed from another directory finds the rack it ran on.
            "inventory": [str(Path(p).resolve()) for p in self.rack.inventory],
            "network": net.record(),
            "host_settings": {
                n: s.model_dump(mode="json", exclude_none=True) for n, s in settings.items()
            },
            "traffic": {
                g.name: {**g.record(), "path": net.path_summary(g.spec.from_, g.spec.to)}
                for g in generators
            },
            "times": {"started": now_iso()},
            "errors": [],
        }
        (trial_dir / "trial.json").write_text(dump_json(record))
        nfqueue: list[str] = []
        try:
            record["configure"] = self.configure(
                trial_dir,
                host_vars(trial, net, settings, self.cc_choices(), self.shaping_choices()),
                trial.name,
            )
            record["times"]["configured"] = now_iso()

            self.log(f"[{trial.name}] arm: captures, recorders, receivers")
            nfqueue = self.arm(trial, net, daemons, generators, remote, record)
            record["times"]["armed"] = now_iso()

            # Receivers are up (armed); senders wait on their host until T0.
            launching = time.time()
            t0 = launching + self.lead_s
            record["times"]["lead_s"] = self.lead_s
            record["times"]["t0"] = t0
            record["times"]["t0_ns"] = int(t0 * 1e9)
            self.log(
                f"[{trial.name}] run for {exp.duration / 1e9:g} s: "
                + "; ".join(
                    f"{g.name} {g.type} {g.spec.from_}->{g.spec.to} at +{g.spec.start / 1e9:g} s"
                    for g in generators
                )
            )
            must(
                per_host(
                    [(g.sender, f"launch {g.name}", lambda g=g: g.launch(t0)) for g in generators]
                )
            )
            record["times"]["launched"] = now_iso()
            launch_s = time.time() - launching
            record["times"]["launch_s"] = round(launch_s, 3)
            if launch_s > self.lead_s:
                # Flows started late: every rate over [T0, end] reads low. Said in the
                # record, and the next trial's lead is long enough.
                record["errors"].append(
                    f"the senders were launched {launch_s - self.lead_s:.2f} s after T0 (lead "
                    f"{self.lead_s:g} s); the next trial's lead is {2 * launch_s:.1f} s"
                )
            self.lead_s = max(self.lead_s, round(2 * launch_s, 1))
            end = t0 + max(g.spec.start + g.duration_ns for g in generators) / 1e9
            self.watch(net, daemons, generators, record, t0).until(end)
            senders = [p for g in generators for p in g.senders()]
            while time.time() < end + FINISH_GRACE_S and any(
                daemons.running(h, n) for h, n in senders
            ):
                time.sleep(0.25)  # iperf3 ends a few hundred ms after its schedule
            time.sleep(exp.drain / 1e9)  # queues drain, the delay line releases what it holds
            record["times"]["traffic_done"] = now_iso()
            record["status"] = "complete"
        except (Interrupted, KeyboardInterrupt) as exc:
            self.applied = {}
            record["status"] = "interrupted"
            record["errors"].append(f"interrupted ({exc or 'SIGINT'})")
            raise Interrupted(str(exc)) from None
        except WatchFailure as exc:
            self.applied = {}
            record["status"] = "failed"
            record["times"]["failed_at"] = now_iso()
            record["errors"].append(str(exc))
            raise
        except Exception as exc:
            self.applied = {}
            record["status"] = "failed"
            record["errors"].append(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.stop_and_collect(
                trial_dir, net, daemons, generators, record, nfqueue, exp.drain / 1e9
            )
        if record["status"] != "complete":
            self.applied = {}  # the next trial configures everything again
        return record

    def watch(
        self,
        net: ResolvedNetwork,
        daemons: Daemons,
        generators: list[TrafficGenerator],
        record: dict[str, Any],
        t0: float,
    ) -> TrialWatch:
        """What must keep running, and until when: captures, recorders and markers until the
        runner stops them, each generator's processes until its own schedule ends."""
        self.watching = watch = TrialWatch(daemons, t0, timeout_s=self.watch_timeout_s)
        for c in net.captures:
            watch.expect(c.host, f"{c.name}.tcpdump", f"capture {c.name}", UNTIL_STOPPED)
        for host, name in self.recorder_names(net, generators):
            watch.expect(host, name, f"recorder {name}", UNTIL_STOPPED)
        for name, m in (record.get("markers") or {}).items():
            watch.expect(m["host"], m["daemon"], f"marker {name}", UNTIL_STOPPED)
        for g in generators:
            if g.runs_to_its_end:
                until = t0 + (g.spec.start + g.duration_ns) / 1e9 - ENDS_EARLY_SLACK_S
                for host, name in g.daemon_names():
                    watch.expect(host, name, f"{g.name} ({g.type})", until)
        return watch

    def arm(
        self,
        trial: Trial,
        net: ResolvedNetwork,
        daemons: Daemons,
        generators: list[TrafficGenerator],
        remote: dict[str, str],
        record: dict[str, Any],
    ) -> list[str]:
        """Read the hosts' facts and delay backends, then start everything that records or
        receives, listening before T0: per host its captures, then its recorders, then its
        receivers, the hosts at once. Returns the hosts whose delay line runs in user space."""
        exp = trial.experiment
        hosts = sorted(remote)
        delayed = sorted({e.host for e in net.egress if e.shaping.delay})
        spent = record["arm_phases_s"] = {}  # where arming's time goes (it is overhead)
        mark = time.monotonic()

        def lap(phase: str) -> None:
            nonlocal mark
            now = time.monotonic()
            spent[phase] = round(now - mark, 2)
            mark = now

        record["hosts"] = host_facts(
            self.rack,
            hosts,
            before=lambda h: f"mkdir -p {shlex.quote(remote[h])}",
            static=self.static_facts,
        )
        record["delay"] = self.delay_backends(net) if delayed else {}
        if (vm := vm_record(self.rack)) is not None:
            record["vm"] = vm  # the VM rack: its VM, calibration, clock offset now
            clock = vm["clock_at_trial"]
            if not clock.get("converged", False):
                # Captures are all in the VM (OWD is unaffected); T0 and start times are the
                # controller's, so the offset shifts when the senders start, by that much.
                self.log(f"[{trial.name}] warning: the VM's clock is off the controller's: {clock}")
        nfqueue = [h for h in delayed if record["delay"][h]["backend"] == "nfqueue"]
        lap("facts")  # hosts' facts, delay backends, the VM's clock
        must(per_host([(g.sender, f"prepare {g.name}", g.prepare) for g in generators]))
        lap("prepare")
        markers = adaptive_marking.marker_sites(exp, net, str(self.plan.source))
        record["markers"] = {m.name: m.record() for m in markers}

        steps: list[Step] = [
            (host, f"snapshot shaping on {host}", lambda h=host, c=command: self.rack.run(h, c))
            for host, command in self.snapshot_commands(net, daemons, "before").items()
        ]
        steps += [
            (
                host,
                f"read marking counters on {host}",
                lambda h=host, c=command: self.rack.run(h, c),
            )
            for host, command in self.marking_commands(net, daemons, "before").items()
        ]
        steps += [
            (host, f"read pacing qdisc on {host}", lambda h=host, c=command: self.rack.run(h, c))
            for host, command in self.pacing_commands(self.pacing, daemons, "before").items()
        ]
        steps += [
            # Resets the delay line's counters for this trial.
            (
                host,
                f"reset delay line stats on {host}",
                lambda h=host: self.delayline_stats(daemons, h),
            )
            for host in nfqueue
        ]
        steps += [
            (
                m.host,
                f"start marker {m.name} on {m.host}",
                lambda m=m: adaptive_marking.start(self.rack, daemons, m),
            )
            for m in markers
        ]
        for c in net.captures:
            command = (
                # Immediate mode: without it libpcap hands packets over a ring block at a
                # time (up to 1 s late), and SIGINT discards the block still being filled.
                f"tcpdump -i {c.iface} -n -s {exp.capture.snaplen} -B 16384 --immediate-mode "
                f"--time-stamp-precision=nano -Z root -w {c.name}.pcap ip"
            )
            steps.append(
                (
                    c.host,
                    f"start capture {c.name}",
                    lambda c=c, cmd=command: daemons.spawn(
                        c.host, f"{c.name}.tcpdump", cmd, ready="listening on"
                    ),
                )
            )
        for host, name, command, ready in self.recorders(net, generators, tag=trial.name):
            steps.append(
                (
                    host,
                    f"start {name} on {host}",
                    lambda h=host, n=name, cmd=command, r=ready: daemons.spawn(h, n, cmd, ready=r),
                )
            )
        must(per_host(steps))
        lap("start")  # snapshots, markers, captures, recorders
        must(per_host([(g.receiver, f"arm {g.name}", g.arm) for g in generators]))
        lap("receivers")
        return nfqueue

    def stop_and_collect(
        self,
        trial_dir: Path,
        net: ResolvedNetwork,
        daemons: Daemons,
        generators: list[TrafficGenerator],
        record: dict[str, Any],
        nfqueue: list[str],
        drain_s: float,
    ) -> None:
        """Stop everything of the trial, bring the files back, write trial.json and the manifest.
        Runs on every exit path; each step is attempted even when an earlier one fails. A trial
        stopped mid-traffic (interrupted, failed) lets its queues drain for `drain_s` between
        stopping the traffic and stopping the captures, as a complete one did before its stop:
        a 60 000-byte queue at 1 Mbit/s still delivers for 0.5 s, and a capture stopped meanwhile
        misses the packet arriving as it stops."""
        with ignore_signals():
            # A host the watch saw stop answering is left alone (each step would wait for
            # its SSH timeout): what runs there and its files stay until it answers again.
            gone = self.watching.unreachable if self.watching else {}
            if self.watching:
                record["watch"] = self.watching.summary()
            for host, seen in gone.items():
                record["errors"].append(
                    f"{host} not stopped nor collected: it {seen}; its processes and files stay "
                    f"on it ({daemons.remote[host]}) until teardown.yml, once it answers"
                )
            # Traffic first (every host at once), then what recorded it: a capture stops only
            # after every sender and receiver has.
            # One call per host and stage stops all of that host's daemons of the stage.
            traffic: dict[str, list[str]] = {}
            for g in generators:
                for host, name in g.daemon_names():
                    traffic.setdefault(host, []).append(name)
            recording: dict[str, list[str]] = {}
            for host, name in self.recorder_names(net, generators):
                recording.setdefault(host, []).append(name)
            # tcpdump writes out what it has read on SIGINT; stop lets it catch up first (drain)
            captures: dict[str, list[str]] = {}
            for c in net.captures:
                recording.setdefault(c.host, []).append(f"{c.name}.tcpdump:INT")
                captures.setdefault(c.host, []).append(f"{c.name}.tcpdump")
            for m in (record.get("markers") or {}).values():  # TERM: stats, rules removed
                recording.setdefault(m["host"], []).append(m["daemon"])
            stages = [
                [
                    (
                        h,
                        f"stop {', '.join(names)} on {h}",
                        lambda h=h, n=names, d=drain: daemons.stop_all(h, n, drain=d.get(h, [])),
                    )
                    for h, names in stage.items()
                    if h not in gone
                ]
                for stage, drain in ((traffic, {}), (recording, captures))
            ]
            # One after the other (the snapshot itself reaches every host at once).
            counters: list[Step] = [
                (
                    "",
                    "snapshot shaping",
                    lambda: self.shaping_snapshot(net, daemons, "after", skip=gone),
                )
            ]
            if net.marking:
                marking = self.marking_commands(net, daemons, "after")
                counters.append(("", "read marking counters", lambda: self.run_on(marking, gone)))
            if self.pacing:
                pacing = self.pacing_commands(self.pacing, daemons, "after")
                counters.append(("", "read pacing qdiscs", lambda: self.run_on(pacing, gone)))
            if "t0" in record["times"]:
                counters += [
                    (
                        "",
                        f"delay line stats {host}",
                        lambda h=host: self.delayline_stats(
                            daemons, h, f"{daemons.remote[h]}/delayline_stats.json"
                        ),
                    )
                    for host in nfqueue
                    if host not in gone
                ]
            traffic_stage, recording_stage = stages
            record["errors"].extend(per_host(traffic_stage))
            if record.get("status") != "complete" and "t0" in record["times"]:
                time.sleep(drain_s)
            for steps in (recording_stage, counters):
                record["errors"].extend(per_host(steps))
            record["times"]["stopped"] = now_iso()

            def pull(host: str) -> None:
                try:
                    record["files"][host] = pull_host(
                        self.rack, host, daemons.remote[host], trial_dir / host
                    )
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    raise CollectError(
                        f"the results disk is full ({shutil.disk_usage(trial_dir).free} bytes "
                        f"free in {trial_dir}): {host} keeps its copies in "
                        f"{daemons.remote[host]}"
                    ) from None

            record["files"] = {}
            failed = per_host(
                [(h, f"collect {h}", lambda h=h: pull(h)) for h in daemons.remote if h not in gone]
            )
            record["errors"].extend(failed)
            if (failed or gone) and record["status"] == "complete":
                record["status"] = "failed"
            adaptive_marking.collect(trial_dir, record)
            for host in nfqueue:
                stats = trial_dir / host / "delayline_stats.json"
                if stats.exists() and host in record.get("delay", {}):
                    record["delay"][host]["delayline_stats"] = json.loads(stats.read_text())
            if record["status"] in ("complete", "failed") and "t0" in record["times"]:
                # The tools' own words (a refused connection, an empty report): the cause when
                # the trial completed, what a failure did to them otherwise.
                for g in generators:
                    record["errors"].extend(g.problems(trial_dir))
                if record["errors"]:
                    record["status"] = "failed"
            record["capture"] = capture_stats(trial_dir, net)
            cut_short = truncated_captures(record["capture"], net)
            if cut_short:
                record["errors"].extend(cut_short)
                if record["status"] != "interrupted":  # the user's stop stays the cause
                    record["status"] = "failed"
            if net.marking:
                record["marking"] = self.marking_record(trial_dir, net)
            if self.pacing:
                record["pacing"] = self.pacing_record(trial_dir, self.pacing)
            if any(e.shaping.qdisc == "rio" for e in net.egress):
                record["rio"] = self.rio_record(trial_dir, net, record.get("delay"))
            record["times"]["collected"] = now_iso()
            record["overhead_s"] = overhead_s(record["times"])
            record["overhead_phases_s"] = overhead_phases(record["times"])
            try:
                # Whole or not at all: a full disk must not leave half a record behind.
                write_whole(trial_dir / "trial.json", dump_json(record))
                write_manifest(trial_dir)
            except OSError as exc:
                raise CollectError(
                    "; ".join([f"cannot write {trial_dir}/trial.json ({exc})", *record["errors"]])
                ) from None


# Where the overhead goes: (phase, from, to) over the times a trial records.
OVERHEAD_PHASES = (
    ("configure", "started", "configured"),
    ("arm", "configured", "armed"),
    ("lead", "armed", "t0"),
    ("stop", "traffic_done", "stopped"),
    ("collect", "stopped", "collected"),
)


def _epoch(value: Any) -> float:
    return (
        float(value)
        if isinstance(value, int | float)
        else datetime.fromisoformat(value).timestamp()
    )


def overhead_phases(times: dict[str, Any]) -> dict[str, float]:
    """Seconds per phase of the overhead, for the phases the trial went through."""
    return {
        phase: round(_epoch(times[b]) - _epoch(times[a]), 2)
        for phase, a, b in OVERHEAD_PHASES
        if a in times and b in times
    }


def overhead_s(times: dict[str, Any]) -> float | None:
    """Seconds the trial spent outside its traffic and queue drain: configure, arm, start
    lead, stop, collect (what a batch pays per trial beyond the experiment itself)."""
    if "t0" not in times or "traffic_done" not in times:
        return None
    whole = datetime.fromisoformat(times["collected"]) - datetime.fromisoformat(times["started"])
    traffic = datetime.fromisoformat(times["traffic_done"]).timestamp() - times["t0"]
    return round(whole.total_seconds() - traffic, 2)


def capture_stats(trial_dir: Path, net: ResolvedNetwork) -> dict[str, dict[str, int]]:
    """tcpdump's own counters (captured, received by filter, dropped by kernel) per capture
    point, and the packets its file holds (`in_file`)."""
    out = {}
    for c in net.captures:
        log = trial_dir / c.host / f"{c.name}.tcpdump.log"
        counts = {}
        if log.exists():
            for line in log.read_text().splitlines():
                words = line.split()
                if len(words) >= 3 and words[0].isdigit():
                    counts[" ".join(words[2:]).replace(" ", "_")] = int(words[0])
        pcap = trial_dir / c.host / f"{c.name}.pcap"
        if pcap.exists():
            counts["in_file"] = pcap_packets(pcap)
        out[c.name] = counts
    return out


def truncated_captures(stats: dict[str, dict[str, int]], net: ResolvedNetwork) -> list[str]:
    """Capture points whose file holds fewer packets than tcpdump captured (a full disk), or
    that captured fewer than the kernel passed their filter and did not drop (packets still in
    the ring when tcpdump stopped)."""
    out = []
    for c in net.captures:
        counts = stats.get(c.name, {})
        if "captured" in counts and counts.get("in_file", 0) < counts["captured"]:
            out.append(
                f"capture {c.name} on {c.host}: its file holds {counts.get('in_file', 0)} of "
                f"the {counts['captured']} packets tcpdump captured (was its disk full?)"
            )
        # On lo the kernel passes each packet twice (out and in) and libpcap drops one copy.
        handed = counts.get("received_by_filter", 0) - counts.get("dropped_by_kernel", 0)
        if c.iface != "lo" and "captured" in counts and counts["captured"] < handed:
            out.append(
                f"capture {c.name} on {c.host}: tcpdump captured {counts['captured']} of the "
                f"{handed} packets its filter passed and the kernel kept (stopped before it "
                f"had read them all)"
            )
    return out


def new_batch_path(results: Path, exp_path: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return results / f"{stamp}-{exp_path.stem}"


def new_batch_dir(results: Path, exp_path: Path) -> Path:
    path = new_batch_path(results, exp_path)
    path.mkdir(parents=True, exist_ok=False)
    return path


def restore(runner: TrialRunner, rack: Rack, log_stem: Path, log: Callable[[str], None]) -> None:
    """Take the last trial's shaping and delay line off the rack (teardown.yml), on the hosts
    this runner's trials named (and the controller): on a rack of 18 hosts where the trials
    used 6, the other 12 were not touched and their teardown would take most of the time. A
    rack a killed runner left is restored by teardown.yml by hand, on every host."""
    if runner.last_vars is None:
        log("restore: no trial configured a host; nothing to give back")
        return
    hosts = sorted(runner.last_vars)
    log(f"restore the network (ansible-playbook teardown.yml on {', '.join(hosts)})")
    variables = {
        h: {k: v for k, v in hv.items() if k.startswith("linux_router")}
        for h, hv in runner.last_vars.items()
    }
    try:
        overlay = write_host_vars(log_stem.with_name(log_stem.name + "_vars.yml"), variables)
    except OSError as exc:  # the results disk is full: the rack is restored all the same
        log_stem = Path(tempfile.mkdtemp(prefix="trialbed-restore-")) / log_stem.name
        log(f"restore: cannot write under the results ({exc}); its files go to {log_stem.parent}")
        overlay = write_host_vars(log_stem.with_name(log_stem.name + "_vars.yml"), variables)
    recap = run_playbook(
        "teardown.yml",
        [*rack.inventory, overlay],
        log_stem.with_suffix(".log"),
        ("--limit", ",".join(["localhost", *hosts])),
        unreachable_ok=True,
    )
    for host in sorted(h for h, r in recap.items() if r["unreachable"]):
        log(
            f"restore: {host} did not answer; it stays as the trial left it (shaping, settings, "
            f"processes): run teardown.yml (make teardown) once it answers"
        )


def failed_record(batch_dir: Path, trial: Trial, exc: Exception) -> dict[str, Any]:
    """The failed trial's record as written, or (when the final one could not be written, and
    the one on disk still says it runs) its cause."""
    try:
        record = json.loads((batch_dir / "trials" / trial.name / "trial.json").read_text())
    except (OSError, ValueError):
        record = {}
    if record.get("status") == "failed" and record.get("errors"):
        return record
    return {"trial": trial.name, "status": "failed", "errors": [str(exc)]}


def run_plan(
    plan: Plan,
    trials: list[Trial],
    rack: Rack,
    results: Path,
    log: Callable[[str], None] = print,
    keep_network: bool = False,
) -> tuple[Path, list[dict[str, Any]]]:
    """Check the selected trials against the rack (read-only), then run them; return the
    batch dir and the trial records. The network is restored on every exit path, except with
    `keep_network` after every trial completed: the last one's configuration then stays on
    the rack, to be looked at or run by hand (teardown.yml removes it)."""
    from trials.batch import RackLock

    # What does not change (kernel, modules, tools) as preflight reads it: the first trial
    # reads only the rest (measured on the VM rack: 6 s instead of 26 s for five hosts).
    static: dict[str, dict[str, Any]] = {}
    checked = preflight(trials, rack, str(plan.source), results, static, plan.trials)
    for line in available(checked):
        log(f"preflight: {line}")
    batch_dir = new_batch_dir(results, plan.source)
    (batch_dir / "experiment.yml").write_text(plan.source.read_text())
    runner = TrialRunner(plan, rack, batch_dir, log=log)
    runner.static_facts = static
    records = []
    finished = False
    with RackLock.for_rack(rack, batch_dir.name, "trial", warn=log):
        try:
            with interruptible():
                for trial in trials:
                    try:
                        records.append(runner.run(trial))
                    except Interrupted:
                        raise
                    except Exception as exc:  # recorded in its trial.json; the others go on
                        log(f"[{trial.name}] failed: {exc}")
                        records.append(failed_record(batch_dir, trial, exc))
            finished = all(r.get("status") == "complete" for r in records)
        finally:
            if keep_network and finished and records:
                log(
                    f"the last trial's configuration stays on the rack (keep network): its "
                    f"variables are {batch_dir / 'trials' / records[-1]['trial']}/ansible/"
                    f"trial_vars.yml; teardown.yml (make teardown) removes it"
                )
            else:
                with ignore_signals():
                    restore(runner, rack, batch_dir / "ansible" / "teardown", log)
    return batch_dir, records
