"""TCP startup dynamics (seed 001, Aron & Druschel 1998) from one sender-side capture.

The capture is taken between the senders and the bottleneck: it holds every SYN and data
segment the senders emit (including the ones the bottleneck will drop) and the ACKs the
receivers send back. Input is a frame as returned by ``analysis.pcap.read_pcap``.

A flow is a TCP data direction (src, dst, sport, dport) as in ``analysis.metrics``: sequence
and ACK numbers are unwrapped there, "bytes delivered" are data bytes acknowledged in order by
the receiver's cumulative ACK (the SYN's and FIN's sequence numbers are not counted), and a
retransmission is a data segment whose end does not pass the highest end sent earlier in its
flow. One connection per 4-tuple is assumed, as there.

Times: every absolute time is int64 ns since the epoch (as ``ts_ns``); every time relative to
a flow's start is in ns too, float64 only where it may be NaN (exact below 104 days).

Each flow's start (``start_ns``) is its first SYN from the data sender; if the capture lacks it
(started late, or the data sender accepted the connection instead of opening it) the start
falls back to the flow's first data packet and ``syn_seen`` is False.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.metrics import (
    FLOW,
    _acked_at,
    _acked_progress,
    _flow_ids,
    _group_agg,
    _retransmitted,
    _starts,
    _tcp_flows,
    tcp_goodput,
)

__all__ = [
    "delivered_by",
    "delivered_total",
    "effective_throughput_per_flow",
    "effective_throughput_table",
    "flow_starts",
    "loss_events",
    "loss_summary",
    "slow_start_exit",
    "window_bytes",
]

_SYN, _FIN, _ACK = 0x02, 0x01, 0x10
_TIMEOUT, _FAST, _OTHER = "timeout", "fast", "other"
_DUPACK_THRESHOLD = 3  # RFC 5681: the third duplicate ACK triggers a fast retransmit


def _parse(
    packets: pd.DataFrame,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``_tcp_flows`` plus each flow's SYN and start columns; also the TCP rows.

    A non-unique index is replaced (the rows of ``data`` are found again by label)."""
    if not packets.index.is_unique:
        packets = packets.reset_index(drop=True)
    flows, data, acks = _tcp_flows(packets)
    tcp = packets[packets["proto"] == 6]
    flags = tcp["tcp_flags"].to_numpy()
    syns = tcp[((flags & _SYN) > 0) & ((flags & _ACK) == 0)]
    sfid = _flow_ids(syns, flows, reverse=False)
    mine = sfid >= 0
    n = len(flows)
    syn_ns = _group_agg(syns["ts_ns"].to_numpy()[mine], sfid[mine], n, "min", -1)
    first = flows["first_ts"].to_numpy().astype(np.int64) if n else np.empty(0, np.int64)
    flows = flows.assign(
        syn_ns=syn_ns,
        syn_seen=syn_ns >= 0,
        syns=np.bincount(sfid[mine], minlength=n).astype(np.int64),
        first_data_ns=first,
        start_ns=np.where(syn_ns >= 0, syn_ns, first),
    )
    return flows, data, acks, tcp


def _capture_end(packets: pd.DataFrame) -> int:
    return int(packets["ts_ns"].max()) if len(packets) else -1


_START_COLS = ["syn_ns", "syn_seen", "syns", "first_data_ns", "start_ns"]


def flow_starts(packets: pd.DataFrame) -> pd.DataFrame:
    """One row per TCP data flow: FLOW columns and

    - ``syn_ns`` (int64): the first SYN without ACK flag sent by the data sender, -1 if the
      capture has none;
    - ``syn_seen`` (bool): whether it has one;
    - ``syns`` (int64): SYNs sent by the data sender (more than 1: SYN retransmissions);
    - ``first_data_ns`` (int64): the first packet carrying payload;
    - ``start_ns`` (int64): ``syn_ns`` if seen, else ``first_data_ns`` — the origin of every
      per-flow cut-off in this module.
    """
    flows, _, _, _ = _parse(packets)
    return flows[FLOW + _START_COLS].copy()


def _cutoffs(cutoffs_ns: Sequence[int]) -> np.ndarray:
    c = np.asarray(cutoffs_ns, dtype=np.int64).reshape(-1)
    if (c < 0).any():
        raise ValueError(f"cut-offs must be >= 0 ns, got {c[c < 0].tolist()}")
    return c


def delivered_by(packets: pd.DataFrame, cutoffs_ns: Sequence[int]) -> pd.DataFrame:
    """Bytes each data flow's receiver acknowledged in order by ``start_ns + t``.

    Long format, one row per flow and cut-off t (flow-major, cut-offs in the given order):
    FLOW columns, ``start_ns``, ``syn_seen``, ``cutoff_ns``, ``bytes`` (int64; ACKs at or
    before the cut-off count) and ``covered`` (the capture extends to the cut-off; if not,
    ``bytes`` is what was acknowledged by the end of the capture).
    """
    cut = _cutoffs(cutoffs_ns)
    flows, _, acks, _ = _parse(packets)
    afid, ts, acked = _acked_progress(flows, acks)
    base = flows["base"].to_numpy().astype(np.int64)
    start = flows["start_ns"].to_numpy()
    n, k = len(flows), len(cut)
    nbytes = np.empty((n, k), dtype=np.int64)
    for j, c in enumerate(cut):  # a few cut-offs, each one vectorized pass over the ACKs
        nbytes[:, j] = _acked_at(afid, ts, acked, base, start + c) - base
    at = np.add.outer(start, cut).reshape(-1)
    out = flows.loc[np.repeat(np.arange(n), k), [*FLOW, "start_ns", "syn_seen"]]
    return out.reset_index(drop=True).assign(
        cutoff_ns=np.tile(cut, n),
        bytes=nbytes.reshape(-1),
        covered=at <= _capture_end(packets),
    )


def _select(flows: pd.DataFrame, which: pd.DataFrame | None) -> np.ndarray:
    """Rows of ``flows`` named by ``which`` (FLOW columns), all rows if None."""
    if which is None:
        return np.arange(len(flows))
    rows = pd.MultiIndex.from_frame(flows[FLOW]).get_indexer(
        pd.MultiIndex.from_frame(which[FLOW].astype(flows[FLOW].dtypes.to_dict()))
    )
    if (rows < 0).any():
        missing = which.loc[rows < 0, FLOW].to_dict("records")
        raise ValueError(f"flows not in the capture as data flows: {missing}")
    return np.unique(rows)


def delivered_total(
    packets: pd.DataFrame, cutoffs_ns: Sequence[int], *, flows: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Bytes acknowledged in order over all data flows (or over ``flows``, a frame with the
    FLOW columns, e.g. rows of :func:`flow_starts`) by ``t0 + t``, where t0 is the earliest
    ``start_ns`` of those flows; a flow that starts later contributes what it had acknowledged
    by then.

    One row per cut-off: ``cutoff_ns``, ``t0_ns``, ``bytes``, ``flows`` (the flows started
    by then) and ``covered`` (the capture extends to t0 + t).
    """
    cut = _cutoffs(cutoffs_ns)
    allf, _, acks, _ = _parse(packets)
    rows = _select(allf, flows)
    afid, ts, acked = _acked_progress(allf, acks)
    base = allf["base"].to_numpy().astype(np.int64)
    start = allf["start_ns"].to_numpy()[rows]
    t0 = int(start.min()) if len(rows) else 0
    nbytes = np.zeros(len(cut), dtype=np.int64)
    started = np.zeros(len(cut), dtype=np.int64)
    for j, c in enumerate(cut):
        t = np.full(len(allf), t0 + c, dtype=np.int64)
        nbytes[j] = (_acked_at(afid, ts, acked, base, t) - base)[rows].sum()
        started[j] = (start <= t0 + c).sum()
    return pd.DataFrame(
        {
            "cutoff_ns": cut,
            "t0_ns": np.full(len(cut), t0, dtype=np.int64),
            "bytes": nbytes,
            "flows": started,
            "covered": (t0 + cut <= _capture_end(packets)) & (len(rows) > 0),
        }
    )


def _rates(nbytes: np.ndarray, cutoff_s: np.ndarray, capacity_bps: float) -> dict[str, np.ndarray]:
    if not capacity_bps > 0:
        raise ValueError(f"capacity_bps must be > 0, got {capacity_bps}")
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(cutoff_s > 0, nbytes * 8 / cutoff_s, np.nan)
    return {"throughput_bps": rate, "utilization": rate / capacity_bps}


def _seconds_to_ns(cutoffs_s: Sequence[float]) -> np.ndarray:
    return np.array([round(float(c) * 1e9) for c in cutoffs_s], dtype=np.int64)


def effective_throughput_table(
    packets: pd.DataFrame,
    cutoffs_s: Sequence[float] = (1, 5, 10, 20, 30),
    *,
    capacity_bps: float,
    flows: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The paper's Fig. 3 table: for each cut-off t (s after the earliest SYN), the data
    delivered over all flows (or ``flows``, see :func:`delivered_total`) and the ratio of useful
    data to what the bottleneck could have carried in t.

    ``capacity_bps``: the bottleneck's payload capacity in bit/s (the caller knows the link
    rate and the header overhead). One row per cut-off: ``cutoff_s``, ``bytes``,
    ``throughput_bps`` (bytes * 8 / t), ``utilization`` (throughput_bps / capacity_bps),
    ``flows`` (started by t) and ``covered`` (the capture lasts until t).
    """
    d = delivered_total(packets, _seconds_to_ns(cutoffs_s), flows=flows)
    cutoff_s = np.asarray(cutoffs_s, dtype=float)
    return pd.DataFrame(
        {
            "cutoff_s": cutoff_s,
            "bytes": d["bytes"].to_numpy(),
            **_rates(d["bytes"].to_numpy(), cutoff_s, capacity_bps),
            "flows": d["flows"].to_numpy(),
            "covered": d["covered"].to_numpy(),
        }
    )


def effective_throughput_per_flow(
    packets: pd.DataFrame, cutoffs_s: Sequence[float] = (1, 5, 10, 20, 30), *, capacity_bps: float
) -> pd.DataFrame:
    """:func:`effective_throughput_table` for each flow, with t counted from the flow's own
    ``start_ns``: the output of :func:`delivered_by` plus ``cutoff_s``, ``throughput_bps`` and
    ``utilization`` (the flow's share of ``capacity_bps``)."""
    d = delivered_by(packets, _seconds_to_ns(cutoffs_s))
    cutoff_s = np.tile(np.asarray(cutoffs_s, dtype=float), len(d) // max(len(cutoffs_s), 1))
    return d.assign(cutoff_s=cutoff_s, **_rates(d["bytes"].to_numpy(), cutoff_s, capacity_bps))


def _events(packets: pd.DataFrame, rto_threshold_ns: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(flows, events) for :func:`loss_events` and :func:`loss_summary`."""
    flows, data, acks, tcp = _parse(packets)
    data = data[data["payload_len"] > 0]
    fid = data["flow"].to_numpy()
    retx = data[_retransmitted(fid, data["end_u"].to_numpy())]

    # Silence before each retransmission: since the flow's previous packet from the sender
    # (any TCP packet of the data direction: data, pure ACK, SYN, FIN).
    fwd = pd.DataFrame(
        {"flow": _flow_ids(tcp, flows, reverse=False), "ts_ns": tcp["ts_ns"].to_numpy()},
        index=tcp.index,
    )
    fwd = fwd[fwd["flow"].to_numpy() >= 0].sort_values(["flow", "ts_ns"], kind="stable")
    fts = fwd["ts_ns"].to_numpy()
    prev = np.where(_starts(fwd["flow"].to_numpy()), -1, np.roll(fts, 1))
    rts = retx["ts_ns"].to_numpy()
    idle = rts - prev[fwd.index.get_indexer(retx.index)]

    # Duplicate ACKs: pure ACKs (no payload, SYN or FIN) repeating the highest ACK so far.
    afid = acks["flow"].to_numpy()
    ack_u = acks["ack_u"].to_numpy()
    high = pd.Series(ack_u).groupby(afid).cummax().to_numpy()
    prev_high = np.roll(high, 1)
    pure = (acks["payload_len"].to_numpy() <= 0) & (
        (acks["tcp_flags"].to_numpy() & (_SYN | _FIN)) == 0
    )
    dup = pure & ~_starts(afid) & (ack_u == prev_high)
    dupacks = _count_before(
        afid[dup],
        ack_u[dup],
        acks["ts_ns"].to_numpy()[dup],
        retx["flow"].to_numpy(),
        retx["seq_u"].to_numpy(),
        rts,
    )

    kind = np.where(
        idle >= rto_threshold_ns,
        _TIMEOUT,
        np.where(dupacks >= _DUPACK_THRESHOLD, _FAST, _OTHER),
    )
    rfid = retx["flow"].to_numpy()
    events = pd.DataFrame(
        {
            "flow": rfid,
            "ts_ns": rts,
            "seq": retx["seq"].to_numpy(),
            "offset": retx["seq_u"].to_numpy() - flows["base"].to_numpy()[rfid],
            "payload_len": retx["payload_len"].to_numpy(),
            "idle_ns": idle,
            "dupacks": dupacks,
            "kind": pd.Categorical(kind, categories=[_TIMEOUT, _FAST, _OTHER]),
        }
    )
    return flows, events


def _count_before(
    gf: np.ndarray, gv: np.ndarray, gt: np.ndarray, qf: np.ndarray, qv: np.ndarray, qt: np.ndarray
) -> np.ndarray:
    """For each query (flow qf, value qv, time qt): the number of items with the same flow and
    value strictly before qt. One sort of items and queries together, no Python loop."""
    n_items = len(gf)
    f = np.concatenate([gf, qf])
    v = np.concatenate([gv, qv])
    t = np.concatenate([gt, qt])
    is_query = np.arange(len(f)) >= n_items
    order = np.lexsort((~is_query, t, v, f))  # at equal times the query sorts first
    item = (~is_query[order]).astype(np.int64)
    start = np.ones(len(order), dtype=bool)
    start[1:] = (f[order][1:] != f[order][:-1]) | (v[order][1:] != v[order][:-1])
    cum = np.cumsum(item)
    before_group = (cum - item)[np.maximum.accumulate(np.where(start, np.arange(len(order)), 0))]
    counts = np.empty(len(f), dtype=np.int64)
    counts[order] = cum - before_group
    return counts[n_items:]


def loss_events(packets: pd.DataFrame, *, rto_threshold_ns: int) -> pd.DataFrame:
    """One row per retransmitted data segment, in flow then time order.

    Columns: FLOW, ``ts_ns``, ``seq`` (as on the wire), ``offset`` (bytes from the flow's
    first data byte: unambiguous across sequence wraps), ``payload_len``, ``idle_ns`` (time
    since the flow's previous packet from the data sender, of any kind), ``dupacks``
    (duplicate ACKs for ``seq`` the receiver sent before it: pure ACKs repeating the highest
    ACK so far; the window is not in the capture frame, so not compared) and ``kind``:

    - "timeout": ``idle_ns >= rto_threshold_ns`` — a retransmission after a silence of at
      least the RTO (choose the threshold below the smallest RTO the stack can use, e.g.
      its ``rto_min``, and above the longest pause a non-timeout retransmission follows);
    - "fast": not a timeout, and at least 3 duplicate ACKs for ``seq`` came before it;
    - "other": the rest (later segments of a recovery, tail loss probes, RACK, ...).

    A segment retransmitted twice sees the same duplicate ACKs both times.
    """
    flows, ev = _events(packets, rto_threshold_ns)
    out = flows.loc[ev["flow"].to_numpy(), FLOW].reset_index(drop=True)
    return pd.concat([out, ev.drop(columns="flow")], axis=1)


def loss_summary(packets: pd.DataFrame, *, rto_threshold_ns: int) -> pd.DataFrame:
    """Per data flow (every flow, zeros if no loss), from :func:`loss_events`: FLOW,
    ``start_ns``, ``retransmissions``, ``timeouts``, ``timeout_idle_ns`` (total silence before
    timeouts), ``timeout_idle_mean_ns`` and ``timeout_idle_max_ns`` (NaN without timeouts),
    ``fast_retransmits``, ``other_retransmits``. Each timeout's own idle time is in
    :func:`loss_events`."""
    flows, ev = _events(packets, rto_threshold_ns)
    n = len(flows)
    fid = ev["flow"].to_numpy()
    kind = ev["kind"].to_numpy()
    idle = ev["idle_ns"].to_numpy()
    to = kind == _TIMEOUT
    idle_to = pd.Series(idle[to]).groupby(fid[to])
    return flows[[*FLOW, "start_ns"]].assign(
        retransmissions=np.bincount(fid, minlength=n).astype(np.int64),
        timeouts=np.bincount(fid[to], minlength=n).astype(np.int64),
        timeout_idle_ns=idle_to.sum().reindex(range(n), fill_value=0).to_numpy(np.int64),
        timeout_idle_mean_ns=idle_to.mean().reindex(range(n)).to_numpy(dtype=float),
        timeout_idle_max_ns=idle_to.max().reindex(range(n)).to_numpy(dtype=float),
        fast_retransmits=np.bincount(fid[kind == _FAST], minlength=n).astype(np.int64),
        other_retransmits=np.bincount(fid[kind == _OTHER], minlength=n).astype(np.int64),
    )


def slow_start_exit(packets: pd.DataFrame) -> pd.DataFrame:
    """Per data flow, the loss-based end of slow start: the first retransmitted data segment
    (the first loss the sender reacted to, by fast retransmit or timeout alike).

    This is where Reno (and CUBIC without HyStart) leaves slow start. HyStart (on by default
    with Linux CUBIC) may leave it earlier on a delay increase without any loss, and a sender
    limited by the receiver window stops growing without leaving it; neither is visible here
    (that needs cwnd, e.g. from the tcp_probe tracepoint).

    Columns: FLOW, ``start_ns``, ``syn_seen``, ``first_retx_ns`` (int64, -1 if none),
    ``exit_ns`` (float64: first_retx_ns - start_ns, NaN if the flow never retransmitted) and
    ``acked_bytes`` (bytes acknowledged in order by then, or over the whole flow if none).
    """
    flows, data, acks, _ = _parse(packets)
    data = data[data["payload_len"] > 0]
    fid = data["flow"].to_numpy()
    retx = _retransmitted(fid, data["end_u"].to_numpy())
    n = len(flows)
    first = _group_agg(data["ts_ns"].to_numpy()[retx], fid[retx], n, "min", -1)
    start = flows["start_ns"].to_numpy()
    afid, ts, acked = _acked_progress(flows, acks)
    base = flows["base"].to_numpy().astype(np.int64)
    upto = np.where(first >= 0, first, np.iinfo(np.int64).max)
    return flows[[*FLOW, "start_ns", "syn_seen"]].assign(
        first_retx_ns=first,
        exit_ns=np.where(first >= 0, (first - start).astype(float), np.nan),
        acked_bytes=_acked_at(afid, ts, acked, base, upto) - base,
    )


def window_bytes(packets: pd.DataFrame, start_ns: int, end_ns: int) -> pd.DataFrame:
    """Per data flow, bytes acknowledged in order in [start_ns, end_ns] (e.g. the 5 s after a
    late joiner's SYN): exactly ``tcp_goodput(packets, start_ns=..., end_ns=...)`` — the last
    ACK at or before end_ns minus the last at or before start_ns — with its ``bytes``,
    ``seconds`` and ``goodput_bps`` columns. Sum ``bytes`` for the data carried across the
    bottleneck."""
    return tcp_goodput(packets, start_ns=start_ns, end_ns=end_ns)
