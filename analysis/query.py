"""The results catalog as it is read: a DuckDB connection with the views ``trials`` (one row
per trial) and ``flows`` (one row per flow) over the catalog's parquet files
(analysis/dataset.py writes them; core.layout.CatalogDir says where).

    import analysis
    analysis.catalog()                                   # the trials view, as pandas
    analysis.catalog("SELECT experiment, date, avg(\\"tcp.goodput_kBps\\") FROM trials "
                     "WHERE status = 'complete' GROUP BY ALL ORDER BY date")
    analysis.catalog(root="elsewhere/catalog")

Column names holding dots, colons or brackets are quoted in SQL ("factor:traffic[0].cc").
"""

from __future__ import annotations

from pathlib import Path

from analysis.lazy import pd
from core.layout import CATALOG_TABLES, CatalogDir, catalog_dir

__all__ = ["CatalogMissing", "catalog", "connect", "listing"]

# The columns a view has when its table has no file yet (an empty catalog answers queries).
_EMPTY = {
    "trials": {
        "experiment": "VARCHAR",
        "date": "DATE",
        "batch": "VARCHAR",
        "trial": "VARCHAR",
        "status": "VARCHAR",
        "analysed": "BOOLEAN",
        "cell": "VARCHAR",
        "commit": "VARCHAR",
        "dirty": "BOOLEAN",
    },
    "flows": {
        "experiment": "VARCHAR",
        "date": "DATE",
        "batch": "VARCHAR",
        "trial": "VARCHAR",
        "table": "VARCHAR",
    },
}


class CatalogMissing(FileNotFoundError):
    """The catalog directory asked for does not exist."""


def _root(root: str | Path | CatalogDir | None) -> CatalogDir:
    if isinstance(root, CatalogDir):
        return root
    return CatalogDir(Path(root)) if root is not None else catalog_dir()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def connect(root: str | Path | CatalogDir | None = None):
    """An in-memory DuckDB connection with the views ``trials`` and ``flows`` over the
    catalog at ``root`` (default: this checkout's results/catalog, or $TRIALBED_CATALOG)."""
    import duckdb

    cat = _root(root)
    if not cat.path.is_dir():
        raise CatalogMissing(
            f"{cat.path}: no results catalog there (it is written as trials are analysed; "
            "`trialbed results backfill` writes it for results analysed before)"
        )
    con = duckdb.connect()
    for table in CATALOG_TABLES:
        if cat.files(table):
            source = (
                f"read_parquet({_quote(cat.pattern(table))}, hive_partitioning = true, "
                "union_by_name = true, hive_types = {'experiment': VARCHAR, 'date': DATE})"
            )
        else:
            cols = ", ".join(f"NULL::{t} AS {c}" for c, t in _EMPTY[table].items())
            source = f"(SELECT {cols} WHERE false)"
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM {source}")
    return con


def catalog(sql: str | None = None, *, root: str | Path | CatalogDir | None = None) -> pd.DataFrame:
    """The answer to ``sql`` (over the views ``trials`` and ``flows``) as a DataFrame; without
    ``sql``, the whole ``trials`` view."""
    con = connect(root)
    try:
        return con.execute(sql or "SELECT * FROM trials ORDER BY date, batch, trial").df()
    finally:
        con.close()


LISTING = """
SELECT experiment, date, batch,
       count(*) AS trials,
       count(*) FILTER (WHERE status = 'complete') AS complete,
       count(*) FILTER (WHERE analysed) AS analysed,
       string_agg(DISTINCT left("commit", 12), ', ') AS commits,
       bool_or(dirty) AS dirty
FROM trials
GROUP BY experiment, date, batch
ORDER BY experiment, date, batch
"""


def listing(root: str | Path | CatalogDir | None = None) -> pd.DataFrame:
    """One row per batch in the catalog: experiment, date, batch, its trials (complete,
    analysed), its commits and whether any ran dirty."""
    con = connect(root)
    try:
        return con.execute(LISTING).df()
    finally:
        con.close()
