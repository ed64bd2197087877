"""A paper's published values for an experiment family, kept as reference data beside its
module (analysis/families/<family>_paper.yml): tables in the paper's layout read into long
tables keyed like ours, and the orderings its text states. For display beside our
measurements, labelled as the paper's; never a test's expected value."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from analysis.lazy import pd

__all__ = ["REGIONS", "Ordering", "Published", "PublishedTable", "published"]

HERE = Path(__file__).resolve().parent
SUFFIX = "_paper.yml"


@dataclass(frozen=True)
class PublishedTable:
    title: str
    keys: list[str]  # our key columns, the paper's congestion control names mapped to ours
    values: list[str]  # our table's column each printed value stands for
    rows: Any  # pd.DataFrame: keys + values, one row per printed cell group
    applies: dict[str, Any]  # only beside trials whose column (analysis.load) has this value

    def applies_to(self, trials: Any) -> Any:
        """The trials (analysis.load rows) the table is about."""
        keep = pd.Series(True, index=trials.index)
        for column, value in self.applies.items():
            keep &= trials.get(column, pd.Series(None, index=trials.index)) == value
        return trials[keep]


@dataclass(frozen=True)
class Ordering:
    figure: str
    metric: str
    where: dict[str, list[Any]]  # group key -> the levels the statement is about ({}: all)
    by: str  # the column whose levels are ordered (cc: the paper's names of them)
    more: list[Any]  # levels, each above every one in `than`
    than: list[Any]
    says: str  # the paper's words
    # A frontier's statement: the levels compared at equal values of this metric, along each
    # level's curve (one point per setting), not setting by setting; None: setting by setting.
    against: str | None = None
    region: str | None = None  # of the curves' common range of `against`: REGIONS, None: all


REGIONS = ("low", "high")  # the lower or upper half of the range the curves share


@dataclass(frozen=True)
class Published:
    family: str
    citation: str
    source: str
    cc: dict[str, list[str]]  # the paper's name of a congestion control -> ours
    tables: dict[str, PublishedTable]
    orderings: list[Ordering]

    def label(self, ours: str) -> str:
        """The paper's name of one of our congestion controls (ours when it has none)."""
        return next((p for p, names in self.cc.items() if str(ours).lower() in names), ours)

    def ours(self, paper: str) -> str:
        """Our name of one of the paper's congestion controls (its first)."""
        return (self.cc.get(paper) or [paper])[0]


def _need(data: dict, key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise ValueError(f"{where}: key {key!r}: expected a {kind.__name__}, got {value!r}")
    return value


def _table(name: str, t: dict, cc: dict[str, list[str]], where: str) -> PublishedTable:
    where = f"{where}: key 'tables.{name}'"
    keys, values = _need(t, "keys", list, where), _need(t, "values", list, where)
    across: dict[str, list] = t.get("across") or {}
    (axis, levels), *more = list(across.items()) or [(None, [None])]
    if more:
        raise ValueError(f"{where}: 'across' holds one key, not {len(across)}")
    records = []
    for i, row in enumerate(_need(t, "rows", list, where)):
        width = len(keys) + len(levels) * len(values)
        if not isinstance(row, list) or len(row) != width:
            raise ValueError(f"{where}: row {i}: expected {width} values, got {row!r}")
        head = dict(zip(keys, row[: len(keys)], strict=True))
        if "cc" in head:
            head["cc"] = (cc.get(head["cc"]) or [head["cc"]])[0]
        for j, level in enumerate(levels):
            at = len(keys) + j * len(values)
            cells = dict(zip(values, row[at : at + len(values)], strict=True))
            records.append({**head, **({axis: level} if axis else {}), **cells})
    all_keys = [*keys, *([axis] if axis else [])]
    title = " ".join(str(t.get("title") or name).split())
    applies = dict(t.get("applies") or {})
    return PublishedTable(title, all_keys, values, pd.DataFrame(records), applies)


@cache
def published(family: str) -> Published | None:
    """The family's published values, or None when it keeps none."""
    path = HERE / f"{family}{SUFFIX}"
    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of citation, cc, tables, orderings")
    cc = {str(k): [str(n) for n in v] for k, v in (data.get("cc") or {}).items()}
    tables = {
        str(name): _table(str(name), t, cc, str(path))
        for name, t in (data.get("tables") or {}).items()
    }
    orderings = []
    for i, o in enumerate(data.get("orderings") or []):
        at = f"{path}: key 'orderings[{i}]'"
        region = o.get("region")
        if region is not None and (region not in REGIONS or not o.get("against")):
            raise ValueError(
                f"{at}: key 'region': {region!r}: allowed {', '.join(REGIONS)}, with 'against'"
            )
        orderings.append(
            Ordering(
                figure=str(_need(o, "figure", str, at)),
                metric=str(_need(o, "metric", str, at)),
                where={str(k): list(v) for k, v in (o.get("where") or {}).items()},
                by=str(o.get("by") or "cc"),
                more=list(_need(o, "more", list, at)),
                than=list(_need(o, "than", list, at)),
                says=" ".join(str(o.get("says") or "").split()),
                against=str(o["against"]) if o.get("against") else None,
                region=region,
            )
        )
    return Published(
        family,
        str(data.get("citation") or ""),
        str(data.get("source") or ""),
        cc,
        tables,
        orderings,
    )
