"""The commands a trial runs on its hosts (snapshots, counters, captures, recorders) and how a
step runs on every host at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from core.command import DEV_NULL, STDOUT, Command, command, redirected, sequence
from core.daemons import Daemons
from core.hostside import (
    ipfw_sampler_command,
    program_command,
    remote_dir,
    siftr_command,
    tc_sampler_command,
    tcp_probe_command,
)
from core.link_rules import DSCP_TABLE_FAMILY, DSCP_TABLE_NAME
from core.rio_bpf import LOADER as RIO_BPF_LOADER
from core.rio_bpf import SHOWN as RIO_BPF_SHOWN
from trials.generators import TrafficGenerator
from trials.network import CaptureSite, ResolvedNetwork
from trials.watch import ENDS_EARLY_SLACK_S, UNTIL_STOPPED

# How often a bottleneck's queue is sampled, unless the inventory says (trialbed_tc_sample_ms).
TC_SAMPLE_MS = 10.0


Step = tuple[str, str, Callable[[], None]]  # (host, what, action)


def per_host(steps: Sequence[Step]) -> list[str]:
    """Run the steps, every host's in their order, the hosts at once (a trial's SSH round
    trips are its overhead: five hosts cost one round trip, not five). Every step is tried;
    returns the failures as 'what: error'."""
    hosts: dict[str, list[tuple[str, Callable[[], None]]]] = {}
    for host, what, action in steps:
        hosts.setdefault(host, []).append((what, action))

    def run(todo: list[tuple[str, Callable[[], None]]]) -> list[str]:
        failed = []
        for what, action in todo:
            try:
                action()
            except Exception as exc:
                failed.append(f"{what}: {type(exc).__name__}: {exc}")
        return failed

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        return [f for failed in pool.map(run, hosts.values()) for f in failed]


def must(failures: list[str]) -> None:
    """Before T0 a failed step fails the trial (the first failure is the cause)."""
    if failures:
        raise RuntimeError("; ".join(failures))


def capture_command(c: CaptureSite, snaplen: int) -> Command:
    """tcpdump for one capture point, writing <name>.pcap in the trial's remote directory."""
    # Immediate mode: without it libpcap hands packets over a ring block at a time (up to 1 s
    # late), and SIGINT discards the block still being filled.
    return command(
        "tcpdump", "-i", c.iface, "-n", "-s", int(snaplen), "-B", 16384, "--immediate-mode",
        "--time-stamp-precision=nano", "-Z", "root", "-w", f"{c.name}.pcap", "ip",
    )  # fmt: skip


def _tc_show(*words: str) -> Command:
    return command("tc", *words)


def snapshot_commands(net: ResolvedNetwork, daemons: Daemons, tag: str) -> dict[str, Command]:
    """Per shaping host: the command that writes its snapshot into the trial directory."""
    commands = {}
    for host in sorted({e.host for e in net.egress}):
        ifaces = [e.iface for e in net.egress if e.host == host]
        d = daemons.remote[host]
        if net.runs_freebsd(host):  # dummynet: the pipes' counters, after their numbers
            pipes = " ".join(f"{i}={n}" for i, n in net.dummynet_pipes(host).items())
            # qdisc rio: its IN and OUT queues' counters (analysis.ipfw_samples
            # .rio_queue_deltas), as GRED's per VQ on Linux.
            queues = [
                redirected(
                    sequence(
                        command("echo", f"## queues in={q['in']} out={q['out']}"),
                        command("ipfw", "queue", "show", q["in"], q["out"]),
                    ),
                    f"{d}/ipfw_queues_{i}_{tag}.txt",
                    stderr=STDOUT,
                )
                for i, q in dummynet_rio_queues(net, host).items()
            ]
            pipe_show = sequence(
                command("echo", f"## pipes {pipes}"), command("ipfw", "pipe", "show")
            )
            commands[host] = sequence(
                redirected(pipe_show, f"{d}/ipfw_{tag}.txt", stderr=STDOUT),
                *queues,
                command("true"),
            )
            continue
        show = sequence(
            *(
                c
                for i in ifaces
                for c in (
                    command("echo", f"## {i}"),
                    _tc_show("-s", "qdisc", "show", "dev", i),
                    _tc_show("-s", "class", "show", "dev", i),
                )
            )
        )
        # RIO's GRED counters per VQ, exact (the text form rounds sizes).
        gred = [
            redirected(
                _tc_show("-s", "-j", "qdisc", "show", "dev", e.iface),
                f"{d}/gred_{e.iface}_{tag}.json",
            )
            for e in net.egress
            if e.host == host and e.shaping.qdisc == "rio"
        ]
        # ... or the BPF RIO's per level, where the router runs it instead (roles/linux_router
        # chooses; its loader answers prog_id null where none is attached).
        bpf_rio = [
            redirected(
                program_command(
                    remote_dir(net.hosts[host].workdir), RIO_BPF_LOADER, "show", e.iface
                ),
                f"{d}/{RIO_BPF_SHOWN.format(iface=e.iface, tag=tag)}",
                stderr=DEV_NULL,
            )
            for e in net.egress
            if e.host == host and e.shaping.qdisc == "rio"
        ]
        nfqueue = redirected(
            command("cat", "/proc/net/netfilter/nfnetlink_queue"),
            f"{d}/nfqueue_{tag}.txt",
            stderr=DEV_NULL,
        )
        commands[host] = sequence(
            redirected(show, f"{d}/tc_{tag}.txt"), *gred, *bpf_rio, nfqueue, command("true")
        )
    return commands


def dummynet_rio_queues(net: ResolvedNetwork, host: str) -> dict[str, dict[str, int]]:
    """A FreeBSD router's rio interfaces and their IN and OUT queue numbers, as
    roles/freebsd_router numbers them (net.dummynet_numbers)."""
    return {i: n["rio"] for i, n in net.dummynet_numbers(host).items() if n["rio"]}


def marking_commands(net: ResolvedNetwork, daemons: Daemons, tag: str) -> dict[str, Command]:
    """Per marking host: the command that writes its rules' counters (nft -j) into the
    trial directory."""
    return {
        host: redirected(
            command("nft", "-j", "list", "table", DSCP_TABLE_FAMILY, DSCP_TABLE_NAME),
            f"{daemons.remote[host]}/dscp_counters_{tag}.json",
        )
        for host in sorted(net.marking)
    }


def pacing_commands(pacing: dict[str, list[str]], daemons: Daemons, tag: str) -> dict[str, Command]:
    """Per pacing host: the command that writes the root qdisc of each of its interfaces
    (`tc -s -j`: fq and its counters) into the trial directory."""
    return {
        host: sequence(
            *(
                redirected(
                    _tc_show("-s", "-j", "qdisc", "show", "dev", i, "root"),
                    f"{daemons.remote[host]}/pacing_{i}_{tag}.json",
                )
                for i in ifaces
            )
        )
        for host, ifaces in pacing.items()
        if ifaces
    }


def bottlenecks(net: ResolvedNetwork, generators: list[TrafficGenerator]) -> dict[str, list]:
    """host -> interfaces of the bottlenecks the generators cross."""
    out: dict[str, list[str]] = {}
    for g in generators:
        b = net.path_summary(g.spec.from_, g.spec.to)["bottleneck"]
        if b and b["iface"] not in out.setdefault(b["host"], []):
            out[b["host"]].append(b["iface"])
    return out


def tcp_senders(generators: list[TrafficGenerator]) -> dict[str, list[str]]:
    """Sender host -> both addresses of each of its TCP flows whose cwnd is recorded."""
    out: dict[str, list[str]] = {}
    for g in generators:
        if g.records_cwnd and g.record().get("proto") == 6:
            addrs = out.setdefault(g.sender, [])
            addrs += [a for a in (str(g.src), str(g.dst)) if a not in addrs]
    return out


def recorders(
    net: ResolvedNetwork,
    generators: list[TrafficGenerator],
    interval_ms: float = TC_SAMPLE_MS,
    tag: str = "",
) -> Iterator[tuple[str, str, Command, str | None]]:
    """(host, daemon, command, log line that says it records) of the measurements taken
    during the trial: every bottleneck's queue every 10 ms (`tc -s` on Linux, `ipfw pipe
    show` on a FreeBSD router, `ipfw queue show` of the two queues of a rio link there),
    and cwnd, ssthresh and srtt on every TCP sender (the tcp_probe tracepoint on Linux,
    SIFTR on FreeBSD)."""
    interval = float(interval_ms)
    for host, ifaces in bottlenecks(net, generators).items():
        programs = remote_dir(net.hosts[host].workdir)  # shipped by role remote_daemons
        if net.runs_freebsd(host):
            pipes = {i: n for i, n in net.dummynet_pipes(host).items() if i in ifaces}
            # qdisc rio: its packets wait in the IN and OUT queues, sampled instead of
            # the pipe's own (empty) queue.
            rio = {i: q for i, q in dummynet_rio_queues(net, host).items() if i in pipes}
            sampler = ipfw_sampler_command(programs, pipes, interval_ms=interval, rio_queues=rio)
            yield host, "ipfw_sampler", sampler, None
        else:
            sampler = tc_sampler_command(programs, ifaces, interval_ms=interval)
            yield host, "tc_sampler", sampler, None
    for host, addrs in tcp_senders(generators).items():
        programs = remote_dir(net.hosts[host].workdir)
        if net.runs_freebsd(host):  # SIFTR logs every flow of the host; analysis picks
            yield host, "siftr", siftr_command(programs), "recording siftr"
        else:
            probe = tcp_probe_command(programs, addrs, tag=tag)
            yield host, "tcp_probe", probe, "recording tcp_probe"


def recorder_names(
    net: ResolvedNetwork, generators: list[TrafficGenerator]
) -> list[tuple[str, str]]:
    """(host, daemon) of every recorder `recorders` starts."""
    return [(host, name) for host, name, _, _ in recorders(net, generators)]


# -- one trial --------------------------------------------------------------------------------


def must_keep_running(
    net: ResolvedNetwork, generators: list[TrafficGenerator], record: dict[str, Any], t0: float
) -> list[tuple[str, str, str, float]]:
    """(host, daemon, label, until) of what must keep running during the trial: captures,
    recorders and markers until the runner stops them (UNTIL_STOPPED), each generator's
    processes until its own schedule ends."""
    out = [(c.host, f"{c.name}.tcpdump", f"capture {c.name}", UNTIL_STOPPED) for c in net.captures]
    out += [(h, n, f"recorder {n}", UNTIL_STOPPED) for h, n in recorder_names(net, generators)]
    out += [
        (m["host"], m["daemon"], f"marker {name}", UNTIL_STOPPED)
        for name, m in (record.get("markers") or {}).items()
    ]
    for g in generators:
        if g.runs_to_its_end:
            until = t0 + (g.spec.start + g.duration_ns) / 1e9 - ENDS_EARLY_SLACK_S
            out += [(h, n, f"{g.name} ({g.type})", until) for h, n in g.daemon_names()]
    return out


def stop_stages(
    net: ResolvedNetwork, generators: list[TrafficGenerator], record: dict[str, Any]
) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[str]]]:
    """What a trial stops, per host, in two stages: the traffic's daemons, then what recorded
    it (recorders, captures stopped by SIGINT, markers by TERM: stats written, rules removed);
    and the captures, which stop lets catch up first (drain): tcpdump writes out on SIGINT
    only what it has read. One call per host and stage stops all of that stage's daemons."""
    traffic: dict[str, list[str]] = {}
    for g in generators:
        for host, name in g.daemon_names():
            traffic.setdefault(host, []).append(name)
    recording: dict[str, list[str]] = {}
    for host, name in recorder_names(net, generators):
        recording.setdefault(host, []).append(name)
    captures: dict[str, list[str]] = {}
    for c in net.captures:
        recording.setdefault(c.host, []).append(f"{c.name}.tcpdump:INT")
        captures.setdefault(c.host, []).append(f"{c.name}.tcpdump")
    for m in (record.get("markers") or {}).values():
        recording.setdefault(m["host"], []).append(m["daemon"])
    return traffic, recording, captures
