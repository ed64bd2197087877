"""The results catalog as it is written: every trial of a batch as a row of the catalog's
``trials`` table (its factors, provenance, status and every scalar metric of its summary), its
per-flow tables as rows of ``flows``, one parquet file per batch and table in the batch's
experiment and date partition (core.layout.CatalogDir). analysis/trial.py adds each trial as
its analysis ends (``add_trial``); ``add_batch`` writes a whole batch again (the end of a
batch's analysis, and the backfill of results written before the catalog: ``backfill``).

Columns of ``trials``: ``batch`` (its path below the results directory), ``batch_dir``,
``trial``, ``id``, ``status``, ``family``, ``experiment_file``, ``repetition``, ``analysed``,
``started``, ``t0_ns``, ``errors``; provenance: ``commit``, ``dirty``, ``kernel``, ``rack``,
``cc_impl``, ``qdisc_impl``, ``delay_backend``; ``cell`` (the factors' values as one text: the
trials a comparison pools), ``factors`` and ``parameters`` (JSON), each factor as
``factor:<key>`` (text), and the metrics named as analysis.load names them (numbers as
doubles). ``flows`` holds the per-flow tables' rows with ``table``, the trial's keys, its
``cell``, factors, ``commit`` and ``status``. The partition keys ``experiment`` and ``date``
come from the files' paths.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from analysis.batches import batch_trials, find_batches
from analysis.columns import summary_metrics
from analysis.lazy import pd
from core.layout import (
    CATALOG_TABLES,
    BatchDir,
    CatalogDir,
    TrialDir,
    batch_key,
    batch_of_trial,
    catalog_dir,
    date_in_name,
)
from core.link_rules import QDISCS, qdisc_of
from core.trial_record import RecordError, load_record

__all__ = [
    "FLOW_TABLES",
    "KEYS",
    "PROVENANCE",
    "add_batch",
    "add_trial",
    "backfill",
    "batch_date",
    "batch_rows",
    "experiment_of",
    "trial_rows",
    "write_rows",
]

# The per-flow tables of a trial's analysis (analysis/<kind>.parquet) that go into ``flows``.
FLOW_TABLES = ("flows", "web_flows")
# A trial's identity and state in the catalog, then what its numbers depend on.
KEYS = ("batch", "batch_dir", "trial", "id", "status", "family", "experiment_file", "repetition")
PROVENANCE = ("commit", "dirty", "kernel", "rack", "cc_impl", "qdisc_impl", "delay_backend")
# The trial's columns each flow row carries.
FLOW_KEYS = ("batch", "trial", "id", "status", "repetition", "cell", "commit", "dirty")


def experiment_of(record: dict[str, Any]) -> str:
    """The experiment a trial belongs to in the catalog: its experiment file's stem (what
    nightly batches are named by), else its family."""
    source = record.get("experiment_file")
    return Path(source).stem if source else str(record.get("family") or "unknown")


def batch_date(batch_dir: Path, records: Iterable[dict[str, Any]] = ()) -> str:
    """The day a batch belongs to (YYYY-MM-DD): its name's (a nightly batch's day, a batch's
    stamp), else the day batch.json says it was created, else its trials' first start."""
    named = date_in_name(Path(batch_dir).name)
    if named:
        return named
    meta = BatchDir(batch_dir).meta
    if meta.exists():
        created = json.loads(meta.read_text()).get("created")
        if created:
            return str(created)[:10]
    starts = [str(r.get("times", {}).get("started"))[:10] for r in records]
    starts = [s for s in starts if s and s != "None"]
    return min(starts) if starts else "1970-01-01"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) or value is None else json.dumps(value)


def cell_of(overrides: dict[str, Any]) -> str:
    """The factors' values as one text, in key order: the trials of one cell of the matrix
    (their repetitions) have the same."""
    return ", ".join(f"{k}={_text(v)}" for k, v in sorted(overrides.items())) or "-"


def _joined(values: Iterable[str]) -> str | None:
    return ", ".join(sorted(set(values))) or None


def queue_implementation(egress: dict[str, Any], delay: dict[str, Any]) -> str:
    """What implemented a shaped egress' queue (a trial record's network.egress entry; its
    record's ``delay`` says the router's backend): dummynet's, tc's qdisc, or for rio on a
    kernel without GRED the BPF program."""
    q = QDISCS.get(qdisc_of(egress))
    router = delay.get(egress.get("host")) or {}
    if router.get("backend") == "dummynet":
        return f"dummynet ({q.dummynet})" if q and q.dummynet else "dummynet"
    if qdisc_of(egress) == "rio" and router.get("rio_implementation") == "bpf":
        return "bpf (hostside/bpf_tc/rio)"  # roles/linux_router: a kernel without GRED
    return f"tc {q.linux_qdisc}" if q and q.linux_qdisc else "tc fifo"


def provenance(record: dict[str, Any]) -> dict[str, Any]:
    """The provenance columns of a trial: commit and dirty flag, the hosts' kernels, the rack
    (its inventory files), each congestion control's implementation (the kernel's module or
    a BPF one, with its object's digest) and each shaped egress' queue implementation."""
    git = record.get("git") or {}
    hosts = record.get("hosts") or {}
    delay = record.get("delay") or {}
    impls = []
    for per_host in (record.get("cc_implementation") or {}).values():
        for cc, d in per_host.items():
            digest = d.get("object_sha256")
            impls.append(f"{cc}={d.get('implementation')}" + (f":{digest[:12]}" if digest else ""))
    if not record.get("cc_implementation"):  # a record from before it was kept
        nodes = (record.get("network") or {}).get("nodes") or {}
        for node, s in (record.get("host_settings") or {}).items():
            facts = hosts.get(nodes.get(node, node)) or {}
            if s.get("cc") and facts:
                bpf = s["cc"] in (facts.get("bpf_cc") or {})
                impls.append(f"{s['cc']}={'bpf' if bpf else 'module'}")
    queues = [
        f"{e.get('link')}={qdisc_of(e)}:{queue_implementation(e, delay)}"
        for e in (record.get("network") or {}).get("egress") or []
    ]
    return {
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
        "kernel": _joined(str(f["kernel"]) for f in hosts.values() if f.get("kernel")),
        "rack": _joined(str(p) for p in record.get("inventory") or []),
        "cc_impl": _joined(impls),
        "qdisc_impl": _joined(queues),
        "delay_backend": _joined(str(d["backend"]) for d in delay.values() if d.get("backend")),
    }


def _metric(value: Any) -> Any:
    """A summary scalar as the catalog holds it: numbers (and flags) as doubles, text as is."""
    if isinstance(value, bool | int | float):
        return float(value)
    return value


def trial_rows(
    batch_dir: Path, trial_dir: Path, record: dict[str, Any] | None = None
) -> tuple[dict[str, Any], pd.DataFrame]:
    """One trial's row of ``trials`` and its rows of ``flows``."""
    td = TrialDir(trial_dir)
    record = record if record is not None else json.loads(td.record.read_text())
    overrides = record.get("overrides") or {}
    name, _ = batch_key(batch_dir)
    times = record.get("times") or {}
    row: dict[str, Any] = {
        "batch": name,
        "batch_dir": str(Path(batch_dir).resolve()),
        "trial": record.get("trial", td.name),
        "id": record.get("id"),
        "status": record.get("status"),
        "family": record.get("family"),
        "experiment_file": record.get("experiment_file"),
        "repetition": record.get("repetition"),
        "analysed": td.summary.exists(),
        "started": pd.to_datetime(times.get("started"), utc=True),
        "t0_ns": times.get("t0_ns"),
        "errors": "; ".join(record.get("errors") or []) or None,
        **provenance(record),
        "cell": cell_of(overrides),
        "factors": json.dumps(overrides, sort_keys=True),
        "parameters": json.dumps(record.get("parameters") or {}, sort_keys=True, default=str),
        **{f"factor:{k}": _text(v) for k, v in sorted(overrides.items())},
    }
    if row["analysed"]:
        metrics = summary_metrics(json.loads(td.summary.read_text()), lists=False)
        row.update({k: _metric(v) for k, v in metrics.items() if k not in row})
    parts = []
    for kind in FLOW_TABLES:
        f = td.table(kind)
        if row["analysed"] and f.exists():
            part = pd.read_parquet(f)
            for c in part.columns:  # addresses as text: the same type in every file
                if isinstance(part[c].dtype, pd.CategoricalDtype):
                    part[c] = part[c].astype(str)
            # A flow's own column named as a trial key (web_flows' per-flow `status`) is kept
            # as flow_<name>: the trial's key takes the name, as in every other table.
            part = part.rename(columns={k: f"flow_{k}" for k in (*FLOW_KEYS, "table") if k in part})
            part.insert(0, "table", kind)
            for i, key in enumerate(FLOW_KEYS):
                part.insert(1 + i, key, row[key])
            for k, v in sorted(overrides.items()):
                part[f"factor:{k}"] = _text(v)
            parts.append(part)
    flows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return row, flows


def batch_rows(batch_dir: Path) -> tuple[str, str, pd.DataFrame, pd.DataFrame]:
    """(experiment, date, trials rows, flows rows) of every trial of a batch with a readable
    record (`trials report` names the others)."""
    rows, flows, records = [], [], []
    for trial_dir in batch_trials(batch_dir):
        try:
            record = load_record(TrialDir(trial_dir).record)
        except RecordError:
            continue
        records.append(record)
        row, flow = trial_rows(batch_dir, trial_dir, record)
        rows.append(row)
        if len(flow):
            flows.append(flow)
    experiment = experiment_of(records[0]) if records else Path(batch_dir).name
    return (
        experiment,
        batch_date(batch_dir, records),
        pd.DataFrame(rows),
        pd.concat(flows, ignore_index=True) if flows else pd.DataFrame(),
    )


@contextmanager
def _locked(catalog: CatalogDir) -> Iterator[None]:
    """The catalog's lock, held while a batch's files are rewritten (the analysis' workers
    add trials side by side)."""
    catalog.path.mkdir(parents=True, exist_ok=True)
    with catalog.lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _uniform(rows: pd.DataFrame) -> pd.DataFrame:
    """Each column of one type: a column whose trials gave text in some rows and numbers in
    others (a summary key that changed type) is text in all."""
    out = rows
    for c in rows.columns:
        if rows[c].dtype != object:
            continue
        values = rows[c].dropna()
        texts = values.map(lambda v: isinstance(v, str))
        if texts.any() and not texts.all():
            out = out if out is not rows else rows.copy()
            out[c] = rows[c].map(lambda v: v if v is None or isinstance(v, str) else _text(v))
    return out


def write_rows(catalog: CatalogDir, table: str, experiment: str, date: str, key: str, rows):
    """A batch's rows of ``table`` as its one file in its partition, whole or not at all (a
    file of its own renamed into place); its files in other partitions go (a batch whose date
    or experiment changed); no rows: no file."""
    target = catalog.part(table, experiment, date, key)
    for old in catalog.files(table, key):
        if old != target:
            old.unlink()
    if rows is None or not len(rows):
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".new-", suffix=".parquet", dir=target.parent)
    os.close(fd)
    try:
        _uniform(rows).to_parquet(tmp, index=False)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_batch(batch_dir: Path, catalog: CatalogDir | None = None) -> CatalogDir:
    """Write a batch's rows (every trial with a record) into its catalog, replacing what the
    catalog had of it; returns the catalog."""
    catalog = catalog or catalog_dir(batch_dir)
    experiment, date, rows, flows = batch_rows(batch_dir)
    _, key = batch_key(batch_dir)
    with _locked(catalog):
        write_rows(catalog, "trials", experiment, date, key, rows)
        write_rows(catalog, "flows", experiment, date, key, flows)
    return catalog


def add_trial(trial_dir: Path, catalog: CatalogDir | None = None) -> CatalogDir | None:
    """Put one trial's rows (again) into its batch's files of the catalog, the batch's other
    trials' rows kept; None for a trial directory outside a batch (nothing written)."""
    batch_dir = batch_of_trial(trial_dir)
    if batch_dir is None:
        return None
    catalog = catalog or catalog_dir(batch_dir)
    record = json.loads(TrialDir(trial_dir).record.read_text())
    row, flows = trial_rows(batch_dir, trial_dir, record)
    _, key = batch_key(batch_dir)
    experiment = experiment_of(record)
    date = batch_date(batch_dir, [record])
    with _locked(catalog):
        for table, new in zip(CATALOG_TABLES, (pd.DataFrame([row]), flows), strict=True):
            old = [pd.read_parquet(f) for f in catalog.files(table, key)]
            old = [o[o.trial != row["trial"]] for o in old if len(o)]
            kept = [o for o in (*old, new) if len(o)]
            both = pd.concat(kept, ignore_index=True) if kept else None
            write_rows(catalog, table, experiment, date, key, both)
    return catalog


def backfill(paths: Path | str | Iterable[Path | str]) -> list[tuple[Path, CatalogDir]]:
    """Every batch found under ``paths`` (at any depth) written into its catalog: (batch,
    catalog) of each."""
    return [(b, add_batch(b)) for b in find_batches(paths)]
