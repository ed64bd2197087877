"""Filters that write the shared link model (linux_router_links: rate, buffer, delay_ms,
qdisc) as ipfw(8)/dummynet(4) arguments, and say what dummynet cannot do of an entry.

Units are read once by core/units.py (as trialbed_units.py reads them); only the last step,
the ipfw words, is written here. Syntax from ipfw(8) of FreeBSD 13/14, section "PIPE, QUEUE
AND SCHEDULER CONFIGURATION", and the parser that reads it (sbin/ipfw/dummynet.c):
  - bw: an integer followed by K|M|G and bit/s (K = 1000); 1.5Mbit/s would read as 1;
  - queue: slots, or bytes: `N Kbytes` means N * 1024 bytes, so 60 000 bytes are written
    `60000bytes` (dummynet.c: a B or "bytes" suffix), never 60KBytes (= 61 440 bytes);
  - delay: whole milliseconds, below 10 000.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    from core import units
except ImportError:  # ansible-playbook from outside the project's environment
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from core import units

# Queue disciplines of the shared link model that dummynet has (cake it has not).
DUMMYNET_QDISCS = ("droptail", "red", "gred", "fq_codel", "pie", "codel")
# dummynet.c keeps bw in an int: bit/s above this are refused ("bandwidth too large").
LARGEST_BW = 2**31 - 1
LARGEST_DELAY_MS = 9999  # dummynet.c: "delay must be < 10000"
# fq_codel's limit (packets) must lie in 1..20480 (ipfw(8), sched type fq_codel: limit).
LARGEST_FQ_LIMIT = 20480
FULL_FRAME_BYTES = 1500


def _given(value: object) -> bool:
    return value not in (None, "")


def dummynet_problems(link: dict) -> list[str]:
    """What dummynet cannot do of one linux_router_links entry, each naming the key (the
    checks shared with the Linux router are trialbed_link_problems)."""
    problems = []
    qdisc = link.get("qdisc") or "droptail"
    if qdisc not in DUMMYNET_QDISCS:
        problems.append(
            f"qdisc {qdisc!r}: dummynet has {', '.join(DUMMYNET_QDISCS)} "
            "(cake is Linux only; use a Linux router for it)"
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
    chooses them: max_th a third of the queue, min_th a third of max_th."""
    try:
        parsed = units.parse_buffer(value)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e
    if parsed.packets:
        max_th = max(parsed.amount // 3, 2)
        min_th = max(max_th // 3, 1)
    else:
        max_th = max(parsed.amount // 3, 3000)
        min_th = max(max_th // 3, FULL_FRAME_BYTES)
    return f"0.002/{min_th}/{max_th}/0.1"


def dummynet_packets(value: object) -> int:
    """A queue limit in packets (fq_codel's limit): slots as given, bytes in full frames."""
    try:
        parsed = units.parse_buffer(value)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e
    packets = parsed.amount if parsed.packets else math.ceil(parsed.amount / FULL_FRAME_BYTES)
    return min(max(packets, 1), LARGEST_FQ_LIMIT)


class FilterModule:
    def filters(self):
        return {
            "trialbed_dummynet_problems": dummynet_problems,
            "trialbed_dummynet_bw": dummynet_bw,
            "trialbed_dummynet_queue": dummynet_queue,
            "trialbed_dummynet_red": dummynet_red,
            "trialbed_dummynet_packets": dummynet_packets,
        }
