"""One trial on a rack, in sequence: configure, arm, run, stop, collect.

The runner knows the network, the capture points and the generators only through their
resolved forms (trials.network, trials.generators): it loops over them. Every exit path
(success, failure, Ctrl-C, SIGTERM) stops the traffic and captures, brings back what was
captured and records the trial's status; restoring the network is the loop's (trials.loop).
The host variables, host commands and record building it uses live in modules of their own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

from collect.fetch import CollectError, pull_host
from core.command import Command, command
from core.daemons import Daemons
from core.layout import BatchDir, TrialDir, remote_trial_dir
from core.rack import Rack
from core.trial_record import dump_record
from trials import adaptive_marking
from trials import host_commands as hc
from trials import record as rec
from trials.configure import RackConfiguration
from trials.generators import GENERATOR_TYPES, TrafficGenerator
from trials.generators.base import TrialContext
from trials.host_commands import Step, must, per_host
from trials.host_vars import host_vars
from trials.interrupts import Interrupted, ignore_signals
from trials.network import ResolvedNetwork, host_cc, host_settings, resolve_network
from trials.plan import Plan, Trial
from trials.preflight import host_facts
from trials.rack_kind import vm_record
from trials.watch import TrialWatch, WatchFailure, watch_timeout_s

# Between launching the senders and their common start time T0: the launches (one SSH
# round trip per sending host, all hosts at once) must be done by then. Measured: 0.1-0.3 s
# on the namespace rack, 3.9-5.4 s on the VM rack under TCG (two senders). The runner lengthens
# the lead to twice the slowest launch it has seen (`TrialRunner.lead_s`).
START_LEAD_S = 1.0
START_LEAD_S_VM = 10.0
FINISH_GRACE_S = 60.0  # how long past its end a sender may take before it is stopped


class LateLaunch(RuntimeError):
    """The senders started after T0: the trial stops at once (see late_launch)."""


def late_launch(launch_s: float, lead_s: float) -> tuple[str | None, float]:
    """What a launch that took ``launch_s`` seconds says when it overran the lead (None: in
    time), and the lead the next trial takes: twice this launch, never less than before.
    Flows that start late make every rate over [T0, end] read low, so such a trial is stopped
    at once rather than after its whole traffic (a batch's retry takes the longer lead)."""
    next_lead = max(lead_s, round(2 * launch_s, 1))
    if launch_s <= lead_s:
        return None, next_lead
    return (
        f"the senders were launched {launch_s - lead_s:.2f} s after T0 (lead {lead_s:g} s): "
        f"stopped at once, as every rate from T0 would read low; the next trial's lead is "
        f"{next_lead:g} s"
    ), next_lead


class TrialRunner:
    """Runs one trial after another on a rack, into a batch directory."""

    def __init__(self, plan: Plan, rack: Rack, batch_dir: Path, log: Callable[[str], None] = print):
        self.plan, self.rack, self.batch_dir, self.log = plan, rack, batch_dir, log
        self.batch_id = batch_dir.name
        self.config = RackConfiguration(plan, rack, log)
        self.static_facts: dict[str, dict[str, Any]] = {}  # per host, read on its first trial
        self.watching: TrialWatch | None = None  # the running trial's watch
        self.pacing: dict[str, list[str]] = {}  # the running trial's fq hosts: their interfaces
        self.watch_timeout_s = watch_timeout_s(rack)
        self.sample_ms = float(rack.vars.get("trialbed_tc_sample_ms", hc.TC_SAMPLE_MS))
        on_vm = rack.vars.get("trialbed_rack_kind") == "vm"
        self.lead_s = START_LEAD_S_VM if on_vm else START_LEAD_S

    def trial_dir(self, trial: Trial) -> Path:
        return BatchDir(self.batch_dir).trial(trial.name).path

    # -- steps on the rack ----------------------------------------------------------------------

    def run_on(self, commands: dict[str, Command], skip: Container[str] = ()) -> None:
        """One command per host, the hosts at once, but those in `skip` (not answering)."""
        todo = {h: c for h, c in commands.items() if h not in skip}
        if todo:
            self.rack.run_parallel(todo)

    def command_steps(self, what: str, commands: dict[str, Command]) -> list[Step]:
        """One step per host that runs its command there."""
        return [
            (h, f"{what} on {h}", lambda h=h, c=c: self.rack.run(h, c)) for h, c in commands.items()
        ]

    def shaping_snapshot(
        self, net: ResolvedNetwork, daemons: Daemons, tag: str, skip: Container[str] = ()
    ) -> None:
        """`tc -s` of every shaped interface and the NFQUEUE counters, per host (but those
        in `skip`)."""
        self.run_on(hc.snapshot_commands(net, daemons, tag), skip)

    def delay_backends(self, net: ResolvedNetwork) -> dict[str, Any]:
        """The router role's record (delay_backend.json) of each host that delays a link or
        runs rio on one (the record says which RIO ran, GRED or the BPF program, and its
        source's sha256)."""
        out = {}
        wanted = {e.host for e in net.egress if e.shaping.delay or e.shaping.qdisc == "rio"}
        for host in sorted(wanted):
            record = f"{self.rack.host(host).workdir}/router/delay_backend.json"
            text = self.rack.run(host, command("cat", record))
            out[host] = json.loads(text)
        return out

    def delayline_stats(self, daemons: Daemons, host: str, out: str | None = None) -> None:
        """The delay line's counters since the last call (SIGUSR1 writes and resets them),
        copied to `out` when given."""
        router = f"{self.rack.host(host).workdir}/router"
        stats = f"{router}/delayline.stats.json"
        daemons.signal(host, "delayline", "USR1", directory=router, wait_file=stats)
        if out:
            self.rack.run(host, command("cp", stats, out))

    # -- one trial --------------------------------------------------------------------------------

    def run(self, trial: Trial) -> dict[str, Any]:
        exp = trial.experiment
        source = str(self.plan.source)
        net = resolve_network(exp, self.rack, source)
        settings = host_settings(exp, net, source)
        hosts = sorted(set(net.nodes.values()))
        trial_dir = self.trial_dir(trial)
        trial_dir.mkdir(parents=True, exist_ok=True)
        remote = {
            h: remote_trial_dir(self.rack.host(h).workdir, self.batch_id, trial.name) for h in hosts
        }
        daemons = Daemons(self.rack, remote)
        self.pacing = {
            net.nodes[n]: sorted(net.hosts[net.nodes[n]].interfaces)
            for n, s in settings.items()
            if s.pacing
        }
        ctx = TrialContext(self.rack, net, daemons, exp.duration, host_cc(settings))
        generators: list[TrafficGenerator] = [
            GENERATOR_TYPES[spec.type](spec, name, i, ctx)
            for i, (spec, name) in enumerate(zip(exp.traffic, exp.generator_names(), strict=True))
        ]
        self.watching = None
        record = rec.started_record(
            trial, source, self.batch_id, self.rack, net, settings, generators
        )
        TrialDir(trial_dir).record.write_text(dump_record(record))
        nfqueue: list[str] = []
        try:
            choices = self.config.choices
            record["configure"] = self.config.apply(
                trial_dir, host_vars(trial, net, settings, choices.cc, choices.shaping), trial.name
            )
            record["times"]["configured"] = rec.now_iso()

            self.log(f"[{trial.name}] arm: captures, recorders, receivers")
            nfqueue = self.arm(trial, net, daemons, generators, remote, record)
            record["cc_implementation"] = rec.cc_implementations(net, settings, record["hosts"])
            record["times"]["armed"] = rec.now_iso()

            # Receivers are up (armed); senders wait on their host until T0.
            launching = time.time()
            t0 = launching + self.lead_s
            record["times"]["lead_s"] = self.lead_s
            record["times"]["t0"] = t0
            record["times"]["t0_ns"] = int(t0 * 1e9)
            self.log(
                f"[{trial.name}] run for {exp.duration / 1e9:g} s: "
                + "; ".join(
                    f"{g.name} {g.type} {g.spec.from_}->{g.spec.to} at +{g.spec.start / 1e9:g} s"
                    for g in generators
                )
            )
            must(
                per_host(
                    [(g.sender, f"launch {g.name}", lambda g=g: g.launch(t0)) for g in generators]
                )
            )
            record["times"]["launched"] = rec.now_iso()
            launch_s = time.time() - launching
            record["times"]["launch_s"] = round(launch_s, 3)
            late, self.lead_s = late_launch(launch_s, self.lead_s)
            if late:
                raise LateLaunch(late)
            end = t0 + max(g.spec.start + g.duration_ns for g in generators) / 1e9
            self.watch(net, daemons, generators, record, t0).until(end)
            senders = [p for g in generators for p in g.senders()]
            while time.time() < end + FINISH_GRACE_S and any(
                daemons.running(h, n) for h, n in senders
            ):
                time.sleep(0.25)  # iperf3 ends a few hundred ms after its schedule
            time.sleep(exp.drain / 1e9)  # queues drain, the delay line releases what it holds
            record["times"]["traffic_done"] = rec.now_iso()
            record["status"] = "complete"
        except (Interrupted, KeyboardInterrupt) as exc:
            self.config.forget()
            record["status"] = "interrupted"
            record["errors"].append(f"interrupted ({exc or 'SIGINT'})")
            raise Interrupted(str(exc)) from None
        except (WatchFailure, LateLaunch) as exc:
            self.config.forget()
            record["status"] = "failed"
            record["times"]["failed_at"] = rec.now_iso()
            record["errors"].append(str(exc))
            raise
        except Exception as exc:
            self.config.forget()
            record["status"] = "failed"
            record["errors"].append(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.stop_and_collect(
                trial_dir, net, daemons, generators, record, nfqueue, exp.drain / 1e9
            )
        if record["status"] != "complete":
            self.config.forget()  # the next trial configures everything again
        return record

    def watch(
        self,
        net: ResolvedNetwork,
        daemons: Daemons,
        generators: list[TrafficGenerator],
        record: dict[str, Any],
        t0: float,
    ) -> TrialWatch:
        """What must keep running, and until when: captures, recorders and markers until the
        runner stops them, each generator's processes until its own schedule ends."""
        self.watching = watch = TrialWatch(daemons, t0, timeout_s=self.watch_timeout_s)
        for host, daemon, label, until in hc.must_keep_running(net, generators, record, t0):
            watch.expect(host, daemon, label, until)
        return watch

    def arm(
        self,
        trial: Trial,
        net: ResolvedNetwork,
        daemons: Daemons,
        generators: list[TrafficGenerator],
        remote: dict[str, str],
        record: dict[str, Any],
    ) -> list[str]:
        """Read the hosts' facts and delay backends, then start everything that records or
        receives, listening before T0: per host its captures, then its recorders, then its
        receivers, the hosts at once. Returns the hosts whose delay line runs in user space."""
        exp = trial.experiment
        hosts = sorted(remote)
        delayed = sorted({e.host for e in net.egress if e.shaping.delay})
        spent = record["arm_phases_s"] = {}  # where arming's time goes (it is overhead)
        mark = time.monotonic()

        def lap(phase: str) -> None:
            nonlocal mark
            now = time.monotonic()
            spent[phase] = round(now - mark, 2)
            mark = now

        record["hosts"] = host_facts(
            self.rack,
            hosts,
            before=lambda h: command("mkdir", "-p", remote[h]),
            static=self.static_facts,
        )
        record["delay"] = self.delay_backends(net)
        if (vm := vm_record(self.rack)) is not None:
            record["vm"] = vm  # the VM rack: its VM, calibration, clock offset now
            clock = vm["clock_at_trial"]
            if not clock.get("converged", False):
                # Captures are all in the VM (OWD is unaffected); T0 and start times are the
                # controller's, so the offset shifts when the senders start, by that much.
                self.log(f"[{trial.name}] warning: the VM's clock is off the controller's: {clock}")
        nfqueue = [h for h in delayed if record["delay"][h]["backend"] == "nfqueue"]
        lap("facts")  # hosts' facts, delay backends, the VM's clock
        must(per_host([(g.sender, f"prepare {g.name}", g.prepare) for g in generators]))
        lap("prepare")
        markers = adaptive_marking.marker_sites(exp, net, str(self.plan.source))
        record["markers"] = {m.name: m.record() for m in markers}

        steps: list[Step] = [
            *self.command_steps("snapshot shaping", hc.snapshot_commands(net, daemons, "before")),
            *self.command_steps(
                "read marking counters", hc.marking_commands(net, daemons, "before")
            ),
            *self.command_steps(
                "read pacing qdisc", hc.pacing_commands(self.pacing, daemons, "before")
            ),
        ]
        # Resets the delay line's counters for this trial.
        steps += [
            (h, f"reset delay line stats on {h}", lambda h=h: self.delayline_stats(daemons, h))
            for h in nfqueue
        ]
        steps += [
            (
                m.host,
                f"start marker {m.name} on {m.host}",
                lambda m=m: adaptive_marking.start(self.rack, daemons, m),
            )
            for m in markers
        ]
        spawns = [
            (
                c.host,
                f"{c.name}.tcpdump",
                hc.capture_command(c, exp.capture.snaplen),
                "listening on",
            )
            for c in net.captures
        ]
        spawns += hc.recorders(net, generators, self.sample_ms, tag=trial.name)
        steps += [
            (h, f"start {n} on {h}", lambda h=h, n=n, c=c, r=r: daemons.spawn(h, n, c, ready=r))
            for h, n, c, r in spawns
        ]
        must(per_host(steps))
        lap("start")  # snapshots, markers, captures, recorders
        must(per_host([(g.receiver, f"arm {g.name}", g.arm) for g in generators]))
        lap("receivers")
        return nfqueue

    def stop_and_collect(
        self,
        trial_dir: Path,
        net: ResolvedNetwork,
        daemons: Daemons,
        generators: list[TrafficGenerator],
        record: dict[str, Any],
        nfqueue: list[str],
        drain_s: float,
    ) -> None:
        """Stop everything of the trial, bring the files back, write trial.json and the manifest.
        Runs on every exit path; each step is attempted even when an earlier one fails. A trial
        stopped mid-traffic (interrupted, failed) lets its queues drain for `drain_s` between
        stopping the traffic and stopping the captures, as a complete one did before its stop:
        a 60 000-byte queue at 1 Mbit/s still delivers for 0.5 s, and a capture stopped meanwhile
        misses the packet arriving as it stops."""
        with ignore_signals():
            # A host the watch saw stop answering is left alone (each step would wait for
            # its SSH timeout): what runs there and its files stay until it answers again.
            gone = self.watching.unreachable if self.watching else {}
            if self.watching:
                record["watch"] = self.watching.summary()
            for host, seen in gone.items():
                record["errors"].append(
                    f"{host} not stopped nor collected: it {seen}; its processes and files stay "
                    f"on it ({daemons.remote[host]}) until teardown.yml, once it answers"
                )
            # Traffic first (every host at once), then what recorded it: a capture stops only
            # after every sender and receiver has.
            traffic, recording, captures = hc.stop_stages(net, generators, record)
            stages = [
                [
                    (
                        h,
                        f"stop {', '.join(names)} on {h}",
                        lambda h=h, n=names, d=drain: daemons.stop_all(h, n, drain=d.get(h, [])),
                    )
                    for h, names in stage.items()
                    if h not in gone
                ]
                for stage, drain in ((traffic, {}), (recording, captures))
            ]
            # One after the other (the snapshot itself reaches every host at once).
            counters: list[Step] = [
                (
                    "",
                    "snapshot shaping",
                    lambda: self.shaping_snapshot(net, daemons, "after", skip=gone),
                )
            ]
            if net.marking:
                marking = hc.marking_commands(net, daemons, "after")
                counters.append(("", "read marking counters", lambda: self.run_on(marking, gone)))
            if self.pacing:
                pacing = hc.pacing_commands(self.pacing, daemons, "after")
                counters.append(("", "read pacing qdiscs", lambda: self.run_on(pacing, gone)))
            if "t0" in record["times"]:
                counters += [
                    (
                        "",
                        f"delay line stats {host}",
                        lambda h=host: self.delayline_stats(
                            daemons, h, f"{daemons.remote[h]}/delayline_stats.json"
                        ),
                    )
                    for host in nfqueue
                    if host not in gone
                ]
            traffic_stage, recording_stage = stages
            record["errors"].extend(per_host(traffic_stage))
            if record.get("status") != "complete" and "t0" in record["times"]:
                time.sleep(drain_s)
            for steps in (recording_stage, counters):
                record["errors"].extend(per_host(steps))
            record["times"]["stopped"] = rec.now_iso()

            def pull(host: str) -> None:
                remote_dir = daemons.remote[host]
                record["files"][host] = pull_host(self.rack, host, remote_dir, trial_dir / host)

            record["files"] = {}
            failed = per_host(
                [(h, f"collect {h}", lambda h=h: pull(h)) for h in daemons.remote if h not in gone]
            )
            record["errors"].extend(failed)
            if (failed or gone) and record["status"] == "complete":
                record["status"] = "failed"
            rec.complete(trial_dir, net, generators, record, self.pacing, nfqueue)
            try:
                # Whole or not at all: a full disk must not leave half a record behind.
                rec.write_record(trial_dir, record)
            except OSError as exc:
                raise CollectError(
                    "; ".join(
                        [f"cannot write {TrialDir(trial_dir).record} ({exc})", *record["errors"]]
                    )
                ) from None
