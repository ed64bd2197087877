"""Experiment files: read within limits, parsed into typed, frozen objects, or rejected with a
clear message.

One schema for every family (../shared/DESIGN.md, "Experiment model"): a `network` of nodes
and shaped links, `traffic` as a list of typed generators, named `captures`, per-host
settings, and `factors` over any dotted key. A message names the file, the key, its line, the
value and what is allowed, before any host is touched. The parts: reader (YAML within
limits), errors (key paths and lines), topology (the network block), experiment (the file),
messages (what a failed validation says); the ranges and identifiers are trials/fields.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trials.spec.errors import At, Lines, SpecError, parse_key, require_unique
from trials.spec.experiment import Capture, CapturePoint, EdgeMarker, Experiment, HostSettings
from trials.spec.messages import format_errors
from trials.spec.reader import Loaded, load_text, read_file
from trials.spec.topology import (
    QDISCS,
    Link,
    MarkRule,
    Network,
    Node,
    RedLevel,
    Rio,
    Shaping,
)

__all__ = [
    "QDISCS",
    "At",
    "Capture",
    "CapturePoint",
    "EdgeMarker",
    "Experiment",
    "HostSettings",
    "Lines",
    "Link",
    "Loaded",
    "MarkRule",
    "Network",
    "Node",
    "RedLevel",
    "Rio",
    "Shaping",
    "SpecError",
    "dump_json",
    "format_errors",
    "load_text",
    "parse_key",
    "read_file",
    "read_yaml",
    "require_unique",
    "validate",
]


def read_yaml(path: Path) -> Any:
    """Parse a YAML file within the limits; an error names the file, line and column."""
    return read_file(Path(path)).data


def validate(raw: Any, source: str | Path, lines: Lines | None = None) -> Experiment:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping of keys at the top level")
    try:
        return Experiment.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_errors(source, exc, lines=lines)) from None


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"
