"""`python -m trials status` (`make status`): what every rack host is doing now, in one
screen, read over SSH (nothing is changed): per experiment interface the shaping in force
(qdiscs, HTB rate, queue limit, netem delay or the delay line's), its counters; per host the
congestion control and its parameters, offloads, MTU and TCP route metrics; trialbed's
daemons running there and trial directories left behind.

A FreeBSD host (its probe says "platform": "FreeBSD") shows the dummynet pipe its ipfw rule
sends each interface's packets to instead of qdiscs (dummynet_shaping), its congestion
control as net.inet.tcp.cc.algorithm names it, and the offloads TSO4, TSO6 and LRO. A rio
link there, approximated by two RED queues (IN and OUT, each fed by its own rule) on its
pipe, takes two rows, one per queue with its RED settings and counters, each labelled as
that approximation (dummynet_rio_shaping)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from core.command import command
from core.hostside import PROBES, SOURCE
from core.program_source import program_source
from core.rack import Rack
from trials.preflight import host_facts

OFFLOADS = {
    "tcp-segmentation-offload": "tso",
    "generic-segmentation-offload": "gso",
    "generic-receive-offload": "gro",
}


LINK_COLUMNS = ("host", "iface", "qdiscs", "rate", "queue limit", "delay", "sent pkt", "dropped",
                "backlog")  # fmt: skip
HOST_COLUMNS = ("host", "cc", "cc parameters", "offloads", "mtu", "route metrics", "running",
                "left behind", "teardown gives back")  # fmt: skip


@functools.cache
def probe_source() -> str:
    """The status probe's text as it is sent, built on first use."""
    return program_source(SOURCE / PROBES["status"])


def gather(rack: Rack) -> dict[str, dict[str, Any]]:
    """Per host: the probe's answer plus its facts (CC, offloads, MTU, routes)."""
    names = sorted(rack.hosts)
    commands = {}
    for name in names:
        host = rack.host(name)
        commands[name] = command("python3", "-c", probe_source(), host.workdir, *host.interfaces)
    probes = {n: json.loads(out) for n, out in rack.run_parallel(commands).items()}
    facts = host_facts(rack, names)
    return {n: {**probes[n], "facts": facts[n]} for n in names}


def is_freebsd(state: dict[str, Any]) -> bool:
    return state.get("platform") == "FreeBSD"


def dummynet_rate(text: str | None) -> str:
    """ipfw's "  1.000 Mbit/s" as 1Mbit/s; "unlimited" as it is; "-" when unread."""
    if not text:
        return "-"
    found = re.fullmatch(r"\s*([\d.]+) (\S+)\s*", text)
    return f"{float(found[1]):g}{found[2]}" if found else text.strip()


def dummynet_shaping(state: dict[str, Any], iface: str) -> dict[str, Any]:
    """One interface of a FreeBSD host, in shaping_of's keys: the dummynet objects its ipfw
    rule sends it to (a pipe and its AQM; or a queue, a scheduler such as fq_codel, whose
    pipe gives rate and delay), the queue limit (KB as ipfw prints it, 1024 bytes; slots as
    pkt), the pipe's delay and the counters of its flows. "-" for what could not be read."""
    pipe = (state.get("dummynet") or {}).get(iface)
    unread = {"rate": "-", "limit": "-", "delay": "-", "sent": "-", "dropped": "-",
              "backlog": "-"}  # fmt: skip
    if pipe is None:
        return {"chain": "-", **unread}
    if not pipe.get("chain"):
        return {"chain": "no dummynet rule", **unread}
    if isinstance(pipe.get("rio"), dict):
        return dummynet_rio_shaping(pipe)
    chain = list(pipe["chain"])
    if len(chain) == 1 and pipe.get("aqm"):
        chain.append(pipe["aqm"])
    queue, delay, packets = pipe.get("queue"), pipe.get("delay_ms"), pipe.get("packets")
    return {
        "chain": "dummynet " + " → ".join(chain),
        "rate": dummynet_rate(pipe.get("rate")),
        "limit": f"{queue}{pipe.get('queue_unit') or ''}" if queue is not None else "-",
        "delay": f"{delay:g} ms (dummynet)" if delay is not None else "-",
        "sent": packets if packets is not None else "-",
        "dropped": pipe["drops"] if pipe.get("drops") is not None else "-",
        "backlog": f"{pipe.get('backlog', 0)}B/{pipe.get('qlen', 0)}p"
        if packets is not None
        else "-",
    }


RIO_APPROXIMATION = "dummynet RED approximation of RIO"


def _counted(entry: dict[str, Any]) -> dict[str, Any]:
    """sent, dropped and backlog of a probe entry's counters ("-" where unread)."""
    packets = entry.get("packets")
    return {
        "sent": packets if packets is not None else "-",
        "dropped": entry["drops"] if entry.get("drops") is not None else "-",
        "backlog": f"{entry.get('backlog') or 0}B/{entry.get('qlen') or 0}p"
        if packets is not None
        else "-",
    }


def dummynet_rio_shaping(entry: dict[str, Any]) -> dict[str, Any]:
    """qdisc rio on a FreeBSD router: the link (its pipe's rate and delay; the two queues'
    counters summed) and under "rio" each queue, IN and OUT, in shaping_of's keys: its rule's
    DSCP match, RED settings (w_q/min_th/max_th/max_p, as `red` configures them), size and
    counters, the chain saying it is the dummynet RED approximation of RIO."""
    rio = entry["rio"]
    pipe, sched = rio.get("pipe"), rio.get("sched")
    via = f"pipe {pipe}" + (f" ({sched.upper()})" if sched else "")
    queues = {}
    for part in ("in", "out"):
        q = rio.get(part) or {}
        red = q.get("red")
        aqm = (
            f"red {red['w_q']:g}/{red['min_th']}/{red['max_th']}/{red['max_p']:g}"
            if red
            else q.get("aqm") or "?"
        )
        size = q.get("queue")
        queues[part] = {
            "chain": f"{RIO_APPROXIMATION}, {part.upper()}: queue {q.get('number', '?')} → "
            f"{via}; {q.get('match') or '?'}; {aqm}",
            "limit": f"{size}{q.get('queue_unit') or ''}" if size is not None else "-",
            **_counted(q),
        }
    delay, size = entry.get("delay_ms"), entry.get("queue")
    return {
        "chain": f"{RIO_APPROXIMATION}: queue {(rio.get('in') or {}).get('number', '?')} (IN) + "
        f"queue {(rio.get('out') or {}).get('number', '?')} (OUT) → {via}",
        "rate": dummynet_rate(entry.get("rate")),
        "limit": f"{size}{entry.get('queue_unit') or ''} each" if size is not None else "-",
        "delay": f"{delay:g} ms (dummynet)" if delay is not None else "-",
        **_counted(entry),
        "rio": {"approximation": rio.get("approximation"), **queues},
    }


def link_rows(shaping: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one interface in the table: its shaping; a rio link's two queues, IN then
    OUT, with the link's rate and delay."""
    rio = shaping.get("rio")
    if not rio:
        return [shaping]
    return [{**shaping, **rio[part]} for part in ("in", "out")]


def shaping_of(state: dict[str, Any], iface: str) -> dict[str, Any]:
    """One interface: its qdisc chain, rate, queue limit, delay (and where it comes from) and
    the counters of the queue that holds the packets (the leaf; the root if it is alone)."""
    if is_freebsd(state):
        return dummynet_shaping(state, iface)
    qdiscs = state["qdiscs"].get(iface) or []
    chain = " → ".join(q["kind"] for q in qdiscs) or "?"
    rate = re.search(r"\brate (\S+)", state["classes"].get(iface) or "")
    leaf = next((q for q in qdiscs if q["kind"] not in ("htb", "netem")), None) or (
        qdiscs[0] if qdiscs else {}
    )
    options = leaf.get("options", {})
    limit = options.get("limit")
    unit = "B" if leaf.get("kind") == "bfifo" else ("pkt" if limit is not None else "")
    delay = "-"
    netem = next((q for q in qdiscs if q["kind"] == "netem"), None)
    backend = state.get("delay_backend") or {}
    if netem is not None:
        seconds = (netem.get("options", {}).get("delay") or {}).get("delay", 0)
        delay = f"{seconds * 1000:g} ms (netem)"
    elif backend.get("backend") == "nfqueue":
        ms = next((ln["delay_ms"] for ln in backend.get("links", []) if ln["iface"] == iface), 0)
        running = any(d["name"] == "delayline" for d in state["daemons"])
        if ms and state["nfqueue_rules"] and running:
            delay = f"{ms:g} ms (delay line)"
        elif ms and (state["nfqueue_rules"] or running):  # half in place: packets stall or pass
            delay = f"{ms:g} ms configured, delay line {'up' if running else 'DOWN'}, " + (
                f"{state['nfqueue_rules']} NFQUEUE rules"
            )
    return {
        "chain": chain,
        "rate": rate.group(1) if rate else "-",
        "limit": f"{limit}{unit}" if limit is not None else "-",
        "delay": delay,
        "sent": leaf.get("packets", 0),
        "dropped": leaf.get("drops", 0),
        "backlog": f"{leaf.get('backlog', 0)}B/{leaf.get('qlen', 0)}p",
    }


def own_settings(record: dict[str, Any] | None) -> str:
    """What teardown would give back: the host's own CC, how many other sysctls and module
    parameters, and which interfaces' settings (testbed_host's record)."""
    if not record:
        return "-"
    sysctls = record.get("sysctls", {})
    cc = sysctls.get("net.ipv4.tcp_congestion_control") or sysctls.get("net.inet.tcp.cc.algorithm")
    others = len(sysctls) - bool(cc) + len(record.get("module_parameters", {}))
    parts = [f"cc {cc}"] if cc else []
    parts += [f"{others} other sysctl{'s' if others > 1 else ''}"] if others else []
    parts += [f"{', '.join(record['interfaces'])} settings"] if record.get("interfaces") else []
    return "; ".join(parts)


def cc_of(state: dict[str, Any]) -> str | None:
    """The congestion control: Linux's sysctl; on FreeBSD net.inet.tcp.cc.algorithm as the
    probe read it (else as the facts did)."""
    sysctls = state["facts"]["sysctls"]
    if is_freebsd(state):
        return state.get("cc") or sysctls.get("net.inet.tcp.cc.algorithm")
    return sysctls.get("net.ipv4.tcp_congestion_control")


def cc_params_of(state: dict[str, Any], cc: str | None) -> dict[str, Any]:
    """The congestion control's parameters: Linux's module parameters; on FreeBSD its MIB
    variables among the facts' sysctls (net.inet.tcp.cc.htcp.rtt_scaling, ...)."""
    f = state["facts"]
    if is_freebsd(state):
        prefix = f"net.inet.tcp.cc.{cc}."
        sysctls = f.get("sysctls") or {}
        return {k[len(prefix) :]: v for k, v in sysctls.items() if k.startswith(prefix)}
    return (f.get("cc_params") or {}).get(cc, {})


def render(rack: Rack, states: dict[str, dict[str, Any]], console: Console) -> None:
    kinds = {"dummynet" if is_freebsd(s) else "tc" for s in states.values()} or {"tc"}
    links = Table(title=f"Experiment interfaces ({', '.join(sorted(kinds, reverse=True))})")
    for col in LINK_COLUMNS:
        links.add_column(col, justify="right" if col in ("sent pkt", "dropped") else "left")
    approximations = []
    for name, state in states.items():
        for iface in rack.host(name).interfaces:
            shaping = shaping_of(state, iface)
            for s in link_rows(shaping):
                links.add_row(name, iface, s["chain"], s["rate"], s["limit"], s["delay"],
                              str(s["sent"]), str(s["dropped"]), s["backlog"])  # fmt: skip
            if shaping.get("rio"):
                label = shaping["rio"].get("approximation") or "approximated"
                approximations.append(f"{name}:{iface} qdisc rio {label}: not RIO")
    if approximations:
        links.caption = "; ".join(approximations)
    console.print(links)

    hosts = Table(title="Hosts")
    for col in HOST_COLUMNS:
        hosts.add_column(col)
    for name, state in states.items():
        f = state["facts"]
        cc = cc_of(state) or "?"
        params = ", ".join(f"{k}={v}" for k, v in cc_params_of(state, cc).items())
        offloads = "; ".join(
            f"{iface} "
            + " ".join(
                f"{k} {'on' if on.get(o) else 'off'}"
                for o, k in ({o: o.lower() for o in on} if is_freebsd(state) else OFFLOADS).items()
            )
            for iface, on in (f.get("offloads") or {}).items()
        )
        mtu = ", ".join(f"{i} {m}" for i, m in (f.get("mtu") or {}).items())
        metrics = "; ".join(
            f"{r.get('dst')} " + " ".join(f"{k} {v}" for k, v in r["metrics"].items())
            for r in f.get("routes") or []
            if r.get("metrics")
        )
        running = ", ".join(f"{d['name']} ({d['pid']})" for d in state["daemons"])
        hosts.add_row(name, cc, params or "-", offloads or "-", mtu or "-", metrics or "-",
                      running or "-", ", ".join(state["leftover_trials"]) or "-",
                      own_settings(state.get("own_settings")))  # fmt: skip
    console.print(hosts)


def summary(rack: Rack, states: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the tables show, as data (`status --json`)."""
    out = {}
    for name, state in states.items():
        f = state["facts"]
        cc = cc_of(state)
        out[name] = {
            "interfaces": {i: shaping_of(state, i) for i in rack.host(name).interfaces},
            "cc": cc,
            "cc_params": cc_params_of(state, cc),
            "offloads": f.get("offloads"),
            "mtu": f.get("mtu"),
            "running": state["daemons"],
            "left_behind": state["leftover_trials"],
            "own_settings_recorded": state.get("own_settings"),
        }
    return out


def show(inventory: list[Path] | None, console: Console, as_json: bool = False) -> int:
    rack = Rack.load(inventory)
    try:
        states = gather(rack)
        if as_json:
            print(json.dumps(summary(rack, states), indent=1))
        else:
            render(rack, states, console)
    finally:
        rack.close()
    return 0
