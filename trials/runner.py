"""Run the trials of an experiment on a rack: configure, arm, run, stop, collect, analyse.

Every exit path (success, failure, Ctrl-C, SIGTERM) stops the traffic and captures, brings
back what was captured, records the trial's status and restores the network.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collect.fetch import pull_host, write_manifest
from trials.ansible import run_playbook, write_host_vars
from trials.preflight import host_facts, preflight
from trials.rack import PROJECT_DIR, Rack
from trials.spec import Experiment, SpecError, Trial, dump_json
from trials.topology import Dumbbell, resolve_dumbbell
from trials.udp_stream import rewrite_for_rack, write_stream_template

START_LEAD_S = 2.0  # between launching the senders and their common start time T0
FINISH_GRACE_S = 60.0  # how long past T0 + duration a sender may take before it is stopped


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; the runner cleans up and records the trial as interrupted."""


@contextmanager
def interruptible():
    """Turn SIGTERM into the same clean stop as Ctrl-C."""

    def handler(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(PROJECT_DIR), *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class Processes:
    """Detached processes on rack hosts, each with a pid file and log in the trial's dir."""

    rack: Rack
    remote: dict[str, str]  # host -> remote trial directory

    def spawn(self, host: str, name: str, command: str, start_at: float | None = None) -> None:
        wait = ""
        if start_at is not None:
            # Every sender sleeps until the same absolute time (one clock on the virtual rack;
            # NTP/PTP-disciplined clocks on a physical one).
            wait = f"python3 -c 'import time; time.sleep(max(0, {start_at!r} - time.time()))'; "
        d = shlex.quote(self.remote[host])
        # Only the detached process may be backgrounded: anything else holding the SSH
        # channel's stdout would keep this call waiting.
        self.rack.run(
            host,
            f"cd {d} || exit 1; setsid sh -c {shlex.quote(wait + 'exec ' + command)} "
            f"> {name}.log 2>&1 < /dev/null & echo $! > {d}/{name}.pid",
        )

    def running(self, host: str, name: str) -> bool:
        pidfile = shlex.quote(f"{self.remote[host]}/{name}.pid")
        return (
            self.rack.run(
                host, f"kill -0 $(cat {pidfile}) 2>/dev/null && echo yes || echo no", check=False
            ).strip()
            == "yes"
        )

    def stop(self, host: str, name: str, sig: str = "TERM") -> None:
        pidfile = shlex.quote(f"{self.remote[host]}/{name}.pid")
        self.rack.run(
            host,
            f"if [ -s {pidfile} ]; then pid=$(cat {pidfile}); "
            f"kill -{sig} $pid 2>/dev/null; for i in $(seq 50); do "
            f"kill -0 $pid 2>/dev/null || break; sleep 0.1; done; "
            f"kill -KILL $pid 2>/dev/null; rm -f {pidfile}; fi; true",
            check=False,
        )


class TrialRunner:
    def __init__(
        self, exp: Experiment, source: Path, rack: Rack, topo: Dumbbell, batch_dir: Path, log=print
    ):
        self.exp, self.source, self.rack, self.topo = exp, source, rack, topo
        self.batch_dir = batch_dir
        self.batch_id = batch_dir.name
        self.log = log
        self.hosts = sorted({topo.router, *topo.end_hosts})

    # -- the steps -------------------------------------------------------------------------

    def router_links(self, trial: Trial) -> list[dict[str, Any]]:
        link = {
            "rate": f"{self.exp.rate}bit",
            "buffer_bytes": self.exp.buffer,
            "delay_ms": trial.one_way_delay_ms,
        }
        return [{"iface": self.topo.egress, **link}, {"iface": self.topo.ingress, **link}]

    def host_vars(self, trial: Trial) -> dict[str, dict[str, Any]]:
        cc = {
            "testbed_host_cc": trial.cc,
            "testbed_host_cc_params": self.exp.cc_params.get(trial.cc, {}),
        }
        out: dict[str, dict[str, Any]] = {h: dict(cc) for h in self.topo.end_hosts}
        out[self.topo.router] = {
            "linux_router_links": self.router_links(trial),
            "capture_points": [
                {"name": "bottleneck_in", "iface": self.topo.ingress},
                {"name": "bottleneck_out", "iface": self.topo.egress},
            ],
            "capture_snaplen": self.exp.capture.snaplen,
        }
        return out

    def configure(self, trial: Trial, trial_dir: Path) -> dict[str, Any]:
        overlay = write_host_vars(trial_dir / "ansible" / "trial_vars.yml", self.host_vars(trial))
        recap = run_playbook(
            "configure.yml",
            [*self.rack.inventory, overlay],
            trial_dir / "ansible" / "configure.log",
        )
        return {"overlay": overlay.name, "recap": recap}

    def udp_stream(self, remote: str) -> str:
        """Build the stream's pcap for the rack, put it on the sender; return its interface."""
        t = self.topo
        exp = self.exp
        dst = str(t.addresses[t.udp_receiver])
        route = json.loads(self.rack.run(t.udp_sender, f"ip -j route get {dst}"))[0]
        gateway, dev = route.get("gateway", dst), route["dev"]
        src_mac = self.rack.run(t.udp_sender, f"cat /sys/class/net/{dev}/address").strip()
        found = self.rack.interface_with_address(gateway)
        if found is None:
            raise RuntimeError(f"no inventory host owns {t.udp_sender}'s next hop {gateway}")
        owner, owner_if = found
        hop_mac = self.rack.run(owner.name, f"cat /sys/class/net/{owner_if}/address").strip()
        packets = exp.duration // exp.udp.interval
        # Built in a scratch directory: the copy the sender replayed comes back with its files.
        scratch = Path(tempfile.mkdtemp(prefix="trialbed-udp-"))
        template, stream = scratch / "template.pcap", scratch / "udp_stream.pcap"
        write_stream_template(
            template,
            packets=packets,
            ip_bytes=exp.udp.packet_bytes,
            interval_ns=exp.udp.interval,
            port=exp.udp.port,
        )
        rewrite_for_rack(
            template,
            stream,
            src_ip=str(t.addresses[t.udp_sender]),
            dst_ip=dst,
            src_mac=src_mac,
            next_hop_mac=hop_mac,
        )
        try:
            self.rack.put(t.udp_sender, stream, f"{remote}/udp_stream.pcap")
        finally:
            shutil.rmtree(scratch)
        return dev

    def router_snapshot(self, remote: str, tag: str) -> None:
        r = self.topo.router
        ifaces = [self.topo.ingress, self.topo.egress]
        cmd = "; ".join(
            f"echo '## {i}'; tc -s qdisc show dev {i}; tc -s class show dev {i}" for i in ifaces
        )
        self.rack.run(
            r,
            f"{{ {cmd}; }} > {shlex.quote(remote)}/tc_{tag}.txt; "
            f"cat /proc/net/netfilter/nfnetlink_queue > {shlex.quote(remote)}/"
            f"nfqueue_{tag}.txt 2>/dev/null; true",
        )

    def delay_backend(self) -> dict[str, Any]:
        router = self.rack.host(self.topo.router)
        text = self.rack.run(self.topo.router, f"cat {router.workdir}/router/delay_backend.json")
        return json.loads(text)

    def captures(self, action: str, remote_dir: str) -> None:
        """Start or stop the router's capture points (the capture role's control script)."""
        ctl = f"{self.rack.host(self.topo.router).workdir}/capture/capture-ctl"
        self.rack.run(self.topo.router, f"{ctl} {action} {shlex.quote(remote_dir)}")

    def delayline(self, action: str, out: str | None = None) -> None:
        router = self.rack.host(self.topo.router)
        ctl = f"{router.workdir}/router/delayline-ctl"
        self.rack.run(
            self.topo.router, f"{ctl} {action} {shlex.quote(out) if out else '/dev/null'}"
        )

    # -- one trial ----------------------------------------------------------------------------

    def run(self, trial: Trial) -> dict[str, Any]:
        t, exp = self.topo, self.exp
        trial_dir = self.batch_dir / "trials" / trial.name
        trial_dir.mkdir(parents=True, exist_ok=True)
        remote = {
            h: f"{self.rack.host(h).workdir}/trials/{self.batch_id}/{trial.name}"
            for h in self.hosts
        }
        procs = Processes(self.rack, remote)
        record: dict[str, Any] = {
            "trial": trial.name,
            "batch": self.batch_id,
            "status": "running",
            "experiment_file": str(self.source),
            "experiment_digest": exp.digest(),
            "parameters": trial.parameters(),
            "git": git_state(),
            "inventory": [str(p) for p in self.rack.inventory],
            "topology": {
                "router": t.router,
                "ingress": t.ingress,
                "egress": t.egress,
                "addresses": {h: str(a) for h, a in t.addresses.items()},
                "clock_domain": self.rack.vars.get("trialbed_clock_domain"),
            },
            "times": {"started": now_iso()},
            "errors": [],
        }
        (trial_dir / "trial.json").write_text(dump_json(record))
        nfqueue = False
        traffic_started = False
        try:
            self.log(f"[{trial.name}] configure (ansible-playbook configure.yml)")
            record["configure"] = self.configure(trial, trial_dir)
            record["delay"] = self.delay_backend()
            nfqueue = record["delay"]["backend"] == "nfqueue"
            record["hosts"] = host_facts(self.rack, self.hosts)

            self.log(f"[{trial.name}] arm: captures, iperf3 server, UDP sink")
            self.rack.run_parallel({h: f"mkdir -p {shlex.quote(d)}" for h, d in remote.items()})
            udp_iface = self.udp_stream(remote[t.udp_sender])
            self.router_snapshot(remote[t.router], "before")
            if nfqueue:
                self.delayline("stats")  # resets the delay line's counters for this trial
            self.captures("start", remote[t.router])
            rcv = t.addresses[t.tcp_receiver]
            procs.spawn(
                t.tcp_receiver,
                "iperf3_server",
                f"iperf3 -s -1 -B {rcv} -p {exp.tcp_port} -J --logfile iperf3_server.json",
            )
            procs.spawn(
                t.udp_receiver,
                "udp_sink",
                "python3 -c "
                + shlex.quote(
                    "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                    f"s.bind(('{t.addresses[t.udp_receiver]}', {exp.udp.port}));\n"
                    "while True: s.recv(65535)"
                ),
            )
            time.sleep(0.5)  # the server must listen before the client connects

            t0 = time.time() + START_LEAD_S
            duration_s = exp.duration / 1e9
            record["times"]["t0"] = t0
            record["times"]["t0_ns"] = int(t0 * 1e9)
            self.log(
                f"[{trial.name}] run: {trial.flows} {trial.cc} flow(s) "
                f"{t.tcp_sender}->{t.tcp_receiver} and UDP {t.udp_sender}->{t.udp_receiver} "
                f"for {duration_s:g} s, RTT {trial.rtt_ms:g} ms"
            )
            procs.spawn(
                t.tcp_sender,
                "iperf3_client",
                f"iperf3 -c {rcv} -B {t.addresses[t.tcp_sender]} -p {exp.tcp_port} "
                f"-t {duration_s:g} -P {trial.flows} -C {trial.cc} -J "
                f"--logfile iperf3_client.json",
                start_at=t0,
            )
            procs.spawn(
                t.udp_sender,
                "tcpreplay",
                f"tcpreplay -i {udp_iface} --preload-pcap --timer=nano udp_stream.pcap",
                start_at=t0,
            )
            traffic_started = True
            deadline = t0 + duration_s + FINISH_GRACE_S
            time.sleep(max(0.0, t0 + duration_s - time.time()))
            while time.time() < deadline and (
                procs.running(t.tcp_sender, "iperf3_client")
                or procs.running(t.udp_sender, "tcpreplay")
            ):
                time.sleep(1.0)
            # Let the queues drain and the delay line release what it holds.
            time.sleep(exp.buffer * 8 / exp.rate + trial.rtt_ms / 1000 + 1.0)
            record["times"]["traffic_done"] = now_iso()
            record["status"] = "complete"
        except (Interrupted, KeyboardInterrupt) as exc:
            record["status"] = "interrupted"
            record["errors"].append(f"interrupted ({exc or 'SIGINT'})")
            raise Interrupted(str(exc)) from None
        except Exception as exc:
            record["status"] = "failed"
            record["errors"].append(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.stop_and_collect(trial, trial_dir, remote, procs, record, nfqueue, traffic_started)
        return record

    def stop_and_collect(
        self,
        trial: Trial,
        trial_dir: Path,
        remote: dict[str, str],
        procs: Processes,
        record: dict[str, Any],
        nfqueue: bool,
        traffic_started: bool,
    ) -> None:
        """Stop everything of the trial, bring the files back, write trial.json and the manifest.
        Runs on every exit path; each step is attempted even when an earlier one fails."""
        t = self.topo
        with ignore_signals():
            steps = [
                (
                    "stop senders",
                    lambda: (
                        procs.stop(t.tcp_sender, "iperf3_client"),
                        procs.stop(t.udp_sender, "tcpreplay"),
                    ),
                ),
                (
                    "stop receivers",
                    lambda: (
                        procs.stop(t.tcp_receiver, "iperf3_server"),
                        procs.stop(t.udp_receiver, "udp_sink"),
                    ),
                ),
                (
                    "stop captures",
                    lambda: self.captures("stop", remote[t.router]),
                ),
                ("snapshot router", lambda: self.router_snapshot(remote[t.router], "after")),
            ]
            if nfqueue and traffic_started:
                steps.append(
                    (
                        "delay line stats",
                        lambda: self.delayline("stats", f"{remote[t.router]}/delayline_stats.json"),
                    )
                )
            for what, step in steps:
                try:
                    step()
                except Exception as exc:
                    record["errors"].append(f"{what}: {type(exc).__name__}: {exc}")
            record["times"]["stopped"] = now_iso()
            record["files"] = {}
            for host in self.hosts:
                try:
                    record["files"][host] = pull_host(
                        self.rack, host, remote[host], trial_dir / host
                    )
                except Exception as exc:
                    record["errors"].append(f"collect {host}: {type(exc).__name__}: {exc}")
                    if record["status"] == "complete":
                        record["status"] = "failed"
            stats = trial_dir / t.router / "delayline_stats.json"
            if stats.exists() and "delay" in record:
                record["delay"]["delayline_stats"] = json.loads(stats.read_text())
            record["capture"] = capture_stats(trial_dir / t.router)
            (trial_dir / "trial.json").write_text(dump_json(record))
            write_manifest(trial_dir)


def capture_stats(router_dir: Path) -> dict[str, dict[str, int]]:
    """tcpdump's own counters (received by filter, dropped by kernel) per capture point."""
    out = {}
    for log in sorted(router_dir.glob("*.tcpdump.log")):
        counts = {}
        for line in log.read_text().splitlines():
            words = line.split()
            if len(words) >= 3 and words[0].isdigit():
                counts[" ".join(words[2:]).replace(" ", "_")] = int(words[0])
        out[log.name.removesuffix(".tcpdump.log")] = counts
    return out


@contextmanager
def ignore_signals():
    """Cleanup must not be cut short by a second Ctrl-C."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def new_batch_dir(results: Path, exp_path: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = results / f"{stamp}-{exp_path.stem}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def run_experiment(
    exp: Experiment,
    source: Path,
    rack: Rack,
    results: Path,
    log=print,
    only: set[str] | None = None,
) -> tuple[Path, list[dict[str, Any]]]:
    """Validate against the rack (read-only), then run every trial; return the batch dir and
    the trial records. The network is restored on every exit path."""
    trials = [tr for tr in exp.trials() if not only or tr.name in only]
    unknown = (only or set()) - {tr.name for tr in trials}
    if unknown:
        raise SpecError(
            f"{source}: no trial named {', '.join(sorted(unknown))}; its trials are: "
            f"{', '.join(sorted(tr.name for tr in exp.trials()))}"
        )
    topo = resolve_dumbbell(exp, rack, str(source))
    preflight(exp, rack, topo, str(source))
    batch_dir = new_batch_dir(results, source)
    (batch_dir / "experiment.yml").write_text(source.read_text())
    runner = TrialRunner(exp, source, rack, topo, batch_dir, log=log)
    records = []
    try:
        with interruptible():
            for trial in trials:
                records.append(runner.run(trial))
    finally:
        with ignore_signals():
            log("restore the network (ansible-playbook teardown.yml)")
            overlay = write_host_vars(
                batch_dir / "ansible" / "teardown_vars.yml",
                {topo.router: {"linux_router_links": runner.router_links(trials[0])}},
            )
            run_playbook(
                "teardown.yml", [*rack.inventory, overlay], batch_dir / "ansible" / "teardown.log"
            )
    return batch_dir, records
