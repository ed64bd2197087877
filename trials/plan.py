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
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trials.spec import (
    Experiment,
    SpecError,
    load_text,
    parse_key,
    read_file,
    validate,
)
from trials.spec.errors import Path as KeyPath
from trials.spec.errors import key_text, printable

__all__ = ["Plan", "Trial", "load_plan", "parse_key", "parse_set", "set_key"]

# Keys that describe the matrix itself and do not make two trials differ.
_NOT_PARAMETERS = {"factors", "repetitions", "seed", "description", "name", "report"}
# The most trials one file may plan: 80 times the largest shipped plan (diffserv.yml, 120);
# at a minute each, a week of one rack. Each is validated when the plan is made.
MAX_TRIALS = 10_000
# A trial's name is a directory name on the controller and on every host (255 bytes at most),
# with room for what is added to it (attempts/<name>/<n>-<status>).
MAX_TRIAL_NAME = 200
_MISSING = object()  # a mapping key the file does not have yet (set_key adds it)


def key_targets(raw: Any, key: str) -> list[KeyPath]:
    """The paths in the raw (unvalidated) experiment that `key` addresses, indices made
    non-negative: two spellings of one setting give the same paths."""
    parts = parse_key(key)
    found: list[KeyPath] = []

    def element_name(item: Any, index: int) -> Any:
        return (
            item.get("name", f"{item.get('type', '')}{index}") if isinstance(item, dict) else None
        )

    def walk(node: Any, rest: list[str | int], done: KeyPath) -> None:
        head, tail = rest[0], rest[1:]
        if isinstance(head, str) and not head.startswith("["):
            if node is not _MISSING and not isinstance(node, dict):
                raise ValueError(
                    f"{key_text(done) or 'the file'} is not a mapping, cannot set {key!r}"
                )
            here = (*done, head)
            if not tail:
                found.append(here)
            else:
                walk(node.get(head, _MISSING) if isinstance(node, dict) else _MISSING, tail, here)
            return
        if not isinstance(node, list):
            raise ValueError(f"'{key_text(done)}' is not a list, cannot index it in {key!r}")
        if isinstance(head, int):
            if not -len(node) <= head < len(node):
                raise ValueError(
                    f"'{key_text(done)}' has {len(node)} entries; {key!r} indexes beyond it"
                )
            indices = [head % len(node)]
        elif head == "[*]":
            indices = list(range(len(node)))
        else:
            wanted = head[1:-1]
            indices = [i for i, item in enumerate(node) if element_name(item, i) == wanted]
            if not indices:
                names = ", ".join(_said(element_name(item, i)) for i, item in enumerate(node))
                raise ValueError(
                    f"'{key_text(done)}' has no entry named {wanted!r}; it has: {names}"
                )
        for i in indices:
            if not tail:
                found.append((*done, i))
            else:
                walk(node[i], tail, (*done, i))

    walk(raw, parts, ())
    return found


def set_key(raw: dict[str, Any], key: str, value: Any) -> list[KeyPath]:
    """Set `key` in the raw (unvalidated) experiment, in place; the paths it set."""
    paths = key_targets(raw, key)
    for path in paths:
        node: Any = raw
        for part in path[:-1]:
            node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
        node[path[-1]] = copy.deepcopy(value)
    return paths


def parse_set(text: str) -> tuple[str, Any]:
    """'duration=20s' -> ('duration', '20s'); the value is read as YAML (numbers, lists),
    within the limits of an experiment file; text that is not YAML stays text."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError("write KEY=VALUE, e.g. --set duration=20s")
    try:
        return key.strip(), load_text(value, f"--set {key.strip()}").data
    except SpecError as exc:
        if "not valid YAML" in str(exc):
            return key.strip(), value
        raise ValueError(str(exc).removeprefix(f"--set {key.strip()}: ")) from None


def _overlap(a: KeyPath, b: KeyPath) -> bool:
    """One path is the other or holds it."""
    return a[: len(b)] == b or b[: len(a)] == a


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
                levels = ", ".join(f"{_said(k)}={_said(v)}" for k, v in t.overrides.items())
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
    text = (
        value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    )
    return re.sub(r"[^A-Za-z0-9.+]+", "", text) or "none"


def trial_id(exp: Experiment, repetition: int) -> str:
    params = exp.model_dump(mode="json", by_alias=True, exclude=_NOT_PARAMETERS)
    blob = json.dumps({"parameters": params, "repetition": repetition}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# Factors may not vary what describes the matrix, nor the rack a batch runs on.
_NOT_FACTORS = {*_NOT_PARAMETERS, "topology"}


def _canonical(value: Any) -> str:
    """One text per level, whatever order its mappings were written in."""
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except TypeError:  # keys of several types (1 and 'a') cannot be sorted
        return repr(value)


def _check_factors(levels: dict[str, list[Any]], path: Path) -> None:
    """SpecError for a factor whose key is not a key, names the matrix itself or the
    topology, or whose levels are none or repeat one another."""
    for key, values in levels.items():
        where = f"{path}: key 'factors.{_said(key)}'"
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
        texts = [_canonical(v) for v in values]
        twice = sorted({t for t in texts if texts.count(t) > 1})
        if twice:
            raise SpecError(f"{where}: level {', '.join(twice)} given more than once")


def _repetitions(value: Any, path: Path) -> int:
    """``repetitions`` of a file that is judged trial by trial: a whole number of at least 1."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise SpecError(f"{path}: key 'repetitions': {value!r} is not a whole number of at least 1")


@dataclass
class _Setting:
    """One --set of the command line, and the paths of the file it changed."""

    text: str
    key: str
    paths: list[KeyPath]


def _apply_sets(
    raw: dict[str, Any], sets: list[str] | tuple[str, ...], path: Path
) -> list[_Setting]:
    """Apply --set KEY=VALUE in order, in place. A value for a factor's own key replaces the
    factor; `factors.<key>=[levels]` makes one; `factors=...` replaces them all."""
    applied: list[_Setting] = []
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
            changed = set_key(raw, key, value)  # `factors={...}` replaces them all
        except ValueError as exc:
            raise SpecError(f"{path}: --set {_said(text)}: {exc}") from None
        for earlier in applied:
            both = next((p for p in changed for q in earlier.paths if _overlap(p, q)), None)
            if both is not None:
                raise SpecError(
                    f"{path}: --set {_said(text)}: {key_text(both)} is already set by "
                    f"--set {_said(earlier.text)}; set it once"
                )
        applied.append(_Setting(text, key, changed))
    return applied


def _factor_paths(
    raw: dict[str, Any], keys: list[str], settings: list[_Setting], path: Path
) -> dict[str, list[KeyPath]]:
    """The paths each factor varies; SpecError where two factors, or a factor and a --set,
    address one setting (two spellings of one key: the trial ids would repeat, and one would
    silently override the other)."""
    targets: dict[str, list[KeyPath]] = {}
    for key in keys:
        try:
            targets[key] = key_targets(raw, key)
        except ValueError as exc:
            raise SpecError(f"{path}: key 'factors.{_said(key)}': {exc}") from None
        for other, paths in targets.items():
            both = next(
                (p for p in targets[key] for q in paths if other != key and _overlap(p, q)), None
            )
            if both is not None:
                raise SpecError(
                    f"{path}: key 'factors.{_said(key)}': it varies {key_text(both)}, as "
                    f"factors.{_said(other)} does; give one factor for one setting"
                )
        for setting in settings:
            both = next((p for p in targets[key] for q in setting.paths if _overlap(p, q)), None)
            if both is not None:
                raise SpecError(
                    f"{path}: --set {_said(setting.text)}: {key_text(both)} is varied by "
                    f"factors.{_said(key)}; replace the factor with --set "
                    f"{_said(key)}=VALUE, or leave it"
                )
    return targets


def _said(text: Any) -> str:
    """A key or a --set from the file or the command line as a message shows it: one line,
    cut short."""
    said = printable(str(text))
    return said if len(said) <= 80 else f"{said[:70]}...{said[-5:]}"


def _level(value: Any) -> str:
    """A factor level as a message shows it: JSON, cut short."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else f"{text[:55]}...{text[-3:]}"


def _check_trials(trials: list[Trial], path: Path) -> None:
    """Every trial has a name and an id of its own: two levels that mean the same (1mbit
    and 1000kbit) or names that fold together (a-b, ab) would overwrite each other."""
    for what, attr in (("name", "name"), ("id", "id")):
        seen: dict[str, Trial] = {}
        for t in trials:
            value = getattr(t, attr)
            if value == "-":  # no id: these overrides do not validate
                continue
            first = seen.setdefault(value, t)
            if first is not t:
                differ = [
                    f"{_said(k)}: {_level(first.overrides[k])} and {_level(t.overrides[k])}"
                    for k in t.overrides
                    if first.overrides[k] != t.overrides[k]
                ]
                raise SpecError(
                    f"{path}: key 'factors': trials {first.name} and {t.name} have one {what} "
                    f"({value}): levels {'; '.join(differ)} give one trial; give each level once"
                )
        if attr == "name":
            long = next((t for t in trials if len(t.name) > MAX_TRIAL_NAME), None)
            if long is not None:
                raise SpecError(
                    f"{path}: key 'factors': trial name {long.name[:40]}... has {len(long.name)} "
                    f"characters; allowed: at most {MAX_TRIAL_NAME} (a directory name on every "
                    "host); use shorter levels"
                )


def load_plan(path: str | Path, sets: list[str] | tuple[str, ...] = ()) -> Plan:
    """Read, override, validate and expand an experiment file; raise SpecError naming the
    file and the key."""
    path = Path(path)
    loaded = read_file(path)
    raw = loaded.data
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping of keys at the top level")
    settings = _apply_sets(raw, sets, path)
    lines = loaded.lines.with_changes({p: None for s in settings for p in s.paths})
    factors = dict(raw["factors"]) if isinstance(raw.get("factors"), dict) else None
    factor_levels = {k: v if isinstance(v, list) else [v] for k, v in (factors or {}).items()}
    _check_factors(factor_levels, path)
    factor_paths = _factor_paths(raw, list(factor_levels), settings, path)
    combinations = math.prod(len(v) for v in factor_levels.values())
    if combinations > MAX_TRIALS:
        raise SpecError(
            f"{path}: key 'factors': {combinations} combinations of levels; allowed: at most "
            f"{MAX_TRIALS} trials in one plan"
        )
    try:
        base: Experiment | None = validate(raw, path, lines)
    except SpecError as exc:
        if sets:  # say that the file was changed before it was judged
            changed = " ".join(_said(s) for s in sets)
            exc = SpecError(f"{exc}\n  (the file as changed by --set {changed})")
        # The file as written may be invalid only where factors override it (e.g. a late
        # joiner's start beyond a shortened duration): then each trial is judged alone.
        if not factors:
            raise exc from None
        base, base_error = None, exc
    repetitions = base.repetitions if base else _repetitions(raw.get("repetitions", 1), path)
    if combinations * repetitions > MAX_TRIALS:
        raise SpecError(
            f"{path}: key 'repetitions': {combinations} combinations x {repetitions} "
            f"repetitions = {combinations * repetitions} trials; allowed: at most {MAX_TRIALS}"
        )
    trials: list[Trial] = []
    keys = list(factor_levels)
    labels = _labels(keys)
    factor_lines = lines.with_changes(
        {p: loaded.lines.at.get(("factors", k)) for k in keys for p in factor_paths[k]}
    )
    for combo in itertools.product(*factor_levels.values()):
        trial_raw = copy.deepcopy(raw)
        overrides = dict(zip(keys, combo, strict=True))
        for key, value in overrides.items():
            try:
                set_key(trial_raw, key, value)
            except ValueError as exc:
                raise SpecError(f"{path}: key 'factors.{_said(key)}': {exc}") from None
        exp, error = None, None
        try:
            exp = validate(trial_raw, path, factor_lines)
        except SpecError as exc:
            error = str(exc)  # select() says which factor levels it comes with
        stem = "_".join(f"{labels[k]}-{_value_text(v)}" for k, v in overrides.items())
        for rep in range(1, repetitions + 1):
            name = f"{stem}_r{rep}" if stem else f"r{rep}"
            tid = trial_id(exp, rep) if exp else "-"
            trials.append(Trial(exp, overrides, rep, name, tid, error))
    _check_trials(trials, path)
    if base is None:
        valid = [t.experiment for t in trials if t.experiment is not None]
        if not valid:
            raise base_error
        base = valid[0]
    random.Random(base.seed).shuffle(trials)
    return Plan(path, base, trials)
