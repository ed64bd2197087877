"""Seed 001 (Aron & Druschel 1998): effective throughput vs elapsed time (the Fig. 3 table:
the useful data transferred over all flows by 1, 5, 10, 20, 30 s after the trial's first data
SYN, the start of the transfers, and its share of what the bottleneck could carry), and the late
joiner (Figs. 7-8: what every sender passed after the bottleneck in the 5 s after the late
joiner's data SYN, as the paper counts it, and its share of the capacity; the data the late
flow itself carried then against its fair share; retransmission timeouts and their idle time
per sender).

The table counts what the paper counts, "the total amount of useful data that was transferred":
the bytes that passed the capture after the bottleneck in sequence
(``transferred_since_first_syn_<c>``), not yet acknowledged. The bytes acknowledged at the
senders' side, half a round trip later, are kept under names that say so: from the first data
SYN (``acked_since_first_syn_<c>``) and from T0, the launch of the senders
(``acked_since_t0_<c>``, with iperf3's set-up: its control connection, three round trips
before the data SYN). Trials analysed before the table counted transferred bytes (2026-12-07)
carry only acknowledged ones (``delivered_<c>`` from T0, or ``delivered_since_first_syn_<c>``):
the tables leave them out and say how many (``legacy_trials``).

Every figure of the tables is a trimmed mean over the group's repetitions (common.trimmed_mean:
of 5, the middle 3), beside the number of repetitions it averages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.families.common import TRIMMED_MEAN, fmt, trimmed_mean, used
from analysis.lazy import pd

CUTOFFS = ("1s", "5s", "10s", "20s", "30s")
LATE_WINDOW_S = 5
SINCE_SYN, SINCE_T0 = "since_first_syn", "since_t0"  # the origins' key suffixes
# What is counted: bytes past the capture after the bottleneck in sequence (the table's), or
# acknowledged in order at the senders' side.
TRANSFERRED, ACKED = "transferred", "acked"
SUMS = ((TRANSFERRED, SINCE_SYN), (ACKED, SINCE_SYN), (ACKED, SINCE_T0))  # the sums kept
# Keys of trials analysed before the table counted transferred bytes (see the docstring).
LEGACY = ("delivered", f"delivered_{SINCE_SYN}")


def bytes_key(measure: str, origin: str, cutoff: str) -> str:
    """The trial summary's bytes over all flows by origin + cutoff."""
    return f"{measure}_{origin}_{cutoff}"


def share_key(measure: str, origin: str, cutoff: str) -> str:
    """Their share of what the bottleneck could carry in cutoff."""
    return f"utilization_{measure}_{origin}_{cutoff}"


# A reproduction record's summary.csv (analysis/reproduction.py): no keys of the family's own
# (the experiment's factors are the table's groups), and the table's figures as the trial
# summary holds them (bytes, fractions of capacity, seconds after T0).
RECORD_KEYS: tuple[str, ...] = ()
RECORD_METRICS = {
    k: k
    for k in (
        "first_data_syn_s",
        *(bytes_key(m, o, c) for m, o in SUMS[:2] for c in CUTOFFS),
        *(share_key(m, o, c) for m, o in SUMS[:2] for c in CUTOFFS),
        "late_start_s",
        "late_first_syn_s",
        "late_first5s_bytes",
        "late_fair_share_bytes",
        "late_share_of_fair",
        "late_window_bytes",
        "late_window_utilization",
        "timeouts",
        "fast_retransmits",
    )
}


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
    # The transfers' start: the earliest data SYN of any bulk flow (s after T0).
    syns = [(s.get("first_data_syn_s"), s.get("first_data_syn_seen")) for s in bulk.values()]
    syns = [x for x in syns if x[0] is not None]
    if syns:
        out["first_data_syn_s"], out["first_data_syn_seen"] = min(syns, key=lambda x: x[0])
    skipped = sorted(
        {s["transferred_skipped"] for s in bulk.values() if "transferred_skipped" in s}
    )
    if skipped:
        out["transferred_skipped"] = "; ".join(skipped)
    for measure, origin in SUMS:
        for c in CUTOFFS:
            # By origin + c over all flows (a late joiner's from the origin too).
            parts = [s.get(f"{measure}_{origin}", {}).get(c) for s in bulk.values()]
            if all(p is not None for p in parts) and parts:
                total = sum(parts)
                out[bytes_key(measure, origin, c)] = total
                out[share_key(measure, origin, c)] = total * 8 / (capacity * float(c[:-1]))
    starts = {n: record["traffic"][n]["start_ns"] for n in bulk}
    late = max(starts, key=starts.get) if starts else None
    if late is not None and starts[late] > 0:
        flows_total = sum(record["traffic"][n]["spec"]["flows"] for n in bulk)
        # Each of its flows from its own data SYN (analysis.traffic.bulk_tcp).
        got = bulk[late].get("delivered_bytes", {}).get(f"{LATE_WINDOW_S}s")
        fair = capacity * LATE_WINDOW_S / 8 * record["traffic"][late]["spec"]["flows"] / flows_total
        out.update(
            late_generator=late,
            late_start_s=starts[late] / 1e9,
            late_first_syn_s=bulk[late].get("first_data_syn_s"),
            late_first5s_bytes=got,
            late_fair_share_bytes=fair,
            late_share_of_fair=(got / fair) if got is not None else None,
        )
        # The paper's Figs. 7 and 8: what every sender passed after the bottleneck in the
        # LATE_WINDOW_S after the late joiner's data SYN, and its share of the capacity.
        window = [s.get("transferred_in_late_window") for s in bulk.values()]
        if window and None not in window:
            out["late_window_bytes"] = sum(window)
            out["late_window_utilization"] = sum(window) * 8 / (capacity * LATE_WINDOW_S)
    return out


def legacy_trials(table: pd.DataFrame) -> int:
    """Complete trials analysed before the table counted transferred bytes: they hold
    acknowledged ones only, under older names (LEGACY), and none of the sums kept now."""
    ok = table[table.status == "complete"]
    old = [f"{k}_{CUTOFFS[0]}" for k in LEGACY if f"{k}_{CUTOFFS[0]}" in ok]
    if not old:
        return 0
    now = ok.get(bytes_key(ACKED, SINCE_SYN, CUTOFFS[0]), pd.Series(index=ok.index, dtype=float))
    return int((ok[old].notna().any(axis=1) & now.isna()).sum())


def legacy_note(table: pd.DataFrame) -> str | None:
    """What to say of legacy_trials, if any."""
    n = legacy_trials(table)
    if not n:
        return None
    return (
        f"{n} trial(s) were analysed before the table counted the bytes that reached the "
        "receivers from the first data SYN (their figures are acknowledged bytes, the oldest "
        "from T0 with iperf3's set-up): left out of the table; analyse them again "
        "(`trials report <batch>`, or `make report REANALYSE=1`)."
    )


def skipped_note(table: pd.DataFrame) -> str | None:
    """Trials whose transferred bytes could not be counted, and why (the first reason)."""
    ok = table[table.status == "complete"]
    why = ok.get("transferred_skipped", pd.Series(dtype=object)).dropna()
    if why.empty:
        return None
    return f"{len(why)} trial(s) have no transferred bytes: {why.iloc[0]}."


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


FIRST_SYN_COLUMN = "first data SYN, s after T0"
KB, SHARE, USED = " KB", " %", " used"  # a cut-off's columns: f"{cutoff}{KB}" ...


def group_columns(through: pd.DataFrame) -> list[str]:
    """The columns of throughput_table that name its groups (those before ``runs``)."""
    return list(through.columns[: through.columns.get_loc("runs")])


def _column(rows: pd.DataFrame, key: str) -> pd.Series:
    return rows.get(key, pd.Series(index=rows.index, dtype=float))


def throughput_table(
    table: pd.DataFrame, measure: str = TRANSFERRED, origin: str = SINCE_SYN
) -> pd.DataFrame:
    """Per group of complete trials: runs, when the first data SYN came (s after T0), and per
    cut-off t the bytes over all flows that passed the capture after the bottleneck in sequence
    by the first data SYN + t (``measure`` ACKED: acknowledged at the senders' side; ``origin``
    SINCE_T0: by T0 + t) in KB (1 KB = 1000 B), their share of the bottleneck's capacity (%)
    and the runs averaged (used). Each figure is the trimmed mean of the runs that have it
    (legacy_trials have none; a trial shorter than t neither)."""
    keyed, by = _keyed(table)
    rows = []
    for key, rows_ in keyed.groupby(by, dropna=False):
        row = {**_key_columns(by, key), "runs": len(rows_)}
        row[FIRST_SYN_COLUMN] = trimmed_mean(_column(rows_, "first_data_syn_s"))
        for c in CUTOFFS:
            got = _column(rows_, bytes_key(measure, origin, c))
            share = _column(rows_, share_key(measure, origin, c))
            row[f"{c}{KB}"] = trimmed_mean(got) / 1000
            row[f"{c}{SHARE}"] = trimmed_mean(share) * 100
            row[f"{c}{USED}"] = used(got)
        rows.append(row)
    return pd.DataFrame(rows)


LAUNCH_COLUMN, LATE_SYN_COLUMN = "launched, s after T0", "data SYN, s after T0"
LATE_DIGITS = {LAUNCH_COLUMN: 0, LATE_SYN_COLUMN: 2, "share": 2, "all senders %": 1}


def late_joiner_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per group of complete trials with a late joiner: when it was launched and when its
    first data SYN came, what every sender passed after the bottleneck in the LATE_WINDOW_S
    seconds after it (the paper's Figs. 7 and 8) and its share of the capacity, the data the
    late joiner carried then against its fair share, timeouts and fast retransmits (trimmed
    means over the runs; used: the runs averaged, of those with a share)."""
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
                "used": used(_column(r, "late_share_of_fair")),
                LAUNCH_COLUMN: trimmed_mean(r.late_start_s),
                LATE_SYN_COLUMN: trimmed_mean(_column(r, "late_first_syn_s")),
                f"all senders, {LATE_WINDOW_S} s KB": trimmed_mean(_column(r, "late_window_bytes"))
                / 1000,
                "all senders %": 100 * trimmed_mean(_column(r, "late_window_utilization")),
                f"late joiner, {LATE_WINDOW_S} s KB": trimmed_mean(r.late_first5s_bytes) / 1000,
                "fair share KB": trimmed_mean(r.late_fair_share_bytes) / 1000,
                "share": trimmed_mean(_column(r, "late_share_of_fair")),
                "timeouts": trimmed_mean(r.timeouts),
                "fast rtx": trimmed_mean(r.fast_retransmits),
            }
        )
    return pd.DataFrame(rows)


def scaled_note(table: pd.DataFrame) -> str | None:
    """What the experiment scaled down from the paper (report.scaled), if it says so."""
    ok = table[table.status == "complete"]
    col = ok.get("scaled", pd.Series(dtype=object))
    return next((s for s in col if isinstance(s, str)), None)


THROUGHPUT_TITLE = (
    "Effective throughput vs elapsed time since the first data SYN "
    "(KB that passed the bottleneck in sequence, % of its capacity)"
)
LATE_TITLE = (
    f"Late joiner: data it carried in the first {LATE_WINDOW_S} s after its data SYN, and timeouts"
)
STATISTIC = f"each figure the {TRIMMED_MEAN}; used: the repetitions averaged"


def print_tables(batch_dir: Path, table: pd.DataFrame, console: Console) -> None:
    through = throughput_table(table)
    if through.empty:
        return
    scaled = scaled_note(table)
    title = f"{THROUGHPUT_TITLE}: {STATISTIC}" + (f" — SCALED: {scaled}" if scaled else "")
    t = Table(title=title)
    keys = [*group_columns(through), "runs", FIRST_SYN_COLUMN]
    for col in keys + list(CUTOFFS):
        t.add_column(escape(col), justify="right")  # a factor: traffic[pair2].start
    for _, row in through.iterrows():
        cells = [
            "-"
            if pd.isna(row[f"{c}{KB}"])
            else f"{row[f'{c}{KB}']:.0f} ({row[f'{c}{SHARE}']:.0f}%, used {row[f'{c}{USED}']})"
            for c in CUTOFFS
        ]
        first = fmt(row[FIRST_SYN_COLUMN], 3)
        t.add_row(*[first if k == FIRST_SYN_COLUMN else str(row[k]) for k in keys], *cells)
    console.print(t)
    for note in (legacy_note(table), skipped_note(table)):
        if note:
            console.print(note)
    late = late_joiner_table(table)
    if not late.empty:
        t2 = Table(title=f"{LATE_TITLE}: {STATISTIC}")
        for col in late.columns:
            t2.add_column(escape(col), justify="right")
        digits = LATE_DIGITS
        n_keys = late.columns.get_loc("used") + 1
        for _, row in late.iterrows():
            cells = list(row.items())
            t2.add_row(
                *[str(v) for _, v in cells[:n_keys]],
                *[fmt(v, digits.get(c, 1)) for c, v in cells[n_keys:]],
            )
        console.print(t2)


def _sums(r: pd.Series, measure: str, origin: str) -> str:
    return (
        ", ".join(
            f"{c}: {r[bytes_key(measure, origin, c)] / 1000:.0f} KB "
            f"({r[share_key(measure, origin, c)] * 100:.0f}%)"
            for c in CUTOFFS
            if pd.notna(r.get(bytes_key(measure, origin, c)))
        )
        or "-"
    )


def trial_rows(r: pd.Series) -> list[tuple[str, str]]:
    rows = []
    syn = r.get("first_data_syn_s")
    at = f"T0 + {syn:.3f} s" if pd.notna(syn) else "-"
    rows.append(
        (f"transferred since the first data SYN ({at}), past the bottleneck in sequence",
         _sums(r, TRANSFERRED, SINCE_SYN))
    )  # fmt: skip
    rows.append(("acknowledged since the first data SYN", _sums(r, ACKED, SINCE_SYN)))
    since_t0 = "acknowledged since T0 (the launch; iperf3's set-up included where it ran)"
    rows.append((since_t0, _sums(r, ACKED, SINCE_T0)))
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
                f"{r.late_generator} launched at T0 + {r.late_start_s:g} s, data SYN at T0 + "
                f"{fmt(r.get('late_first_syn_s'), 3)} s: "
                f"{fmt(r.late_first5s_bytes / 1000)} KB in the {LATE_WINDOW_S} s after it, "
                f"fair share {fmt(r.late_fair_share_bytes / 1000)} KB "
                f"({fmt(r.late_share_of_fair, 2)})",
            )
        )
        if pd.notna(r.get("late_window_bytes")):
            rows.append(
                (
                    f"all senders, the {LATE_WINDOW_S} s after the late joiner's data SYN",
                    f"{fmt(r.late_window_bytes / 1000)} KB past the bottleneck in sequence, "
                    f"{fmt(100 * r.late_window_utilization)} % of its capacity",
                )
            )
    return rows
