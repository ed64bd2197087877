"""Helpers the family reports share: the generator a figure comes from, numbers as text, and
the trimmed mean every family's tables average repetitions with."""

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


# From this many repetitions on, the highest and the lowest are dropped (seed 000's protocol:
# 5 runs, the mean of the middle 3; the papers' protocols here run 5 of every cell).
TRIM_FROM = 5
TRIMMED_MEAN = (
    f"trimmed mean over the repetitions: with {TRIM_FROM} or more, the highest and the lowest "
    f"dropped (the middle 3 of 5); with fewer, the mean of all"
)


def trimmed(values):
    """The repetitions a trimmed mean averages: those with a value, less the highest and the
    lowest when there are TRIM_FROM or more."""
    values = values.dropna().sort_values()
    return values.iloc[1:-1] if len(values) >= TRIM_FROM else values


def trimmed_mean(values) -> float:
    """The mean of trimmed(values) (NaN when no repetition has a value)."""
    kept = trimmed(values.astype(float))
    return float(kept.mean()) if len(kept) else float("nan")


def trimmed_sd(values) -> float:
    """The run-to-run spread: the standard deviation of trimmed(values) (NaN below two)."""
    kept = trimmed(values.astype(float))
    return float(kept.std(ddof=1)) if len(kept) > 1 else float("nan")


def used(values) -> int:
    """How many repetitions trimmed_mean(values) averages."""
    return len(trimmed(values))
