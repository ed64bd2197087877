"""Helpers the family reports share."""

from __future__ import annotations

import math
from typing import Any


def first_of(summary: dict[str, Any], record: dict[str, Any], kind: str) -> tuple[str, dict, dict]:
    """(name, analysis summary, trial.json entry) of the first generator of a type."""
    for name, gen in record["traffic"].items():
        if gen["type"] == kind:
            return name, summary["generators"][name], gen
    raise KeyError(f"the trial has no {kind} generator")


def fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def trimmed(values):
    """With five or more repetitions the highest and lowest are dropped, as in seed 000."""
    values = values.sort_values()
    return values.iloc[1:-1] if len(values) >= 5 else values
