"""Experiment files: parsed into typed, frozen objects, or rejected with a clear message.

A message names the file, the key and what is allowed, before any host is touched.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from trials.units import parse_bytes, parse_duration_ns, parse_rate

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

RateBps = Annotated[int, BeforeValidator(parse_rate), PlainSerializer(lambda v: f"{v}bit")]
Bytes = Annotated[int, BeforeValidator(parse_bytes), PlainSerializer(lambda v: f"{v}B")]
DurationNs = Annotated[
    int, BeforeValidator(parse_duration_ns), PlainSerializer(lambda v: f"{v / 1e6:g}ms")
]


class SpecError(ValueError):
    """An experiment file that cannot be run as written."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


class Factors(_Strict):
    """The matrix: every combination of these values is one trial (times repetitions)."""

    cc: Annotated[list[str], BeforeValidator(_as_list), Field(min_length=1)]
    rtt_ms: Annotated[
        list[Annotated[float, Field(ge=0, le=10_000)]],
        BeforeValidator(_as_list),
        Field(min_length=1),
    ]
    flows: Annotated[
        list[Annotated[int, Field(ge=1, le=128)]], BeforeValidator(_as_list), Field(min_length=1)
    ]

    @field_validator("cc")
    @classmethod
    def _known_cc(cls, values: list[str]) -> list[str]:
        for v in values:
            if v not in LINUX_CC:
                raise ValueError(
                    f"unknown congestion control {v!r}; allowed: {', '.join(LINUX_CC)}"
                )
        return values


class Roles(_Strict):
    """Which inventory hosts play which part (the seed-000 dumbbell by default)."""

    router: str = "R"
    tcp_sender: str = "A"
    tcp_receiver: str = "C"
    udp_sender: str = "B"
    udp_receiver: str = "D"


class UdpStream(_Strict):
    """The VoIP-like flow: fixed-size IP packets at a fixed interval, replayed by tcpreplay."""

    packet_bytes: int = Field(186, ge=28, le=1500, description="IP packet size (header included)")
    interval: DurationNs = Field(default=parse_duration_ns("20ms"))
    port: int = Field(40000, ge=1, le=65535)


class Capture(_Strict):
    snaplen: int = Field(128, ge=96, le=65535)


class Experiment(_Strict):
    """One experiment file."""

    experiment: Literal["collateral_damage"]
    description: str = ""
    rate: RateBps
    buffer: Bytes
    duration: DurationNs
    warmup: DurationNs = Field(
        default=parse_duration_ns("5s"), description="start of the steady-state goodput window"
    )
    factors: Factors
    repetitions: int = Field(1, ge=1, le=100)
    seed: int = 1
    cc_params: dict[str, dict[str, int | str]] = Field(default_factory=dict)
    hosts: Roles = Field(default_factory=Roles)
    udp: UdpStream = Field(default_factory=UdpStream)
    capture: Capture = Field(default_factory=Capture)
    tcp_port: int = Field(5201, ge=1, le=65535)

    @field_validator("cc_params")
    @classmethod
    def _cc_params(cls, value: dict[str, dict[str, int | str]]) -> dict[str, dict[str, int | str]]:
        for name in value:
            if name not in LINUX_CC:
                raise ValueError(
                    f"unknown congestion control {name!r}; allowed: {', '.join(LINUX_CC)}"
                )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Experiment:
        if self.warmup >= self.duration:
            raise ValueError(
                f"warmup ({self.warmup / 1e9:g} s) must be shorter than duration "
                f"({self.duration / 1e9:g} s)"
            )
        frame = self.udp.packet_bytes + 14
        if self.buffer < 1514:
            raise ValueError(f"buffer ({self.buffer} B) must hold at least one full frame (1514 B)")
        if frame * 8 * 1e9 / self.udp.interval >= self.rate:
            raise ValueError(
                "the UDP stream alone would fill the bottleneck: lower udp.packet_bytes "
                "or raise udp.interval or rate"
            )
        return self

    def trials(self) -> list[Trial]:
        """Every trial of the matrix, in a seeded random order (so that slow drifts of the
        rack do not line up with one factor)."""
        combos = itertools.product(
            self.factors.cc, self.factors.rtt_ms, self.factors.flows, range(1, self.repetitions + 1)
        )
        out = [
            Trial(experiment=self, cc=cc, rtt_ms=rtt, flows=flows, repetition=rep)
            for cc, rtt, flows, rep in combos
        ]
        random.Random(self.seed).shuffle(out)
        return out

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]


class Trial(BaseModel):
    """One point of the matrix with every parameter resolved."""

    model_config = ConfigDict(frozen=True)

    experiment: Experiment
    cc: str
    rtt_ms: float
    flows: int
    repetition: int

    @property
    def name(self) -> str:
        return f"{self.cc}-rtt{self.rtt_ms:g}ms-{self.flows}flow-r{self.repetition}"

    @property
    def one_way_delay_ms(self) -> float:
        return self.rtt_ms / 2

    def parameters(self) -> dict[str, Any]:
        """The resolved parameters as recorded in trial.json."""
        exp = self.experiment.model_dump(mode="json", exclude={"factors", "repetitions"})
        return {
            **exp,
            "cc": self.cc,
            "rtt_ms": self.rtt_ms,
            "flows": self.flows,
            "repetition": self.repetition,
            "cc_params": self.experiment.cc_params.get(self.cc, {}),
        }


def _format_errors(path: Path, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in e["loc"]).replace(
            ".[", "["
        )
        where = f"key '{key}'" if key else "keys"
        if e["type"] == "extra_forbidden":
            model = _model_at(e["loc"][:-1])
            allowed = ", ".join(model.model_fields) if model else "see experiments/*.yml"
            lines.append(f"{path}: unknown key '{key}'; allowed here: {allowed}")
        elif e["type"] == "missing":
            lines.append(f"{path}: key '{key}' is required")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{path}: {where}: {msg}")
    return "\n".join(lines)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Experiment
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        model = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
    return model


def load_experiment(path: str | Path) -> Experiment:
    """Parse and validate an experiment file; raise SpecError naming the file and key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such experiment file") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping of keys at the top level")
    try:
        return Experiment.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_format_errors(path, exc)) from None


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"
