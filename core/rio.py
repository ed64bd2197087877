"""RIO (RED with IN and OUT, Clark and Fang 1998) as Linux builds it: GRED in RIO mode
(`gred setup ... grio`), one virtual queue (VQ) per drop precedence in one physical queue.

Seed 004 (../shared/EXPERIMENTS.md §4) gives the thresholds in packets: they are converted to
bytes here with a mean packet size, which the trial records. GRED picks a packet's VQ from
`skb->tc_index`; in Debian 12's kernel (no dsmark, no tcindex) a clsact egress filter with
`classid :N` sets it, so the DSCPs of IN map to VQ 0 and everything else to VQ 1 (OUT).

A third level, `high` (VQ 2: RFC 2597's high drop precedence, AF*3), is built when the
experiment gives it: seed 004's three-colour marker MPM sends APM's probes there. The paper
gives no thresholds for it; its defaults are OUT's (min 2, max 6, Pmax 0.2), and in RIO mode
its average also holds IN's and OUT's, so it is dropped first.

GRED has no w_q of its own: tc derives its EWMA weight 2^-Wlog from `burst`
(iproute2 tc/tc_red.c, tc_red_eval_ewma), so a w_q is written as the burst that gives the
nearest power of two, and the weight the queue really uses is recorded beside the one asked.

One module serves the experiment schema (validation, record), the linux_router role's filters
(the tc arguments) and the runner (GRED's per-VQ counters from `tc -s qdisc show`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from core.dscp import parse_dscp
from core.link_rules import qdisc_of
from core.units import parse_buffer, parse_bytes

PRECEDENCES = ("in", "out")  # VQ 0, VQ 1; GRED's prio 1 and 2 (grio: OUT's average adds IN's)
HIGH = "high"  # VQ 2, prio 3, when given (its average adds IN's and OUT's)
# EXPERIMENTS.md §4: OUT min 2, max 6, Pmax 0.2; IN min swept 9..240, max = 3 min, Pmax 0.1;
# w_q 0.0012. A max not given is 3 x min (both levels of the paper follow it).
DEFAULTS: dict[str, dict[str, float]] = {
    "in": {"min": 9, "pmax": 0.1, "w_q": 0.0012},
    "out": {"min": 2, "pmax": 0.2, "w_q": 0.0012},
    HIGH: {"min": 2, "pmax": 0.2, "w_q": 0.0012},
}
MAX_OVER_MIN = 3
MEAN_PACKET = "1500B"  # the seed-004 flow table: 190 packets carry 284 454 bytes (1497 B each)
# Bytes per packet that convert thresholds: a minimum Ethernet frame to a jumbo packet.
MEAN_PACKET_RANGE = (64, 9000)
# IN: drop precedence 1 of every AF class (RFC 2597); every other DSCP is OUT.
IN_DSCP = ("af11", "af21", "af31", "af41")
# High: drop precedence 3 of every AF class, when the queue has that level.
HIGH_DSCP = ("af13", "af23", "af33", "af43")
KEYS = ("mean_packet", "in", "out", HIGH, "in_dscp", "high_dscp")
LARGEST_WLOG = 31  # tc_red_eval_ewma tries wlog 1..31


class RioError(ValueError):
    """A RIO setting that cannot be built; the message names the key."""


def tc_red_eval_ewma(qmin: int, burst: int, avpkt: int) -> int:
    """The EWMA log tc derives from burst (a port of iproute2's tc_red_eval_ewma); -1: none."""
    a = burst + 1 - qmin / avpkt
    if a < 1.0:
        return -1
    w = 0.5
    for wlog in range(1, 32):
        if a <= (1 - (1 - w) ** burst) / w:
            return wlog
        w /= 2
    return -1


def wlog_for(w_q: float) -> int:
    """The GRED Wlog nearest to w_q (in log scale): 0.0012 -> 10 (w_q 0.000977)."""
    if not 0 < w_q < 1:
        raise RioError(f"w_q {w_q!r} must lie between 0 and 1 (e.g. 0.0012)")
    return max(1, min(LARGEST_WLOG, round(-math.log2(w_q))))


def burst_for(wlog: int, qmin: int, avpkt: int) -> int:
    """The smallest burst (packets) for which tc chooses Wlog `wlog` with these min and avpkt."""
    for burst in range(max(1, math.ceil(qmin / avpkt)), 1 << 22):
        got = tc_red_eval_ewma(qmin, burst, avpkt)
        if got == wlog:
            return burst
        if got > wlog:  # wlog grows with burst: it was skipped
            break
    raise RioError(f"no burst gives EWMA weight 2^-{wlog} with min {qmin} B and avpkt {avpkt} B")


@dataclass(frozen=True)
class VirtualQueue:
    """One GRED VQ of a RIO queue, in the units tc takes (bytes), with what it came from."""

    dp: int
    precedence: str  # in | out | high
    prio: int
    min_packets: int
    max_packets: int
    pmax: float
    w_q: float  # as asked
    mean_packet: int  # bytes per packet of the conversion, also GRED's avpkt
    limit: int  # bytes: the physical queue (the link's buffer)

    @property
    def min_bytes(self) -> int:
        return self.min_packets * self.mean_packet

    @property
    def max_bytes(self) -> int:
        return self.max_packets * self.mean_packet

    @property
    def wlog(self) -> int:
        return wlog_for(self.w_q)

    @property
    def w_q_effective(self) -> float:
        return 2.0**-self.wlog

    @property
    def burst(self) -> int:
        return burst_for(self.wlog, self.min_bytes, self.mean_packet)

    def record(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "min_bytes": self.min_bytes,
            "max_bytes": self.max_bytes,
            "wlog": self.wlog,
            "w_q_effective": self.w_q_effective,
            "burst": self.burst,
        }


def _level(rio: dict[str, Any], name: str) -> dict[str, float]:
    given = rio.get(name) or {}
    if not isinstance(given, dict):
        raise RioError(f"rio.{name}: a mapping of min, max, pmax, w_q (packets), not {given!r}")
    unknown = set(given) - {"min", "max", "pmax", "w_q"}
    if unknown:
        raise RioError(
            f"rio.{name}: unknown key {', '.join(sorted(unknown))}; allowed: min, max, pmax, w_q"
        )
    level = {**DEFAULTS[name], **{k: v for k, v in given.items() if v is not None}}
    level.setdefault("max", MAX_OVER_MIN * level["min"])
    for key in ("min", "max"):
        value = level[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RioError(f"rio.{name}.{key}: {value!r} is not a whole number of packets >= 1")
    if level["max"] <= level["min"]:
        raise RioError(
            f"rio.{name}.max ({level['max']} packets) must be above rio.{name}.min "
            f"({level['min']} packets)"
        )
    pmax = level["pmax"]
    if isinstance(pmax, bool) or not isinstance(pmax, int | float) or not 0 < pmax <= 1:
        raise RioError(f"rio.{name}.pmax: {pmax!r} is not a probability in (0, 1]")
    w_q = level["w_q"]
    if isinstance(w_q, bool) or not isinstance(w_q, int | float) or not 0 < w_q < 1:
        raise RioError(f"rio.{name}.w_q: {w_q!r} must lie between 0 and 1 (e.g. 0.0012)")
    return level


def mean_packet_bytes(rio: dict[str, Any]) -> int:
    try:
        value = parse_bytes(rio.get("mean_packet") or MEAN_PACKET)
    except ValueError as e:
        raise RioError(f"rio.mean_packet: {e}") from None
    low, high = MEAN_PACKET_RANGE
    if not low <= value <= high:
        raise RioError(f"rio.mean_packet: {value} B is not a packet size ({low}B to {high}B)")
    return value


def precedences(rio: dict[str, Any]) -> tuple[str, ...]:
    """The queue's levels, VQ 0 first: in and out, and high when the experiment gives it."""
    return (*PRECEDENCES, HIGH) if rio.get(HIGH) is not None else PRECEDENCES


def _codes(rio: dict[str, Any], key: str, default: tuple[str, ...]) -> list[int]:
    try:
        codes = [parse_dscp(n) for n in rio.get(key) or list(default)]
    except ValueError as e:
        raise RioError(f"rio.{key}: {e}") from None
    return list(dict.fromkeys(codes))


def in_dscp(rio: dict[str, Any]) -> list[int]:
    """The DSCPs whose packets are IN (VQ 0)."""
    return _codes(rio, "in_dscp", IN_DSCP)


def high_dscp(rio: dict[str, Any]) -> list[int]:
    """The DSCPs whose packets go to the high level (VQ 2); none without that level."""
    if rio.get(HIGH) is None:
        if rio.get("high_dscp"):
            raise RioError("rio.high_dscp: given, but the queue has no rio.high level")
        return []
    codes = _codes(rio, "high_dscp", HIGH_DSCP)
    both = sorted(set(codes) & set(in_dscp(rio)))
    if both:
        raise RioError(f"rio.high_dscp: DSCP {both} also in rio.in_dscp; a code has one level")
    return codes


def virtual_queues(rio: dict[str, Any], buffer: object) -> list[VirtualQueue]:
    """IN and OUT of a RIO queue whose physical queue is `buffer` (60000B, or 40pkt counted in
    mean packets); raise RioError naming the key when a threshold does not fit."""
    unknown = set(rio) - set(KEYS)
    if unknown:
        raise RioError(f"rio: unknown key {', '.join(sorted(unknown))}; allowed: {', '.join(KEYS)}")
    mean = mean_packet_bytes(rio)
    high_dscp(rio)  # checks in_dscp too
    try:
        parsed = parse_buffer(buffer)
    except ValueError as e:
        raise RioError(f"buffer: {e}") from None
    limit = parsed.in_bytes(mean)
    size = f"{parsed}: {limit} B at mean_packet" if parsed.packets else f"{limit} B"
    out = []
    for dp, name in enumerate(precedences(rio)):
        level = _level(rio, name)
        vq = VirtualQueue(
            dp=dp,
            precedence=name,
            prio=dp + 1,
            min_packets=int(level["min"]),
            max_packets=int(level["max"]),
            pmax=float(level["pmax"]),
            w_q=float(level["w_q"]),
            mean_packet=mean,
            limit=limit,
        )
        if vq.max_bytes > limit:
            raise RioError(
                f"rio.{name}.max: {vq.max_packets} packets ({vq.max_bytes} B at mean_packet "
                f"{mean}B) do not fit the link's buffer ({size}): GRED would "
                "drop at the tail before RED's max; raise the buffer or lower the thresholds"
            )
        vq.burst  # noqa: B018 (raises when no burst gives the weight)
        out.append(vq)
    return out


def link_problems(link: dict[str, Any]) -> list[str]:
    """What is wrong with the rio settings of a linux_router_links entry (none when it is
    not a rio link and gives none)."""
    if qdisc_of(link) != "rio":
        return ["rio: thresholds given, but qdisc is not rio"] if link.get("rio") else []
    if not link.get("rate") or not link.get("buffer"):
        return ["qdisc rio needs a rate and a buffer (its physical queue)"]
    try:
        virtual_queues(link.get("rio") or {}, link["buffer"])
    except RioError as e:
        return [str(e)]
    return []


def tos_filters(rio: dict[str, Any]) -> list[dict[str, Any]]:
    """The clsact egress filters' ToS matches (flower ip_tos value/mask) and the VQ each
    sends to: IN's DSCPs to VQ 0, high's to VQ 2 (every other packet goes to OUT, VQ 1)."""
    return [
        {"tos": f"{code << 2:#04x}", "mask": "0xfc", "vq": vq}
        for vq, codes in ((0, in_dscp(rio)), (2, high_dscp(rio)))
        for code in codes
    ]


# GRED's per-VQ fields in `tc -s -j qdisc show` (iproute2 6.1, tc/q_gred.c) -> our names. The
# text form rounds sizes (a byte count near a multiple of 1024 prints as "4Kb"): JSON is exact.
GRED_COUNTERS = {
    "packets": "packets",
    "bytes": "bytes",
    "forced_drop": "forced_drops",  # average above max (or pmax reached)
    "prob_drop": "early_drops",  # between min and max, with RED's probability
    "pdrop": "pdrop",  # the physical queue (limit) was full
    "other": "other_drops",
    "forced_mark": "forced_marks",
    "prob_mark": "early_marks",
}
GRED_GAUGES = {"prio": "prio", "qave": "qave_bytes", "backlog": "backlog_bytes"}
DROPS = ("forced_drops", "early_drops", "pdrop", "other_drops")


def gred_counters(listing: str) -> dict[int, dict[str, int]]:
    """Per VQ of the GRED qdisc in a `tc -s -j qdisc show dev X` listing: its counters
    (and drops, their sum); {} when the interface has no GRED qdisc."""
    for qdisc in json.loads(listing or "[]"):
        if qdisc.get("kind") != "gred":
            continue
        out = {}
        for vq in qdisc.get("options", {}).get("vqs", []):
            row = {ours: int(vq.get(theirs, 0)) for theirs, ours in GRED_COUNTERS.items()}
            row.update(
                {ours: int(vq[theirs]) for theirs, ours in GRED_GAUGES.items() if theirs in vq}
            )
            row["drops"] = sum(row[k] for k in DROPS)
            out[int(vq["vq"])] = row
        return out
    return {}


def counters_delta(
    before: dict[int, dict[str, int]], after: dict[int, dict[str, int]]
) -> dict[int, dict[str, int]]:
    """What each VQ counted between two listings (a VQ absent before counts from zero; the
    gauges, average and current queue, are those of `after`)."""
    counted = [*GRED_COUNTERS.values(), "drops"]
    return {
        dp: {**now, **{k: now[k] - before.get(dp, {}).get(k, 0) for k in counted}}
        for dp, now in after.items()
    }
