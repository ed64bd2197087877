"""The message of a file that does not validate: one line per problem, each naming the file,
the key, its line where known, the value and what is allowed there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from trials.fields import shown
from trials.generators import GENERATOR_TYPES
from trials.spec.errors import Lines, error_path, key_text, parse_key, printable
from trials.spec.experiment import Experiment

_LEADING_KEY = re.compile(
    r"(?:Value error, )?([A-Za-z_]\w*(?:\[[^\]]+\])*(?:\.[A-Za-z_]\w*(?:\[[^\]]+\])*)*)(?::| \()"
)
# pydantic's own errors whose message does not show the value that was given
_SHOW_INPUT = ("literal_error", "_type", "_parsing", "string_too_", "too_short", "too_long")


def _leading_key(msg: str) -> str | None:
    """The key a message of a check across keys begins with ('traffic[1].start (15 s) ...')."""
    m = _LEADING_KEY.match(msg)
    if m is None:
        return None
    try:
        parse_key(m[1])
    except ValueError:
        return None
    return m[1]


def format_errors(
    source: str | Path, err: ValidationError, prefix: str = "", lines: Lines | None = None
) -> str:
    out = []
    for e in err.errors():
        path = error_path(e)
        msg = e["msg"].removeprefix("Value error, ")
        if not path and (named := _leading_key(msg)):
            path = tuple(parse_key(named))
        key = key_text(path)
        if prefix:
            key = f"{prefix}.{key}" if key and not key.startswith("[") else f"{prefix}{key}"
        where = f"key '{key}'" if key else "keys"
        if e["type"] == "extra_forbidden":
            text = f"unknown key '{key}'; allowed here: {_allowed_at(e['loc'])}"
        elif e["type"] == "missing":
            text = f"key '{key}' is required"
        elif e["type"] == "union_tag_invalid":
            text = f"{where}: {msg}"
        elif e["type"] == "union_tag_not_found":  # a generator without its type
            text = f"{where}: needs a type; the types are: {', '.join(GENERATOR_TYPES)}"
        elif any(part in e["type"] for part in _SHOW_INPUT):
            text = f"{where}: {msg}, not {shown(e.get('input'))}"
        else:
            text = f"{where}: {msg}"
        line = lines.of(path) if lines is not None and not prefix else None
        out.append(f"{source}: {printable(text)}" + (f" (line {line})" if line else ""))
    return "\n".join(dict.fromkeys(out))


def _allowed_at(loc: tuple[Any, ...]) -> str:
    """Field names (as written in files) of the model that holds the unknown key."""
    model: Any = Experiment
    mapping_key = False  # the part before was a mapping of names (hosts): this is a name
    for part in loc[:-1]:
        if isinstance(part, int) or mapping_key:
            mapping_key = False
            continue
        if part in GENERATOR_TYPES:
            model = GENERATOR_TYPES[part].spec_class
            continue
        field = model.model_fields.get(part) if isinstance(model, type) else None
        if field is None:
            # a key written under its alias (from)
            field = (
                next((f for f in model.model_fields.values() if f.alias == part), None)
                if isinstance(model, type)
                else None
            )
        if field is None:
            return "see experiments/*.yml"
        model = _inner_model(field.annotation)
        if model is None:
            return "see experiments/*.yml"
        mapping_key = _is_mapping(field.annotation)
    return ", ".join(f.alias or n for n, f in model.model_fields.items())


def _is_mapping(annotation: Any) -> bool:
    """Whether the annotation is (or allows) a dict: its keys are names, not fields."""
    if get_origin(annotation) is dict:
        return True
    return any(_is_mapping(arg) for arg in get_args(annotation))


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None
