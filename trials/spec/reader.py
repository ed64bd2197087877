"""Experiment files and `--set` values read as YAML within limits, so that any input (a
multi-GB file, /dev/zero, binary data, a deeply nested or alias-bombed document) is refused in
a fraction of a second with bounded memory, naming the file, the line and the limit.

The size is checked before reading; depth, entries per list or mapping, values in all
(aliases expanded), length of one value and mapping keys on libyaml's event stream, before a
single object is built. Then the document is built by a safe loader that refuses a key given
twice, and the line of every key is kept for the error messages (`Loaded.lines`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trials.spec.errors import Lines, SpecError

# The limits, with the reasons (the shipped files: at most 3.1 kB, 6 levels, 12 entries in one
# list or mapping, 387 values, 82 characters in one value).
MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 16
MAX_ENTRIES = 1000
MAX_VALUES = 10_000
MAX_VALUE_CHARS = 10_000
MAX_NUMBER_CHARS = 40
LIMITS = {
    "file size": (f"{MAX_FILE_BYTES} bytes", "256 KiB: 80 times the largest shipped file"),
    "nesting depth": (
        f"{MAX_DEPTH} levels",
        "twice the deepest the schema needs: a factor whose levels are whole link lists",
    ),
    "entries of one list or mapping": (
        f"{MAX_ENTRIES}",
        "a rack has tens of hosts, links and flows; a factor's levels fit too",
    ),
    "values in the file": (
        f"{MAX_VALUES}, aliases expanded",
        "25 times the largest shipped file, and an alias cannot multiply it",
    ),
    "characters of one value": (f"{MAX_VALUE_CHARS}", "a long description"),
    "characters of one number": (f"{MAX_NUMBER_CHARS}", "a 63-bit seed has 19 digits"),
}

_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when built


class _UniqueKeyLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """safe_load, but a key given twice in one mapping is an error (PyYAML keeps the last
    one silently: a second `duration:` would win over the first without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node)
            first = seen.get(key)
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} given twice (first on line {first + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


@dataclass
class Loaded:
    """A document and the line of each key in it."""

    data: Any
    lines: Lines


@dataclass
class _Open:
    """A list or mapping whose end has not come yet."""

    anchor: str | None
    mapping: bool
    entries: int = 0
    values: int = 1
    height: int = 0


def _over(source: object, mark: Any, what: str, found: str) -> SpecError:
    limit, why = LIMITS[what]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return SpecError(f"{source}: {where}{what}: {found}; allowed: at most {limit} ({why})")


def _check_events(events: Any, source: object) -> None:
    """Raise SpecError at the first event beyond a limit (the events are a flat stream: no
    recursion, and nothing built yet)."""
    resolver = yaml.resolver.Resolver()
    stack: list[_Open] = []
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (values, height) of its node
    total = 0
    for event in events:
        if isinstance(event, yaml.NodeEvent):
            parent = stack[-1] if stack else None
            if parent is not None:
                if (
                    parent.mapping
                    and parent.entries % 2 == 0
                    and not isinstance(event, yaml.ScalarEvent | yaml.AliasEvent)
                ):
                    raise SpecError(
                        f"{source}: line {event.start_mark.line + 1}, column "
                        f"{event.start_mark.column + 1}: a key must be a plain value, not a "
                        "list or mapping"
                    )
                parent.entries += 1
                if parent.entries > MAX_ENTRIES * (2 if parent.mapping else 1):
                    found = f"more than {MAX_ENTRIES}"
                    raise _over(source, event.start_mark, "entries of one list or mapping", found)
        if isinstance(event, yaml.CollectionStartEvent):
            total += 1
            if len(stack) + 1 > MAX_DEPTH:
                found = f"more than {MAX_DEPTH} levels"
                raise _over(source, event.start_mark, "nesting depth", found)
            stack.append(_Open(event.anchor, isinstance(event, yaml.MappingStartEvent)))
        elif isinstance(event, yaml.CollectionEndEvent):
            done = stack.pop()
            if done.anchor:
                anchors[done.anchor] = (done.values, done.height + 1)
            if stack:
                stack[-1].values += done.values
                stack[-1].height = max(stack[-1].height, done.height + 1)
        elif isinstance(event, yaml.ScalarEvent):
            total += 1
            _check_scalar(event, resolver, source)
            if event.anchor:
                anchors[event.anchor] = (1, 0)
            if stack:
                stack[-1].values += 1
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor not in anchors:
                raise SpecError(
                    f"{source}: line {event.start_mark.line + 1}, column "
                    f"{event.start_mark.column + 1}: not valid YAML: alias *{event.anchor} "
                    "refers to a node that contains it, or to no anchor before it"
                )
            values, height = anchors[event.anchor]
            total += values
            if len(stack) + height > MAX_DEPTH:
                found = (
                    f"alias *{event.anchor} nests the document more than {MAX_DEPTH} levels deep"
                )
                raise _over(source, event.start_mark, "nesting depth", found)
            if stack:
                stack[-1].values += values
                stack[-1].height = max(stack[-1].height, height)
        if total > MAX_VALUES:
            found = f"more than {MAX_VALUES}"
            raise _over(source, getattr(event, "start_mark", None), "values in the file", found)


def _check_scalar(
    event: yaml.ScalarEvent, resolver: yaml.resolver.Resolver, source: object
) -> None:
    value = event.value
    if len(value) > MAX_VALUE_CHARS:
        found = f"{len(value)}"
        raise _over(source, event.start_mark, "characters of one value", found)
    if len(value) > MAX_NUMBER_CHARS and event.implicit[0]:
        tag = resolver.resolve(yaml.ScalarNode, value, event.implicit)
        if tag.endswith((":int", ":float")):
            found = f"{len(value)}"
            raise _over(source, event.start_mark, "characters of one number", found)


def _key_lines(root: yaml.Node) -> dict[tuple[str | int, ...], int]:
    """Path -> line (1-based) of every key and list element under root."""
    lines: dict[tuple[str | int, ...], int] = {}
    todo: list[tuple[tuple[str | int, ...], yaml.Node]] = [((), root)]
    while todo:
        path, node = todo.pop()
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    here = (*path, key_node.value)
                    lines.setdefault(here, key_node.start_mark.line + 1)
                    todo.append((here, value_node))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                here = (*path, i)
                lines.setdefault(here, item.start_mark.line + 1)
                todo.append((here, item))
    return lines


def _not_yaml(source: object, exc: yaml.YAMLError, text: str) -> SpecError:
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not take
        pos = int(exc.position)
        line, column = text.count("\n", 0, pos) + 1, pos - text.rfind("\n", 0, pos)
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return SpecError(
            f"{source}: line {line}, column {column}: not valid YAML: character U+{code:04X}: "
            f"{exc.reason}"
        )
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        context = ""
        if exc.problem and exc.context and exc.context_mark:
            start = exc.context_mark
            context = f" ({exc.context}, from line {start.line + 1}, column {start.column + 1})"
        return SpecError(f"{source}: {where}not valid YAML: {exc.problem or exc.context}{context}")
    return SpecError(f"{source}: not valid YAML: {exc}")


def load_text(text: str, source: object) -> Loaded:
    """Parse YAML text within the limits; SpecError names the source, line and limit."""
    try:
        _check_events(yaml.parse(text, Loader=_UniqueKeyLoader), source)
        loader = _UniqueKeyLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return Loaded(None, Lines())
            lines = _key_lines(node)
            return Loaded(loader.construct_document(node), Lines(lines))
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise _not_yaml(source, exc, text) from None


def read_file(path: Path) -> Loaded:
    """Read an experiment file within the limits (the size before a byte is parsed)."""
    try:
        with path.open("rb") as f:
            info = os.fstat(f.fileno())
            if stat.S_ISREG(info.st_mode) and info.st_size > MAX_FILE_BYTES:
                raise _over(path, None, "file size", f"{info.st_size} bytes")
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{path}: no such experiment file") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: a directory, not an experiment file") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_FILE_BYTES:
        raise _over(path, None, "file size", f"more than {MAX_FILE_BYTES} bytes")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise SpecError(f"{path}: not a text file (byte {nul} is NUL)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None
    return load_text(text, path)
