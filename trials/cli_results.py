"""`trialbed results ...`: the results catalog from the command line.

results list [--catalog DIR]                      one line per batch in the catalog
results query "SQL" [--catalog DIR] [--csv]       the answer to a query over the views
                                                  trials (a row per trial) and flows
results backfill [PATH]...                        write the batches under PATH (default
                                                  results/) into their catalog
results regressions BATCH [--nights N | --baseline BATCH] [--alpha A] [--correction bh|holm]
                                                  the batch against its baseline, tested;
                                                  exit 3 when a metric changed
results trends EXPERIMENT [--out DIR] [--nights N]  its nights as series: flagged nights,
                                                  the night a shift holds from, its commit
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.regressions import ALPHA, NIGHTS
from analysis.stats import CORRECTIONS
from core.layout import CATALOG_ENV, RESULTS_DIR, CatalogDir, catalog_dir

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `results` subcommand and its actions, on the command line's subparsers."""
    results = sub.add_parser(
        "results",
        help="the results catalog: list its batches, query it with SQL, backfill it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = results.add_subparsers(dest="action", required=True)
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--catalog",
        type=Path,
        help=f"the catalog directory (default: ${CATALOG_ENV}, else results/catalog)",
    )
    actions.add_parser("list", parents=[where], help="one line per batch in the catalog")
    query = actions.add_parser(
        "query", parents=[where], help="run SQL over the views trials and flows (DuckDB)"
    )
    query.add_argument("sql", help='e.g. "SELECT date, count(*) FROM trials GROUP BY date"')
    query.add_argument("--csv", action="store_true", help="print CSV, not a table")
    backfill = actions.add_parser(
        "backfill", help="write batches analysed before the catalog existed into it"
    )
    backfill.add_argument(
        "paths",
        type=Path,
        nargs="*",
        default=[RESULTS_DIR],
        help="batches, or directories of batches at any depth (default: results/)",
    )
    judge = actions.add_parser(
        "regressions",
        parents=[where],
        help="test a batch against the nights before it (exit 3: a metric changed)",
    )
    judge.add_argument("batch", type=Path, help="the batch directory (it is catalogued first)")
    judge.add_argument("--nights", type=int, default=NIGHTS, help=f"default {NIGHTS}")
    judge.add_argument("--baseline", help="a batch (directory or catalog name) instead")
    judge.add_argument("--alpha", type=float, default=ALPHA, help=f"default {ALPHA}")
    judge.add_argument("--correction", choices=CORRECTIONS, default=CORRECTIONS[0])
    trend = actions.add_parser(
        "trends",
        parents=[where],
        help="an experiment's nights as series, with flagged nights and shifts (a page)",
    )
    trend.add_argument("experiment", help="its name or file (experiments/smoke.yml: smoke)")
    trend.add_argument("--out", type=Path, help="default: <catalog>/trends/<experiment>/")
    trend.add_argument("--nights", type=int, default=NIGHTS, help="each night's baseline")
    return results


def _print(frame, console: Console, title: str | None = None) -> None:
    table = Table(title=title)
    for c in frame.columns:
        table.add_column(escape(str(c)))
    for row in frame.itertuples(index=False):
        table.add_row(*(escape("" if v is None else str(v)) for v in row))
    console.print(table)


def run(args: argparse.Namespace, err: Console) -> int:
    """0 done, 2 a bad query, path or missing catalog (said on ``err``)."""
    from analysis.query import CatalogMissing, catalog, listing

    out = Console(width=None if sys.stdout.isatty() else 200)
    try:
        if args.action == "backfill":
            from analysis.dataset import backfill
            from analysis.results import NotABatch

            try:
                done = backfill(args.paths)
            except NotABatch as exc:
                err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
                return 2
            for batch, cat in done:
                out.print(f"{batch} -> {cat.path}", highlight=False)
            out.print(f"{len(done)} batch(es) written into the catalog")
            return 0
        if args.action == "regressions":
            return _regressions(args, out, err)
        if args.action == "trends":
            from analysis.html_report.trends import write_trends

            cat = CatalogDir(args.catalog) if args.catalog else catalog_dir()
            name = Path(args.experiment).stem
            page = write_trends(name, args.out or cat.trends(name), cat, nights=args.nights)
            out.print(f"trends: {page}", highlight=False)
            return 0
        if args.action == "list":
            frame = listing(args.catalog)
            if frame.empty:
                out.print("the catalog holds no batch")
                return 0
            _print(frame, out, "batches in the results catalog")
            return 0
        import duckdb

        try:
            frame = catalog(args.sql, root=args.catalog)
        except duckdb.Error as exc:
            err.print(f"[red]query:[/red] {escape(str(exc))}", highlight=False)
            return 2
        if args.csv:
            frame.to_csv(sys.stdout, index=False)
        else:
            _print(frame, out)
        return 0
    except CatalogMissing as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2


def _regressions(args: argparse.Namespace, out: Console, err: Console) -> int:
    from analysis.dataset import add_batch
    from analysis.regressions import judge
    from analysis.results import NotABatch
    from trials.nightly import CHANGE_FOUND

    catalog = CatalogDir(args.catalog) if args.catalog else None
    try:
        add_batch(args.batch, catalog)
    except NotABatch as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    verdict = judge(
        args.batch,
        nights=args.nights,
        baseline=args.baseline,
        alpha=args.alpha,
        correction=args.correction,
        catalog=catalog,
    )
    out.print(escape("\n".join(verdict.lines())), highlight=False)
    return CHANGE_FOUND if verdict.found else 0
