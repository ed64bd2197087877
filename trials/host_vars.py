"""The trial's variables for every host (the roles' inputs), and which changes between two
trials a host's own switch script makes instead of configure.yml."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from core.link_rules import MTU
from core.rack import Rack, RackError
from core.units import format_duration, format_rate
from trials.network import ResolvedNetwork, host_settings, resolve_network
from trials.plan import Plan, Trial
from trials.spec import HostSettings, SpecError

# Kernel defaults of the TCP buffer limits: a trial that sets none gets these back.
TCP_RMEM = (4096, 131072, 6291456)
TCP_WMEM = (4096, 16384, 4194304)


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
                iface: net.mtu.get((host, iface), MTU) for iface in net.hosts[host].interfaces
            },
            "testbed_host_route_metrics": {
                **({"initcwnd": s.initcwnd} if s.initcwnd else {}),
                **({"rto_min": format_duration(s.rto_min)} if s.rto_min else {}),
            },
            "trialbed_flow_cc": sorted(set(flow_cc.get(host, []))),
            # Only when asked: the role's default is auto.
            **(
                {"testbed_host_cc_implementation": s.cc_implementation}
                if s.cc_implementation
                else {}
            ),
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
            # Only when asked (network.links[].rio.implementation): the role's default is auto.
            if asked := net.rio_implementation.get(host):
                v["linux_router_rio_implementation"] = asked[0]
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
    same choices (linux_router_links_choices) with the same RIO implementation (the choices
    are rendered for one)."""
    if applied is None or "linux_router_links" not in wanted:
        return False
    choices = wanted.get("linux_router_links_choices", [])
    impl = "linux_router_rio_implementation"
    return (
        applied.get("linux_router_links") != wanted["linux_router_links"]
        and applied.get(impl) == wanted.get(impl)
        and wanted["linux_router_links"] in choices
        and applied.get("linux_router_links_choices") == choices
    )


def shaping_shape(links: list[dict[str, Any]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The interfaces a link list shapes and those it delays: a switch keeps both (the role
    refuses choices that differ in them)."""
    delayed = tuple(x["iface"] for x in links if (x.get("delay_ms") or 0) > 0)
    return tuple(x["iface"] for x in links), delayed


@dataclass
class SwitchChoices:
    """What the plan's trials set on each host that a switch can change. `cc`: per Linux host,
    the congestion controls the trials select there, where they select more than one, each
    with its module parameters where every trial gives it the same ({} where they differ).
    `shaping`: per Linux router, the link settings (linux_router_links) of the trials, where
    they take more than one and every one shapes and delays the same interfaces. Both are
    configured once, so that a trial that differs from the last only in them switches."""

    cc: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    shaping: dict[str, list[list[dict[str, Any]]]] = field(default_factory=dict)


def switch_choices(plan: Plan, rack: Rack) -> SwitchChoices:
    """Scan the plan's trials for the choices a switch can make (SwitchChoices)."""
    cc_found: dict[str, dict[str, list[dict[str, Any]]]] = {}
    links_found: dict[str, dict[str, list[dict[str, Any]]]] = {}
    source = str(plan.source)
    for t in plan.trials:
        if t.error:
            continue
        try:
            net = resolve_network(t.experiment, rack, source)
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
    return SwitchChoices(
        cc={
            h: {
                cc: params[0] if all(p == params[0] for p in params) else {}
                for cc, params in sorted(choices.items())
            }
            for h, choices in cc_found.items()
            if len(choices) > 1
        },
        shaping={
            h: [found[k] for k in sorted(found)]
            for h, found in links_found.items()
            if len(found) > 1 and len({shaping_shape(x) for x in found.values()}) == 1
        },
    )
