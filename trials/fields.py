"""Field types shared by the experiment schema and the traffic generators' specs: units are
parsed once into integers (bit/s, bytes, ns) and written back in their shortest exact form."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, PlainValidator

from core.units import (
    Buffer,
    format_duration,
    format_rate,
    parse_buffer,
    parse_bytes,
    parse_duration_ns,
    parse_offset_ns,
    parse_rate,
)

# Congestion controls Linux has (built in or as modules); whether a host has one is checked
# against the host itself by the preflight.
LINUX_CC = (
    "reno",
    "cubic",
    "htcp",
    "bbr",
    "bic",
    "dctcp",
    "highspeed",
    "hybla",
    "illinois",
    "lp",
    "nv",
    "scalable",
    "vegas",
    "veno",
    "westwood",
    "yeah",
    "cdg",
)
RateBps = Annotated[int, BeforeValidator(parse_rate), PlainSerializer(format_rate)]
Bytes = Annotated[int, BeforeValidator(parse_bytes), PlainSerializer(lambda v: f"{v}B")]
DurationNs = Annotated[int, BeforeValidator(parse_duration_ns), PlainSerializer(format_duration)]
OffsetNs = Annotated[int, BeforeValidator(parse_offset_ns), PlainSerializer(format_duration)]
BufferSize = Annotated[Buffer, PlainValidator(parse_buffer), PlainSerializer(str)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,31}$")]


def _known_cc(value: str) -> str:
    if value not in LINUX_CC:
        raise ValueError(f"unknown congestion control {value!r}; allowed: {', '.join(LINUX_CC)}")
    return value


CongestionControl = Annotated[str, BeforeValidator(_known_cc)]


class Strict(BaseModel):
    """Frozen, and every key it does not know is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
