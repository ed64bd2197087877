"""analysis.queue.queue_occupancy's events computed a second way, as the oracle the compiled
merge (analysis.queuemerge.queue_levels, which queue_occupancy uses) is checked against:
arrivals, drops and departures concatenated, then ordered by (time, event code) with two
stable numpy sorts, the occupancy a running sum."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.metrics import undecided
from analysis.pcap import ip_strings
from analysis.queue import ETHERNET_HEADER, EVENTS


def queue_events(
    matched: pd.DataFrame,
    *,
    delay_ns: int = 0,
    max_delay_ns: int,
    end_ns: int | None = None,
    with_rows: bool = False,
) -> pd.DataFrame:
    """What queue_occupancy returns, from the same match_packets output; ``with_rows``: also each
    event's row in ``matched`` (column ``row``), as queue_levels(rows=True) gives it."""
    ts = matched["ts_ns"].to_numpy(np.int64)
    fwd = matched["forwarded"].to_numpy(bool)
    out_ts = matched["ts_out_ns"].to_numpy(np.int64)
    if end_ns is None:
        end_ns = int(out_ts[fwd].max()) if fwd.any() else int(ts.max(initial=0))
    keep = np.flatnonzero(~undecided(ts, fwd, max_delay_ns=max_delay_ns, end_ns=end_ns))
    ts, fwd, out_ts = ts[keep], fwd[keep], out_ts[keep]
    frame = matched["ip_len"].to_numpy()[keep].astype(np.int64) + ETHERNET_HEADER
    n_fwd = int(fwd.sum())
    rows = np.r_[np.arange(len(keep)), np.flatnonzero(fwd)]  # arrivals/drops, then departures
    t = np.r_[ts + delay_ns, out_ts[fwd]]
    code = np.r_[np.where(fwd, 1, 2), np.zeros(n_fwd, np.int64)].astype(np.int8)  # EVENTS
    sign = np.r_[fwd.astype(np.int64), -np.ones(n_fwd, np.int64)]
    by_code = np.argsort(code, kind="stable")
    order = by_code[np.argsort(t[by_code], kind="stable")]
    rows, t, code, sign = rows[order], t[order], code[order], sign[order]
    size = frame[rows]
    src = keep[rows]  # row in ``matched``
    return pd.DataFrame(
        {
            "ts_ns": t,
            "event": pd.Categorical.from_codes(code, dtype=EVENTS),
            "frame_bytes": size.astype(np.int32),
            "src": ip_strings(matched["src"].to_numpy()[src]),
            "dst": ip_strings(matched["dst"].to_numpy()[src]),
            "proto": matched["proto"].to_numpy()[src],
            "sport": matched["sport"].to_numpy()[src],
            "dport": matched["dport"].to_numpy()[src],
            "packets": np.cumsum(sign),
            "bytes": np.cumsum(sign * size),
            **({"row": src} if with_rows else {}),
        }
    )
