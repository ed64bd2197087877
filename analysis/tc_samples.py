"""`tc -s` samples recorded during a trial by hostside/recorders/tc_sampler.py (JSON lines), and
their comparison with the queue reconstructed from the captures (analysis.queue)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from analysis.damaged import not_text
from analysis.lazy import pd
from analysis.queue import occupancy_at
from analysis.tcp_probe import open_recording

__all__ = [
    "LEAF_KINDS",
    "SAMPLE_COUNTERS",
    "compare_levels",
    "compare_with_samples",
    "leaf_samples",
    "read_tc_samples",
    "sample_records",
    "whole_lines",
]

# The queue under the shaper that holds the link's packets and counts its drops: drop-tail
# (bfifo, pfifo), an AQM, or a dummynet pipe.
LEAF_KINDS = ("bfifo", "pfifo", "red", "gred", "codel", "fq_codel", "pie", "cake", "dummynet")
SAMPLE_COUNTERS = ("bytes", "packets", "drops", "overlimits", "requeues", "backlog", "qlen")


def sample_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """The sampler's records (one per sample and device) of a file, gzipped or not, without
    its closing line and a last line cut short (sampler killed mid-write)."""
    with open_recording(Path(path)) as f:
        try:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not rec.get("end"):
                    yield rec
        except UnicodeDecodeError as exc:
            raise not_text(path, exc) from None


def read_tc_samples(path: str | Path) -> pd.DataFrame:
    """One row per sample, device and qdisc: ts_ns (CLOCK_REALTIME, midpoint of the tc call),
    spread_ns (its duration: the uncertainty of ts_ns), dev, kind, handle, parent, and the
    counters (bytes, packets, drops, overlimits, requeues, backlog = queued bytes, qlen =
    queued packets). A last line cut short (sampler killed mid-write) is ignored. The lines
    are parsed at once by pyarrow's JSON reader (a line a sample and device: 10 MB for three
    minutes of a link); a file it cannot read (another line damaged) line by line."""
    table = _columns_at_once(whole_lines(path))
    return table if table is not None else _line_by_line(path)


def whole_lines(path: str | Path) -> bytes:
    """A sampler's file, gzipped or not, without a last line cut short (sampler killed
    mid-write): the bytes a JSON lines reader takes at once."""
    with open_recording(Path(path), "rb") as f:
        raw = f.read()
    whole = raw[: raw.rfind(b"\n") + 1]
    try:
        json.loads(raw[len(whole) :])
        return raw  # the last line is whole, without its newline
    except ValueError:
        return whole


_COLUMNS = ["ts_ns", "spread_ns", "dev", "kind", "handle", "parent", *SAMPLE_COUNTERS]


def _columns_at_once(text: bytes) -> pd.DataFrame | None:
    """read_tc_samples' table of the lines (pyarrow.json), or None when they are not all as
    the sampler writes them."""
    import pyarrow as pa
    import pyarrow.json as pj

    qdisc = pa.struct(
        [(c, pa.string()) for c in ("kind", "handle", "parent")]
        + [("root", pa.bool_())]
        + [(c, pa.int64()) for c in SAMPLE_COUNTERS]
    )
    line = [("ts_ns", pa.int64()), ("spread_ns", pa.int64()), ("dev", pa.string())]
    schema = pa.schema([*line, ("end", pa.bool_()), ("qdiscs", pa.list_(qdisc))])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    if not text.strip():
        return pd.DataFrame(columns=_COLUMNS).astype(_INT64)
    try:
        lines = pj.read_json(pa.BufferReader(text), parse_options=options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    end = lines["end"].fill_null(False).to_numpy(zero_copy_only=False)
    samples = lines.filter(pa.array(~end))
    if samples["qdiscs"].null_count or samples["dev"].null_count:
        return None  # (the line by line reader says what is missing)
    qdiscs = samples["qdiscs"].combine_chunks()
    row = qdiscs.value_parent_indices().to_numpy()
    q = qdiscs.flatten()
    parent = q.field("parent").to_numpy(zero_copy_only=False)
    root = q.field("root").fill_null(False).to_numpy(zero_copy_only=False)
    out = {
        "ts_ns": samples["ts_ns"].to_numpy()[row],
        "spread_ns": samples["spread_ns"].to_numpy()[row],
        "dev": samples["dev"].to_numpy()[row],
        "kind": q.field("kind").fill_null("").to_numpy(zero_copy_only=False),
        "handle": q.field("handle").fill_null("").to_numpy(zero_copy_only=False),
        "parent": np.where(pd.isna(parent), np.where(root, "root", ""), parent).astype(object),
        **{c: q.field(c).fill_null(0).to_numpy() for c in SAMPLE_COUNTERS},
    }
    return pd.DataFrame(out, columns=_COLUMNS).astype(_INT64)


_INT64 = {c: "int64" for c in ("ts_ns", "spread_ns", *SAMPLE_COUNTERS)}


def _line_by_line(path: str | Path) -> pd.DataFrame:
    """read_tc_samples, a line at a time (a damaged line skipped)."""
    rows = []
    for rec in sample_records(path):
        for q in rec["qdiscs"]:
            rows.append(
                {
                    "ts_ns": rec["ts_ns"],
                    "spread_ns": rec["spread_ns"],
                    "dev": rec["dev"],
                    "kind": q.get("kind", ""),
                    "handle": q.get("handle", ""),
                    "parent": q.get("parent", "root" if q.get("root") else ""),
                    **{c: q.get(c, 0) for c in SAMPLE_COUNTERS},
                }
            )
    return pd.DataFrame(rows, columns=_COLUMNS).astype(_INT64)


def leaf_samples(samples: pd.DataFrame, dev: str) -> pd.DataFrame:
    """The leaf qdisc's samples on ``dev`` (its queue: LEAF_KINDS), in time order."""
    leaf = samples[(samples["dev"] == dev) & samples["kind"].isin(LEAF_KINDS)]
    return leaf.sort_values("ts_ns", kind="stable").reset_index(drop=True)


def compare_with_samples(queue: pd.DataFrame, leaf: pd.DataFrame) -> pd.DataFrame:
    """Per tc sample: its backlog/qlen, the reconstructed occupancy at the sample's time, and
    the difference (reconstructed - tc), in packets and bytes. Drops counted by the qdisc
    since the first sample are compared with drop events since then."""
    t = leaf["ts_ns"].to_numpy(np.int64)
    rec = occupancy_at(queue, t)
    drops_q = np.searchsorted(
        queue["ts_ns"].to_numpy()[(queue["event"] == "drop").to_numpy()], t, side="right"
    )
    return compare_levels(leaf, rec["packets"].to_numpy(), rec["bytes"].to_numpy(), drops_q)


def compare_levels(
    leaf: pd.DataFrame, packets: np.ndarray, nbytes: np.ndarray, drops: np.ndarray
) -> pd.DataFrame:
    """compare_with_samples' table from the reconstructed occupancy at each sample's time
    (packets, bytes) and the drop events up to it."""
    t = leaf["ts_ns"].to_numpy(np.int64)
    out = pd.DataFrame(
        {
            "ts_ns": t,
            "spread_ns": leaf["spread_ns"].to_numpy(),
            "tc_packets": leaf["qlen"].to_numpy(),
            "tc_bytes": leaf["backlog"].to_numpy(),
            "packets": packets,
            "bytes": nbytes,
            "tc_drops": leaf["drops"].to_numpy() - (leaf["drops"].to_numpy()[:1] if len(t) else 0),
            "drops": drops - (drops[:1] if len(t) else 0),
        }
    )
    out["diff_packets"] = out["packets"] - out["tc_packets"]
    out["diff_bytes"] = out["bytes"] - out["tc_bytes"]
    return out
