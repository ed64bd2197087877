"""The trial record (trial.json) as a typed model: what a trial was, how it ran, what came back.

The runner fills it in as the trial goes; everything that reads a trial record reads it through
``read_record``, which also takes records written before they carried a ``format_version``
(version 1: the same keys, none required beyond the trial's name).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.layout import FORMAT_VERSION

Status = Literal["running", "complete", "failed", "interrupted"]


class TrialRecord(BaseModel):
    """One trial's record. The nested parts (network, hosts, traffic, ...) are the resolved
    forms their producers write; the model names them and their types, and keeps any key a
    newer writer added (extra="allow") so that an old reader loses nothing it rewrites."""

    model_config = ConfigDict(extra="allow")

    format_version: int = 1
    trial: str
    id: str | None = None
    batch: str | None = None
    status: Status = "failed"
    experiment_file: str | None = None
    experiment_digest: str | None = None
    family: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    repetition: int | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    git: dict[str, Any] = Field(default_factory=dict)
    inventory: list[str] = Field(default_factory=list)
    network: dict[str, Any] = Field(default_factory=dict)
    host_settings: dict[str, Any] = Field(default_factory=dict)
    traffic: dict[str, Any] = Field(default_factory=dict)
    times: dict[str, Any] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    configure: dict[str, Any] | None = None
    hosts: dict[str, Any] | None = None
    delay: dict[str, Any] | None = None
    markers: dict[str, Any] | None = None
    watch: dict[str, Any] | None = None
    files: dict[str, Any] | None = None
    capture: dict[str, Any] | None = None
    overhead_s: float | None = None
    overhead_phases_s: dict[str, float] | None = None

    def dump(self) -> str:
        """The record as trial.json holds it: the keys that were set, indented."""
        fields = self.model_dump(mode="json", exclude_unset=True)
        return json.dumps(fields, indent=2, sort_keys=True) + "\n"


def new_record(**fields: Any) -> dict[str, Any]:
    """The first form of a trial record, as the runner begins to fill it in: checked against
    the model, stamped with this code's format version."""
    TrialRecord.model_validate(fields)
    return {"format_version": FORMAT_VERSION, **fields}


def dump_record(record: dict[str, Any]) -> str:
    """trial.json's text for a record the runner has filled in (validated against the model;
    values JSON has no type for, such as paths, are written as text)."""
    plain = json.loads(json.dumps(record, default=str))
    return TrialRecord.model_validate(plain).dump()


def read_record(path: Path) -> TrialRecord:
    """A trial.json of any format version; OSError or ValueError (pydantic's ValidationError
    is one) when it is missing or is not a trial record."""
    return TrialRecord.model_validate_json(path.read_bytes())
