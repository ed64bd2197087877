"""The parts the hosts of a collateral-damage trial play, resolved against the inventory."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from trials.rack import Rack, RackError
from trials.spec import Experiment


@dataclass(frozen=True)
class Dumbbell:
    router: str
    tcp_sender: str
    tcp_receiver: str
    udp_sender: str
    udp_receiver: str
    addresses: dict[str, ipaddress.IPv4Address]
    # Router interfaces: `ingress` faces the senders, `egress` the receivers.
    ingress: str
    egress: str

    @property
    def end_hosts(self) -> tuple[str, ...]:
        return (self.tcp_sender, self.tcp_receiver, self.udp_sender, self.udp_receiver)


def resolve_dumbbell(exp: Experiment, rack: Rack, source: str) -> Dumbbell:
    roles = exp.hosts
    addresses = {}
    for role in ("tcp_sender", "tcp_receiver", "udp_sender", "udp_receiver"):
        name = getattr(roles, role)
        try:
            addresses[name] = rack.host(name).experiment_address()
        except RackError as exc:
            raise RackError(f"{source}: key 'hosts.{role}': {exc}") from None
    try:
        router = rack.host(roles.router)
    except RackError as exc:
        raise RackError(f"{source}: key 'hosts.router': {exc}") from None
    if "linux_routers" not in router.groups:
        raise RackError(
            f"{source}: key 'hosts.router': {roles.router} is not in group linux_routers"
        )

    def side(role_a: str, role_b: str) -> str:
        names = {router.interface_towards(addresses[getattr(roles, r)]) for r in (role_a, role_b)}
        if len(names) != 1 or None in names:
            raise RackError(
                f"{source}: hosts.{role_a} and hosts.{role_b} must sit on one segment "
                f"attached to router {roles.router} (its interfaces: "
                f"{', '.join(f'{k} {v}' for k, v in router.interfaces.items())})"
            )
        return names.pop()

    ingress = side("tcp_sender", "udp_sender")
    egress = side("tcp_receiver", "udp_receiver")
    if ingress == egress:
        raise RackError(f"{source}: senders and receivers are on the same side of {roles.router}")
    return Dumbbell(
        router=roles.router,
        tcp_sender=roles.tcp_sender,
        tcp_receiver=roles.tcp_receiver,
        udp_sender=roles.udp_sender,
        udp_receiver=roles.udp_receiver,
        addresses=addresses,
        ingress=ingress,
        egress=egress,
    )
