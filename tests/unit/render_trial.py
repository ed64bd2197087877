"""Every command one trial sends to its hosts, rendered without a rack: the virtual rack's hosts
from inventory/virtual/topologies/ (no SSH), a rack that records what it is asked to run, and
the runner's own functions for each phase (facts, arm, launch, snapshots, stop, collect,
leftovers, switches). And a reading of a command as sh reads it: which characters it takes as
themselves (quoted, escaped or harmless) and which it acts on."""

from __future__ import annotations

import functools
import ipaddress
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from collect.fetch import pull_host
from core.command import Command, command
from core.daemons import Daemons
from core.layout import remote_trial_dir
from core.rack import Host, Rack
from trials import adaptive_marking
from trials import host_commands as hc
from trials.batch_worker import stop_leftovers
from trials.configure import switch_commands
from trials.generators import GENERATOR_TYPES
from trials.generators.base import TrialContext
from trials.network import host_cc, host_settings, resolve_network
from trials.plan import Trial
from trials.preflight import host_facts

PROJECT = Path(__file__).resolve().parents[2]
TOPOLOGIES = PROJECT / "inventory/virtual/topologies"
# What sh takes as itself outside quotes (shlex.quote leaves such words bare).
SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


class RecordingRack(Rack):
    """A rack whose hosts answer nothing: every command it is given is kept (and must be a
    built one), and answers are empty JSON where the caller parses them."""

    def __init__(self, hosts: dict[str, Host]):
        super().__init__([], hosts, {})
        self.sent: list[tuple[str, Command]] = []

    def run(self, name: str, command: Command, *, check: bool = True, timeout=None) -> str:
        assert isinstance(command, Command), f"not built by core.command: {command!r}"
        self.host(name)
        self.sent.append((name, command))
        return "{}" if "python3" in command else ""

    def put(self, name: str, local: Path, remote: str) -> None:
        self.host(name)


class RecordingDaemons(Daemons):
    """Daemons whose programs are kept as given (the helper's command wraps each in a word)."""

    def __init__(self, rack: Rack, remote: dict[str, str]):
        super().__init__(rack, remote)
        self.programs: list[tuple[str, Command]] = []

    def spawn(self, host: str, name: str, program: Command, *args: Any, **kwargs: Any) -> None:
        assert isinstance(program, Command), f"not built by core.command: {program!r}"
        self.programs.append((host, program))
        super().spawn(host, name, program, *args, **kwargs)


def topology_hosts(
    topology: str,
    workdir: Callable[[str], str] = lambda name: "/var/lib/trialbed",
    iface: str = "",
    host_vars: dict[str, Any] | None = None,
) -> dict[str, Host]:
    """The hosts of a virtual topology: each host's trialbed_dir `workdir(name)`, each interface
    name prefixed with `iface`, every host given `host_vars`."""
    data = yaml.safe_load((TOPOLOGIES / f"{topology}.yml").read_text())
    return {
        name: Host(
            name=name,
            address=h["mgmt"],
            user="root",
            groups=tuple(h["groups"]),
            workdir=workdir(name),
            interfaces={
                f"{iface}{k}": ipaddress.IPv4Interface(v) for k, v in h["interfaces"].items()
            },
            vars=dict(host_vars or {}),
        )
        for name, h in data["hosts"].items()
    }


def topology_rack(topology: str, workdir: str = "/var/lib/trialbed", iface: str = "") -> Rack:
    """The virtual rack of a topology, every host's trialbed_dir `workdir`; with `iface`, each
    interface name is prefixed with it."""
    return RecordingRack(topology_hosts(topology, lambda name: workdir, iface))


def trial_commands(
    trial: Trial,
    rack: RecordingRack,
    source: str,
    batch: str = "b",
    name: str | None = None,
    switch_cc: str | None = None,
) -> list[Command]:
    """Every command the trial's phases send (the helper's own and the programs it starts);
    `batch` and `name` make the trial's remote directories; `switch_cc`: the congestion
    control a switch selects on every host (default: the hosts' own, where they set one)."""
    exp, name = trial.experiment, name or trial.name
    net = resolve_network(exp, rack, source)
    settings = host_settings(exp, net, source)
    hosts = sorted(set(net.nodes.values()))
    remote = {h: remote_trial_dir(rack.host(h).workdir, batch, name) for h in hosts}
    daemons = RecordingDaemons(rack, remote)
    host_facts(rack, hosts, before=lambda h: command("mkdir", "-p", remote[h]))
    ctx = TrialContext(rack, net, daemons, exp.duration, host_cc(settings))
    generators = [
        GENERATOR_TYPES[spec.type](spec, label, i, ctx)
        for i, (spec, label) in enumerate(zip(exp.traffic, exp.generator_names(), strict=True))
    ]
    for g in generators:
        if g.type == "cbr_udp":  # what prepare() reads from the sender's route
            g.iface = next(iter(net.hosts[g.sender].interfaces))  # type: ignore[attr-defined]
    pacing = {
        net.nodes[n]: sorted(net.hosts[net.nodes[n]].interfaces)
        for n, s in settings.items()
        if s.pacing
    }
    record: dict[str, Any] = {"markers": {}}
    for tag in ("before", "after"):
        rack.run_parallel(hc.snapshot_commands(net, daemons, tag))
        rack.run_parallel(hc.marking_commands(net, daemons, tag))
        rack.run_parallel(hc.pacing_commands(pacing, daemons, tag))
    for site in adaptive_marking.marker_sites(exp, net, source):
        adaptive_marking.start(rack, daemons, site)
        record["markers"][site.name] = site.record()
    for c in net.captures:
        daemons.spawn(c.host, f"{c.name}.tcpdump", hc.capture_command(c, exp.capture.snaplen))
    for host, daemon, program, ready in hc.recorders(net, generators, tag=name):
        daemons.spawn(host, daemon, program, ready=ready)
    for g in generators:
        g.arm()
        g.launch(1.0e9)
    for stage in hc.stop_stages(net, generators, record):
        for host, names in stage.items():
            daemons.stop_all(host, names)
    for host in hosts:
        pull_host(rack, host, remote[host], Path("/nonexistent"))
    stop_leftovers(rack, batch, name)
    ccs = {net.host_of(n): s.cc for n, s in settings.items() if s.cc}
    if switch_cc is not None:
        ccs = dict.fromkeys(hosts, switch_cc)
    rack.run_parallel(switch_commands(rack, ccs, {h: 0 for h in net.routers}))
    programs = [p for _, p in daemons.programs]
    return [*(c for _, c in rack.sent), *programs]


_TOKEN = re.compile(r"""'([^']*)'?|"((?:[^"\\]|\\.)*)"?|\\(.)|([^'"\\]+)|\\$""", re.S)


@functools.lru_cache(maxsize=1024)
def shell_reading(cmd: str) -> tuple[str, bytes]:
    """The characters sh keeps of `cmd` (quotes dropped), and for each whether sh takes it as
    itself (1): in single quotes, escaped, in double quotes but for $ ` \\ (even escaped
    ones: a reading that errs towards 'acted on'), or harmless (SAFE) outside quotes."""
    chars: list[str] = []
    literal = bytearray()
    for single, double, escaped, bare in _TOKEN.findall(cmd):
        if single or escaped:
            chars.append(single or escaped)
            literal += b"\x01" * len(single or escaped)
        elif double:
            text = re.sub(r'\\([$`"\\\n])', r"\1", double)  # what the escapes leave
            chars.append(text)
            literal += bytes(c not in "$`\\" for c in text)
        elif bare:
            chars.append(bare)
            literal += bytes(c in SAFE for c in bare)
    return "".join(chars), bytes(literal)


def _bare(text: str) -> str:
    return text.replace("'", "").replace('"', "").replace("\\", "")


def unquoted(cmd: str, text: str) -> list[str]:
    """Where `text` appears in `cmd` with a character sh would act on (the text around it)."""
    if _bare(text) not in _bare(cmd):  # sh drops only quotes and backslashes: not in it
        return []
    chars, literal = shell_reading(cmd)
    found, start = [], chars.find(text)
    while text and start >= 0:
        if not all(literal[start : start + len(text)]):
            found.append(chars[max(0, start - 30) : start + len(text) + 30])
        start = chars.find(text, start + 1)
    return found


def appears(cmd: str, text: str) -> bool:
    return _bare(text) in _bare(cmd) and text in shell_reading(cmd)[0]


def dumps(commands: list[Command]) -> str:
    return json.dumps([str(c) for c in commands], indent=1)[:3000]
