"""TCP startup dynamics (seed 001, Aron & Druschel 1998) from one sender-side capture.

The capture is taken between the senders and the bottleneck: it holds every SYN and data
segment the senders emit (including the ones the bottleneck will drop) and the ACKs the
receivers send back. The DataFrame functions take a frame as returned by
``analysis.pcap.read_pcap``; the trial analysis calls the same figures on a scan's arrays
(``Flows``). Both go through the flow kernels of analysis/tcpflows.py.

A flow is a TCP data direction (src, dst, sport, dport) as there: sequence and ACK numbers
are unwrapped there, "bytes delivered" are data bytes acknowledged in order by the receiver's
cumulative ACK (the SYN's and FIN's sequence numbers are not counted), and a retransmission
is a data segment whose end does not pass the highest end sent earlier in its flow. One
connection per 4-tuple is assumed, as there.

Times: every absolute time is int64 ns since the epoch (as ``ts_ns``); every time relative to
a flow's start is in ns too, float64 only where it may be NaN (exact below 104 days).

Each flow's start (``start_ns``) is its first SYN from the data sender; if the capture lacks it
(started late, or the data sender accepted the connection instead of opening it) the start
falls back to the flow's first data packet and ``syn_seen`` is False. The aggregate over
several flows (the paper's Fig. 3 table) counts from the earliest start of those flows: the
transfer's first SYN, never the moment the sending program was launched (iperf3's control
connection comes three round trips before its data SYN) and never a workload tool's control
connection (the caller chooses the data flows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from analysis.lazy import pd
from analysis.metrics import FLOW, TCP_COLUMNS, tcp_goodput
from analysis.tcpflows import DataPass, Queries, TcpPackets, ack_times, data_pass, flow_order

__all__ = [
    "Flows",
    "at_step",
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

_TIMEOUT, _FAST, _OTHER = "timeout", "fast", "other"
KINDS = (_TIMEOUT, _FAST, _OTHER)
_DUPACK_THRESHOLD = 3  # RFC 5681: the third duplicate ACK triggers a fast retransmit
_START_COLS = ["syn_ns", "syn_seen", "syns", "first_data_ns", "start_ns"]
_LATEST = np.iinfo(np.int64).max


@dataclass
class Flows:
    """A capture's TCP flows (those among ``directions``, a bool per direction, if given) as
    the kernels see them: the data pass done; the ACK pass answers the ``queries`` added
    before ``acks()`` runs it. ``flows``: their directions in the order of their first
    payload packet; ``end_ns``: the capture's (or the flows' packets') latest time, -1 if
    none."""

    p: TcpPackets
    data: DataPass
    flows: np.ndarray
    end_ns: int
    queries: Queries = field(default_factory=Queries)

    @classmethod
    def of(cls, p: TcpPackets, end_ns: int, directions=None, times=None) -> Flows:
        """``times``: when the data pass takes the flows' state (see data_pass)."""
        data = data_pass(p, times)
        return cls(p, data, flow_order(p.first_data, directions), end_ns)

    def starts(self) -> dict[str, np.ndarray]:
        """Per flow: syn_ns (-1: no SYN), syn_seen, syns, first_data_ns, start_ns."""
        d, f = self.data, self.flows
        syn, first = d.syn_ns[f], d.first_ts[f]
        return {
            "syn_ns": syn,
            "syn_seen": syn >= 0,
            "syns": d.syns[f],
            "first_data_ns": first,
            "start_ns": np.where(syn >= 0, syn, first),
        }

    def ends(self) -> dict[str, np.ndarray]:
        return {k: v[self.flows] for k, v in self.p.ends.items()}

    def acks(self):
        return self.queries.run(self.p, self.data)

    def add_delivered(self, name: str, cutoffs_ns: np.ndarray) -> None:
        """Queries of delivered(name): each flow at start_ns + each cut-off."""
        start = self.starts()["start_ns"]
        at = np.add.outer(start, cutoffs_ns).reshape(-1)
        self.queries.add(name, np.repeat(self.flows, len(cutoffs_ns)), at)

    def delivered(self, name: str) -> np.ndarray:
        """Bytes acked in order by each query of ``name`` minus the flow's base."""
        flows = np.concatenate(self.queries.flows)[self.queries.where[name]]
        return self.queries.acked(name, self.data) - self.data.base[flows]

    def add_steps(self, name: str, lo_ns: int, hi_ns: int) -> None:
        """Queries of steps(name): every flow at lo_ns and at each ACK of its flows in
        (lo_ns, hi_ns], the only times its bytes delivered can change there: the bytes its
        flows delivered at any time in [lo_ns, hi_ns], from one ACK pass, for a time known
        only after the pass (the trial's first data SYN, when a capture read later holds it)."""
        acks = ack_times(self.p, self.data, self.flows, lo_ns, hi_ns)
        times = np.unique(np.concatenate([np.asarray([lo_ns], np.int64), acks]))
        self.queries.add(name, np.repeat(self.flows, len(times)), np.tile(times, len(self.flows)))

    def steps(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(times, bytes): the bytes its flows delivered in all (acknowledged in order, each
        from its base) by each time of add_steps(name)'s queries; at_step reads them."""
        times = np.concatenate(self.queries.times)[self.queries.where[name]]
        if not len(self.flows):
            return times, np.zeros(0, np.int64)
        got = self.delivered(name).reshape(len(self.flows), -1).sum(axis=0).astype(np.int64)
        return times[: len(got)], got

    def add_exit(self, name: str = "exit") -> None:
        """Queries of slow_start(name): each flow at its first retransmission (or never)."""
        first = self._first_retx()
        self.queries.add(name, self.flows, np.where(first >= 0, first, _LATEST))

    def _first_retx(self) -> np.ndarray:
        """Per flow: its first retransmission's time, -1 if none."""
        retx = self.data.retx
        earliest = np.full(len(self.p.reverse), _LATEST, np.int64)
        np.minimum.at(earliest, retx["direction"], self.p.ts[retx["row"]])
        return np.where(earliest < _LATEST, earliest, -1)[self.flows]

    def slow_start(self, name: str = "exit") -> dict[str, np.ndarray]:
        """Per flow: first_retx_ns (-1: none), exit_ns (after start_ns; NaN: none) and
        acked_bytes by then (or over the whole flow), from add_exit(name)'s queries."""
        first = self._first_retx()
        start = self.starts()["start_ns"]
        return {
            "first_retx_ns": first,
            "exit_ns": np.where(first >= 0, (first - start).astype(float), np.nan),
            "acked_bytes": self.delivered(name),
        }

    def losses(self, rto_threshold_ns: int) -> dict[str, np.ndarray]:
        """One entry per retransmitted data segment, in flow then time order: flow (its index
        in ``flows``), ts_ns, seq (as on the wire), offset (from the flow's base),
        payload_len, idle_ns (since the flow's previous packet of any kind), dupacks
        (duplicate ACKs for its sequence number before it) and kind (index into KINDS).
        Needs the ACK pass (acks())."""
        index = np.full(len(self.p.reverse), -1, np.int64)
        index[self.flows] = np.arange(len(self.flows))
        retx = self.data.retx
        flow = index[retx["direction"]]
        mine = np.flatnonzero(flow >= 0)
        mine = mine[np.argsort(flow[mine], kind="stable")]  # flow-major, time order within
        rows, d = retx["row"][mine], retx["direction"][mine]
        ts = self.p.ts[rows].astype(np.int64)
        dups = self.queries.answers.dups
        ours = index[dups["direction"]] >= 0  # (the capture's other flows are not counted)
        dupacks = _count_before(
            dups["direction"][ours], dups["ack_u"][ours], dups["ts"][ours], d,
            retx["seq_u"][mine], ts,
        )  # fmt: skip
        idle = retx["idle_ns"][mine]
        kind = np.where(
            idle >= rto_threshold_ns, 0, np.where(dupacks >= _DUPACK_THRESHOLD, 1, 2)
        ).astype(np.int8)
        return {
            "flow": flow[mine],
            "ts_ns": ts,
            "seq": self.p.seq[rows].astype(np.int64),
            "offset": retx["seq_u"][mine] - self.data.base[d],
            "payload_len": self.p.plen[rows].astype(np.int64),
            "idle_ns": idle,
            "dupacks": dupacks,
            "kind": kind,
        }


def at_step(steps: tuple[np.ndarray, np.ndarray], t_ns: int) -> int | None:
    """The bytes a Flows.steps curve holds at t_ns (ACKs at t_ns count); None when t_ns lies
    before the curve's first time (nothing is known there)."""
    times, got = steps
    i = int(np.searchsorted(times, t_ns, side="right")) - 1
    return int(got[i]) if i >= 0 and len(got) else None


def loss_counts(events: dict[str, np.ndarray], flows: int) -> dict[str, np.ndarray]:
    """Per flow (``flows`` of them) from Flows.losses: retransmissions, timeouts,
    timeout_idle_ns (total silence before timeouts), its mean and max (NaN without timeouts),
    fast_retransmits, other_retransmits."""
    fid, kind, idle = events["flow"], events["kind"], events["idle_ns"]
    to = kind == 0
    total = np.bincount(fid[to], minlength=flows).astype(np.int64)
    idle_sum = np.zeros(flows, np.int64)
    np.add.at(idle_sum, fid[to], idle[to])
    idle_max = np.full(flows, np.nan)
    if to.any():
        most = np.full(flows, np.iinfo(np.int64).min)
        np.maximum.at(most, fid[to], idle[to])
        idle_max = np.where(total > 0, most.astype(float), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(total > 0, idle_sum / np.maximum(total, 1), np.nan)
    return {
        "retransmissions": np.bincount(fid, minlength=flows).astype(np.int64),
        "timeouts": total,
        "timeout_idle_ns": idle_sum,
        "timeout_idle_mean_ns": mean,
        "timeout_idle_max_ns": idle_max,
        "fast_retransmits": np.bincount(fid[kind == 1], minlength=flows).astype(np.int64),
        "other_retransmits": np.bincount(fid[kind == 2], minlength=flows).astype(np.int64),
    }


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


# The DataFrame API: each function runs the kernels over the frame's TCP packets.


def _flows(packets: pd.DataFrame) -> Flows:
    cols = {k: packets[k].to_numpy() for k in TCP_COLUMNS}
    end = int(cols["ts_ns"].max()) if len(packets) else -1
    return Flows.of(TcpPackets.of_columns(cols), end)


def _table(f: Flows, **columns) -> pd.DataFrame:
    return pd.DataFrame({**f.ends(), **columns})


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
    f = _flows(packets)
    return _table(f, **f.starts())


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
    f = _flows(packets)
    f.add_delivered("by", cut)
    f.acks()
    return delivered_rows(f.ends(), f.starts(), f.end_ns, cut, f.delivered("by"))


def delivered_rows(ends, start, end_ns: int, cut: np.ndarray, nbytes: np.ndarray) -> pd.DataFrame:
    """delivered_by's rows from Flows' ends(), starts() and end_ns, and Flows.delivered of its
    add_delivered queries."""
    n, k = len(start["start_ns"]), len(cut)
    ends = {c: np.repeat(v, k) for c, v in ends.items()}
    at = np.add.outer(start["start_ns"], cut).reshape(-1)
    return pd.DataFrame(
        {
            **ends,
            "start_ns": np.repeat(start["start_ns"], k),
            "syn_seen": np.repeat(start["syn_seen"], k),
            "cutoff_ns": np.tile(cut, n),
            "bytes": nbytes.astype(np.int64),
            "covered": at <= end_ns,
        }
    )


def _select(f: Flows, which: pd.DataFrame | None) -> np.ndarray:
    """Rows of the flows named by ``which`` (FLOW columns), all rows if None."""
    if which is None:
        return np.arange(len(f.flows))
    table = pd.DataFrame(f.ends())
    rows = pd.MultiIndex.from_frame(table[FLOW]).get_indexer(
        pd.MultiIndex.from_frame(which[FLOW].astype(table[FLOW].dtypes.to_dict()))
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
    f = _flows(packets)
    rows = _select(f, flows)
    start = f.starts()["start_ns"][rows]
    t0 = int(start.min()) if len(rows) else 0
    every = np.repeat(f.flows, len(cut))
    f.queries.add("total", every, np.tile(t0 + cut, len(f.flows)))
    f.acks()
    got = (f.queries.acked("total", f.data) - f.data.base[every]).reshape(len(f.flows), len(cut))
    return pd.DataFrame(
        {
            "cutoff_ns": cut,
            "t0_ns": np.full(len(cut), t0, dtype=np.int64),
            "bytes": got[rows].sum(axis=0).astype(np.int64),
            "flows": (start[:, None] <= t0 + cut).sum(axis=0).astype(np.int64),
            "covered": (t0 + cut <= f.end_ns) & (len(rows) > 0),
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


def loss_event_rows(ends: dict[str, np.ndarray], events: dict[str, np.ndarray]) -> pd.DataFrame:
    """loss_events' rows from Flows' ends() and Flows.losses."""
    ends = {c: v[events["flow"]] for c, v in ends.items()}
    kind = pd.Categorical.from_codes(events["kind"], categories=list(KINDS))
    rest = {k: v for k, v in events.items() if k not in ("flow", "kind")}
    return pd.DataFrame({**ends, **rest, "kind": kind})


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
    f = _flows(packets)
    f.acks()
    return loss_event_rows(f.ends(), f.losses(rto_threshold_ns))


def loss_summary(packets: pd.DataFrame, *, rto_threshold_ns: int) -> pd.DataFrame:
    """Per data flow (every flow, zeros if no loss), from :func:`loss_events`: FLOW,
    ``start_ns``, ``retransmissions``, ``timeouts``, ``timeout_idle_ns`` (total silence before
    timeouts), ``timeout_idle_mean_ns`` and ``timeout_idle_max_ns`` (NaN without timeouts),
    ``fast_retransmits``, ``other_retransmits``. Each timeout's own idle time is in
    :func:`loss_events`."""
    f = _flows(packets)
    f.acks()
    counts = loss_counts(f.losses(rto_threshold_ns), len(f.flows))
    return _table(f, start_ns=f.starts()["start_ns"], **counts)


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
    f = _flows(packets)
    f.add_exit()
    f.acks()
    start = f.starts()
    return _table(f, start_ns=start["start_ns"], syn_seen=start["syn_seen"], **f.slow_start())


def window_bytes(packets: pd.DataFrame, start_ns: int, end_ns: int) -> pd.DataFrame:
    """Per data flow, bytes acknowledged in order in [start_ns, end_ns] (e.g. the 5 s after a
    late joiner's SYN): exactly ``tcp_goodput(packets, start_ns=..., end_ns=...)`` — the last
    ACK at or before end_ns minus the last at or before start_ns — with its ``bytes``,
    ``seconds`` and ``goodput_bps`` columns. Sum ``bytes`` for the data carried across the
    bottleneck."""
    return tcp_goodput(packets, start_ns=start_ns, end_ns=end_ns)
