"""`python -m analysis.html_report results/<batch> [--previous results/<other>]`, or several
batches in one report (`... results/<a> results/<b> --out DIR`): what `make report` runs;
prints the page's path."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.html_report import AUTO, unreadable_records, write_report
from analysis.regressions import NIGHTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.html_report",
        description="Write a batch's report: one self-contained HTML page, its tables as CSV "
        "and its figures as PNG (default: <batch>/report/).",
    )
    parser.add_argument(
        "batch",
        type=Path,
        nargs="+",
        help="the batch directory (results/<batch>); several: their trials in one report (one "
        "curve per marker of a family's experiment files run as separate batches), --out needed",
    )
    parser.add_argument(
        "--previous",
        default=AUTO,
        help="the batch to compare with (default: the previous batch of the same experiment "
        "in the same directory; 'none': no comparison)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="where to write (default: <batch>/report; several batches: required)",
    )
    parser.add_argument(
        "--reanalyse", action="store_true", help="analyse every trial again from its captures"
    )
    parser.add_argument(
        "--nights",
        type=int,
        default=NIGHTS,
        help=f"regressions: test against this many earlier batches of the experiment in the "
        f"results catalog (default {NIGHTS})",
    )
    parser.add_argument(
        "--baseline", help="regressions: test against this batch instead (directory or name)"
    )
    args = parser.parse_args(argv)
    previous = None if args.previous == "none" else args.previous
    try:
        page = write_report(
            args.batch[0],
            args.out,
            previous,
            reanalyse=args.reanalyse,
            more=args.batch[1:],
            nights=args.nights,
            baseline=args.baseline,
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {page}")
    print(f"tables (CSV) and figures (PNG): {page.parent}/")
    bad = unreadable_records(args.batch)
    for line in bad:
        print(f"report: left out: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
