"""Match packets between two captures of the same traffic (upstream and downstream of a router).

A packet is identified by KEY_COLUMNS; IP IDs wrap and UDP payloads repeat, so a key may
occur many times in a capture and a match must also fall inside a time window. Matching is
greedy in ``before`` time order: each packet takes the earliest unused ``after`` packet with
the same key and ``ts_ns`` in [ts, ts + max_delay_ns], as a FIFO router would deliver them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.fastpath import key_hashes, match_times

__all__ = ["KEY_COLUMNS", "match_packets"]

KEY_COLUMNS = ("src", "dst", "proto", "sport", "dport", "ip_id", "seq", "payload_head")


def key_hash(df: pd.DataFrame) -> np.ndarray:
    """64-bit hash of KEY_COLUMNS (216 bits of key do not fit in one sortable integer):
    splitmix64 rounds over four words (addresses; protocol, ports and IP ID; sequence number;
    payload head), in one compiled pass (analysis.fastpath.key_hashes)."""
    return key_hashes(*(df[c].to_numpy() for c in KEY_COLUMNS))


def match_packets(before: pd.DataFrame, after: pd.DataFrame, *, max_delay_ns: int) -> pd.DataFrame:
    """Find each ``before`` packet in ``after`` (same clock, downstream).

    Returns ``before`` (same index and columns) plus ``ts_out_ns`` (int64, -1 if unmatched) and
    ``forwarded`` (bool). Keys are compared through a 64-bit hash: a false match needs two
    different keys with equal hashes inside one time window (odds 2**-64 per pair).

    The matching is analysis.fastpath's compiled pass over both sides in time order
    (match_times); tests check it against plain greedy matchings.
    """
    ts_out = np.full(len(before), -1, dtype=np.int64)
    if len(before) and len(after):
        ts_out = match_times(
            key_hash(before),
            before["ts_ns"].to_numpy(np.int64),
            key_hash(after),
            after["ts_ns"].to_numpy(np.int64),
            max_delay_ns=max_delay_ns,
        )
    return before.assign(ts_out_ns=ts_out, forwarded=ts_out >= 0)
