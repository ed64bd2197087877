"""The TCP flow kernels every TCP metric reads (goodput and retransmissions in
analysis/metrics.py, startup dynamics in analysis/startup.py, a trial's bulk_tcp analysis):
two compiled passes (numba) over a capture's packets in time order, whether the packets come
from a scan (analysis/scan.py) or from a frame's columns, and a third on request.

Definitions: a flow is a TCP direction that carried payload, numbered by its first payload
packet in file order; packets are taken in time order (stable); sequence and ACK numbers are
unwrapped by summing signed 32-bit steps, the flow's first data-or-FIN packet anchoring both.

- The data pass (data and FIN packets of flows): per flow its packets, retransmissions (a
  payload packet whose end does not pass the highest end sent before it), first payload time,
  ``base`` (the lowest payload sequence number: the byte after the SYN), ``fin`` (the FIN's
  sequence number), its first SYN and their count; each retransmission with the time since
  the flow's previous packet; the state of every flow at given times (a capture cut there).
- The ACK pass (packets with the ACK flag of a flow's reverse direction): the highest ACK so
  far at given times (``acked_at``: ACKs at the time count), the time of the last ACK that
  advanced, and the duplicate ACKs (pure ACKs repeating the highest ACK so far).

- The in-sequence pass (payload packets of chosen flows): where each packet moved its flow's
  in-sequence point, the end of the payload contiguous from ``base`` that has passed the
  capture (what a receiver there would have in order; a retransmission or an out-of-order
  segment counts once, when it closes the gap).

Bytes acknowledged in order by time t are that highest ACK clipped to [base, fin] (SYN and FIN
take a sequence number each), or ``base`` when no ACK came by t.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from analysis.directions import directions_of
from analysis.resources import alloc, fit
from analysis.timeorder import row, time_order

__all__ = [
    "AckPass",
    "DataPass",
    "Queries",
    "TcpPackets",
    "ack_pass",
    "ack_times",
    "acked",
    "data_pass",
    "flow_order",
    "goodput",
    "in_sequence",
]

_ACK, _FIN, _SYN = 0x10, 0x01, 0x02
NEVER = 2**62
_NONE = np.int64(-1)


@njit(cache=True, nogil=True, inline="always")
def _s32(x):
    return ((x + 2**31) & 0xFFFFFFFF) - 2**31


@dataclass
class TcpPackets:
    """What the kernels read of packets: per row its direction (``ids``, -1: not TCP) and
    columns (payload_len 0 where a header says less), per direction its reverse, its first
    payload row (-1: not a flow) and its ends; ``order``: the rows by time (stable), empty
    when they are in time order."""

    ids: np.ndarray
    ts: np.ndarray
    flags: np.ndarray
    seq: np.ndarray
    ack: np.ndarray
    plen: np.ndarray
    reverse: np.ndarray
    first_data: np.ndarray
    ends: dict[str, np.ndarray]
    order: np.ndarray

    @property
    def directions(self) -> int:
        return len(self.reverse)

    @classmethod
    def of_capture(cls, cap) -> TcpPackets:
        """A scan's packets (analysis/scan.py's Capture): its directions as they are (those
        that are not TCP are no flows: no TCP payload)."""
        d = cap.directions
        return cls(
            cap.direction, cap.ts_ns, cap.tcp_flags, cap.seq, cap.ack, cap.payload_len,
            d["reverse"], d["first_data"], {k: d[k] for k in ("src", "dst", "sport", "dport")},
            time_order(cap.ts_ns, cap.in_order),
        )  # fmt: skip

    @classmethod
    def of_columns(cls, cols: dict[str, np.ndarray]) -> TcpPackets:
        """Columns of read_pcap's names (ts_ns, src, dst, sport, dport, proto, tcp_flags, seq,
        ack, payload_len) as arrays: their TCP packets' directions are numbered here."""
        ids, m, rev = directions_of(
            cols["src"], cols["dst"], cols["sport"], cols["dport"], cols["proto"]
        )
        plen = np.asarray(cols["payload_len"])
        first_data = _first_data(ids, m, plen)
        first = _first_rows(ids, m)
        ends = {k: np.asarray(cols[k])[first] for k in ("src", "dst", "sport", "dport")}
        ts = np.ascontiguousarray(cols["ts_ns"], dtype=np.int64)
        return cls(
            ids, ts, np.asarray(cols["tcp_flags"]), np.asarray(cols["seq"]),
            np.asarray(cols["ack"]), plen, rev, first_data, ends, time_order(ts),
        )  # fmt: skip


@njit(cache=True, nogil=True)
def _first_data(ids, m, plen):
    """Per direction: the row of its first payload packet (file order), -1 if none."""
    first_data = np.full(m, _NONE)
    for i in range(len(ids)):
        d = ids[i]
        if d >= 0 and plen[i] > 0 and first_data[d] < 0:
            first_data[d] = i
    return first_data


@njit(cache=True, nogil=True)
def _first_rows(ids, m):
    first = np.full(m, _NONE)
    for i in range(len(ids)):
        if ids[i] >= 0 and first[ids[i]] < 0:
            first[ids[i]] = i
    return first


def flow_order(first_data: np.ndarray, directions: np.ndarray | None = None) -> np.ndarray:
    """The flows (directions that carried payload; among ``directions``, a bool per
    direction, if given) in the order of their first payload packet."""
    flows = np.flatnonzero(first_data >= 0)
    if directions is not None:
        flows = flows[np.asarray(directions, bool)[flows]]
    return flows[np.argsort(first_data[flows], kind="stable")]


@dataclass
class DataPass:
    """The data pass's per-direction arrays (index: direction; meaningful for flows), its
    retransmissions (``retx``: row, direction, unwrapped seq, idle ns each) and its
    snapshots (``at``: per time given, the flows' base, fin and whether they had payload by
    then); ``ack_rows``: the rows the ACK pass reads."""

    first_seq: np.ndarray
    base: np.ndarray
    fin: np.ndarray
    first_ts: np.ndarray
    packets: np.ndarray
    retransmitted: np.ndarray
    retransmitted_bytes: np.ndarray
    syn_ns: np.ndarray
    syns: np.ndarray
    retx: dict[str, np.ndarray]
    at: dict[str, np.ndarray]
    ack_rows: np.ndarray


def data_pass(p: TcpPackets, times: np.ndarray | None = None) -> DataPass:
    """The data pass over ``p`` (see the module docstring); ``times``: when to take the
    flows' state (a capture cut at each: its packets at or before it)."""
    times = np.sort(np.asarray([] if times is None else times, np.int64))
    m, n = p.directions, len(p.ids)
    kinds = np.int32 if n < 2**31 else np.int64
    ack_rows, retx_rows = alloc(n, kinds), alloc(n, kinds)
    idle, retx_u = alloc(n, np.int64), alloc(n, np.int64)
    snap = {k: np.empty((len(times), m), t) for k, t in (("base", np.int64), ("fin", np.int64))}
    snap["has"] = np.zeros((len(times), m), np.bool_)
    out = _data(
        p.order, p.ids, p.first_data, p.reverse, p.ts, p.flags, p.seq, p.plen, times,
        snap["base"], snap["fin"], snap["has"], ack_rows, retx_rows, idle, retx_u,
    )  # fmt: skip
    *per_flow, n_acks, n_retx = out
    rows = fit(retx_rows, n_retx)
    retx = {"row": rows, "direction": p.ids[rows].astype(np.int64), "seq_u": fit(retx_u, n_retx)}
    retx["idle_ns"] = fit(idle, n_retx)
    return DataPass(*per_flow, retx, {"ts": times, **snap}, fit(ack_rows, n_acks))


@njit(cache=True, nogil=True)
def _data(
    order, ids, first_data, rev, ts, flags, seq, plen, times, at_base, at_fin, at_has,
    ack_rows, retx_rows, idle, retx_u,
):  # fmt: skip
    m = len(rev)
    acks_a_flow = np.zeros(m, np.bool_)  # the direction's packets ACK a flow's data
    for d in range(m):
        acks_a_flow[d] = rev[d] >= 0 and first_data[rev[d]] >= 0
    started = np.zeros(m, np.bool_)
    prev_raw = np.zeros(m, np.int64)
    cur = np.zeros(m, np.int64)
    first_seq = np.zeros(m, np.int64)
    high = np.full(m, -NEVER, np.int64)
    base = np.full(m, NEVER, np.int64)
    fin = np.full(m, NEVER, np.int64)
    first_ts = np.full(m, NEVER, np.int64)
    packets = np.zeros(m, np.int64)
    retx = np.zeros(m, np.int64)
    retx_bytes = np.zeros(m, np.int64)
    syn_ns = np.full(m, _NONE)
    syns = np.zeros(m, np.int64)
    last_ts = np.full(m, _NONE)  # the flow's previous packet (any kind): idle before a retx
    n_acks = n_retx = 0
    t = 0  # snapshots taken
    for k in range(len(ids)):
        i = row(order, k)
        while t < len(times) and times[t] < ts[i]:  # the state at times[t]: rows up to it
            _snapshot(t, base, fin, packets, at_base, at_fin, at_has)
            t += 1
        d = ids[i]
        if d < 0:
            continue
        ack_rows[n_acks] = i  # every row written, the count advances for ACKs of flows
        n_acks += acks_a_flow[d] & ((flags[i] & _ACK) != 0)
        if first_data[d] < 0:
            continue
        before = last_ts[d]
        last_ts[d] = ts[i]
        if (flags[i] & _SYN) != 0 and (flags[i] & _ACK) == 0:
            syns[d] += 1
            if syn_ns[d] < 0:
                syn_ns[d] = ts[i]
        p = np.int64(plen[i])
        is_fin = (flags[i] & _FIN) != 0
        if p <= 0 and not is_fin:
            continue
        raw = np.int64(seq[i])
        if started[d]:
            u = cur[d] + _s32(raw - prev_raw[d])
        else:
            started[d] = True
            first_seq[d] = raw
            u = raw
        prev_raw[d], cur[d] = raw, u
        end = u + max(p, 0)
        if p > 0:
            packets[d] += 1
            if end <= high[d]:
                retx[d] += 1
                retx_bytes[d] += p
                retx_rows[n_retx], retx_u[n_retx] = i, u
                idle[n_retx] = ts[i] - before  # before: -1 when it is the flow's first
                n_retx += 1
            high[d] = max(high[d], end)
            base[d] = min(base[d], u)
            first_ts[d] = min(first_ts[d], ts[i])
        if is_fin:
            fin[d] = min(fin[d], end)
    while t < len(times):
        _snapshot(t, base, fin, packets, at_base, at_fin, at_has)
        t += 1
    return (
        first_seq, base, fin, first_ts, packets, retx, retx_bytes, syn_ns, syns, n_acks, n_retx
    )  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def _snapshot(t, base, fin, packets, at_base, at_fin, at_has):
    for d in range(len(base)):
        at_base[t, d], at_fin[t, d], at_has[t, d] = base[d], fin[d], packets[d] > 0


@dataclass
class AckPass:
    """The ACK pass's per-flow arrays (index: direction): ``run`` (bytes acked in order at the
    end, unclipped below: see acked), ``last_adv`` (the last ACK that advanced past base, -1
    if none), ``seen`` (any ACK); ``highest``/``highest_seen``: per query, the highest ACK by
    its time and whether one came; ``dups``: direction, unwrapped ack and time of each
    duplicate ACK, in time order."""

    run: np.ndarray
    last_adv: np.ndarray
    seen: np.ndarray
    highest: np.ndarray
    highest_seen: np.ndarray
    dups: dict[str, np.ndarray]


def ack_pass(p: TcpPackets, data: DataPass, flows=None, times=None) -> AckPass:
    """The ACK pass over the rows the data pass listed, answering the queries (``flows``:
    directions, ``times``: when; the highest ACK of the flow at or before each)."""
    q_flow = np.asarray([] if flows is None else flows, np.int64)
    q_ts = np.asarray([] if times is None else times, np.int64)
    by_time = np.argsort(q_ts, kind="stable")
    raw_max, raw_seen = np.zeros(len(q_ts), np.int64), np.zeros(len(q_ts), np.bool_)
    n = len(data.ack_rows)
    dup = (alloc(n, np.int64), alloc(n, np.int64), alloc(n, np.int64))
    run, last_adv, seen, n_dups = _acks(
        data.ack_rows, p.ids, p.reverse, p.ts, p.flags, p.ack, p.plen, data.first_seq,
        data.base, data.fin, q_flow[by_time], q_ts[by_time], raw_max, raw_seen, *dup,
    )  # fmt: skip
    highest, highest_seen = np.empty_like(raw_max), np.empty_like(raw_seen)
    highest[by_time], highest_seen[by_time] = raw_max, raw_seen
    dups = dict(zip(("direction", "ack_u", "ts"), (fit(a, n_dups) for a in dup), strict=True))
    return AckPass(run, last_adv, seen, highest, highest_seen, dups)


@njit(cache=True, nogil=True)
def _acks(
    ack_rows, ids, rev, ts, flags, ack, plen, first_seq, base, fin, q_flow, q_ts, q_max,
    q_seen, dup_dir, dup_ack, dup_ts,
):  # fmt: skip
    m = len(rev)
    started = np.zeros(m, np.bool_)
    a_raw = np.zeros(m, np.int64)
    a_cur = np.zeros(m, np.int64)
    highest = np.zeros(m, np.int64)  # the highest unwrapped ACK so far
    run = np.zeros(m, np.int64)  # the highest ACK clipped to [base, fin] so far
    last_adv = np.full(m, _NONE)
    q, n_dups = 0, 0
    for a in range(len(ack_rows)):
        i = ack_rows[a]
        while q < len(q_ts) and q_ts[q] < ts[i]:  # ACKs at the query's time count
            f = q_flow[q]
            q_max[q], q_seen[q] = highest[f], started[f]
            q += 1
        f = rev[ids[i]]
        raw = np.int64(ack[i])
        if started[f]:
            u = a_cur[f] + _s32(raw - a_raw[f])
        else:
            u = first_seq[f] + _s32(raw - first_seq[f])
        a_raw[f], a_cur[f] = raw, u
        pure = plen[i] == 0 and (flags[i] & (_SYN | _FIN)) == 0
        if pure and started[f] and u == highest[f]:
            dup_dir[n_dups], dup_ack[n_dups], dup_ts[n_dups] = f, u, ts[i]
            n_dups += 1
        highest[f] = max(highest[f], u) if started[f] else u
        acked = min(max(u, base[f]), fin[f])
        if not started[f] or acked > run[f]:
            if acked > base[f]:
                last_adv[f] = ts[i]
            run[f] = acked if not started[f] else max(run[f], acked)
        started[f] = True
    while q < len(q_ts):
        f = q_flow[q]
        q_max[q], q_seen[q] = highest[f], started[f]
        q += 1
    return run, last_adv, started, n_dups


def ack_times(p: TcpPackets, data: DataPass, flows: np.ndarray, lo_ns: int, hi_ns: int):
    """The times in [lo_ns, hi_ns] of the packets the ACK pass reads for ``flows`` (their
    reverse directions' ACKs), in time order: where the bytes they delivered can change."""
    mine = np.zeros(p.directions, np.bool_)
    mine[np.asarray(flows, np.int64)] = True
    return _ack_times(data.ack_rows, p.ts, p.ids, p.reverse, mine, lo_ns, hi_ns)


@njit(cache=True, nogil=True)
def _ack_times(rows, ts, ids, rev, mine, lo, hi):
    a, b = 0, len(rows)
    while a < b:  # the rows are in time order: the first at or after lo
        m = (a + b) // 2
        if ts[rows[m]] < lo:
            a = m + 1
        else:
            b = m
    n, k = 0, a
    while k < len(rows) and ts[rows[k]] <= hi:
        n += mine[rev[ids[rows[k]]]]
        k += 1
    out = np.empty(n, np.int64)
    n = 0
    for j in range(a, k):
        if mine[rev[ids[rows[j]]]]:
            out[n] = ts[rows[j]]
            n += 1
    return out


def acked(highest: np.ndarray, seen: np.ndarray, base: np.ndarray, fin: np.ndarray) -> np.ndarray:
    """Sequence number acknowledged in order by a query's time: its highest ACK clipped to
    [base, fin], and never below base (base where no ACK came): as the running maximum of
    clipped ACKs, since clipping keeps order."""
    clipped = np.minimum(np.maximum(highest, base), fin)
    return np.maximum(np.where(seen, clipped, 0), base)


class Queries:
    """Sets of ACK-pass queries, each under a name: added before the pass, answered after it
    (``acked``: bytes acknowledged in order by each query's time, against the flows' own base
    and fin or given ones)."""

    def __init__(self) -> None:
        self.flows: list[np.ndarray] = []
        self.times: list[np.ndarray] = []
        self.where: dict[str, slice] = {}
        self.windows: dict[str, tuple] = {}  # goodput_queries': flows, start_ns, end_ns
        self.answers: AckPass | None = None

    def add(self, name: str, flows, times) -> None:
        flows = np.asarray(flows, np.int64)
        start = sum(len(f) for f in self.flows)
        self.flows.append(flows)
        self.times.append(np.broadcast_to(np.asarray(times, np.int64), flows.shape))
        self.where[name] = slice(start, start + len(flows))

    def run(self, p: TcpPackets, data: DataPass) -> AckPass:
        cat = np.concatenate
        flows, times = (cat(x) if x else np.empty(0, np.int64) for x in (self.flows, self.times))
        self.answers = ack_pass(p, data, flows, times)
        return self.answers

    def acked(self, name: str, data: DataPass, base=None, fin=None) -> np.ndarray:
        at = self.where[name]
        flows = np.concatenate(self.flows)[at] if self.flows else np.empty(0, np.int64)
        base = data.base[flows] if base is None else base
        fin = data.fin[flows] if fin is None else fin
        a = self.answers
        return acked(a.highest[at], a.highest_seen[at], base, fin)


def goodput_queries(queries: Queries, data: DataPass, flows, start_ns=None, end_ns=None) -> str:
    """Add the queries of :func:`goodput` (``start_ns``, ``end_ns``: a scalar, one per flow, or
    None: the flow's own first payload time and last advancing ACK); returns their name."""
    name = f"goodput{len(queries.windows)}"
    flows = np.asarray(flows, np.int64)
    lo = data.first_ts[flows] if start_ns is None else start_ns
    queries.add(f"{name}.lo", flows, lo)
    queries.add(f"{name}.hi", flows, 0 if end_ns is None else end_ns)
    queries.windows[name] = (flows, start_ns, end_ns)
    return name


def goodput(queries: Queries, data: DataPass, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, span ns) per flow of the queries ``name`` (goodput_queries): the bytes acked in
    order between the last ACK at or before the window's start and the last at or before
    its end, and the window's length. Without a start: from the flow's first payload
    packet; without an end: to its last ACK that advanced (none: an empty period)."""
    flows, start_ns, end_ns = queries.windows[name]
    a = queries.answers
    lo = np.broadcast_to(data.first_ts[flows] if start_ns is None else start_ns, flows.shape)
    a_lo = queries.acked(f"{name}.lo", data)
    if end_ns is not None:
        hi = np.broadcast_to(np.asarray(end_ns, np.int64), flows.shape)
        a_hi = queries.acked(f"{name}.hi", data)
    else:
        advanced = a.last_adv[flows] >= 0
        hi = np.where(advanced, a.last_adv[flows], lo)
        a_hi = np.where(advanced, np.maximum(a.run[flows], data.base[flows]), a_lo)
    return np.maximum(a_hi - a_lo, 0), np.maximum(hi - lo, 0)


def in_sequence(
    p: TcpPackets, data: DataPass, directions: np.ndarray, until_ns: int = NEVER
) -> dict[str, np.ndarray]:
    """The in-sequence pass over the flows among ``directions`` (a bool per direction), up to
    ``until_ns`` (the pass stops there): every payload packet that moved its flow's
    in-sequence point (see the module docstring), in time order: its ``direction``, ``ts`` and
    ``bytes`` (how far it moved the point). Over the whole capture a flow's sum of ``bytes``
    is its payload contiguous from base."""
    chosen = np.asarray(directions, np.bool_) & (p.first_data >= 0)
    room = np.where(chosen, data.packets, 0)  # a flow's heap: at most its payload packets
    at = np.concatenate([[0], np.cumsum(room)[:-1]]).astype(np.int64)
    n = int(room.sum())
    # Only segments beyond a gap enter a heap: its pages stay untouched, and so unallocated.
    hs, he = alloc(n, np.int64, huge=False), alloc(n, np.int64, huge=False)
    out = [alloc(n, np.int64, huge=False) for _ in range(3)]
    k = _in_sequence(
        p.order, p.ids, p.first_data, p.ts, p.flags, p.seq, p.plen, chosen, data.base, at,
        np.int64(until_ns), hs, he, *out,
    )  # fmt: skip
    return dict(zip(("direction", "ts", "bytes"), (fit(a, k) for a in out), strict=True))


@njit(cache=True, nogil=True)
def _in_sequence(
    order, ids, first_data, ts, flags, seq, plen, chosen, base, at, until, hs, he, d_out,
    ts_out, b_out,
):  # fmt: skip
    """One pass in time order. Sequence numbers are unwrapped as the data pass does (each
    data-or-FIN packet of the flow a step); each flow's segments beyond a gap wait in its heap
    (hs/he from at[d]), keyed by their start, until the gap closes."""
    m = len(first_data)
    started = np.zeros(m, np.bool_)
    prev_raw = np.zeros(m, np.int64)
    cur = np.zeros(m, np.int64)
    point = base.copy()
    size = np.zeros(m, np.int64)
    n = 0
    for k in range(len(ids)):
        i = row(order, k)
        if ts[i] > until:
            break
        d = ids[i]
        if d < 0 or first_data[d] < 0:
            continue
        p = np.int64(plen[i])
        if p <= 0 and (flags[i] & _FIN) == 0:
            continue
        raw = np.int64(seq[i])
        u = cur[d] + _s32(raw - prev_raw[d]) if started[d] else raw
        started[d] = True
        prev_raw[d], cur[d] = raw, u
        if p <= 0 or not chosen[d]:
            continue
        o, before = at[d], point[d]
        if u > before:  # beyond a gap: waits until the gap closes
            _heap_push(hs[o:], he[o:], size[d], u, u + p)
            size[d] += 1
            continue
        reach = max(before, u + p)
        while size[d] > 0 and hs[o] <= reach:
            reach = max(reach, he[o])
            size[d] = _heap_pop(hs[o:], he[o:], size[d])
        if reach > before:
            point[d] = reach
            d_out[n], ts_out[n], b_out[n] = d, ts[i], reach - before
            n += 1
    return n


@njit(cache=True, nogil=True, inline="always")
def _heap_push(hs, he, h, s, e):
    i = h
    while i > 0 and hs[(i - 1) // 2] > s:
        hs[i], he[i] = hs[(i - 1) // 2], he[(i - 1) // 2]
        i = (i - 1) // 2
    hs[i], he[i] = s, e


@njit(cache=True, nogil=True, inline="always")
def _heap_pop(hs, he, h):
    """Remove the smallest start; returns the new size."""
    h -= 1
    s, e = hs[h], he[h]
    i = 0
    while 2 * i + 1 < h:
        c = 2 * i + 1
        if c + 1 < h and hs[c + 1] < hs[c]:
            c += 1
        if hs[c] >= s:
            break
        hs[i], he[i] = hs[c], he[c]
        i = c
    hs[i], he[i] = s, e
    return h
