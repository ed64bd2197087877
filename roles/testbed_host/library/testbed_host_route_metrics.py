#!/usr/bin/python
"""Ansible module: the TCP route metrics of a trial (initcwnd, initrwnd, rto_min) on every IPv4
route through the host's experiment interfaces.

No module exists for route metrics. The desired state is explicit: the routes carry exactly the
given managed metrics, and a managed metric absent from `metrics` is removed, so that a trial
without initcwnd gets the kernel's default back. Everything else about a route (destination,
gateway, device, protocol, scope, source, priority, table, tos, onlink, other metrics and their
locks) is restated as it is. It changes only routes that differ, so a second run reports ok.
"""

from __future__ import annotations

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: testbed_host_route_metrics
short_description: initcwnd, initrwnd and rto_min on the IPv4 routes of experiment interfaces
description:
  - Reads C(ip -4 -d -j route show table all) and replaces (C(ip route replace)) each unicast
    route whose device is one of O(interfaces) and whose managed metrics differ from O(metrics).
  - Managed metrics absent from O(metrics) are removed from the routes.
  - Other metrics of a route (mtu, advmss, ...) and their locks are kept.
  - Multipath routes, and routes with a nexthop object or an encapsulation, are left alone
    with a warning.
options:
  interfaces:
    description: Experiment interfaces; every route through one of them is managed.
    type: list
    elements: str
    required: true
  metrics:
    description: The managed metrics the routes must carry; an absent key is removed.
    type: dict
    default: {}
    suboptions:
      initcwnd: {description: Initial congestion window in segments (1..1000)., type: int}
      initrwnd: {description: Initial receive window in segments (at least 1)., type: int}
      rto_min:
        description: Minimum retransmission timeout, as ip route takes it (200ms, 1s).
        type: str
"""

EXAMPLES = r"""
- name: Start every connection with ten segments and a 200 ms minimum RTO
  testbed_host_route_metrics:
    interfaces: [left]
    metrics: {initcwnd: 10, rto_min: 200ms}
"""

RETURN = r"""
routes:
  description: The routes that differed, with their managed metrics before and after.
  returned: always
  type: list
  elements: dict
"""

MANAGED = ("initcwnd", "initrwnd", "rto_min")
INITCWND_MAX = 1000
# TCP_RTO_MAX of the Linux kernel.
RTO_MIN_MAX_MS = 120_000
# Route attributes of `ip -d -j route show` this module knows how to restate.
RESTATED = {"type", "dst", "gateway", "dev", "protocol", "scope", "prefsrc", "metric", "table"}
RESTATED |= {"tos", "flags", "metrics"}
# Flags that describe state (not settable); onlink is the only one a route is created with.
STATE_FLAGS = {"linkdown", "dead", "pervasive", "offload", "trap", "rt_offload_failed"}
# ip -j shows rtt, rttvar and rto_min in milliseconds; ip route takes them with a unit.
MILLISECOND_METRICS = {"rtt", "rttvar", "rto_min"}
DURATION = re.compile(r"^(\d+)(ms|s)$")


def rto_min_ms(text: str) -> int | None:
    """Milliseconds of a duration such as 200ms or 1s (None when not one)."""
    m = DURATION.match(text.strip())
    return int(m[1]) * (1000 if m[2] == "s" else 1) if m else None


def validate(module: AnsibleModule) -> dict[str, int]:
    """The desired managed metrics as integers (rto_min in ms); fail on a bad value."""
    want = {k: v for k, v in (module.params["metrics"] or {}).items() if v is not None}
    problems = []
    if "initcwnd" in want and not 1 <= want["initcwnd"] <= INITCWND_MAX:
        problems.append(f"metrics.initcwnd must be 1..{INITCWND_MAX}, got {want['initcwnd']}")
    if "initrwnd" in want and want["initrwnd"] < 1:
        problems.append(f"metrics.initrwnd must be at least 1, got {want['initrwnd']}")
    if "rto_min" in want:
        ms = rto_min_ms(str(want["rto_min"]))
        if ms is None or not 1 <= ms <= RTO_MIN_MAX_MS:
            problems.append(
                "metrics.rto_min must be a whole number of ms or s from 1ms to 120s "
                f"(200ms, 1s), got {want['rto_min']!r}"
            )
        want["rto_min"] = ms
    missing = [i for i in module.params["interfaces"] if not os.path.exists(f"/sys/class/net/{i}")]
    if missing:
        problems.append(f"no such interface: {', '.join(missing)}")
    if problems:
        module.fail_json(msg="; ".join(problems))
    return want


class Routes:
    def __init__(self, module: AnsibleModule):
        self.module = module
        self._locks: list[tuple[str, set[str]]] | None = None

    def ip(self, *args: str) -> str:
        cmd = ["ip", *args]
        rc, out, err = self.module.run_command(cmd)
        if rc != 0:
            self.module.fail_json(msg=f"{' '.join(cmd)} failed: {err.strip()}", rc=rc)
        return out

    def dump(self) -> list[dict]:
        return json.loads(self.ip("-4", "-d", "-j", "route", "show", "table", "all") or "[]")

    def managed(self, interfaces: list[str]) -> list[dict]:
        """Unicast routes through the interfaces (the local table holds the host's own)."""
        out = []
        for route in self.dump():
            hops = {hop.get("dev") for hop in route.get("nexthops", [])}
            if hops & set(interfaces):
                self.module.warn(f"multipath route {route['dst']} left alone")
                continue
            if route.get("dev") not in interfaces or route.get("type", "unicast") != "unicast":
                continue
            if route.get("table", "main") == "local":
                continue
            unknown = set(route) - RESTATED
            if unknown:
                self.module.warn(
                    f"route {route['dst']} dev {route['dev']} left alone: it has "
                    f"{', '.join(sorted(unknown))}, which this module does not restate"
                )
                continue
            out.append(route)
        return out

    def locked(self, route: dict) -> set[str]:
        """Metrics of a route that carry `lock` (ip -j does not show locks; the text does).

        A line of the text dump is matched to the route by destination, device, table, tos and
        priority (the key under which the kernel keeps a route).
        """
        if self._locks is None:
            self._locks = []
            text = self.ip("-4", "-d", "route", "show", "table", "all")
            for line in text.splitlines():
                if not line or line[0].isspace():
                    continue
                words = line.split()
                locks = {words[i - 1] for i, w in enumerate(words) if w == "lock" and i > 0}
                self._locks.append((line, locks))
        dev = f" dev {route['dev']} "
        table = f" table {route.get('table', 'main')} "
        prio = f" metric {route['metric']} " if "metric" in route else None
        for line, locks in self._locks:
            words = line.split()
            if words[1] != route["dst"] or dev not in line + " " or table not in line + " ":
                continue
            if "tos" in route and f" tos {route['tos']} " not in line:
                continue
            if (prio is None and " metric " not in line) or (prio and prio in line + " "):
                return locks
        self.module.fail_json(msg=f"cannot find route {route['dst']}{dev}in `ip route show`")
        return set()

    def replace_args(self, route: dict, want: dict[str, int]) -> list[str]:
        """`ip route replace` arguments restating the route with the wanted managed metrics."""
        args = ["-4", "route", "replace", route.get("type", "unicast"), route["dst"]]
        if "tos" in route:
            args += ["tos", route["tos"]]
        args += ["table", str(route.get("table", "main"))]
        for key, word in (("protocol", "proto"), ("scope", "scope"), ("metric", "metric")):
            if key in route:
                args += [word, str(route[key])]
        if "gateway" in route:
            args += ["via", route["gateway"]]
        args += ["dev", route["dev"]]
        if "onlink" in route.get("flags", []):
            args.append("onlink")
        if "prefsrc" in route:
            args += ["src", route["prefsrc"]]
        kept = {k: v for k, v in current_metrics(route).items() if k not in MANAGED}
        locks = self.locked(route) if kept else set()
        for name, value in kept.items():
            if name == "ecn":
                args += ["features", "ecn"]
                continue
            word = "congctl" if name == "congestion" else name
            args += [word, *(["lock"] if word in locks else [])]
            args.append(f"{value}ms" if name in MILLISECOND_METRICS else str(value))
        for name, value in want.items():
            args += [name, f"{value}ms" if name in MILLISECOND_METRICS else str(value)]
        return args


def current_metrics(route: dict) -> dict:
    out: dict = {}
    for entry in route.get("metrics", []):
        out.update(entry)
    return out


def managed_metrics(route: dict) -> dict[str, int]:
    return {k: v for k, v in current_metrics(route).items() if k in MANAGED}


def describe(route: dict) -> str:
    via = f" via {route['gateway']}" if "gateway" in route else ""
    table = f" table {route['table']}" if route.get("table", "main") != "main" else ""
    return f"{route['dst']}{via} dev {route['dev']}{table}"


def shown(metrics: dict[str, int]) -> str:
    parts = [
        f"{k} {v}ms" if k in MILLISECOND_METRICS else f"{k} {v}" for k, v in sorted(metrics.items())
    ]
    return " ".join(parts) or "(kernel defaults)"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "interfaces": {"type": "list", "elements": "str", "required": True},
            "metrics": {
                "type": "dict",
                "default": {},
                "options": {
                    "initcwnd": {"type": "int"},
                    "initrwnd": {"type": "int"},
                    "rto_min": {"type": "str"},
                },
            },
        },
        supports_check_mode=True,
    )
    want = validate(module)
    routes = Routes(module)
    differing = [
        r for r in routes.managed(module.params["interfaces"]) if managed_metrics(r) != want
    ]
    report = [
        {"route": describe(r), "before": managed_metrics(r), "after": want} for r in differing
    ]
    diff = {
        "before": "".join(f"{describe(r)}: {shown(managed_metrics(r))}\n" for r in differing),
        "after": "".join(f"{describe(r)}: {shown(want)}\n" for r in differing),
    }
    if differing and not module.check_mode:
        for route in differing:
            routes.ip(*routes.replace_args(route, want))
        # Read back: the kernel must now show exactly what was asked.
        wrong = [
            f"{describe(r)}: {shown(managed_metrics(r))}"
            for r in routes.managed(module.params["interfaces"])
            if managed_metrics(r) != want
        ]
        if wrong:
            module.fail_json(msg=f"routes still differ after ip route replace: {wrong}")
    module.exit_json(changed=bool(differing), routes=report, diff=diff)


if __name__ == "__main__":
    main()
