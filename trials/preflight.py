"""Ask every host of a trial what it has, read-only, and refuse an experiment it cannot run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from trials.rack import Rack, RackError
from trials.spec import Experiment, SpecError
from trials.topology import Dumbbell

_FACTS_SOURCE = (Path(__file__).with_name("host_facts.py")).read_text()
REQUIRED_TOOLS = {
    "tcp_sender": ["iperf3"],
    "tcp_receiver": ["iperf3"],
    "udp_sender": ["tcpreplay"],
    "router": ["tcpdump", "tc"],
}
MIN_FREE_DISK = 200 * 10**6


def host_facts(rack: Rack, names: list[str]) -> dict[str, dict[str, Any]]:
    """Facts of each host (host_facts.py run there), gathered in parallel."""
    commands = {}
    for name in names:
        host = rack.host(name)
        args = " ".join(shlex.quote(a) for a in [host.workdir, *host.interfaces])
        commands[name] = f"python3 -c {shlex.quote(_FACTS_SOURCE)} {args}"
    return {name: json.loads(out) for name, out in rack.run_parallel(commands).items()}


def preflight(
    exp: Experiment, rack: Rack, topo: Dumbbell, source: str
) -> dict[str, dict[str, Any]]:
    names = sorted({topo.router, *topo.end_hosts})
    facts = host_facts(rack, names)
    problems = []
    for cc in exp.factors.cc:
        for name in (topo.tcp_sender, topo.tcp_receiver):
            f = facts[name]
            if cc not in f["cc_loaded"] and cc not in f["cc_modules"]:
                modules = ", ".join(f["cc_modules"]) or "none"
                problems.append(
                    f"{source}: key 'factors.cc': {cc!r} is not available on host {name} "
                    f"(kernel {f['kernel']}): it has {', '.join(f['cc_loaded'])} (CC modules: "
                    f"{modules}). Remove it from the experiment or use a rack whose kernel has it."
                )
    for cc, params in exp.cc_params.items():
        if cc not in exp.factors.cc:
            continue
        for name in (topo.tcp_sender, topo.tcp_receiver):
            have = facts[name]["cc_params"].get(cc)
            if have is None:
                continue  # module not loaded yet: the testbed_host role checks after loading it
            for param in params:
                if param not in have:
                    problems.append(
                        f"{source}: key 'cc_params.{cc}.{param}': tcp_{cc} on host {name} has no "
                        f"such parameter; it has: {', '.join(sorted(have)) or 'none'}"
                    )
    for role, tools in REQUIRED_TOOLS.items():
        name = getattr(topo, role)
        for tool in tools:
            if not facts[name]["tools"].get(tool):
                problems.append(
                    f"host {name} ({role}) lacks {tool}: install it (make setup, or the "
                    "testbed_host role with testbed_host_install_packages: true)"
                )
    for name, f in facts.items():
        if f["free_disk_bytes"] < MIN_FREE_DISK:
            problems.append(
                f"host {name}: only {f['free_disk_bytes'] / 1e6:.0f} MB free in "
                f"{rack.host(name).workdir}; captures need at least "
                f"{MIN_FREE_DISK / 1e6:.0f} MB"
            )
    if problems:
        raise SpecError("\n".join(dict.fromkeys(problems)))
    return facts


__all__ = ["RackError", "host_facts", "preflight"]
