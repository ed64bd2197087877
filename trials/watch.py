"""The trial's watch: while the traffic runs, what would spoil the trial without anyone
noticing is looked for, and stops it at once with the cause.

Every WATCH_EVERY_S, one check per host (`trialbed-check`, sh; `trialbed-daemon` where it cannot
answer alone) reports which of the trial's processes ended on their own and how much room is
left where the host writes the trial's files. The hosts of a round are asked one after
another, spread over its spacing, and all at once at the end of the traffic, when the
measurement is over. Each check says what it cost its host, and the rounds are spaced so that
the watch takes at most WATCH_CPU_SHARE of one CPU. On the VM rack under TCG:
- a check that was a Python start cost 0.6-1.2 s of CPU: ten hosts checked every 5 s took more
  than the VM's two vCPUs from the trial's packets (its veths' backlog overflowed, SYN-ACK
  retransmissions failed); spaced out, a round of ten came every 145 s, and one round 1 s
  before the end stalled every handshake for 1-5 s;
- the shell check costs 0.07 s idle, 0.15 s in a diffserv trial (rounds every 31 s);
- ten hosts asked at once still made a burst (turnaround p99 12.9 ms, max 125 ms, in a 120-s
  diffserv trial), hence one after another.
A trial fails when:
- a capture, a recorder, a marker or a receiver ended before the runner stopped it
  (UNTIL_STOPPED);
- a sender ended before its own schedule did (one that sends a set number of bytes or
  transactions may end early and is not watched);
- a host stopped answering over SSH (its sshd killed, the host down);
- a host's file system has less than MIN_FREE_BYTES free: tcpdump goes on "capturing" with a
  full disk and writes nothing (measured here: 3000 packets captured, a 64 KB file), so the
  trial must stop before that happens.
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from core.daemons import Daemons
from core.rack import Rack, RackError
from core.units import parse_duration_ns

# A failure is seen within 5 s where checks are cheap (a few ms of CPU on a real host).
WATCH_EVERY_S = 5.0
# The most of one CPU the checks may take, summed over the rack's hosts (each check reports
# its own CPU time); slower checks space the rounds out.
WATCH_CPU_SHARE = 0.05
# What a capture, a recorder or a marker must outlive: the runner stops them after the traffic
# and the drain, so one found ended at any round (the last, at the end, included) ended early.
UNTIL_STOPPED = math.inf
# An answer slower than this counts as the host not answering (rack variable
# trialbed_watch_timeout overrides it).
CHECK_TIMEOUT_S = 15.0
MIN_FREE_BYTES = 4 * 2**20
# A sender's process may end this long before its schedule ends (start-up, rounding).
ENDS_EARLY_SLACK_S = 2.0


def watch_timeout_s(rack: Rack) -> float:
    """The inventory's trialbed_watch_timeout (a duration), checked before any host is touched."""
    value = rack.vars.get("trialbed_watch_timeout")
    if value is None:
        return CHECK_TIMEOUT_S
    try:
        return parse_duration_ns(str(value)) / 1e9
    except ValueError as exc:
        where = ", ".join(str(p) for p in rack.inventory)
        raise RackError(f"{where}: trialbed_watch_timeout: {exc}") from None


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class WatchFailure(RuntimeError):
    """The watch saw the trial spoiled; the message names every cause found."""


@dataclass
class TrialWatch:
    daemons: Daemons
    t0: float
    # host -> daemon -> (what it is, watched until this epoch time)
    expected: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)  # host -> what was seen
    timeout_s: float = CHECK_TIMEOUT_S
    rounds: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)  # host -> its last check's cost
    every_s: float = WATCH_EVERY_S  # the spacing the last round's cost asks for

    def expect(self, host: str, name: str, what: str, until: float) -> None:
        self.expected.setdefault(host, {})[name] = (what, until)

    def since_t0(self, when: float | None = None) -> str:
        return f"+{(when or time.time()) - self.t0:.1f} s"

    def check_host(self, host: str, now: float) -> list[str]:
        watched = [n for n, (_, until) in self.expected.get(host, {}).items() if now < until]
        try:
            answer = json.loads(self.daemons.check(host, watched or ["-"], self.timeout_s))
        except (RackError, ValueError) as exc:
            error = exc.__cause__ or exc  # the SSH error, not the command
            # A link that went down times out with no words of its own: name the error.
            cause = str(error)[-300:] or f"{type(error).__name__}: no answer within its timeout"
            self.unreachable[host] = f"stopped answering at {self.since_t0(now)} ({cause})"
            self.cpu_s.pop(host, None)
            return [f"{host} {self.unreachable[host]}"]
        self.cpu_s[host] = float(answer.get("cpu_s") or 0.0)
        # Judged at the answer, not at the question: on a slow host (the VM rack under TCG:
        # 5 s for one round measured) a sender may end on schedule while it is asked.
        answered = time.time()
        problems = []
        free = int(answer["free_bytes"])
        if free < MIN_FREE_BYTES:
            problems.append(
                f"{host}: its disk is full ({mib(free)} free in {self.daemons.remote[host]} "
                f"at {self.since_t0(now)}; at least {mib(MIN_FREE_BYTES)} must stay free, or "
                f"captures are cut short)"
            )
        for name, state in answer["daemons"].items():
            if name not in watched or state["state"] == "running":
                continue
            what, until = self.expected[host][name]
            if answered >= until:
                continue  # it may have ended on schedule before the check ran
            said = f": its log ends {state['log']!r}" if state.get("log") else ""
            # A writer that found no room ends for that reason: say so next to it.
            full = "; the host's disk is full, which may be why" if free < MIN_FREE_BYTES else ""
            problems.append(
                f"{what} on {host} ended by {self.since_t0(answered)}, before the trial "
                f"({name}: {state['state']}{said}{full})"
            )
        return problems

    def answering(self) -> list[str]:
        """The hosts still asked: those not seen to stop answering."""
        return [h for h in self.daemons.remote if h not in self.unreachable]

    def check(self, skip: str | None = None) -> list[str]:
        """One round of checks, every host (but `skip`) at once: the last, at the end, and
        after a problem; the problems found."""
        now = time.time()
        hosts = [h for h in self.answering() if h != skip]
        self.rounds += skip is None
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            found = list(pool.map(lambda h: self.check_host(h, now), hosts))
        return [p for problems in found for p in problems]

    @property
    def round_cpu_s(self) -> float:
        """What a round costs, summed over the hosts' last checks."""
        return sum(self.cpu_s.values())

    def spacing_s(self, every_s: float) -> float:
        """`every_s`, or longer when a round costs more than WATCH_CPU_SHARE of a CPU."""
        return max(every_s, self.round_cpu_s / WATCH_CPU_SHARE)

    def until(self, end: float, every_s: float = WATCH_EVERY_S) -> None:
        """Check every host every `every_s` (or as spaced by the checks' cost) until `end`
        (epoch time), and every host at once at `end`; raise WatchFailure at the first check
        that finds a problem. Within a round the hosts are asked one after another, spread over
        its spacing: ten asked at once on the VM rack took both vCPUs in one burst."""
        while (start := time.time()) < end:
            hosts = self.answering()
            spacing = self.spacing_s(every_s)
            slots = [(h, start + spacing * i / len(hosts)) for i, h in enumerate(hosts, 1)]
            if not slots or slots[0][1] >= end:
                break
            self.rounds += 1
            for host, at in slots:
                if at >= end:
                    break
                time.sleep(max(0.0, at - time.time()))
                problems = self.check_host(host, time.time())
                self.every_s = self.spacing_s(every_s)
                if problems:  # the others at once: the failure names every cause there is
                    problems += self.check(skip=host)
                    raise WatchFailure("; ".join(problems))
        time.sleep(max(0.0, end - time.time()))
        problems = self.check()
        self.every_s = self.spacing_s(every_s)
        if problems:
            raise WatchFailure("; ".join(problems))

    def summary(self) -> dict[str, float | int]:
        """For the trial's record: how often the hosts were checked, what a round cost, and
        how long a check waited for a host's answer."""
        return {
            "rounds": self.rounds,
            "every_s": round(self.every_s, 2),
            "round_cpu_s": round(self.round_cpu_s, 3),
            "timeout_s": self.timeout_s,
        }
