"""Seed 001 (Aron & Druschel 1998): effective throughput vs elapsed time (the Fig. 3 table:
data delivered over all flows by T0 + 1, 5, 10, 20, 30 s and its share of what the
bottleneck could carry), and
the late joiner (Figs. 7-8: data the late flow carried in its first 5 s against its fair
share; retransmission timeouts and their idle time per sender)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from analysis.families.common import fmt
from analysis.lazy import pd

CUTOFFS = ("1s", "5s", "10s", "20s", "30s")
LATE_WINDOW_S = 5


def trial_summary(record: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    bulk = {
        n: s for n, s in summary["generators"].items() if record["traffic"][n]["type"] == "bulk_tcp"
    }
    capacities = [s["payload_capacity_bps"] for s in bulk.values() if s.get("payload_capacity_bps")]
    capacity = min(capacities) if capacities else float("nan")
    out: dict[str, Any] = {
        "payload_capacity_bps": capacity,
        "scaled": (record["parameters"].get("report") or {}).get("scaled"),
        "timeouts": sum(s.get("timeouts", 0) for s in bulk.values()),
        "fast_retransmits": sum(s.get("fast_retransmits", 0) for s in bulk.values()),
        "timeouts_by_sender": {n: s.get("timeout_idle_ms", []) for n, s in bulk.items()},
        "slow_start_exit_s": {n: s.get("slow_start_exit_s") for n, s in bulk.items()},
    }
    for c in CUTOFFS:
        # Data delivered by T0 + c over all flows (a late joiner counts from T0 too).
        parts = [s.get("delivered_since_t0", {}).get(c) for s in bulk.values()]
        if all(p is not None for p in parts) and parts:
            total = sum(parts)
            out[f"delivered_{c}"] = total
            out[f"utilization_{c}"] = total * 8 / (capacity * float(c[:-1]))
    starts = {n: record["traffic"][n]["start_ns"] for n in bulk}
    late = max(starts, key=starts.get) if starts else None
    if late is not None and starts[late] > 0:
        flows_total = sum(record["traffic"][n]["spec"]["flows"] for n in bulk)
        got = bulk[late].get("delivered_bytes", {}).get(f"{LATE_WINDOW_S}s")
        fair = capacity * LATE_WINDOW_S / 8 * record["traffic"][late]["spec"]["flows"] / flows_total
        out.update(
            late_generator=late,
            late_start_s=starts[late] / 1e9,
            late_first5s_bytes=got,
            late_fair_share_bytes=fair,
            late_share_of_fair=(got / fair) if got is not None else None,
        )
    return out


def _groups(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if c.startswith("factor:")]


def _keyed(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Complete trials and the columns to group them by (the factors, or one group 'all')."""
    ok = table[table.status == "complete"]
    groups = _groups(ok)
    return (ok if groups else ok.assign(_all="all")), (groups or ["_all"])


def _key_columns(by: list[str], key: Any) -> dict[str, Any]:
    key = key if isinstance(key, tuple) else (key,)
    return {g.removeprefix("factor:").removeprefix("_"): k for g, k in zip(by, key, strict=True)}


def throughput_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per group of complete trials: runs, and per cut-off the mean data delivered by T0 + t
    over all flows (KB, 1 KB = 1000 B) and its share of the bottleneck's capacity (%)."""
    keyed, by = _keyed(table)
    rows = []
    for key, rows_ in keyed.groupby(by, dropna=False):
        row = {**_key_columns(by, key), "runs": len(rows_)}
        for c in CUTOFFS:
            have = f"delivered_{c}" in rows_ and not rows_[f"delivered_{c}"].isna().all()
            row[f"{c} KB"] = rows_[f"delivered_{c}"].mean() / 1000 if have else float("nan")
            row[f"{c} %"] = rows_[f"utilization_{c}"].mean() * 100 if have else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def late_joiner_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per group of complete trials with a late joiner: when it joined, the data it carried in
    its first LATE_WINDOW_S seconds against its fair share, timeouts and fast retransmits
    (means over the runs)."""
    keyed, by = _keyed(table)
    if "late_generator" not in keyed:
        return pd.DataFrame()
    late = keyed[keyed.late_generator.notna()]
    rows = []
    for key, r in late.groupby(by, dropna=False):
        rows.append(
            {
                **_key_columns(by, key),
                "runs": len(r),
                "joins at s": r.late_start_s.mean(),
                f"first {LATE_WINDOW_S} s KB": r.late_first5s_bytes.mean() / 1000,
                "fair share KB": r.late_fair_share_bytes.mean() / 1000,
                "share": r.late_share_of_fair.mean(),
                "timeouts": r.timeouts.mean(),
                "fast rtx": r.fast_retransmits.mean(),
            }
        )
    return pd.DataFrame(rows)


def scaled_note(table: pd.DataFrame) -> str | None:
    """What the experiment scaled down from the paper (report.scaled), if it says so."""
    ok = table[table.status == "complete"]
    col = ok.get("scaled", pd.Series(dtype=object))
    return next((s for s in col if isinstance(s, str)), None)


def print_tables(batch_dir: Path, table: pd.DataFrame, console: Console) -> None:
    through = throughput_table(table)
    if through.empty:
        return
    scaled = scaled_note(table)
    title = "Effective throughput vs elapsed time (KB delivered, % of bottleneck capacity)"
    t = Table(title=title + (f" — SCALED: {scaled}" if scaled else ""))
    keys = [c for c in through.columns if c == "runs" or not c.endswith((" KB", " %"))]
    for col in keys + list(CUTOFFS):
        t.add_column(col, justify="right")
    for _, row in through.iterrows():
        cells = [
            "-" if pd.isna(row[f"{c} KB"]) else f"{row[f'{c} KB']:.0f} ({row[f'{c} %']:.0f}%)"
            for c in CUTOFFS
        ]
        t.add_row(*[str(row[k]) for k in keys], *cells)
    console.print(t)
    late = late_joiner_table(table)
    if not late.empty:
        t2 = Table(
            title=f"Late joiner: data it carried in its first {LATE_WINDOW_S} s, and timeouts"
        )
        for col in late.columns:
            t2.add_column(col, justify="right")
        digits = {"joins at s": 0, "share": 2}
        n_keys = late.columns.get_loc("runs") + 1
        for _, row in late.iterrows():
            cells = list(row.items())
            t2.add_row(
                *[str(v) for _, v in cells[:n_keys]],
                *[fmt(v, digits.get(c, 1)) for c, v in cells[n_keys:]],
            )
        console.print(t2)


def trial_rows(r: pd.Series) -> list[tuple[str, str]]:
    rows = []
    delivered = [
        f"{c}: {r[f'delivered_{c}'] / 1000:.0f} KB ({r[f'utilization_{c}'] * 100:.0f}%)"
        for c in CUTOFFS
        if f"delivered_{c}" in r and pd.notna(r[f"delivered_{c}"])
    ]
    rows.append(("delivered by", ", ".join(delivered) or "-"))
    rows.append(("bottleneck payload capacity", f"{fmt(r.payload_capacity_bps / 1e6, 3)} Mbit/s"))
    for name, idle in (r.timeouts_by_sender or {}).items():
        exits = (r.slow_start_exit_s or {}).get(name) or []
        rows.append(
            (
                name,
                f"{len(idle)} timeout(s) idle {', '.join(f'{v:.0f}' for v in idle) or '-'} ms; "
                f"slow start left at {', '.join(fmt(v, 2) for v in exits) or '-'} s",
            )
        )
    if isinstance(r.get("late_generator"), str):
        rows.append(
            (
                "late joiner",
                f"{r.late_generator} at {r.late_start_s:g} s: "
                f"{fmt(r.late_first5s_bytes / 1000)} KB in its first 5 s, fair share "
                f"{fmt(r.late_fair_share_bytes / 1000)} KB ({fmt(r.late_share_of_fair, 2)})",
            )
        )
    return rows
