"""Analysis package: a trial's captures read (analysis/scan.py), matched and turned into
metrics and tables (analysis/trial.py); ``load`` and ``load_table`` give batches as tidy
tables, ``batch_trials`` one batch's trial directories (analysis/results.py), ``catalog`` the
answer to a query over the results catalog (analysis/query.py); each imported on first use:
reading captures needs no pandas."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analysis.query import catalog
    from analysis.results import NotABatch, batch_trials, load, load_table, summary_file

__all__ = ["NotABatch", "batch_trials", "catalog", "load", "load_table", "summary_file"]


def __getattr__(name: str):
    if name == "catalog":
        from analysis import query

        return query.catalog
    if name in __all__:
        from analysis import results

        return getattr(results, name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
