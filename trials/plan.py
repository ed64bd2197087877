"""From an experiment file to its trials: `--set` overrides, factors over any dotted key,
readable names, stable ids, a seeded order, `--only` selection.

A key is dotted with list indices: `duration`, `traffic[0].cc`, `hosts.senders.initcwnd`,
`network.links[*].delay` (every element), `network.links[bottleneck].buffer` (the element
whose name is `bottleneck`). Each trial is the file with its overrides applied, validated
like the file itself.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import itertools
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trials.spec import Experiment, SpecError, read_yaml, validate

_TOKEN = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[([^\]]+)\]")
# Keys that describe the matrix itself and do not make two trials differ.
_NOT_PARAMETERS = {"factors", "repetitions", "seed", "description", "name", "report"}


def parse_key(key: str) -> list[str | int]:
    """'traffic[0].cc' -> ['traffic', 0, 'cc']; '[*]' and '[name]' stay strings in brackets."""
    parts: list[str | int] = []
    pos = 0
    while pos < len(key):
        m = _TOKEN.match(key, pos)
        if not m or (pos == 0 and key.startswith(".")):
            raise ValueError(
                f"{key!r} is not a key; write dotted names with list indices, e.g. "
                "traffic[0].cc, hosts.senders.initcwnd, network.links[bottleneck].delay"
            )
        if m[1] is not None:
            parts.append(m[1])
        else:
            inner = m[2].strip()
            parts.append(int(inner) if inner.lstrip("-").isdigit() else f"[{inner}]")
        pos = m.end()
    return parts


def set_key(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` in the raw (unvalidated) experiment, in place."""
    parts = parse_key(key)

    def element_name(item: Any, index: int) -> Any:
        return (
            item.get("name", f"{item.get('type', '')}{index}") if isinstance(item, dict) else None
        )

    def walk(node: Any, rest: list[str | int], done: str) -> None:
        head, tail = rest[0], rest[1:]
        if isinstance(head, str) and not head.startswith("["):
            if not isinstance(node, dict):
                raise ValueError(f"{done or 'the file'} is not a mapping, cannot set {key!r}")
            if not tail:
                node[head] = copy.deepcopy(value)
                return
            node.setdefault(head, {})
            walk(node[head], tail, f"{done}.{head}".lstrip("."))
            return
        if not isinstance(node, list):
            raise ValueError(f"'{done}' is not a list, cannot index it in {key!r}")
        if isinstance(head, int):
            if not -len(node) <= head < len(node):
                raise ValueError(f"'{done}' has {len(node)} entries; {key!r} indexes beyond it")
            targets = [head]
        elif head == "[*]":
            targets = list(range(len(node)))
        else:
            wanted = head[1:-1]
            targets = [i for i, item in enumerate(node) if element_name(item, i) == wanted]
            if not targets:
                names = ", ".join(str(element_name(item, i)) for i, item in enumerate(node))
                raise ValueError(f"'{done}' has no entry named {wanted!r}; it has: {names}")
        for i in targets:
            if not tail:
                node[i] = copy.deepcopy(value)
            else:
                walk(node[i], tail, f"{done}[{i}]")

    walk(raw, parts, "")


def parse_set(text: str) -> tuple[str, Any]:
    """'duration=20s' -> ('duration', '20s'); the value is read as YAML (numbers, lists)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError("write KEY=VALUE, e.g. --set duration=20s")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        return key.strip(), value


@dataclass(frozen=True)
class Trial:
    """One point of the matrix: the validated experiment with its overrides applied."""

    experiment: Experiment | None  # None when these overrides do not validate (see error)
    overrides: dict[str, Any]  # factor key -> level, in file order
    repetition: int
    name: str
    id: str
    error: str | None = None  # why these overrides do not validate (select() adds which)

    def parameters(self) -> dict[str, Any]:
        """The resolved parameters as recorded in trial.json."""
        return self.experiment.model_dump(mode="json", by_alias=True, exclude={"factors"})


@dataclass
class Plan:
    source: Path
    base: Experiment
    trials: list[Trial] = field(default_factory=list)

    def select(self, patterns: list[str] | None) -> list[Trial]:
        """Trials whose name or id matches one of the patterns (fnmatch globs); a selected
        trial whose overrides do not validate is an error (an unselected one is not)."""
        chosen = self._match(patterns)
        broken: dict[str, list[str]] = {}  # message -> the factor levels of its trials
        for t in chosen:
            if t.error:
                levels = ", ".join(f"{k}={v}" for k, v in t.overrides.items())
                broken.setdefault(t.error, []).append(levels)
        if broken:
            lines = []
            for message, where in broken.items():
                where = [w for w in dict.fromkeys(where) if w]
                if len(where) == 1:
                    message += f" (in the trial with {where[0]})"
                elif where:  # one line, not one per trial
                    message += (
                        f" (in the trial with {where[0]}, and in {len(where) - 1} more trial(s))"
                    )
                lines.append(message)
            raise SpecError("\n".join(lines))
        return chosen

    def _match(self, patterns: list[str] | None) -> list[Trial]:
        if not patterns:
            return list(self.trials)
        chosen = [
            t
            for t in self.trials
            if any(fnmatch.fnmatchcase(t.name, p) or t.id == p for p in patterns)
        ]
        unmatched = [
            p
            for p in patterns
            if not any(fnmatch.fnmatchcase(t.name, p) or t.id == p for t in self.trials)
        ]
        if unmatched:
            raise SpecError(
                f"{self.source}: --only {', '.join(unmatched)} matches no trial; its trials are: "
                f"{', '.join(sorted(t.name for t in self.trials))}"
            )
        return chosen


def _labels(keys: list[str]) -> dict[str, str]:
    """A short label per factor key: its last name, made longer where two would collide."""

    def label(key: str, depth: int) -> str:
        parts = [str(p).strip("[]") for p in parse_key(key)]
        return ".".join(parts[-depth:]).replace("*", "all")

    out = {}
    for key in keys:
        depth = 1
        while any(label(other, depth) == label(key, depth) for other in keys if other != key):
            depth += 1
        out[key] = label(key, depth)
    return out


def _value_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return re.sub(r"[^A-Za-z0-9.+]+", "", text) or "none"


def trial_id(exp: Experiment, repetition: int) -> str:
    params = exp.model_dump(mode="json", by_alias=True, exclude=_NOT_PARAMETERS)
    blob = json.dumps({"parameters": params, "repetition": repetition}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# Factors may not vary what describes the matrix, nor the rack a batch runs on.
_NOT_FACTORS = {*_NOT_PARAMETERS, "topology"}


def _check_factors(levels: dict[str, list[Any]], path: Path) -> None:
    """SpecError for a factor whose key is not a key, names the matrix itself or the
    topology, or whose levels are none or repeat one another."""
    for key, values in levels.items():
        where = f"{path}: key 'factors.{key}'"
        try:
            parts = parse_key(key)
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None
        if parts[0] in _NOT_FACTORS:
            why = (
                "one batch runs on one rack; write a file per topology"
                if parts[0] == "topology"
                else "it describes the matrix, not a trial"
            )
            raise SpecError(f"{where}: {parts[0]} cannot be a factor ({why})")
        if not values:
            raise SpecError(f"{where}: no levels; give one value or a list of them")
        texts = [json.dumps(v, sort_keys=True, default=str) for v in values]
        twice = sorted({t for t in texts if texts.count(t) > 1})
        if twice:
            raise SpecError(f"{where}: level {', '.join(twice)} given more than once")


def _repetitions(value: Any, path: Path) -> int:
    """``repetitions`` of a file that is judged trial by trial: a whole number of at least 1."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise SpecError(f"{path}: key 'repetitions': {value!r} is not a whole number of at least 1")


def load_plan(path: str | Path, sets: list[str] | tuple[str, ...] = ()) -> Plan:
    """Read, override, validate and expand an experiment file; raise SpecError naming the
    file and the key."""
    path = Path(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping of keys at the top level")
    raw = copy.deepcopy(raw)
    for text in sets:
        try:
            key, value = parse_set(text)
            if key.startswith("factors.") and len(key) > len("factors."):
                # factors.<dotted key>=[levels]: one factor, whose key keeps its dots
                if not isinstance(raw.get("factors"), dict):
                    raw["factors"] = {}
                raw["factors"][key.removeprefix("factors.")] = value
                continue
            file_factors = raw.get("factors")
            if isinstance(file_factors, dict) and key in file_factors:
                # A single value set on the command line replaces the factor.
                raw["factors"] = {k: v for k, v in file_factors.items() if k != key}
            set_key(raw, key, value)  # `factors={...}` replaces them all
        except ValueError as exc:
            raise SpecError(f"{path}: --set {text}: {exc}") from None
    factors = dict(raw["factors"]) if isinstance(raw.get("factors"), dict) else None
    factor_levels = {k: v if isinstance(v, list) else [v] for k, v in (factors or {}).items()}
    _check_factors(factor_levels, path)
    try:
        base: Experiment | None = validate(raw, path)
    except SpecError as exc:
        if sets:  # say that the file was changed before it was judged
            exc = SpecError(f"{exc}\n  (the file as changed by --set {' '.join(sets)})")
        # The file as written may be invalid only where factors override it (e.g. a late
        # joiner's start beyond a shortened duration): then each trial is judged alone.
        if not factors:
            raise exc from None
        base, base_error = None, exc
    repetitions = base.repetitions if base else _repetitions(raw.get("repetitions", 1), path)
    trials: list[Trial] = []
    keys = list(factor_levels)
    labels = _labels(keys)
    for combo in itertools.product(*factor_levels.values()):
        trial_raw = copy.deepcopy(raw)
        overrides = dict(zip(keys, combo, strict=True))
        for key, value in overrides.items():
            try:
                set_key(trial_raw, key, value)
            except ValueError as exc:
                raise SpecError(f"{path}: key 'factors.{key}': {exc}") from None
        exp, error = None, None
        try:
            exp = validate(trial_raw, path)
        except SpecError as exc:
            error = str(exc)  # select() says which factor levels it comes with
        stem = "_".join(f"{labels[k]}-{_value_text(v)}" for k, v in overrides.items())
        for rep in range(1, repetitions + 1):
            name = f"{stem}_r{rep}" if stem else f"r{rep}"
            tid = trial_id(exp, rep) if exp else "-"
            trials.append(Trial(exp, overrides, rep, name, tid, error))
    if base is None:
        valid = [t.experiment for t in trials if t.experiment is not None]
        if not valid:
            raise base_error
        base = valid[0]
    random.Random(base.seed).shuffle(trials)
    return Plan(path, base, trials)
