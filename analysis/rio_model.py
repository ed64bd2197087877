"""RIO's early drop as the tc BPF program hostside/bpf_tc/rio/rio.bpf.c computes it, in Python:
the reference the program is tested against packet by packet (same integers, same truncations,
same order of steps), and a way to replay a sequence of arrivals offline (what the program
would have dropped, the virtual FIFO's backlog and RED's averages as each packet saw them).

One object is one program's state: `arrive` takes a packet's arrival time, size, level and the
random value the program would draw, and returns what became of it. The fixed point and the
parameters are core/rio_bpf.py's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from core.rio_bpf import (
    AVG_SHIFT,
    BACKLOGS,
    BYTE_WORK,
    D_SHIFT,
    LEVELS,
    MAX_LIMIT,
    P_SHIFT,
    RATIO_SHIFT,
    REASONS,
    RING,
    W_SHIFT,
    BpfRio,
)

MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1
SIGNED_MAX = MASK64 >> 1


@dataclass
class SubQueue:
    """One level's packets (mode gred) or levels 0..L's (coupled): RED's state for it."""

    avg: int = 0  # bytes << AVG_SHIFT
    count: int = 0  # packets since the last drop (or since the average left min..max)
    arrival_ns: int = 0  # its last arrival, accepted or not
    accept_ns: int = 0  # its last accepted packet's arrival (0: none yet)
    accept_work: int = 0  # work ahead of that packet (queued) or up to its end (fluid)


@dataclass(frozen=True)
class Slot:
    start: int  # bytes accepted before it (mod 2^32)
    size: int
    level: int
    cum: tuple[int, int]  # bytes of levels 0 and 1 accepted before it (mod 2^32)


@dataclass(frozen=True)
class Decision:
    """What a packet saw and what became of it (the program's `last`)."""

    level: int
    reason: str  # one of REASONS
    queue: tuple[int, ...]  # each sub-queue's backlog, bytes
    queued: int  # the FIFO's waiting bytes
    avg: int  # the average compared, bytes << AVG_SHIFT
    pb: int  # p_b << P_SHIFT

    @property
    def dropped(self) -> bool:
        return self.reason != REASONS[0]


@dataclass
class Counters:
    packets: list[int] = field(default_factory=lambda: [0] * LEVELS)
    bytes: list[int] = field(default_factory=lambda: [0] * LEVELS)
    early: list[int] = field(default_factory=lambda: [0] * LEVELS)
    forced: list[int] = field(default_factory=lambda: [0] * LEVELS)
    limit: list[int] = field(default_factory=lambda: [0] * LEVELS)
    ring_full: list[int] = field(default_factory=lambda: [0] * LEVELS)


def level_of_dscp(cfg: BpfRio, dscp: int | None) -> int:
    """A packet's level from its DSCP (None: not IP, which is OUT as in the program)."""
    if dscp is None:
        return 1
    if (cfg.in_dscp >> dscp) & 1:
        return 0
    if len(cfg.levels) > 2 and (cfg.high_dscp >> dscp) & 1:
        return 2
    return 1


def decay(avg: int, wq: int, m: int) -> int:
    """avg x (1 - w)^m by squaring in 31-bit fractions, truncated as the program truncates."""
    one = 1 << D_SHIFT
    if m >> 32:
        return 0
    base, f = one - (wq << (D_SHIFT - W_SHIFT)), one
    for i in range(32):
        if (m >> i) & 1:
            f = (f * base) >> D_SHIFT
        base = (base * base) >> D_SHIFT
    return (avg * f) >> D_SHIFT


class RioModel:
    """The program's state and its step."""

    def __init__(self, cfg: BpfRio):
        self.cfg = cfg
        self.fluid = cfg.backlog == BACKLOGS[1]
        self.coupled = cfg.mode == "coupled"
        self.limit = cfg.limit_bytes if 0 < cfg.limit_bytes < MAX_LIMIT else MAX_LIMIT
        self.slots: deque[Slot] = deque()
        self.head = 0
        self.tail = 0
        self.now_ns = 0
        self.work = 0
        self.accepted = 0
        self.level_accepted = [0] * LEVELS
        self.sub = [SubQueue() for _ in range(LEVELS)]
        self.counters = Counters()
        self.idle_decays = 0  # averages decayed over an idle period (RED's m packets)

    def holds(self, j: int, level: int) -> bool:
        return level <= j if self.coupled else level == j

    def _departed(self, slot: Slot, unsent: int) -> bool:
        behind = (self.accepted - slot.start) & MASK32
        if self.fluid:
            behind -= slot.size
        return behind >= unsent

    def _idling(self, q: SubQueue, work_j: int) -> bool:
        if work_j or not q.accept_ns:
            return False
        return q.arrival_ns - q.accept_ns <= q.accept_work // self.cfg.rate_bps

    def _idle_packets(self, q: SubQueue, now: int) -> int:
        since = now - q.accept_ns
        if since > SIGNED_MAX // self.cfg.rate_bps:
            return MASK64
        return (since * self.cfg.rate_bps - q.accept_work) // (self.cfg.mean_packet * BYTE_WORK)

    def _backlogs(self) -> tuple[list[int], int]:
        """Each level's backlog (work units) and the FIFO's waiting bytes."""
        work_l = [0] * LEVELS
        if not self.slots:
            return work_l, 0
        e = self.slots[0]
        in_l = [(self.level_accepted[k] - e.cum[k]) & MASK32 for k in (0, 1)]
        ahead = (self.accepted - e.start) & MASK32
        work_l = [in_l[0] * BYTE_WORK, in_l[1] * BYTE_WORK, (ahead - in_l[0] - in_l[1]) * BYTE_WORK]
        if not self.fluid:
            return work_l, ahead
        rest = self.work - (ahead - e.size) * BYTE_WORK  # the head is on the wire
        work_l[e.level] -= e.size * BYTE_WORK - rest
        return work_l, ahead - e.size

    def arrive(self, now_ns: int, size: int, level: int, rnd: int) -> Decision:
        """One packet: `rnd` is the program's random 32-bit value for it."""
        cfg, c = self.cfg, self.counters
        c.packets[level] += 1
        c.bytes[level] += size
        if now_ns > self.now_ns:
            dt = now_ns - self.now_ns
            self.work = 0 if dt > self.work // cfg.rate_bps else self.work - dt * cfg.rate_bps
            self.now_ns = now_ns
        now = self.now_ns

        unsent = -(-self.work // BYTE_WORK)
        while self.slots and self._departed(self.slots[0], unsent):
            self.slots.popleft()
            self.head = (self.head + 1) & MASK32
        waiting = len(self.slots) - (1 if self.fluid and self.slots else 0)

        work_l, queued = self._backlogs()
        work_j = [sum(w for i, w in enumerate(work_l) if self.holds(j, i)) for j in range(LEVELS)]
        for j in range(len(cfg.levels)):
            if not self.holds(j, level):
                continue
            q, lj = self.sub[j], cfg.levels[j]
            if self._idling(q, work_j[j]):
                q.avg = decay(q.avg, lj.wq, self._idle_packets(q, now))
                self.idle_decays += 1
            else:
                d = ((work_j[j] // BYTE_WORK) << AVG_SHIFT) - q.avg
                q.avg += (d * lj.wq) >> W_SHIFT
            q.arrival_ns = now

        avg = self.sub[level].avg
        if not self.coupled:
            avg += sum(
                self.sub[j].avg for j in range(level) if not self._idling(self.sub[j], work_j[j])
            )

        p, q = cfg.levels[level], self.sub[level]
        low, high = p.min_bytes << AVG_SHIFT, p.max_bytes << AVG_SHIFT
        reason, pb = "pass", 0
        if avg < low or (cfg.ns2_guard and waiting <= 1):
            q.count = 0
        elif avg >= high:
            q.count = 0
            reason = "forced"
        else:  # the n-th packet after a drop goes with p_b / (1 - (n - 1) p_b)
            ratio = ((avg - low) << RATIO_SHIFT) // (high - low)
            pb = (p.maxp * ratio) >> RATIO_SHIFT
            cp = q.count * pb
            if cp >= 1 << P_SHIFT or rnd * ((1 << P_SHIFT) - cp) < pb << P_SHIFT:
                q.count = 0
                reason = "early"
            else:
                q.count += 1

        if reason == "pass" and queued + size > self.limit:
            reason = "limit"
        if reason == "pass" and ((self.tail - self.head) & MASK32) >= RING:
            reason = "ring_full"
        if reason == "pass":
            before = self.work
            self.slots.append(
                Slot(self.accepted, size, level, (self.level_accepted[0], self.level_accepted[1]))
            )
            self.tail = (self.tail + 1) & MASK32
            self.accepted = (self.accepted + size) & MASK32
            self.level_accepted[level] = (self.level_accepted[level] + size) & MASK32
            self.work += size * BYTE_WORK
            for j in range(LEVELS):
                if self.holds(j, level):
                    self.sub[j].accept_ns = now
                    self.sub[j].accept_work = self.work if self.fluid else before
        else:
            getattr(c, reason)[level] += 1
        queue = tuple(w // BYTE_WORK for w in work_j)
        return Decision(level, reason, queue, queued, avg, pb)


def replay(cfg: BpfRio, arrivals: Iterable[tuple[int, int, int | None, int]]) -> Iterator[Decision]:
    """What the program decides for each (time ns, size, DSCP or None, random value)."""
    model = RioModel(cfg)
    for now, size, dscp, rnd in arrivals:
        yield model.arrive(now, size, level_of_dscp(cfg, dscp), rnd)
