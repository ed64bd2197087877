"""Filters that read the roles' quantities with units through core/units.py, the definition
the experiment schema uses too: a role and an experiment file agree on what 1mbit, 60000B,
20pkt and 200ms mean, and refuse the same things (mbps, 60KB) with the same message."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    from core import rio, units
except ImportError:  # ansible-playbook from outside the project's environment
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from core import rio, units

# Bytes a packet-counted buffer is taken to hold, where tc needs bytes (RED thresholds).
FULL_FRAME_BYTES = 1500
# A drop-tail limit in bytes must hold at least one full Ethernet frame.
SMALLEST_BUFFER_BYTES = 1514
QDISCS = ("droptail", "red", "gred", "rio", "fq_codel", "pie", "codel", "cake")


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
            if not parsed.packets and parsed.amount < SMALLEST_BUFFER_BYTES:
                problems.append(
                    f"buffer: {buffer!r} holds no full frame; at least {SMALLEST_BUFFER_BYTES}B"
                )
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
    if link.get("qdisc", "droptail") not in QDISCS:
        problems.append(f"qdisc {link.get('qdisc')!r}: one of {', '.join(QDISCS)}")
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


def buffer_bytes(value: object, packet_bytes: int = FULL_FRAME_BYTES) -> int:
    """'60kB' -> 60000; '20pkt' -> 20 full frames' worth."""
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
            "trialbed_duration_problem": duration_problem,
        }
