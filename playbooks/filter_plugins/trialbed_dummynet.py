"""Filters that write the shared link model (linux_router_links: rate, buffer, delay_ms,
qdisc) as ipfw(8)/dummynet(4) arguments, and say what dummynet cannot do of an entry.

Units are read once by core/units.py (as trialbed_units.py reads them); only the last step,
the ipfw words, is written here. Syntax from ipfw(8) of FreeBSD 13/14, section "PIPE, QUEUE
AND SCHEDULER CONFIGURATION", and the parser that reads it (sbin/ipfw/dummynet.c):
  - bw: an integer followed by K|M|G and bit/s (K = 1000); 1.5Mbit/s would read as 1;
  - queue: slots, or bytes: `N Kbytes` means N * 1024 bytes, so 60 000 bytes are written
    `60000bytes` (dummynet.c: a B or "bytes" suffix), never 60KBytes (= 61 440 bytes);
  - delay: whole milliseconds, below 10 000.

qdisc rio (seed 004's RIO) has no dummynet counterpart: it is approximated by two RED queues
(flowsets) on the link's pipe, IN and OUT, fed by rules matching the DSCP (dummynet_rio; the
template roles/freebsd_router/templates/ipfw.rules.j2 says what differs from Linux's GRED).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

# The core of the checkout this plugin belongs to, ahead of any other on the path (an
# installed one may be another checkout's).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from core import link_rules, rio, units
from core.dscp import dscp_name

# The queue disciplines dummynet has, and how, are core/link_rules.py's QDISCS; rio is an
# approximation (two RED queues on one pipe, see dummynet_rio).
# dummynet.c keeps bw in an int: bit/s above this are refused ("bandwidth too large").
LARGEST_BW = 2**31 - 1
LARGEST_DELAY_MS = 9999  # dummynet.c: "delay must be < 10000"
# fq_codel's limit (packets) must lie in 1..20480 (ipfw(8), sched type fq_codel: limit).
LARGEST_FQ_LIMIT = 20480
# The weight of RED's average in a queue the role sizes itself (red, gred).
RED_W_Q = 0.002
# dummynet keeps RED's w_q as fixed point (link_rules.dummynet_fixed_point): below 2^-SCALE_RED
# it would be 0.
SCALE_RED = link_rules.DUMMYNET_SCALE_RED
# ipfw(8), PIPE, QUEUE AND SCHEDULER CONFIGURATION: a queue's weight, 1..100. IN and OUT get
# the same one (the pipe's WF2Q+ then favours neither; see the template).
RIO_WEIGHT = 1
RIO_LABEL = link_rules.DUMMYNET_RIO_LABEL
RIO_DIFFERENCES = (
    "each queue keeps its own average queue length: OUT's drop probability follows OUT's "
    "average, where RIO's (GRED grio) follows the total of IN and OUT",
    "the two queues are served by the pipe's WF2Q+ scheduler with equal weights, not as one "
    "FIFO: while both are backlogged each gets half the link whatever its arrival share (an "
    "idle one's share goes to the other), and each queue may hold a whole buffer",
    "thresholds and queue limits are counted in packets (dummynet slots), not bytes",
)


def _given(value: object) -> bool:
    return value not in (None, "")


def dummynet_problems(link: dict) -> list[str]:
    """What dummynet cannot do of one linux_router_links entry, each naming the key (the
    checks shared with the Linux router are trialbed_link_problems)."""
    problems = []
    qdisc = link_rules.qdisc_of(link)
    if qdisc not in link_rules.DUMMYNET_QDISCS:
        linux_only = link_rules.LINUX_ONLY_QDISCS
        problems.append(
            f"qdisc {qdisc!r}: dummynet has {', '.join(link_rules.DUMMYNET_QDISCS)} "
            f"({', '.join(linux_only)} {'is' if len(linux_only) == 1 else 'are'} Linux only; "
            "use a Linux router for it)"
        )
    if _given(link.get("rate")):
        try:
            if units.parse_rate(link["rate"]) > LARGEST_BW:
                problems.append(f"rate {link['rate']!r}: dummynet's bw holds at most 2147mbit")
        except ValueError:
            pass  # trialbed_link_problems names it
    try:
        delay = float(link.get("delay_ms") or 0)
    except (TypeError, ValueError):
        delay = 0.0  # trialbed_link_problems names it
    if qdisc == "rio" and (link.get("rio") or {}).get(rio.HIGH) is not None:
        problems.append(
            "rio.high: the dummynet approximation of RIO has two queues (IN, OUT); a third drop "
            "level needs a Linux router (GRED)"
        )
    if qdisc == "rio":
        for name in rio.PRECEDENCES:
            w_q = ((link.get("rio") or {}).get(name) or {}).get("w_q")
            if isinstance(w_q, int | float) and 0 < w_q < 2**-SCALE_RED:
                problems.append(
                    f"rio.{name}.w_q {w_q!r}: dummynet keeps w_q in {SCALE_RED} bits, "
                    f"at least {2**-SCALE_RED:.7f} (2^-{SCALE_RED})"
                )
    if delay != int(delay) or not 0 <= delay <= LARGEST_DELAY_MS:
        problems.append(
            f"delay_ms {link.get('delay_ms')!r}: dummynet delays by whole milliseconds, "
            f"0..{LARGEST_DELAY_MS} (ipfw pipe config delay)"
        )
    return problems


def dummynet_bw(value: object) -> str:
    """'1mbit' -> '1Mbit/s', '1.5mbit' -> '1500Kbit/s' (whole numbers only)."""
    try:
        bps = units.parse_rate(value)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e
    for unit, factor in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if bps % factor == 0:
            return f"{bps // factor}{unit}bit/s"
    return f"{bps}bit/s"


def dummynet_queue(value: object) -> str:
    """'60000B' -> '60000bytes'; '20pkt' -> '20' (slots)."""
    try:
        parsed = units.parse_buffer(value)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e
    return str(parsed.amount) if parsed.packets else f"{parsed.amount}bytes"


def dummynet_red(value: object) -> str:
    """RED's w_q/min_th/max_th/max_p for a queue of `value`, thresholds in the queue's own
    unit (ipfw(8): bytes for a queue in bytes, slots otherwise), chosen as the Linux router
    chooses them (link_rules.red_thresholds)."""
    try:
        parsed = units.parse_buffer(value)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e
    min_th, max_th = link_rules.red_thresholds(parsed.amount, parsed.packets)
    return f"{RED_W_Q:g}/{min_th}/{max_th}/{link_rules.RED_MAX_P:g}"


def dummynet_packets(value: object) -> int:
    """A queue limit in packets (fq_codel's limit): slots as given, bytes in full-size
    packets (link_rules.limit_packets), at most dummynet's largest."""
    try:
        parsed = units.parse_buffer(value)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e
    return min(link_rules.limit_packets(parsed.amount, parsed.packets), LARGEST_FQ_LIMIT)


def _rio_level(vq: rio.VirtualQueue) -> dict:
    red = f"{vq.w_q:g}/{vq.min_packets}/{vq.max_packets}/{vq.pmax:g}"
    return {
        "red": red,
        "min_slots": vq.min_packets,
        "max_slots": vq.max_packets,
        "pmax": vq.pmax,
        "w_q": vq.w_q,
        "w_q_effective": link_rules.dummynet_fixed_point(vq.w_q),
    }


def dummynet_rio(link: dict) -> dict:
    """qdisc rio as two dummynet RED queues: per precedence (in, out) the `red` argument
    w_q/min_th/max_th/max_p with the thresholds in slots (packets, as the paper and
    linux_router_links give them), the queues' size in slots (`slots`: the buffer in packets,
    or its bytes in whole mean packets), the weight, and the IN DSCPs as ipfw's `dscp` option
    reads them (af11,af21,...; a code without a name as its number)."""
    try:
        settings = link.get("rio") or {}
        vq_in, vq_out = rio.virtual_queues(settings, link["buffer"])
        codes = rio.in_dscp(settings)
    except (rio.RioError, KeyError) as e:
        raise AnsibleFilterError(f"linux_router_links entry {link.get('iface')}: {e}") from e
    return {
        "slots": vq_in.limit // vq_in.mean_packet,
        "mean_packet": vq_in.mean_packet,
        "weight": RIO_WEIGHT,
        "in_dscp": ",".join(dscp_name(code) for code in codes),
        "in_dscp_codes": codes,
        "in": _rio_level(vq_in),
        "out": _rio_level(vq_out),
    }


def dummynet_rio_record(links: list, base: int) -> dict:
    """Per rio interface, what delay_backend.json (and so trial.json's delay record) says of
    the approximation: the label, what differs from RIO, the pipe, queues and RED settings."""
    out = {}
    qdiscs = [link_rules.qdisc_of(link) for link in links]
    for link, numbers in zip(links, link_rules.dummynet_numbers(qdiscs, base), strict=True):
        queues = numbers["rio"]
        if queues is None:
            continue
        built = dummynet_rio(link)
        out[link["iface"]] = {
            "rio": RIO_LABEL,
            "differences": list(RIO_DIFFERENCES),
            "pipe": numbers["pipe"],
            "queues": queues,
            "queue_slots": built["slots"],
            "mean_packet": built["mean_packet"],
            "weight": built["weight"],
            "in_dscp": built["in_dscp_codes"],
            "in": built["in"],
            "out": built["out"],
        }
    return out


class FilterModule:
    def filters(self):
        return {
            "trialbed_dummynet_problems": dummynet_problems,
            "trialbed_dummynet_bw": dummynet_bw,
            "trialbed_dummynet_queue": dummynet_queue,
            "trialbed_dummynet_red": dummynet_red,
            "trialbed_dummynet_packets": dummynet_packets,
            "trialbed_dummynet_rio": dummynet_rio,
            "trialbed_dummynet_rio_record": dummynet_rio_record,
        }
