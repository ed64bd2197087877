"""The results catalog's query time: a grouped query (per experiment, cell and night: runs,
mean, median and p90 of three metrics) over synthetic catalogs of 1 000 and 100 000 trial rows,
written as the catalog writes a batch (analysis/dataset.py: one file per night, 40 metric
columns, factors and provenance), read through the views of analysis/query.py.

  python tests/bench/bench_catalog.py [--rows 1000 100000] [--per-night 500] [--repeat 5]

Cold: a new connection (its views made) and the query's first run; warm: the same query again
on that connection (the median of --repeat runs). Ends with one comparable line per size.
Writes into a temporary directory only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT))

from analysis.dataset import write_rows  # noqa: E402
from analysis.query import connect  # noqa: E402
from core.layout import CatalogDir  # noqa: E402

QUERY = """
SELECT experiment, cell, date, count(*) AS runs,
       avg("tcp.goodput_kBps") AS goodput, median("voip.owd_median_ms") AS owd,
       quantile_cont("queue[downstream].drops", 0.9) AS drops_p90
FROM trials WHERE status = 'complete'
GROUP BY ALL ORDER BY experiment, cell, date
"""
METRICS = 40
CELLS = ["traffic[0].cc=reno", "traffic[0].cc=cubic", "traffic[0].cc=bbr"]


def night(rng: np.random.Generator, n: int, experiment: str, day: str) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "batch": f"nightly/{experiment}/{day}",
            "trial": [f"t{i}" for i in range(n)],
            "status": np.where(rng.random(n) < 0.97, "complete", "failed"),
            "repetition": rng.integers(1, 6, n).astype(float),
            "commit": "c0ffee" * 6 + "beef",
            "dirty": False,
            "kernel": "6.1.0-28-amd64",
            "cell": rng.choice(CELLS, n),
            "tcp.goodput_kBps": rng.normal(110, 5, n),
            "voip.owd_median_ms": rng.normal(400, 20, n),
            "queue[downstream].drops": rng.poisson(6, n).astype(float),
        }
    )
    extra = {f"m{k}": rng.normal(size=n) for k in range(METRICS - 3)}
    return pd.concat([frame, pd.DataFrame(extra)], axis=1)


def build(root: Path, rows: int, per_night: int) -> int:
    """``rows`` trial rows over two experiments, ``per_night`` rows a night; the files."""
    rng = np.random.default_rng(1)
    cat = CatalogDir(root)
    nights = max(rows // per_night, 1)
    for k in range(nights):
        experiment = ("smoke", "startup")[k % 2]
        day = (pd.Timestamp("2026-01-01") + pd.Timedelta(days=k // 2)).strftime("%Y-%m-%d")
        n = rows // nights + (1 if k < rows % nights else 0)
        write_rows(cat, "trials", experiment, day, f"b{k}", night(rng, n, experiment, day))
    return nights


def measure(root: Path, repeat: int) -> tuple[float, float, int]:
    started = time.perf_counter()
    con = connect(root)
    answer = con.execute(QUERY).df()
    cold = time.perf_counter() - started
    warm = []
    for _ in range(repeat):
        t = time.perf_counter()
        con.execute(QUERY).df()
        warm.append(time.perf_counter() - t)
    total = int(con.execute("SELECT count(*) FROM trials").fetchone()[0])
    con.close()
    assert answer.runs.sum() <= total and len(answer) > 0
    return cold, statistics.median(warm), total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1000, 100_000])
    ap.add_argument("--per-night", type=int, default=500, help="trial rows per batch file")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    lines = []
    for rows in args.rows:
        with tempfile.TemporaryDirectory(prefix="bench-catalog-") as tmp:
            files = build(Path(tmp), rows, args.per_night)
            cold, warm, total = measure(Path(tmp), args.repeat)
        assert total == rows, (total, rows)
        lines.append(
            f"catalog: grouped query over {rows} trial rows ({files} files, {METRICS} metric "
            f"columns): cold {cold * 1000:.0f} ms (views made, first run), warm "
            f"{warm * 1000:.0f} ms (median of {args.repeat})"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
