"""Filters that read the roles' quantities with units through core/units.py, the definition
the experiment schema uses too: a role and an experiment file agree on what 1mbit, 60000B,
20pkt and 200ms mean, and refuse the same things (mbps, 60KB) with the same message."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

# The core of the checkout this plugin belongs to, ahead of any other on the path (an
# installed one may be another checkout's).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from core import link_rules, rio, units


def _given(value: object) -> bool:
    return value not in (None, "")


def link_problems(link: dict, interfaces: list[str], forwarding: bool) -> list[str]:
    """What is wrong with one entry of linux_router_links, each naming the key and what is
    allowed (an empty list: nothing)."""
    problems = []
    if link.get("iface") not in interfaces:
        problems.append(
            f"iface {link.get('iface')!r} is not an experiment interface of this host "
            f"(it has: {', '.join(interfaces) or 'none'})"
        )
    rate, buffer = link.get("rate"), link.get("buffer")
    if _given(rate) != _given(buffer):
        problems.append("rate and buffer go together: give both (a shaped link) or neither")
    if _given(rate):
        try:
            units.parse_rate(rate)
        except ValueError as e:
            problems.append(f"rate: {e} (bit units only: mbps would be megabytes per second)")
    if _given(buffer):
        try:
            parsed = units.parse_buffer(buffer)
            # A drop-tail limit in bytes must hold at least one full Ethernet frame.
            smallest = link_rules.FULL_FRAME_BYTES
            if not parsed.packets and parsed.amount < smallest:
                problems.append(f"buffer: {buffer!r} holds no full frame; at least {smallest}B")
        except ValueError as e:
            problems.append(f"buffer: {e}")
    given_delay = link.get("delay_ms", 0)
    try:
        delay = float(given_delay)
        if delay < 0:
            raise ValueError
    except (TypeError, ValueError):
        problems.append(
            f"delay_ms: {given_delay!r} is not a number of milliseconds >= 0 (e.g. 25: one-way, "
            "in this direction)"
        )
    else:
        if delay > 0 and not forwarding:
            problems.append(
                "delay_ms only on a forwarding host (an end host's own packets held in a "
                "delay line throttle its TCP)"
            )
    if link.get("qdisc", link_rules.DEFAULT_QDISC) not in link_rules.QDISCS:
        problems.append(f"qdisc {link.get('qdisc')!r}: one of {', '.join(link_rules.QDISC_NAMES)}")
    elif not any(p.startswith(("rate", "buffer")) for p in problems):
        problems += rio.link_problems(link)  # qdisc rio: its thresholds against the buffer
    return problems


def rate_bps(value: object) -> int:
    """'1mbit' -> 1000000."""
    try:
        return units.parse_rate(value)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e


def rate(value: object) -> str:
    """The rate as tc reads it, in its shortest exact form: '1.5mbit' -> '1500kbit'."""
    return units.format_rate(rate_bps(value))


def buffer_bytes(value: object, packet_bytes: int = link_rules.MTU) -> int:
    """'60kB' -> 60000; '20pkt' -> 20 full-size packets' worth."""
    try:
        return units.parse_buffer(value).in_bytes(packet_bytes)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e


def buffer_packets(value: object) -> int | None:
    """'20pkt' -> 20; a byte limit -> None."""
    try:
        parsed = units.parse_buffer(value)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e
    return parsed.amount if parsed.packets else None


def queue_packets(value: object) -> int:
    """A queue limit in packets (fq_codel, pie, codel): '20pkt' -> 20; '60000B' -> 40."""
    try:
        parsed = units.parse_buffer(value)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e
    return link_rules.limit_packets(parsed.amount, parsed.packets)


def red(value: object) -> dict:
    """tc red's settings for a queue of `value` (in bytes, a packet counted full-size):
    min and max thresholds (link_rules.red_thresholds), avpkt, the burst tc-red(8) advises
    for them, (2 min + max) / (3 avpkt) + 1, and the probability at max."""
    bytes_ = buffer_bytes(value)
    min_th, max_th = link_rules.red_thresholds(bytes_, packets=False)
    avpkt = link_rules.RED_AVPKT
    return {
        "limit": bytes_,
        "min": min_th,
        "max": max_th,
        "avpkt": avpkt,
        "burst": int((2 * min_th + max_th) / (3 * avpkt) + 1),
        "probability": link_rules.RED_MAX_P,
    }


def duration_problem(value: object, what: str, smallest_ns: int, largest_ns: int) -> str:
    """'' when `value` is a duration within the bounds, else why not."""
    try:
        ns = units.parse_duration_ns(value)
    except ValueError as e:
        return f"{what}: {e}"
    if not smallest_ns <= ns <= largest_ns:
        low, high = units.format_duration(smallest_ns), units.format_duration(largest_ns)
        return f"{what}: {value!r} is outside {low}..{high}"
    return ""


class FilterModule:
    def filters(self):
        return {
            "trialbed_link_problems": link_problems,
            "trialbed_rate": rate,
            "trialbed_buffer_bytes": buffer_bytes,
            "trialbed_buffer_packets": buffer_packets,
            "trialbed_queue_packets": queue_packets,
            "trialbed_red": red,
            "trialbed_duration_problem": duration_problem,
        }
