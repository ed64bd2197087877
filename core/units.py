"""Quantities with units as written in experiment files and role variables: rates, byte
sizes, buffers, durations.

Each parser returns an exact integer in the base unit (bit/s, bytes, nanoseconds) and raises
ValueError with the allowed forms, so that the schema can name the key in its message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

# Its home is core/link_rules.py; named here too for trials/spec.py, which imports it from here.

_NUMBER = r"(?P<num>-?[0-9]+(?:\.[0-9]+)?)\s*"

RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
BYTE_UNITS = {"B": 1, "kB": 10**3, "MB": 10**6}  # 1 KB = 1000 B, as in the papers
PACKET_UNITS = {"pkt": 1}
TIME_UNITS = {"us": 10**3, "ms": 10**6, "s": 10**9, "min": 60 * 10**9}


def _parse(
    text: object, units: dict[str, int], what: str, example: str, *, zero_ok: bool = False
) -> int:
    allowed = ", ".join(units)
    folded = {unit.lower(): factor for unit, factor in units.items()}
    match = re.fullmatch(_NUMBER + r"(?P<unit>[A-Za-z]+)", str(text).strip())
    if not match or match["unit"].lower() not in folded:
        raise ValueError(
            f"{text!r} is not a {what}; write a number and one of: {allowed} (e.g. {example})"
        )
    value = Decimal(match["num"]) * folded[match["unit"].lower()]
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number of {next(iter(units))}")
    if value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{text!r} must be {'at least' if zero_ok else 'greater than'} zero")
    return int(value)


def parse_rate(text: object) -> int:
    """'1mbit' -> 1_000_000 (bit/s)."""
    return _parse(text, RATE_UNITS, "rate", "1mbit")


def parse_bytes(text: object) -> int:
    """'60000B' or '60kB' -> 60_000 (bytes)."""
    return _parse(text, BYTE_UNITS, "size in bytes", "60000B")


def parse_duration_ns(text: object) -> int:
    """'20ms' -> 20_000_000 (ns)."""
    return _parse(text, TIME_UNITS, "duration", "180s")


def parse_offset_ns(text: object) -> int:
    """A point in time after T0: like a duration, but '0s' is allowed."""
    return _parse(text, TIME_UNITS, "time offset", "15s", zero_ok=True)


@dataclass(frozen=True)
class Buffer:
    """A drop-tail limit: bytes (tc bfifo, dummynet KBytes) or packets (pfifo, slots)."""

    amount: int
    unit: str  # "B" or "pkt"

    def __str__(self) -> str:
        return f"{self.amount}{self.unit}"

    @property
    def packets(self) -> bool:
        return self.unit == "pkt"

    def in_bytes(self, packet_bytes: int) -> int:
        """The limit in bytes (a packet limit counts full packets of `packet_bytes`)."""
        return self.amount * packet_bytes if self.packets else self.amount


def parse_buffer(text: object) -> Buffer:
    """'60000B', '60kB' -> Buffer(60000, 'B'); '20pkt' -> Buffer(20, 'pkt')."""
    if isinstance(text, Buffer):
        return text
    units = {**BYTE_UNITS, **PACKET_UNITS}
    amount = _parse(text, units, "buffer size", "60000B or 20pkt")
    unit = "pkt" if str(text).strip().lower().endswith("pkt") else "B"
    return Buffer(amount, unit)


def format_duration(ns: int) -> str:
    """The shortest exact form: 25000000 -> '25ms', 0 -> '0s'."""
    for unit, factor in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if ns % factor == 0:
            return f"{ns // factor}{unit}"
    return f"{ns / 1e3:g}us"


def format_rate(bps: int) -> str:
    for unit, factor in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps % factor == 0:
            return f"{bps // factor}{unit}"
    return f"{bps}bit"
