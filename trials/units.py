"""Quantities with units as written in experiment files: rates, byte sizes, durations.

Each parser returns an exact integer in the base unit (bit/s, bytes, nanoseconds) and raises
ValueError with the allowed forms, so that the schema can name the key in its message.
"""

from __future__ import annotations

import re
from decimal import Decimal

_NUMBER = r"(?P<num>-?[0-9]+(?:\.[0-9]+)?)\s*"

RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
BYTE_UNITS = {"B": 1, "kB": 10**3, "MB": 10**6}  # 1 KB = 1000 B, as in the papers
TIME_UNITS = {"us": 10**3, "ms": 10**6, "s": 10**9, "min": 60 * 10**9}


def _parse(text: object, units: dict[str, int], what: str, example: str) -> int:
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
    if value <= 0:
        raise ValueError(f"{text!r} must be greater than zero")
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
