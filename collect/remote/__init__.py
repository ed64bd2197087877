"""Scripts that run on rack hosts during a trial (standard library only, no project imports):
each is started as a daemon by the runner and writes one file into the host's trial
directory. ``command(name, *args)`` gives the shell command that runs one of them without
installing it first (its source passed to ``python3 -c``).

How a trial records them (core.daemons.Daemons runs the command in the host's trial
directory, so the relative output names land there and are collected with the rest):

    # every router with a shaped egress, after the captures listen, before traffic:
    daemons.spawn(host, "tc_sampler", tc_sampler_command(ifaces))   # -> tc_samples.jsonl
    # (a FreeBSD router: daemons.spawn(host, "ipfw_sampler", ipfw_sampler_command(pipes,
    #  rio_queues=...)) -> ipfw_samples.jsonl, its rio links' two queues included)
    # every Linux TCP sender, with the addresses of its flows' two ends:
    daemons.spawn(host, "tcp_probe", tcp_probe_command(addrs, tag=trial_name),
                  ready="recording tcp_probe")                       # -> tcp_probe.txt
    ...  # traffic, drain
    daemons.stop_all(host, ["tc_sampler", "tcp_probe"])  # one round trip per host

The analysis reads <trial>/<router host>/tc_samples.jsonl (analysis.trial.TC_SAMPLES) and
<trial>/<sender host>/tcp_probe.txt (analysis.traffic.bulk_tcp.TCP_PROBE).
"""

from __future__ import annotations

import shlex
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {
    "tc_sampler": HERE / "tc_sampler.py",
    "tcp_probe": HERE / "tcp_probe.py",
    "ipfw_sampler": HERE / "ipfw_sampler.py",
    "siftr": HERE / "siftr.py",
}


def command(name: str, *args: str) -> str:
    """`python3 -c '<source of collect/remote/NAME.py>' ARGS...`, quoted for sh."""
    source = SCRIPTS[name].read_text()
    return shlex.join(["python3", "-c", source, *args])


def tc_sampler_command(
    devices: list[str], out: str = "tc_samples.jsonl", interval_ms: float = 10.0
) -> str:
    """Samples `tc -s -j qdisc show` of `devices` every `interval_ms` into `out` (JSON lines)
    until SIGTERM/SIGINT."""
    return command("tc_sampler", "--interval-ms", f"{interval_ms:g}", "--out", out, *devices)


def ipfw_sampler_command(
    pipes: dict[str, int],
    out: str = "ipfw_samples.jsonl",
    interval_ms: float = 10.0,
    rio_queues: dict[str, dict[str, int]] | None = None,
) -> str:
    """Samples `ipfw pipe show` of a FreeBSD router's pipes ({egress interface: pipe number},
    as freebsd_router numbers them) every `interval_ms` into `out` until SIGTERM/SIGINT. An
    interface in `rio_queues` ({interface: {"in": N, "out": M}}, qdisc rio: its packets wait
    in those two queues, not in the pipe's) is sampled with `ipfw queue show N M` instead,
    given as DEV=PIPE/IN,OUT."""
    rio_queues = rio_queues or {}
    specs = [
        f"{dev}={number}/{rio_queues[dev]['in']},{rio_queues[dev]['out']}"
        if dev in rio_queues
        else f"{dev}={number}"
        for dev, number in sorted(pipes.items())
    ]
    return command("ipfw_sampler", "--interval-ms", f"{interval_ms:g}", "--out", out, *specs)


def tcp_probe_command(addresses: list[str], out: str = "tcp_probe.txt", tag: str = "") -> str:
    """Records the tcp:tcp_probe tracepoint for sockets with an address in `addresses` (its
    own tracefs instance, mounting tracefs if needed) into `out` until SIGTERM/SIGINT."""
    extra = ["--tag", tag] if tag else []
    return command("tcp_probe", "--out", out, *extra, *addresses)


def siftr_command(out: str = "siftr.log", port: int | None = None) -> str:
    """Records SIFTR on a FreeBSD sender into `out` (every packet; only `port`'s flows if
    given) until SIGTERM/SIGINT; prints "recording siftr" once enabled."""
    return command("siftr", "--out", out, *(["--port", str(port)] if port is not None else []))
