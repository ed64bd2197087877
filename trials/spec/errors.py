"""Where a problem of an experiment file is: the error type, dotted key paths
(`network.links[0].rate`) to and from their parts, and the file line of each key.

A check across keys raises `At(key, message)` (a ValueError, so pydantic carries it) to name
the key at fault rather than the model that holds it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from trials.fields import shown
from trials.generators import GENERATOR_TYPES

Path = tuple[str | int, ...]
_LONGEST_PART = 60  # characters of one part of a key shown in a message


# What would break a message's line or rewrite a terminal: C0 and C1 controls, and what
# str.splitlines takes for a line end.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """Text from a file as one line of a message: control characters escaped (\\n, \\x1b)."""
    return _UNPRINTABLE.sub(lambda m: repr(m[0])[1:-1], text)


class SpecError(ValueError):
    """An experiment file that cannot be run as written."""


class At(ValueError):
    """A problem of the key `key`, relative to the model whose check raises it."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def require_unique(what: str, key: str, names: list[str]) -> None:
    """At the second element of the list `key` whose name repeats an earlier one."""
    for i, name in enumerate(names):
        if name in names[:i]:
            raise At(
                f"{key}[{i}]",
                f"{what} names must be unique; repeated: {name} (first at [{names.index(name)}])",
            )


_TOKEN = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[([^\]]*)\]")
_ELEMENT = re.compile(r"-?[0-9]+|\*|[A-Za-z][A-Za-z0-9_]{0,31}")


def parse_key(key: Any) -> list[str | int]:
    """'traffic[0].cc' -> ['traffic', 0, 'cc']; '[*]' and '[name]' stay strings in brackets."""
    text = key if isinstance(key, str) else ""
    parts: list[str | int] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        inner = m[2].strip() if m and m[2] is not None else None
        if (
            not m
            or (pos == 0 and text.startswith("."))
            or (inner is not None and not _ELEMENT.fullmatch(inner))
        ):
            parts = []
            break
        if m[1] is not None:
            parts.append(m[1])
        else:
            parts.append(int(inner) if inner.lstrip("-").isdigit() else f"[{inner}]")  # type: ignore[union-attr]
        pos = m.end()
    if not parts:
        raise ValueError(
            f"{shown(key)} is not a key; write dotted names with list indices, e.g. "
            "traffic[0].cc, hosts.senders.initcwnd, network.links[bottleneck].delay (an "
            "element by its index, by its name, or [*] for every one)"
        )
    return parts


def path_of(loc: Iterable[Any]) -> Path:
    """A pydantic error location as a path of the file: without the generator union's branch
    name and the marker of a mapping's key."""
    return tuple(p for p in loc if p not in GENERATOR_TYPES and p != "[key]")


def key_text(path: Iterable[Any]) -> str:
    """('traffic', 0, 'cc') -> 'traffic[0].cc' (a part of a hostile file's key cut short)."""

    def part(p: Any) -> str:
        text = printable(str(p))
        return text if len(text) <= _LONGEST_PART else f"{text[:_LONGEST_PART]}..."

    return "".join(f"[{p}]" if isinstance(p, int) else f".{part(p)}" for p in path).lstrip(".")


def join(base: Path, key: str) -> Path:
    """A key relative to `base` ('start', '[2].name') as one path."""
    return base + tuple(parse_key(key))


@dataclass
class Lines:
    """The line of each key in the file, and the keys --set or a factor changed (their value
    is not the file's: a factor's points to the factor's own line, --set's to none)."""

    at: dict[Path, int] = field(default_factory=dict)
    changed: dict[Path, int | None] = field(default_factory=dict)

    def of(self, path: Path) -> int | None:
        prefixes = [path[:n] for n in range(len(path), 0, -1)]
        for p in prefixes:
            if p in self.changed:
                return self.changed[p]
        return next((self.at[p] for p in prefixes if p in self.at), None)

    def with_changes(self, changes: dict[Path, int | None]) -> Lines:
        return Lines(self.at, {**self.changed, **changes})


def error_path(e: Any) -> Path:
    """The path of one pydantic error, taking the key an `At` names."""
    path = path_of(e["loc"])
    cause = (e.get("ctx") or {}).get("error")
    if isinstance(cause, At):
        path = join(path, cause.key)
    return path


def first_message(err: ValidationError) -> str:
    """The first error of a nested validation, as 'key: message' relative to its model."""
    e = err.errors()[0]
    key = key_text(error_path(e))
    msg = e["msg"].removeprefix("Value error, ")
    return f"{key}: {msg}" if key else msg
