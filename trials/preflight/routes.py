"""The routes an experiment's traffic needs on every host of its path (data one way, ACKs or
replies the other), and what is wrong with the route a host's kernel picks instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trials.network import ResolvedNetwork


@dataclass(frozen=True)
class Route:
    """The route a host needs to an address for the experiment's traffic: out of its
    experiment interface ``dev``, through ``gateway`` (``via``, a rack host) or, with
    gateway None, straight to the address on that interface's subnet."""

    address: str
    dev: str
    gateway: str | None
    via: str | None
    why: str


def expected_routes(
    net: ResolvedNetwork, endpoints: tuple[str, str], why: str
) -> list[tuple[str, Route]]:
    """The routes every host on the rack's path between two ends takes to the far end, both
    ways (data one way, ACKs or replies the other): each hop (ResolvedNetwork.path) leaves
    through its interface towards the next host's address on that interface's subnet, the
    last straight to the far end. Routers included: on a lab rack with two routers the first
    needs a route to the far segment via the second, which no role sets."""
    out = []
    if net.host_of(endpoints[0]) == net.host_of(endpoints[1]):
        return out  # both ends on one host: no route between them to check
    for here, there in (endpoints, endpoints[::-1]):
        hops = net.path(here, there)
        address = str(net.address_of(there))
        for (host, dev), following in zip(hops, [*hops[1:], None], strict=True):
            gateway = via = None
            if following is not None:
                via = following[0]
                subnet = net.hosts[host].interfaces[dev].network
                gateway = next(
                    str(i.ip) for i in net.hosts[via].interfaces.values() if i.network == subnet
                )
            out.append((host, Route(address, dev, gateway, via, f"{there}, {why}")))
    return out


def route_problems(host: str, need: Route, found: dict[str, Any] | None) -> list[str]:
    """What is wrong with the route host's kernel picks to need.address (facts' route_to;
    None where the host has no command to ask)."""
    if found is None:
        return []
    got = found.get(need.address)
    hop = f"via {need.via} ({need.gateway}) " if need.gateway else ""
    fix = f"the host's own network configuration needs a route to {need.address} {hop}on {need.dev}"
    if got is None:
        return [f"host {host} has no route to {need.address} ({need.why}): {fix}"]
    if got.get("dev") != need.dev:
        return [
            f"host {host}'s route to {need.address} ({need.why}) leaves through "
            f"{got.get('dev')}, not its experiment interface {need.dev}: the traffic would "
            f"bypass the rack's links; {fix}"
        ]
    if got.get("gateway") != need.gateway:
        went = f"via {got['gateway']}" if got.get("gateway") else "straight to it"
        return [
            f"host {host}'s route to {need.address} ({need.why}) goes {went} on {need.dev}, "
            f"not {hop.strip() or 'straight to it'}: the traffic would miss the rack's path; "
            f"{fix}"
        ]
    return []
