"""The experiment's adaptive markers (`markers:`) on the rack: where each runs, how it is
started and stopped, and what the trial records of it.

Each marker is one daemon on its edge router (hostside/markers/edge_marker.py, which role
remote_daemons ships with markers.py beside it), bound to its own NFQUEUE; it adds its own
iptables rules (one per marked interface, mangle PREROUTING, --queue-bypass) once bound and
removes them when it stops. SIGTERM makes it write `<name>_stats.json` (packets, packets per
second, DSCPs written, retransmissions seen, time per packet in it), which trial.json keeps
under markers.<name>.stats.

With `implementation: bpf` the daemon is hostside/markers/bpf_edge_marker.py instead: the same
options, signals and stats file, but the marking is the tc BPF program hostside/bpf_tc/
edge_marker/ on the interfaces' ingress (built on the router under <trialbed_dir>/bpf_tc/,
attached on start, detached on SIGTERM); its stats add the sources' and the object's sha256.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.command import Command
from core.daemons import READY_TIMEOUT_S, Daemons
from core.dscp import af_code_points
from core.hostside import (
    BPF_EDGE_MARKER,
    BPF_TC_BUILD,
    EDGE_MARKER,
    program_command,
    remote_dir,
)
from core.rack import Rack, RackError
from trials.network import ResolvedNetwork, _shared_interfaces
from trials.spec import EdgeMarker, Experiment

QUEUE_BASE = 100  # NFQUEUE numbers: the delay line's start at 1


@dataclass(frozen=True)
class MarkerSite:
    name: str
    node: str
    host: str
    ifaces: tuple[str, ...]
    queue: int
    spec: EdgeMarker

    @property
    def daemon(self) -> str:
        return f"{self.name}_marker"

    @property
    def stats_file(self) -> str:
        return f"{self.name}_stats.json"

    def marker_command(self, python: str, hostside_dir: str) -> Command:
        """The marker run by `python` from the host's shipped programs (`hostside_dir`, in
        the host's trialbed_dir)."""
        s = self.spec
        code_points = ",".join(map(str, af_code_points(s.af_class)))
        args = ["--marker", s.marker, "--stats", self.stats_file,
                "--af-class", str(s.af_class), "--code-points", code_points, "--a0", str(s.a0),
                "--alpha", str(s.alpha), "--ns", str(s.n_s), "--na", str(s.n_a)]  # fmt: skip
        for iface in self.ifaces:
            args += ["--iface", iface]
        if s.implementation == "bpf":
            build_dir = f"{posixpath.dirname(hostside_dir)}/{BPF_TC_BUILD}"
            args += ["--build-dir", build_dir]
            return program_command(hostside_dir, BPF_EDGE_MARKER, *args, python=python)
        args = ["--queue", str(self.queue), *args]
        return program_command(hostside_dir, EDGE_MARKER, *args, python=python)

    def record(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "host": self.host,
            "interfaces": list(self.ifaces),
            "queue": None if self.spec.implementation == "bpf" else self.queue,
            "daemon": self.daemon,
            "stats_file": f"{self.host}/{self.stats_file}",
            **self.spec.model_dump(mode="json", exclude={"name"}),
        }


def marker_sites(exp: Experiment, net: ResolvedNetwork, source: str) -> list[MarkerSite]:
    """Each marker's router and the interfaces where the packets of its links come in."""
    links = {lk.name: lk for lk in exp.network.links}
    sites = []
    for i, m in enumerate(exp.markers):
        if m.at not in net.routers:
            raise RackError(
                f"{source}: key 'markers[{i}].at': {m.at} is not a router of the rack; an "
                f"edge marker runs on a router ({', '.join(sorted(net.routers))})"
            )
        host = net.hosts[net.host_of(m.at)]
        ifaces = []
        for name in m.links:
            other = next(n for n in links[name].ends if n != m.at)
            mine = _shared_interfaces(host, net.hosts[net.host_of(other)])[0][0]
            ifaces.append(mine)
        sites.append(MarkerSite(m.label(i), m.at, host.name, tuple(ifaces), QUEUE_BASE + i, m))
    return sites


def router_python(rack: Rack, host: str) -> str:
    """The router's Python with NetfilterQueue: the delay line's (linux_router role)."""
    python = str(rack.host(host).vars.get("linux_router_delayline_python") or "python3")
    project = rack.host(host).vars.get("trialbed_project_dir")
    if project:  # the virtual rack's group_vars write it as a template of this variable
        python = python.replace("{{ trialbed_project_dir }}", str(project))
    return python


def start(
    rack: Rack, daemons: Daemons, site: MarkerSite, ready_timeout_s: float = READY_TIMEOUT_S
) -> None:
    """Start the marker on its host; returns once its rules are in place."""
    shipped = remote_dir(rack.host(site.host).workdir)
    marker = site.marker_command(router_python(rack, site.host), shipped)
    daemons.spawn(site.host, site.daemon, marker, ready="ready", ready_timeout_s=ready_timeout_s)


def collect(trial_dir: Path, record: dict[str, Any]) -> None:
    """Put each marker's stats (brought back with its host's files) into the record."""
    for name, entry in (record.get("markers") or {}).items():
        path = trial_dir / entry["stats_file"]
        if path.exists():
            entry["stats"] = json.loads(path.read_text())
        else:
            record["errors"].append(f"marker {name}: no stats from {entry['host']}")
