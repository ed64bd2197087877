"""The trial record (trial.json) as a typed model: what a trial was, how it ran, what came back.

The runner fills it in as the trial goes; everything that reads a trial record reads it through
``read_record`` (the model) or ``load_record`` (its keys as written), which also take records
written before they carried a ``format_version`` (version 1: the same keys, none required
beyond the trial's name), and refuse a file that is not a record, naming it and why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.layout import FORMAT_VERSION

Status = Literal["running", "complete", "failed", "interrupted"]
# A record holds a trial's settings, facts and errors: tens of kB. A larger file is not one
# (and is not read whole to find that out).
MAX_RECORD_BYTES = 64 << 20


UNREADABLE = "unreadable"  # the status given to a trial whose record cannot be read


class RecordError(ValueError):
    """A trial.json that is not a trial record (missing, cut short, another file): the
    message names the file and what is wrong with it."""


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
    """A trial.json of any format version; RecordError when it is not a trial record."""
    return TrialRecord.model_validate(load_record(path))


def load_record(path: Path) -> dict[str, Any]:
    """trial.json's keys as written, once they are known to make a trial record (of any
    format version); RecordError naming the file and what is wrong otherwise."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
    except OSError as exc:
        raise RecordError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    what = "a trial record is the JSON object trialbed writes (trial, status, times, ...)"
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"{path}: larger than {MAX_RECORD_BYTES >> 20} MB; {what}")
    try:
        value = json.loads(data.decode())
    except UnicodeDecodeError as exc:
        raise RecordError(f"{path}: not UTF-8 text (byte {exc.start}); {what}") from None
    except json.JSONDecodeError as exc:
        raise RecordError(
            f"{path}: not JSON ({exc.msg}: line {exc.lineno}, column {exc.colno}; cut short "
            f"or another file); {what}"
        ) from None
    if not isinstance(value, dict):
        raise RecordError(f"{path}: holds a JSON {type(value).__name__}; {what}")
    try:
        TrialRecord.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise RecordError(f"{path}: key {key!r}: {first['msg']}; {what}") from None
    return value
