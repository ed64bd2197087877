"""This batch against an earlier one of the same experiment (last night's, by default): per
group and metric, the difference of the (trimmed) means, flagged where it exceeds the
run-to-run spread (the larger of the two batches' σ)."""

from __future__ import annotations

import json
import numbers
import re
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd

from analysis.batches import batch_trials
from analysis.families.common import trimmed_mean, trimmed_sd
from analysis.html_report import provenance
from analysis.html_report.page import Page
from core.layout import BatchDir

__all__ = ["compare_batches", "previous_batch", "sections"]

RULE = (
    "A metric is flagged when the difference of the two batches' means exceeds its run-to-run "
    "spread: the larger of the two batches' standard deviations over the group's (trimmed) "
    "repetitions. Groups with a single repetition in both batches have no spread: their "
    "difference is shown, never flagged."
)
_STAMP = re.compile(r"^\d{8}T\d{6}Z-")


def experiment_key(batch: Path) -> str | None:
    """What makes two batches comparable: the experiment file's name (batch.json), else the
    batch name without its timestamp prefix (results/<stamp>-<name>), else the family of its
    first trial."""
    meta = BatchDir(batch).meta
    if meta.exists():
        with_exp = json.loads(meta.read_text()).get("experiment")
        if with_exp:
            return Path(with_exp).stem
    if _STAMP.match(batch.name):
        return _STAMP.sub("", batch.name)
    first = next(iter(batch_trials(batch)), None)
    if first is None:
        return None
    return f"family {json.loads((first / 'trial.json').read_text()).get('family')}"


def previous_batch(batch: Path) -> Path | None:
    """The batch before this one in the same parent directory (names sort by date:
    results/nightly/<name>/<YYYY-MM-DD> or results/<stamp>-<name>) of the same experiment."""
    batch = batch.resolve()
    key = experiment_key(batch)
    earlier = sorted(
        c
        for c in batch.parent.iterdir()
        if c.name < batch.name and BatchDir(c).is_batch() and key and experiment_key(c) == key
    )
    return earlier[-1] if earlier else None


def _stats(values: pd.Series) -> tuple[int, float, float]:
    values = values.dropna()
    return len(values), trimmed_mean(values), trimmed_sd(values)


def _order(key: object) -> tuple:
    """Group keys in natural order: numbers by value, everything else as text."""
    parts = key if isinstance(key, tuple) else (key,)
    return tuple(
        (0, float(v), "") if isinstance(v, numbers.Real) and not pd.isna(v) else (1, 0.0, str(v))
        for v in parts
    )


def compare_batches(
    this: pd.DataFrame, before: pd.DataFrame, group: list[str], metrics: dict[str, str]
) -> pd.DataFrame:
    """One row per group and metric present in either batch: runs, means and σ of both,
    the difference (this − before), the spread and the flag (None: no spread known)."""
    rows = []
    for metric in metrics:
        if metric not in this and metric not in before:
            continue
        a = this.assign(_v=pd.to_numeric(this.get(metric), errors="coerce"))
        b = before.assign(_v=pd.to_numeric(before.get(metric), errors="coerce"))
        ga = dict(list(a.groupby(group, dropna=False)._v)) if len(a) else {}
        gb = dict(list(b.groupby(group, dropna=False)._v)) if len(b) else {}
        for key in sorted(set(ga) | set(gb), key=_order):
            na, ma, sa = _stats(ga.get(key, pd.Series(dtype=float)))
            nb, mb, sb = _stats(gb.get(key, pd.Series(dtype=float)))
            if na == 0 and nb == 0:
                continue
            spreads = [s for s in (sa, sb) if not np.isnan(s)]
            spread = max(spreads) if spreads else float("nan")
            diff = ma - mb
            flag = None if np.isnan(spread) or np.isnan(diff) else bool(abs(diff) > spread)
            key = key if isinstance(key, tuple) else (key,)
            rows.append(
                {
                    **{g.removeprefix("factor:"): k for g, k in zip(group, key, strict=True)},
                    "metric": metrics[metric],
                    "runs": na,
                    "mean": ma,
                    "sd": sa,
                    "runs_before": nb,
                    "mean_before": mb,
                    "sd_before": sb,
                    "difference": diff,
                    "spread": spread,
                    "moved": flag,
                }
            )
    return pd.DataFrame(rows)


def _moved(flag: object) -> bool:
    return flag is not None and not pd.isna(flag) and bool(flag)


def sections(
    page: Page,
    batch_dir: Path,
    trials: pd.DataFrame,
    before_dir: Path | None,
    before: pd.DataFrame | None,
    families: dict[str, ModuleType],
) -> None:
    page.section("This batch vs the previous batch")
    if before_dir is None or before is None:
        page.note(
            "No previous batch to compare with (none given with PREVIOUS=, and no earlier batch "
            "of the same experiment in this batch's directory)."
        )
        return
    page.text(f"Previous batch: {before_dir}")
    page.text(RULE)
    changed = {
        k: (v, provenance.fingerprint(provenance.records(before_dir)).get(k))
        for k, v in provenance.fingerprint(provenance.records(batch_dir)).items()
    }
    moved_setup = [f"{k}: {old} → {new}" for k, (new, old) in changed.items() if new != old]
    if moved_setup:
        page.note("What changed between the batches: " + "; ".join(moved_setup))
    else:
        page.text("Same commit, kernels, tool versions and delay backends in both batches.")
    shown = False
    for family, rows in trials.groupby("family", dropna=False):
        module = families.get(family)
        if module is None:
            continue
        then = before[before.family == family] if "family" in before else before.iloc[:0]
        table = compare_batches(
            module.usable(rows), module.usable(then), module.groups(rows), module.METRICS
        )
        if table.empty:
            continue
        shown = True
        moved = table[table.moved.map(_moved)]
        keys = list(table.columns[: list(table.columns).index("metric")])
        if len(moved):
            page.warn(
                f"{len(moved)} metric(s) moved beyond their run-to-run spread: "
                + "; ".join(
                    f"{r.metric} ({', '.join(f'{k} {r[k]}' for k in keys)}): "
                    f"{r['mean_before']:.4g} → {r['mean']:.4g}"
                    for _, r in moved.iterrows()
                )
            )
        else:
            page.text("No metric moved beyond its run-to-run spread.")
        if table.moved.isna().all():
            page.note(
                "No group has two or more repetitions in either batch: there is no spread to "
                "judge a difference by, so nothing is flagged."
            )
        page.table(
            table,
            f"{family}: this batch against {before_dir.name} (flagged rows: moved beyond spread)",
            csv=f"compare_previous_{family}.csv",
            digits={"mean": 2, "mean_before": 2, "sd": 2, "sd_before": 2, "difference": 2},
            row_class=lambda r: "flag" if _moved(r.moved) else None,
        )
    if not shown:
        page.note("The previous batch has no trial of this batch's families to compare with.")
