"""Per-flow TCP metrics and one-way delay / loss of read_pcap frames: the DataFrame face of the
flow kernels (analysis/tcpflows.py) and of the matching (analysis/match.py), which the trial
analysis calls on a scan's arrays.

A flow is (src, dst, sport, dport); its data direction is the one carrying payload.
Sequence and ACK numbers are unwrapped from 32 bits by summing signed 32-bit steps in
time order, so a flow may cross the 2**32 boundary any number of times.
"""

from __future__ import annotations

import numpy as np

from analysis.lazy import pd
from analysis.match import match_packets, undecided
from analysis.tcpflows import Queries, TcpPackets, data_pass, flow_order, goodput, goodput_queries
from core.link_rules import FULL_FRAME_BYTES as MAX_FRAME_BYTES

__all__ = [
    "FLOW",
    "MAX_FRAME_BYTES",
    "RETRANSMISSION_COLUMNS",
    "TCP_COLUMNS",
    "one_way_delay",
    "owd_upper_bound_ns",
    "queue_full_events",
    "summarize_owd",
    "tcp_flow_counters",
    "tcp_goodput",
    "tcp_retransmissions",
]

FLOW = ["src", "dst", "sport", "dport"]
TCP_COLUMNS = ("ts_ns", *FLOW, "proto", "tcp_flags", "seq", "ack", "payload_len")
RETRANSMISSION_COLUMNS = ("data_packets", "retransmitted_packets", "retransmitted_bytes")


def tcp_flow_counters(
    packets, *, start_ns: int | None = None, end_ns: int | None = None
) -> dict[str, np.ndarray]:
    """Per data flow, in the order of :func:`tcp_goodput`: src, dst, sport, dport,
    data_packets, retransmitted_packets, retransmitted_bytes (as :func:`tcp_retransmissions`),
    bytes and span_ns (acked bytes and period of :func:`tcp_goodput` with the same window).
    ``packets``: TCP_COLUMNS as arrays, or a scan (analysis.scan.Capture)."""
    p = (
        TcpPackets.of_columns(packets)
        if isinstance(packets, dict)
        else TcpPackets.of_capture(packets)
    )
    data = data_pass(p)
    flows = flow_order(p.first_data)
    queries = Queries()
    name = goodput_queries(queries, data, flows, start_ns, end_ns)
    queries.run(p, data)
    nbytes, span = goodput(queries, data, name)
    return {
        **{k: v[flows] for k, v in p.ends.items()},
        "data_packets": data.packets[flows],
        "retransmitted_packets": data.retransmitted[flows],
        "retransmitted_bytes": data.retransmitted_bytes[flows],
        "bytes": nbytes,
        "span_ns": span,
    }


def goodput_frame(ends: dict[str, np.ndarray], nbytes, span_ns) -> pd.DataFrame:
    """tcp_goodput's rows: the flows' ends, bytes, seconds and goodput_bps (NaN where the
    period is empty)."""
    out = pd.DataFrame({k: ends[k] for k in FLOW})
    if out.empty:
        return out.assign(bytes=np.int64(0), seconds=0.0, goodput_bps=0.0).astype(
            {"bytes": "int64", "seconds": "float64", "goodput_bps": "float64"}
        )
    seconds = span_ns / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(seconds > 0, nbytes * 8 / seconds, np.nan)
    return out.assign(bytes=nbytes, seconds=seconds, goodput_bps=rate)


def tcp_goodput(
    packets: pd.DataFrame, *, start_ns: int | None = None, end_ns: int | None = None
) -> pd.DataFrame:
    """In-order bytes acknowledged by each data flow's receiver, and the rate.

    With a window: bytes acked between the last ACK at or before ``start_ns`` and the last ACK
    at or before ``end_ns``, over the window length. Without: from the flow's first data packet
    to its last ACK that advanced. A missing bound defaults to that per-flow value.
    goodput_bps is NaN when the period is empty.
    """
    c = tcp_flow_counters(_columns(packets), start_ns=start_ns, end_ns=end_ns)
    return goodput_frame(c, c["bytes"], c["span_ns"])


def tcp_retransmissions(packets: pd.DataFrame) -> pd.DataFrame:
    """Per data flow: data packets, and those whose end (seq + payload) does not pass the
    highest end sent earlier in the flow (in time order)."""
    c = tcp_flow_counters(_columns(packets))
    return pd.DataFrame({k: c[k] for k in (*FLOW, *RETRANSMISSION_COLUMNS)})


def _columns(packets: pd.DataFrame) -> dict[str, np.ndarray]:
    return {k: packets[k].to_numpy() for k in TCP_COLUMNS}


def owd_upper_bound_ns(*, one_way_delay_ns: int, buffer_bytes: int, rate_bps: int) -> int:
    """The longest one-way delay a packet can see through a drop-tail bottleneck: the path's
    propagation delay (RTT/2), plus waiting behind a full queue and the full-size frame the
    shaper is sending when it arrives, (buffer + 1514 B) x 8 / rate (its own serialization
    is inside that: the queue it joins holds at most buffer bytes including itself)."""
    return one_way_delay_ns + -(-(buffer_bytes + MAX_FRAME_BYTES) * 8 * 10**9 // rate_bps)


def one_way_delay(
    before: pd.DataFrame,
    after: pd.DataFrame,
    *,
    max_delay_ns: int,
    proto: int = 17,
    end_ns: int | None = None,
) -> pd.DataFrame:
    """match_packets columns plus ``owd_ns`` (-1 when lost) and ``lost`` for packets of
    ``proto`` in ``before``. Only packets that could not yet have arrived by end_ns (defaults
    to the last timestamp in ``after``, or in ``before`` if ``after`` is empty) are left out:
    those not seen downstream, sent within max_delay_ns of the end and after the last packet
    that was delivered (see :func:`undecided`)."""
    b = before[before["proto"] == proto]
    a = after[after["proto"] == proto]
    m = match_packets(b, a, max_delay_ns=max_delay_ns)
    if end_ns is None:
        src = after if len(after) else before
        end_ns = int(src["ts_ns"].max()) if len(src) else 0
    return with_owd(m, max_delay_ns=max_delay_ns, end_ns=end_ns)


def with_owd(matched: pd.DataFrame, *, max_delay_ns: int, end_ns: int) -> pd.DataFrame:
    """``matched`` (match_packets' columns) without the undecided packets, plus ``owd_ns``
    (-1 when lost) and ``lost``."""
    fwd = matched["forwarded"].to_numpy()
    cut = undecided(matched["ts_ns"].to_numpy(), fwd, max_delay_ns=max_delay_ns, end_ns=end_ns)
    m = matched[~cut].copy()
    fwd = fwd[~cut]
    m["owd_ns"] = np.where(fwd, m["ts_out_ns"].to_numpy() - m["ts_ns"].to_numpy(), -1)
    m["lost"] = ~fwd
    return m


def queue_full_events(matched: pd.DataFrame, *, start_ns: int, end_ns: int) -> dict:
    """Runs of consecutive drops (in arrival order) among packets entering a bottleneck.

    ``events`` counts runs whose first drop lies in [start_ns, end_ns); ``drops`` is the
    number of dropped packets in those runs (including any part running past end_ns).
    """
    return drop_runs(
        matched["ts_ns"].to_numpy(), matched["forwarded"].to_numpy(bool), start_ns, end_ns
    )


def drop_runs(ts: np.ndarray, forwarded: np.ndarray, start_ns: int, end_ns: int) -> dict:
    """queue_full_events of arrays: the packets' times and whether each was forwarded."""
    order = np.argsort(ts, kind="stable")
    ts = ts[order]
    dropped = ~forwarded[order]
    run_start = dropped.copy()
    run_start[1:] &= ~dropped[:-1]
    run_id = np.cumsum(run_start)
    counted = run_start & (ts >= start_ns) & (ts < end_ns)
    events = int(counted.sum())
    drops = int(np.isin(run_id[dropped], run_id[counted]).sum())
    minutes = (end_ns - start_ns) / 60e9
    return {
        "events": events,
        "drops": drops,
        "minutes": minutes,
        "events_per_minute": events / minutes if minutes > 0 else float("nan"),
    }


def summarize_owd(owd_df) -> dict:
    """Packet and loss counts plus delay statistics (ms) over delivered packets; the standard
    deviation is the sample one (ddof=1). Statistics are NaN when nothing was delivered.
    ``owd_df`` is one_way_delay's frame or any mapping of its lost and owd_ns arrays."""
    lost = np.asarray(owd_df["lost"], dtype=bool)
    ms = np.asarray(owd_df["owd_ns"])[~lost] / 1e6
    nan = float("nan")
    stats = dict.fromkeys(("min_ms", "median_ms", "mean_ms", "std_ms", "max_ms", "p99_ms"), nan)
    if len(ms):
        stats = {
            "min_ms": float(ms.min()),
            "median_ms": float(np.median(ms)),
            "mean_ms": float(ms.mean()),
            "std_ms": float(ms.std(ddof=1)) if len(ms) > 1 else nan,
            "max_ms": float(ms.max()),
            "p99_ms": float(np.percentile(ms, 99)),
        }
    return {"packets": len(lost), "lost": int(lost.sum()), **stats}
