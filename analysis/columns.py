"""A trial's summary and parameters as flat columns: nested keys joined into dotted names, as
analysis.load's rows and the results catalog's name them."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["flatten", "summary_metrics"]


def flatten(value: Any, prefix: str, out: dict[str, Any], lists: bool = True) -> None:
    """Scalars under dotted paths; lists of named dicts as [name]; lists of scalars as JSON
    text (with ``lists``, else left out), other lists left out."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out, lists)
    elif isinstance(value, list):
        if value and all(isinstance(v, dict) and v.get("name") for v in value):
            for v in value:
                rest = {k: x for k, x in v.items() if k != "name"}
                flatten(rest, f"{prefix}[{v['name']}]", out, lists)
        elif lists and (not value or all(not isinstance(v, dict | list) for v in value)):
            out[prefix] = json.dumps(value) if value else None
    else:
        out[prefix] = value


def summary_metrics(summary: dict[str, Any], lists: bool = True) -> dict[str, Any]:
    """A trial's analysis/summary.json as metric columns: ``<generator>.<metric>``,
    ``queue[<link>].<metric>`` and the rest under its own dotted name (the trial's keys and
    factors left out); lists of numbers as JSON text with ``lists``, else left out."""
    summary = dict(summary)
    metrics: dict[str, Any] = {}
    for name, gen in (summary.pop("generators", None) or {}).items():
        flatten(gen, name, metrics, lists)
    for link, queue in (summary.pop("queues", None) or {}).items():
        flatten(
            {k.removeprefix("queue_"): v for k, v in queue.items()},
            f"queue[{link}]",
            metrics,
            lists,
        )
    for key in ("trial", "id", "status", "family", "repetition"):
        summary.pop(key, None)
    flatten({k: v for k, v in summary.items() if not k.startswith("factor:")}, "", metrics, lists)
    return metrics
