"""Congestion control as the trials ask it of each host, and where they ask it: the host's own
(hosts.*.cc) across a plan, the key a node's choice or module parameters come from, and the
FreeBSD senders whose TCP cwnd SIFTR records."""

from __future__ import annotations

from core.rack import Rack, RackError
from trials.generators import GENERATOR_TYPES
from trials.generators.base import TrialContext
from trials.network import ResolvedNetwork, host_settings, resolve_network
from trials.plan import Trial
from trials.preflight.facts import runs_freebsd
from trials.spec import Experiment, SpecError


def siftr_senders(exp: Experiment, net: ResolvedNetwork, rack: Rack) -> dict[str, str]:
    """FreeBSD sender host -> the generator whose TCP cwnd SIFTR records there (the runner's
    recorders: TrialRunner.tcp_senders)."""
    if not any(runs_freebsd(rack, net.host_of(spec.from_)) for spec in exp.traffic):
        return {}
    ctx = TrialContext(rack=rack, network=net, daemons=None, duration_ns=exp.duration)  # type: ignore[arg-type]
    out: dict[str, str] = {}
    names = exp.generator_names()
    for i, (spec, name) in enumerate(zip(exp.traffic, names, strict=True)):
        if not runs_freebsd(rack, net.host_of(spec.from_)):
            continue
        g = GENERATOR_TYPES[spec.type](spec, name, i, ctx)
        if g.records_cwnd and g.record().get("proto") == 6:
            out.setdefault(g.sender, f"traffic[{i}] ({spec.type})")
    return out


def own_ccs(trials: list[Trial], rack: Rack, source: str) -> dict[str, set[str]]:
    """Per node, the congestion controls the trials select as its host's own (hosts.*.cc)."""
    out: dict[str, set[str]] = {}
    for t in trials:
        if t.error or t.experiment is None:
            continue
        try:
            net = resolve_network(t.experiment, rack, source)
            settings = host_settings(t.experiment, net, source)
        except (SpecError, RackError):
            continue  # that trial's own problem, named where it is checked
        for node, s in settings.items():
            if s.cc:
                out.setdefault(node, set()).add(s.cc)
    return out


def params_layer(exp: Experiment, node: str, cc: str) -> str:
    """The hosts layer that gives `node` its cc_params of `cc`: the node's own, else a group
    (senders, receivers, an inventory group), else all."""
    layers = [layer for layer, s in exp.hosts.items() if cc in s.cc_params]
    for layer in (node, *(x for x in layers if x not in (node, "all")), "all"):
        if layer in layers:
            return layer
    return "all"


def cc_key(trial: Trial, exp: Experiment, node: str, field: str = "cc") -> str:
    """The key a node's congestion control (or another of its host settings: `field`, e.g.
    cc_implementation) came from (a factor, or the hosts block)."""
    for key in trial.overrides:
        if key.startswith("hosts.") and key.endswith(f".{field}"):
            return f"factors.{key}"
    for layer in (node, "senders", "receivers", "all"):
        if layer in exp.hosts and getattr(exp.hosts[layer], field) is not None:
            return f"hosts.{layer}.{field}"
    return f"hosts.{field}"


def layer_of(trials: list[Trial], cc: str, param: str) -> str:
    """The hosts layer that gives module parameter `param` of `cc`, in the first trial that
    gives it (all when none does)."""
    for trial in trials:
        for layer, s in trial.experiment.hosts.items():
            if param in s.cc_params.get(cc, {}):
                return layer
    return "all"
