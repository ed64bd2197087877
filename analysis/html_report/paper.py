"""The paper's published values beside ours in a family's report (analysis/families/published):
a table of ours with the paper's columns next to it, each labelled "paper", and the orderings
the paper's text states of its figures against the order of our trimmed means. Display only."""

from __future__ import annotations

import pandas as pd

from analysis.families.common import TRIMMED_MEAN, trimmed_mean, trimmed_sd, used
from analysis.families.published import Published, published
from analysis.html_report.page import Page

__all__ = ["PAPER", "beside", "orderings"]

PAPER = "paper"  # the label of every published value on the page and in the CSV
AVERAGED = "trimmed means"  # what our side of an ordering compares (common.TRIMMED_MEAN)


def _our_cc(pub: Published, frame: pd.DataFrame) -> pd.DataFrame:
    """Our congestion control names as the published table's (newreno and reno alike)."""
    if "cc" not in frame:
        return frame
    return frame.assign(cc=[pub.ours(pub.label(c)) for c in frame.cc])


def beside(page: Page, family: str, name: str, ours: pd.DataFrame, digits: dict) -> None:
    """Our table (indexed or with columns by the published table's keys) and the paper's
    values of the same cells, as "paper <column>", with our value minus the paper's for the
    first value; cells only one side has show – on the other."""
    pub = published(family)
    table = pub.tables.get(name) if pub else None
    if table is None:
        return
    flat = ours.reset_index() if any(n is not None for n in ours.index.names) else ours
    mine = _our_cc(pub, flat)
    theirs = table.rows.rename(columns={v: f"{PAPER} {v}" for v in table.values})
    merged = mine.merge(theirs, on=table.keys, how="outer", sort=True)
    for c in flat.columns:  # counts stay whole where only the paper has the cell
        if pd.api.types.is_integer_dtype(flat[c]) and c in merged:
            merged[c] = merged[c].astype("Int64")
    first = table.values[0]
    if first in merged:
        merged[f"ours − {PAPER} {first}"] = merged[first] - merged[f"{PAPER} {first}"]
    shown = [c for c in merged.columns if c in flat.columns or c.startswith(PAPER)]
    shown += [f"ours − {PAPER} {first}"] if first in merged else []
    more = {f"{PAPER} {v}": digits.get(v, 1) for v in table.values}
    page.table(
        merged[shown],
        f"{table.title}, from the paper ({pub.citation}), beside ours: the columns labelled "
        f"'{PAPER}' are the paper's published values (display only)",
        csv=f"{name}_vs_{PAPER}.csv",
        digits={**digits, **more, f"ours − {PAPER} {first}": digits.get(first, 1)},
    )


TIE = "within the runs' spread"  # the column of a statement our levels do not separate


def _flag(holds: object, tie: object) -> str | None:
    """Rows where ours has the paper's ordering reversed beyond the runs' spread are flagged."""
    return "flag" if holds is not None and not bool(holds) and tie is not True else None


def _within_spread(compared: pd.DataFrame, gap: float) -> bool | None:
    """Whether the gap between the two sides' closest trimmed means is no larger than the
    runs' spread (the largest trimmed standard deviation of the levels compared, as the batch
    comparison's rule); None without a spread (a single run)."""
    spread = compared["sd"].max()
    return None if pd.isna(spread) or pd.isna(gap) else bool(abs(gap) <= spread)


def _setting(name: str, value: object) -> str | None:
    """A level's setting in its label (none where it has none: UDP's TCP window)."""
    if pd.isna(value):
        return None
    whole = isinstance(value, float) and value.is_integer()
    return f"{name} {int(value) if whole else value}"


def _levels(g: pd.DataFrame, by: str, metric: str, settings: list[str]) -> pd.DataFrame:
    """Per level of ``by`` in a group and per setting it ran at: its label (the settings
    that differ in the group, where it has them), the trimmed mean of its runs, the runs
    averaged and the runs there are."""
    own = [s for s in settings if s != by and s in g]
    differ = {s for s in own if g[s].nunique(dropna=False) > 1}
    rows = []
    for key, runs in g.groupby([by, *own], sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        shown = [_setting(s, v) for s, v in zip(own, key[1:], strict=True) if s in differ]
        shown = [s for s in shown if s]
        label = f"{key[0]} ({', '.join(shown)})" if shown else str(key[0])
        values = runs[metric]
        rows.append(
            (key[0], label, trimmed_mean(values), trimmed_sd(values), used(values), len(values))
        )
    return pd.DataFrame(rows, columns=["level", "label", "mean", "sd", "used", "runs"])


def _order(levels: pd.DataFrame) -> str:
    """Levels from the highest trimmed mean down, each with the runs it averages."""
    return " > ".join(
        f"{r.label} {r.mean:.3g} ({r.used} of {r.runs})"
        for r in levels.sort_values("mean", ascending=False).itertuples()
    )


def orderings(
    page: Page, family: str, ok: pd.DataFrame, groups: list[str], settings: tuple[str, ...] = ()
) -> None:
    """Per statement of the paper and group of ours it is about (``groups``: the columns a
    group is made of, what the paper compares at): the paper's ordering, ours (the trimmed
    mean of each level's runs; a level that ran at several ``settings``, e.g. a protocol's own
    send size, once per setting), and whether ours has it: every setting of a level in
    `more` above every one of a level in `than`."""
    pub = published(family)
    if pub is None or not pub.orderings:
        return
    rows = []
    for o in pub.orderings:
        if o.against or o.metric not in ok or o.by not in ok:
            continue  # a frontier's statement: analysis/html_report/frontier.py
        data = _our_cc(pub, ok[ok[o.metric].notna()])
        for k, levels in o.where.items():
            data = data[data[k].isin(levels)] if k in data else data.iloc[:0]
        by = [c for c in groups if c != o.by and c in data]
        named = pub.ours if o.by == "cc" else (lambda level: level)
        more, than = [named(n) for n in o.more], [named(n) for n in o.than]
        for key, g in data.groupby(by, sort=True, dropna=False) if by else [((), data)]:
            levels = _levels(g, o.by, o.metric, list(settings))
            if not levels.level.isin(more + than).any():
                continue  # none of the levels the statement is about ran in this group
            have = all(c in set(levels.level) for c in more + than)
            high = levels[levels.level.isin(more)]["mean"]
            low = levels[levels.level.isin(than)]["mean"]
            gap = high.min() - low.max() if have else float("nan")
            compared = levels[levels.level.isin(more + than)]
            rows.append(
                {
                    "figure": o.figure,
                    **dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)),
                    f"{PAPER}: more": ", ".join(map(str, o.more)),
                    f"{PAPER}: than": ", ".join(map(str, o.than)),
                    f"ours ({AVERAGED})": _order(levels),
                    f"ours as the {PAPER}": bool(gap > 0) if have else None,
                    TIE: _within_spread(compared, gap) if have else None,
                }
            )
    if not rows:
        return
    page.heading(f"Orderings the paper states ({pub.citation})")
    page.items([f"{o.figure}: “{o.says}”" for o in pub.orderings if not o.against])
    page.table(
        pd.DataFrame(rows),
        f"The paper's orderings (labelled '{PAPER}': its text, display only) beside the order "
        f"of ours per group, each level's {TRIMMED_MEAN} (its runs averaged, of those there "
        f"are); – where a level has no trial. '{TIE}': the gap between the two sides is no "
        "larger than the largest standard deviation of a level's (trimmed) runs, so our runs "
        "do not order them; such a row is not flagged",
        csv=f"orderings_vs_{PAPER}.csv",
        digits={"rtt_ms": 0, "rate_mbps": 0},
        row_class=lambda r: _flag(r[f"ours as the {PAPER}"], r[TIE]),
    )
