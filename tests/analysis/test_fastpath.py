"""The array fast path (read_columns, match_times, queue_levels, tcp_flow_counters) gives
the numbers of the DataFrame API exactly, on a capture pair with real TCP dynamics."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.fastpath import (
    _departure_order,
    _directions,
    ack_column,
    crossing_times,
    flow_counters,
    match_rows,
    scan,
)
from analysis.match import key_hash, match_packets
from analysis.metrics import (
    match_times,
    queue_levels,
    tcp_flow_counters,
    tcp_goodput,
    tcp_retransmissions,
)
from analysis.pcap import COLUMNS, PcapError, PcapTruncatedWarning, read_columns, read_pcap
from analysis.pcapscan import _alloc
from analysis.queue import EVENTS, queue_occupancy

from .greedy import greedy_match
from .pcapgen import arp_frame, ethernet, ipv4, tcp_segment, udp_datagram, write_pcap
from .queue_oracle import queue_events
from .tcpgen import generate
from .test_pcap import T0, random_capture

DELAY = 2 * 10**9


def departure_order(rows: np.ndarray, out_ts: np.ndarray, n_fwd: int) -> np.ndarray:
    return _departure_order(rows.copy(), out_ts, n_fwd)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("fast")
    generate(d / "b.pcap", d / "a.pcap", packets=40_000, flows=3, duration_ns=5 * 10**9)
    return d / "b.pcap", d / "a.pcap"


def test_read_columns_is_read_pcap(pair: tuple[Path, Path]) -> None:
    frame = read_pcap(pair[0])
    cols = read_columns(pair[0], [*COLUMNS, "key_hash"])
    for c in COLUMNS:
        assert cols[c].dtype == frame[c].dtype and np.array_equal(cols[c], frame[c].to_numpy())
    assert np.array_equal(cols["key_hash"], key_hash(frame))
    assert list(read_columns(pair[0], ["seq"])) == ["seq"]


@pytest.fixture(scope="module")
def fifo_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """As ``pair``, but the flows share one FIFO queue, as at a real bottleneck."""
    d = tmp_path_factory.mktemp("fifo")
    generate(
        d / "b.pcap", d / "a.pcap", packets=40_000, flows=3, duration_ns=5 * 10**9,
        loss=0.005, shared_queue=True,
    )  # fmt: skip
    return d / "b.pcap", d / "a.pcap"


@pytest.mark.parametrize("shuffle", [False, True], ids=["time-order", "shuffled"])
@pytest.mark.parametrize("queue", ["per-flow", "shared"])
def test_match_times_is_the_greedy_matching(
    pair: tuple[Path, Path], fifo_pair: tuple[Path, Path], shuffle: bool, queue: str
) -> None:
    """On a whole capture pair, in time order or not, its flows overtaking each other (a
    queue each) or not (one FIFO: the matcher's common case, the earliest packet waiting is
    the one that leaves): match_times (and match_packets, which uses it) give the greedy
    matching computed another way (tests/analysis/greedy.py)."""
    pair = fifo_pair if queue == "shared" else pair
    b, a = read_pcap(pair[0]), read_pcap(pair[1])
    if shuffle:  # out of time order: the matching must still follow time
        b, a = b.sample(frac=0.5, random_state=1), a.sample(frac=0.7, random_state=2)
    hb, ha, tb, ta = key_hash(b), key_hash(a), b.ts_ns.to_numpy(), a.ts_ns.to_numpy()
    short = 50_000_000 if queue == "shared" else 30_000_000  # shorter than some packets' delay
    for delay in (DELAY, short):
        ref = greedy_match(hb, ha, tb, ta, delay)
        got = match_times(hb, tb, ha, ta, max_delay_ns=delay)
        assert np.array_equal(got, ref)
        frame = match_packets(b, a, max_delay_ns=delay)
        assert np.array_equal(frame["ts_out_ns"].to_numpy(), ref) and frame.index.equals(b.index)
        assert (ref >= 0).sum() > (len(b) // 3 if delay == DELAY else 100)
        assert delay == DELAY or (ref < 0).sum() > len(b) // 10  # the short window cut some


@pytest.mark.parametrize("threads", [1, 2], ids=["one-merge", "two-halves"])
@pytest.mark.parametrize("order", ["merge", "departures", "fifo", "sort"])
@pytest.mark.parametrize("cut", [False, True], ids=["decided", "undecided"])
def test_queue_levels_is_queue_occupancy(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, order: str, cut: bool, threads: int
) -> None:
    """queue_levels and queue_occupancy (built on it) give the events of the numpy oracle
    (tests/analysis/queue_oracle.py). Each path of queue_levels: arrivals in time order
    merged with departures that are not in arrival order (several flows: sorted first, or in
    the order match_rows gives) or are (one flow: one FIFO), and the general sort; with
    every packet decided, or the last ones undecided (the capture after the router ended
    first); merged at once or as two halves at once."""
    from analysis import fastpath

    monkeypatch.setattr(fastpath, "_QUEUE_SPLIT_MIN", 0 if threads == 2 else 1 << 40)
    b, a = read_pcap(pair[0]), read_pcap(pair[1])
    matched = match_packets(b, a, max_delay_ns=DELAY)
    fwd = matched.ts_out_ns.to_numpy() >= 0
    if order == "fifo":  # one flow: its departures keep its arrival order
        one = matched.sport.to_numpy() == matched.sport.to_numpy()[fwd & (matched.proto == 6)][0]
        matched = matched[one]
        dep = matched.ts_out_ns.to_numpy()[matched.ts_out_ns.to_numpy() >= 0]
        assert (np.diff(dep) >= 0).all()
    elif order in ("merge", "departures"):
        dep = matched.ts_out_ns.to_numpy()[fwd]
        assert (np.diff(dep) < 0).any()
    else:  # not in time order: the sorting path
        matched = matched.sample(frac=1, random_state=3)
    if cut:  # the capture after the router stopped early: the last packets are undecided
        late = matched.ts_ns.to_numpy() >= matched.ts_ns.quantile(0.9)
        matched = matched.assign(
            ts_out_ns=np.where(late, -1, matched.ts_out_ns), forwarded=~late & matched.forwarded
        )
    departures = None
    if order == "departures":
        ts_out, departures = match_rows(
            key_hash(b), b.ts_ns.to_numpy(), key_hash(a), a.ts_ns.to_numpy(), max_delay_ns=DELAY
        )
        out = matched.ts_out_ns.to_numpy()
        assert np.array_equal(ts_out[out >= 0], out[out >= 0])
        departures = departures[out[departures] >= 0]  # not the cut ones
        assert len(departure_order(departures, out, (out >= 0).sum()))  # used, not sorted
    ref = queue_events(matched, delay_ns=1000, max_delay_ns=DELAY, with_rows=True)  # oracle
    frame = queue_occupancy(matched, delay_ns=1000, max_delay_ns=DELAY)  # on queue_levels
    pd.testing.assert_frame_equal(frame, ref.drop(columns="row"))  # addresses, ports too
    got = queue_levels(
        matched.ts_ns.to_numpy(),
        matched.ts_out_ns.to_numpy(),
        *(  # frame sizes, or IP lengths and the Ethernet header
            (matched.ip_len.to_numpy(),)
            if order in ("merge", "departures")
            else (matched.ip_len.to_numpy().astype(np.int64) + 14,)
        ),
        delay_ns=1000,
        max_delay_ns=DELAY,
        departures=departures,
        header_bytes=14 if order in ("merge", "departures") else 0,
        rows=True,
        threads=threads,
    )
    events = 2 * matched.forwarded.sum() + (~matched.forwarded).sum()
    assert len(ref) < events - 10 if cut else len(ref) == events  # undecided: left out
    for c in ("ts_ns", "frame_bytes", "packets", "bytes"):
        assert np.array_equal(got[c], ref[c].to_numpy()), c
    assert np.array_equal(got["event"], ref.event.cat.codes.to_numpy())
    assert np.array_equal(got["row"], ref["row"].to_numpy())
    assert list(EVENTS.categories) == ["departure", "arrival", "drop"]
    assert (got["event"] == 2).sum() > (0 if order == "fifo" else 10)  # drops happened


@pytest.mark.parametrize("departures", ["by-time", "row-order", "sorted"])
def test_queue_levels_in_two_halves(monkeypatch: pytest.MonkeyPatch, departures: str) -> None:
    """Merged as two halves at once (the second from the state counted before its first
    arrival), the events are those of one merge, with ties of every kind where the halves
    meet (departures, arrivals and drops at one time), undecided packets at the end, and
    departures in the order given, in row order (one FIFO) or sorted."""
    from analysis import fastpath

    monkeypatch.setattr(fastpath, "_QUEUE_SPLIT_MIN", 0)
    splits = []
    state = fastpath._queue_state

    def counted(*args):
        splits.append(args[-1])
        return state(*args)

    monkeypatch.setattr(fastpath, "_queue_state", counted)
    rng = np.random.default_rng(5)
    for case in range(400):
        n = int(rng.integers(2, 60))
        ts = np.sort(rng.integers(0, 8, n)) * 1000  # a handful of times: ties everywhere
        fwd = rng.random(n) < 0.7
        wait = 2000 if departures == "row-order" else rng.integers(0, 4, n) * 1000
        out = np.where(fwd, ts + wait, -1)
        order = None
        if departures == "by-time":
            rows = np.flatnonzero(fwd)
            order = rows[np.lexsort((rows, out[rows]))]
        options = {
            "delay_ns": int(rng.integers(0, 2)) * 1000,
            "max_delay_ns": 3000,
            "end_ns": None if case % 3 else int(ts.max()) + 500,  # the last ones undecided
            "departures": order,
            "rows": True,
        }
        sizes = rng.integers(40, 1500, n)
        one = queue_levels(ts, out, sizes, threads=1, **options)
        two = queue_levels(ts, out, sizes, threads=2, **options)
        for c in one:
            assert np.array_equal(two[c], one[c]), (case, c)
    assert len(splits) > 300


@pytest.mark.parametrize("threads", [1, 2])
def test_queue_levels_widen_what_did_not_fit(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """The occupancy is written in 16-bit packets and 32-bit bytes first; a queue that held
    more (40,000 packets of 60,000 bytes: 2.4 GB) is counted again from the events in the
    types its range needs, with the levels a running sum gives, whichever half of a
    two-halves merge held the most, also when the merge gave its arrival times back as it
    went (consume); a small queue keeps the narrow types."""
    from analysis import fastpath

    monkeypatch.setattr(fastpath, "_QUEUE_SPLIT_MIN", 0)
    n = 40_000
    ts = np.arange(n, dtype=np.int64) * 1000
    out = ts + 10**9  # every packet arrives before the first leaves
    size = np.full(n, 60_000)
    given = _alloc(1 << 17, np.int64)[:n]  # a mapping of its own (1 MB): given back as passed
    given[:] = ts
    spent = queue_levels(given, out, size, max_delay_ns=2 * 10**9, threads=threads, consume=True)
    assert resident_bytes(given) < 64 << 10
    got = queue_levels(ts, out, size, max_delay_ns=2 * 10**9, threads=threads)
    for c in got:
        assert np.array_equal(spent[c], got[c]) and spent[c].dtype == got[c].dtype, c
    level = np.r_[np.arange(1, n + 1), np.arange(n - 1, -1, -1)]
    assert got["packets"].dtype == np.int32 and got["bytes"].dtype == np.int64
    assert np.array_equal(got["packets"], level)
    assert np.array_equal(got["bytes"], level.astype(np.int64) * 60_000)
    assert got["bytes"].max() == n * 60_000 > 2**31
    # The same queue, then 60,000 packets through an empty one: with two halves, the peak
    # is in the first (the second starts at the middle arrival).
    late = 2 * 10**9 + np.arange(60_000, dtype=np.int64) * 1000
    ts2, out2 = np.r_[ts, late], np.r_[out, late + 10]
    got = queue_levels(ts2, out2, np.full(len(ts2), 1500), max_delay_ns=2 * 10**9, threads=threads)
    assert got["packets"].dtype == np.int32 and got["packets"].max() == n
    assert np.array_equal(got["packets"], np.r_[level, np.tile([1, 0], 60_000)])
    small = queue_levels(ts, ts + 1500, size, max_delay_ns=10**4, threads=threads)
    assert small["packets"].dtype == np.int16 and small["bytes"].dtype == np.int32
    assert small["packets"].max() == 2 and small["bytes"].max() == 120_000


@pytest.mark.parametrize("threads", [1, 2], ids=["one-merge", "two-halves"])
@pytest.mark.parametrize("departures", ["by-time", "row-order", "copied"])
def test_queue_levels_consume_what_they_passed(
    monkeypatch: pytest.MonkeyPatch, threads: int, departures: str
) -> None:
    """With consume, the merge gives back the pages of the arrival times and of the
    departures list it has passed, a piece at a time (both halves of a two-halves merge
    their own), or the whole list where it does not read it (departures in row order, or
    copied into an int32 list of its own); the events are those of a merge that keeps them,
    for arrival times given as a view into a longer mapping too."""
    from analysis import fastpath

    monkeypatch.setattr(fastpath, "_QUEUE_SPLIT_MIN", 0 if threads == 2 else 1 << 40)
    monkeypatch.setattr(fastpath, "_QUEUE_PIECE", 5000)
    rng = np.random.default_rng(11)
    n = 300_000
    ts = np.cumsum(rng.integers(0, 3, n)) * 1000
    fwd = rng.random(n) < 0.9
    if departures == "row-order":  # one FIFO
        out = np.where(fwd, ts + 10**6, -1)
    else:  # two FIFOs: even rows wait longer
        out = np.where(fwd, ts + np.where(np.arange(n) % 2, 10**6, 3 * 10**6), -1)
    rows = np.flatnonzero(fwd)
    order = rows[np.lexsort((rows, out[rows]))]
    options = {"max_delay_ns": 5 * 10**6, "header_bytes": 14, "threads": threads}
    ref = queue_levels(ts, out, np.full(n, 1500), departures=order.copy(), **options)
    mapping = _alloc(n + 70_000, np.int64)
    given_ts = mapping[50_000 : 50_000 + n]  # a view, pages of the mapping on both sides
    given_ts[:] = ts
    mapping[:50_000] = mapping[-20_000:] = 7
    given_dep = _alloc(len(order), np.int64 if departures == "copied" else np.int32)
    given_dep[:] = order
    got = queue_levels(
        given_ts, out, np.full(n, 1500), departures=given_dep, consume=True, **options
    )
    for c in ref:
        assert np.array_equal(got[c], ref[c]), c
    assert resident_bytes(given_ts) < 32 << 10  # at most a page at each end of each half
    assert resident_bytes(given_dep) < 32 << 10
    assert (mapping[:50_000] == 7).all() and (mapping[-20_000:] == 7).all()  # not the view's


class _SecondHalfFirst:
    """ThreadPoolExecutor's stand-in for the queue's two halves: the job submitted (the second
    half) runs to its end at once, before the first half: one order two threads may take."""

    def __init__(self, *_args, **_kwargs) -> None:
        pass

    def __enter__(self) -> _SecondHalfFirst:
        return self

    def __exit__(self, *_exc) -> None:
        return None

    def submit(self, fn, *args) -> Future:
        done: Future = Future()
        done.set_result(fn(*args))
        return done


@pytest.mark.parametrize("where", ["sparse-drops", "departure-on-a-page"])
def test_queue_halves_consume_only_what_the_other_does_not_read(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The second half of a consuming two-halves merge, run to its end before the first, gives
    back nothing the first half still reads in its last events: the times of the middle
    arrival and of the next drop (pages past the middle when drops are sparse), and the
    entry of the departures list that follows its last departure (read as the next one, here
    at the start of a page); once both are done the rows between them go back too."""
    from analysis import fastpath

    monkeypatch.setattr(fastpath, "_QUEUE_SPLIT_MIN", 0)
    monkeypatch.setattr(fastpath, "ThreadPoolExecutor", _SecondHalfFirst)
    n = 200_000
    ts = np.arange(n, dtype=np.int64) * 1000
    if where == "sparse-drops":  # forwarded until pages past the middle, then drops
        out = np.where(np.arange(n) < n // 2 + 5000, ts + 10**6, -1)
        out[-1] = ts[-1] + 10**6  # no undecided packet at the end
        order = np.flatnonzero(out >= 0).astype(np.int32)
    else:  # two FIFOs (the departures list is not in row order), ties, drops
        rng = np.random.default_rng(3)
        ts = np.cumsum(rng.integers(0, 3, n)) * 1000
        wait = np.where(np.arange(n) % 2, 10**5, 3 * 10**6) + rng.integers(0, 2, n) * 1000
        out = np.where(rng.random(n) < 0.95, ts + wait, -1)
        rows = np.flatnonzero(out >= 0)
        order = rows[np.lexsort((rows, out[rows]))].astype(np.int32)
    size = np.full(n, 100)
    options = {"max_delay_ns": 10**8, "threads": 2}
    ref = queue_levels(ts, out, size, departures=order.copy(), **options)
    given_ts = _alloc(n, np.int64) if where == "sparse-drops" else ts.copy()  # (kept whole)
    given_ts[:] = ts
    middle = fastpath._next_arrival(out, n // 2)
    cut, last_fwd = int(out.max()) - 10**8, int(ts[out >= 0].max())
    half = fastpath._queue_state(ts, out, size, 0, 0, order, len(order), cut, last_fwd, middle)
    pad = -half[3] % 1024  # the first half's next departure, order[half[3]], begins a page
    mapping = _alloc(len(order) + pad + 300_000, np.int32)
    given = mapping[pad : pad + len(order)]
    given[:] = order
    got = queue_levels(given_ts, out, size, departures=given, consume=True, **options)
    for c in ref:
        assert np.array_equal(got[c], ref[c]), c
    assert resident_bytes(given) < 32 << 10
    assert resident_bytes(given_ts) < 32 << 10 or where != "sparse-drops"


def test_matching_follows_the_greedy_rule_with_repeated_keys() -> None:
    """Keys that repeat (IP IDs wrap, UDP payloads repeat) within and across windows, times
    with ties, both sides in and out of time order: match_rows gives analysis.match's greedy
    matching (each before packet in time order takes the earliest unused after packet of its
    key in [ts, ts + max_delay]; tests/analysis/greedy.py) and the matched rows in departure
    order."""
    rng = np.random.default_rng(11)
    for case in range(300):
        nb, na, nkeys = rng.integers(1, 300), rng.integers(1, 300), rng.integers(1, 20)
        hb, ha = (rng.integers(0, nkeys, n).astype(np.uint64) for n in (nb, na))
        tb, ta = (rng.integers(0, 1000, n).astype(np.int64) for n in (nb, na))
        delay = int(rng.integers(0, 200))
        if case % 2:  # in time order, as a capture is written
            tb.sort()
            ta.sort()
        want = greedy_match(hb, ha, tb, ta, delay)
        got, departures = match_rows(hb, tb, ha, ta, max_delay_ns=delay)
        assert np.array_equal(got, want), case
        assert sorted(departures) == sorted(np.flatnonzero(want >= 0)), case
        assert (np.diff(want[departures]) >= 0).all(), case  # in the order they left


@pytest.mark.parametrize("in_order", [True, False], ids=["in-order", "shuffled"])
def test_matching_with_many_packets_passed_over(in_order: bool) -> None:
    """Thousands of packets dropped or overtaken while their windows are open: the matcher's
    table of packets passed over fills past half many times, is rebuilt (windows closed
    since go) and grows; the matching stays the greedy one."""
    rng = np.random.default_rng(3)
    n = 20_000
    tb = np.sort(rng.integers(0, 10**7, n)).astype(np.int64)
    hb = rng.integers(0, 2**63, n).astype(np.uint64)
    hb[rng.random(n) < 0.02] = 7  # a repeated key too
    kept = rng.random(n) > 0.3  # the rest dropped
    late = rng.random(n) < 0.05  # overtaken: leave later than their turn
    ta = tb + 1000 + np.where(late, rng.integers(0, 10**6, n), 0)
    ha, ta = hb[kept], ta[kept]
    order = np.argsort(ta, kind="stable")
    ha, ta = ha[order], ta[order]
    if not in_order:
        perm = rng.permutation(len(ha))
        ha, ta = ha[perm], ta[perm]
    for delay in (2 * 10**6, 10**5, 5000):  # windows long, shorter than some overtaking, short
        want = greedy_match(hb, ha, tb, ta, delay)
        got, departures = match_rows(hb, tb, ha, ta, max_delay_ns=delay)
        assert np.array_equal(got, want), delay
        assert sorted(departures) == sorted(np.flatnonzero(want >= 0)), delay
    assert 0.9 * kept.sum() < (want >= 0).sum() < kept.sum()  # short: overtaken ones missed


def test_a_shared_queue_keeps_arrival_order(fifo_pair: tuple[Path, Path]) -> None:
    """tests/analysis/tcpgen.py's shared queue is one FIFO: the packets that cross it (data
    and UDP; not the handshakes and FINs, which it does not queue) leave in the order they
    arrived, and some were dropped."""
    b, a = read_pcap(fifo_pair[0]), read_pcap(fifo_pair[1])
    queued = ((b.proto == 6) & (b.payload_len > 0) | (b.proto == 17)).to_numpy()
    out = match_packets(b, a, max_delay_ns=DELAY).ts_out_ns.to_numpy()[queued]
    assert (np.diff(out[out >= 0]) > 0).all()
    assert 20 < (out < 0).sum() < len(out) // 20


def test_departures_within_one_tick_are_put_in_row_order() -> None:
    """Two packets that leave within one timestamp tick may be listed by the capture after
    the router out of row order: queue_levels' order is (departure time, row), repaired in
    place; a list far from that order, or one that repeats or misses a row, is refused (the
    caller sorts) rather than half used."""
    rng = np.random.default_rng(5)
    out = np.sort(rng.integers(0, 400, 5000)) * 1000  # µs ticks: many equal departure times
    out[rng.random(5000) < 0.05] = -1  # dropped
    fwd = np.flatnonzero(out >= 0).astype(np.int32)
    want = np.argsort(out, kind="stable")[len(out) - len(fwd) :]
    seen = fwd.copy()  # as captured: equal times in any order
    for t in np.unique(out[fwd]):
        run = np.flatnonzero(out[seen] == t)
        seen[run] = seen[run][::-1]
    assert not np.array_equal(seen, want)
    assert np.array_equal(departure_order(seen, out, len(fwd)), want)
    assert np.array_equal(departure_order(want, out, len(fwd)), want)
    assert not len(departure_order(rng.permutation(fwd), out, len(fwd)))  # far from it
    repeated = seen.copy()
    repeated[1] = repeated[0]
    assert not len(departure_order(repeated, out, len(fwd)))
    assert not len(departure_order(seen[:-1], out, len(fwd)))
    ts = np.arange(len(out), dtype=np.int64) * 1000 - 10**6
    ref = queue_levels(ts, out, np.full(len(out), 100), max_delay_ns=DELAY)
    got = queue_levels(ts, out, np.full(len(out), 100), max_delay_ns=DELAY, departures=seen)
    for c in ref:
        assert np.array_equal(got[c], ref[c]), c


def test_departures_are_put_in_order_in_place() -> None:
    """Departures out of arrival order (two FIFOs) listed as the capture after them saw them
    (equal times in any order): queue_levels puts a writable int32 list in order where it
    is, and copies one it may not write; the events are those of its own sort."""
    rng = np.random.default_rng(4)
    ts = np.arange(6000, dtype=np.int64) * 1000
    out = ts + np.where(np.arange(6000) % 2 == 0, 5, 20) * 1000  # the odd rows wait longer
    out = out // 4000 * 4000  # 4 µs ticks: runs of equal departure times
    out[rng.random(6000) < 0.05] = -1
    want = np.argsort(out, kind="stable")[(out < 0).sum() :].astype(np.int32)
    seen = want.copy()
    for t in np.unique(out[want]):
        run = np.flatnonzero(out[seen] == t)
        seen[run] = seen[run][::-1]
    assert not np.array_equal(seen, want) and not (np.diff(out[out >= 0]) >= 0).all()
    size = np.full(len(out), 100)
    ref = queue_levels(ts, out, size, max_delay_ns=DELAY)
    frozen, listed = seen.copy(), seen.copy()
    frozen.flags.writeable = False
    for given in (listed, frozen):
        got = queue_levels(ts, out, size, max_delay_ns=DELAY, departures=given)
        for c in ref:
            assert np.array_equal(got[c], ref[c]), c
    assert np.array_equal(listed, want)  # in order where it was: no copy
    assert np.array_equal(frozen, seen)
    scrambled = want[::-1].copy()  # too far from the order for insertion: sorted instead
    got = queue_levels(ts, out, size, max_delay_ns=DELAY, departures=scrambled)
    for c in ref:
        assert np.array_equal(got[c], ref[c]), c
    assert np.array_equal(np.sort(scrambled), np.sort(want))  # the same rows, none lost


def _signed(steps: pd.Series) -> pd.Series:
    """32-bit sequence-number steps as signed numbers (unwrapping, summed)."""
    return ((steps + 2**31) % 2**32) - 2**31


def _last_advance_minus_first_data(frame: pd.DataFrame, flow: dict) -> int:
    """The flow's goodput period worked out from the packets with pandas, apart from the
    counters: from its first payload packet to the last ACK that acknowledged new payload
    (its FIN's ACK acknowledges no payload)."""
    mine = frame[(frame.src == flow["src"]) & (frame.sport == flow["sport"])]
    data = mine[mine.payload_len > 0]
    s0 = int(data.seq.iloc[0])
    seq = s0 + _signed(data.seq.astype(np.int64).diff().fillna(0)).cumsum()
    base, end = int(seq.min()), int((seq + data.payload_len).max())
    back = frame[(frame.src == flow["dst"]) & (frame.dport == flow["sport"])]
    back = back[back.tcp_flags & 0x10 > 0]
    first_ack = int(_signed(pd.Series([int(back.ack.iloc[0]) - s0])).iloc[0])
    steps = _signed(back.ack.astype(np.int64).diff().fillna(0))
    acked = (s0 + first_ack + steps.cumsum()).clip(upper=end)
    advanced = (acked > acked.cummax().shift(fill_value=base)) & (acked > base)
    return int(back.ts_ns[advanced].max()) - int(data.ts_ns.min())


def test_flow_counters_are_the_generators_truth(tmp_path: Path) -> None:
    """Both array paths (read_columns' columns, a scan) and the frame metrics count what the
    generator wrote: unique bytes, data packets, retransmitted packets and bytes, per flow in
    order of first data, on flows that lose packets and whose sequence numbers wrap."""
    truth = generate(
        tmp_path / "b.pcap", tmp_path / "a.pcap", packets=40_000, flows=3, loss=0.003,
        duration_ns=5 * 10**9, seed=4,
    )  # fmt: skip
    frame = read_pcap(tmp_path / "b.pcap")
    data = frame[frame.payload_len > 0]
    assert (
        data.groupby("sport").seq.apply(lambda s: (s.astype("int64").diff() < -(2**31)).any())
    ).any()
    want = pd.DataFrame(truth.flows)
    assert want.retransmitted_packets.gt(0).all()
    names = ["src", "dst", "sport", "dport", "bytes", "data_packets", "retransmitted_packets",
             "retransmitted_bytes"]  # fmt: skip
    firsts = data.groupby("sport").ts_ns.min()
    want = want.assign(first=want.sport.map(firsts)).sort_values("first", kind="stable")[names]
    columns = pd.DataFrame(tcp_flow_counters(read_columns(tmp_path / "b.pcap", COLUMNS)))
    scanned = pd.DataFrame(flow_counters(scan(tmp_path / "b.pcap")))
    frames = tcp_retransmissions(frame).merge(tcp_goodput(frame)[["sport", "bytes"]], on="sport")
    for got in (columns, scanned, frames):
        assert got[names].astype("int64").values.tolist() == want.astype("int64").values.tolist()
    periods = [_last_advance_minus_first_data(frame, f) for f in want.to_dict("records")]
    assert columns.span_ns.tolist() == scanned.span_ns.tolist() == periods
    assert (tcp_goodput(frame).seconds * 1e9).round().astype("int64").tolist() == periods


def test_a_growing_capture_is_read_up_to_its_size_at_the_start(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """tcpdump may still be writing: bytes appended while reading are not read (the columns
    were sized for the file as it was)."""
    from analysis import pcapscan

    data = pair[0].read_bytes()
    path = pair[0].parent / "growing.pcap"
    path.write_bytes(data[: len(data) // 2])
    real = pcapscan.os.path.getsize

    grown = []

    def size_then_grow(p):  # the file is completed right after its size was taken
        size = real(p)
        if not grown:
            with open(p, "ab") as f:
                f.write(data[len(data) // 2 :])
            grown.append(size)
        return size

    monkeypatch.setattr(pcapscan.os.path, "getsize", size_then_grow)
    with pytest.warns(UserWarning, match="truncated"):
        half = read_columns(path, ["ts_ns"])["ts_ns"]
    monkeypatch.undo()
    whole = read_columns(path, ["ts_ns"])["ts_ns"]
    assert 0 < len(half) < len(whole) and np.array_equal(half, whole[: len(half)])


@pytest.mark.parametrize("snaplen", [65535, 60, 50], ids=["whole", "cut-in-tcp", "cut-in-ports"])
def test_scan_is_read_columns(tmp_path: Path, snaplen: int) -> None:
    """scan's columns are read_pcap's (TCP fields on TCP packets, payload lengths below 0 as
    0); every packet's direction holds its addresses, ports and protocol; thousands of
    directions (the table grows while scanning); frames cut inside the headers."""
    path = write_pcap(tmp_path / "r.pcap", random_capture(seed=5, n=6000), snaplen=snaplen)
    cols = read_columns(path, [*COLUMNS, "key_hash"])
    cap = scan(path)
    for c in ("ts_ns", "key_hash", "ip_len"):
        assert np.array_equal(getattr(cap, c), cols[c]), c
    tcp = cols["proto"] == 6
    assert np.array_equal(cap.tcp_flags, np.where(tcp, cols["tcp_flags"], 0))
    seq_or_ack, acks = _tcp_numbers(cols)
    assert np.array_equal(cap.seq_or_ack, seq_or_ack) and np.array_equal(ack_column(cap), acks)
    assert np.array_equal(cap.payload_len, np.where(tcp, np.maximum(cols["payload_len"], 0), 0))
    d = cap.directions
    assert len(d["src"]) > 2 * 2048 and cap.in_order
    for c in ("src", "dst", "sport", "dport", "proto"):
        assert np.array_equal(d[c][cap.direction], cols[c]), c
    assert np.array_equal(d["first"], np.unique(cap.direction, return_index=True)[1])
    payload = cap.payload_len > 0  # TCP only: 0 on other packets
    first_data = np.full(len(d["src"]), -1)
    dirs, rows = np.unique(cap.direction[payload], return_index=True)
    first_data[dirs] = np.flatnonzero(payload)[rows]
    assert np.array_equal(d["first_data"], first_data) and (first_data >= 0).any()
    has = d["reverse"] >= 0
    assert has.any() and np.array_equal(d["reverse"][d["reverse"][has]], np.flatnonzero(has))
    assert np.array_equal(d["src"][d["reverse"][has]], d["dst"][has])
    assert np.array_equal(d["sport"][d["reverse"][has]], d["dport"][has])


def test_directions_of_many_flows(tmp_path: Path) -> None:
    """tcp_flow_counters' direction ids (fastpath._directions): one per (src, dst, sport,
    dport) of the TCP packets in order of first appearance, -1 for other packets, and each
    direction's reverse; thousands of them, so the table grows several times."""
    path = write_pcap(tmp_path / "r.pcap", random_capture(seed=5, n=6000))
    cols = read_columns(path, ["src", "dst", "sport", "dport", "proto"])
    swap = {"src": "dst", "dst": "src", "sport": "dport", "dport": "sport", "proto": "proto"}
    cols = {c: np.r_[cols[c], cols[swap[c]][:500]] for c in cols}  # some replies
    ids, m, rev = _directions(cols["src"], cols["dst"], cols["sport"], cols["dport"], cols["proto"])
    seen: dict[tuple[int, ...], int] = {}
    want = []
    for src, dst, sport, dport, proto in zip(*(cols[c].tolist() for c in cols), strict=True):
        want.append(seen.setdefault((src, dst, sport, dport), len(seen)) if proto == 6 else -1)
    assert ids.tolist() == want and m == len(seen) > 2 * 1024
    keys = list(seen)
    back = [seen.get((dst, src, dport, sport), -1) for src, dst, sport, dport in keys]
    assert rev.tolist() == back and max(back) >= 0


def test_acks_carried_by_data_count(pair: tuple[Path, Path]) -> None:
    """A packet that acknowledges a flow's data counts as its ACK whether or not it carries
    data of its own: each flow's counters stay as they are when a third of the packets of
    its reverse direction (pure ACKs before) carry data, with and without a window."""
    cols = read_columns(pair[0], COLUMNS)
    four = ("src", "dst", "sport", "dport")
    key = pd.MultiIndex.from_arrays([cols[c] for c in four])
    sends = key[cols["payload_len"] > 0].unique()
    reverse = ~key.isin(sends) & (cols["proto"] == 6)  # the directions of the ACKs
    both = {**cols, "payload_len": cols["payload_len"].copy()}
    answers = reverse & (np.random.default_rng(2).random(len(reverse)) < 1 / 3)
    both["payload_len"][answers] = 700
    t = np.sort(cols["ts_ns"])
    for bounds in ({}, {"start_ns": int(t[len(t) // 3]), "end_ns": int(t[2 * len(t) // 3])}):
        one_way = pd.DataFrame(tcp_flow_counters(cols, **bounds))
        two_way = pd.DataFrame(tcp_flow_counters(both, **bounds))
        assert len(two_way) == 2 * len(one_way) and one_way.bytes.gt(0).all()
        same = one_way.merge(two_way, on=list(four), suffixes=("", "_both"))
        assert len(same) == len(one_way)
        for c in ("bytes", "span_ns", "data_packets", "retransmitted_packets"):
            assert same[c].tolist() == same[f"{c}_both"].tolist(), c


def test_packets_without_the_ack_flag_ack_nothing(pair: tuple[Path, Path]) -> None:
    """SYNs and RSTs without the ACK flag sent back on the flows (their ack field any
    number) change no flow's counters."""
    cols = read_columns(pair[0], COLUMNS)
    key = pd.MultiIndex.from_arrays([cols[c] for c in ("src", "dst", "sport", "dport")])
    sends = key[cols["payload_len"] > 0].unique()
    reverse = np.flatnonzero(~key.isin(sends) & (cols["proto"] == 6))
    rng = np.random.default_rng(8)
    extra = rng.choice(reverse, size=len(reverse) // 10, replace=False)
    more = {c: np.r_[cols[c], cols[c][extra]] for c in cols}  # after the rest in the file
    more["tcp_flags"][len(cols["ts_ns"]) :] = rng.choice([0x02, 0x04], len(extra))  # SYN, RST
    more["ack"][len(cols["ts_ns"]) :] = rng.integers(0, 2**32, len(extra))
    t = np.sort(cols["ts_ns"])
    for bounds in ({}, {"start_ns": int(t[len(t) // 3]), "end_ns": int(t[2 * len(t) // 3])}):
        ref, got = tcp_flow_counters(cols, **bounds), tcp_flow_counters(more, **bounds)
        assert ref["bytes"].sum() > 0
        for c in ref:
            assert np.array_equal(got[c], ref[c]), c


def _tcp_numbers(cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """What a scan keeps of read_columns' seq and ack: seq_or_ack (seq of a TCP packet with
    data or FIN, else its ack) and ack_column (the ack where the ACK flag is set or the
    packet carries neither data nor FIN), 0 on other packets."""
    tcp = cols["proto"] == 6
    flags = np.where(tcp, cols["tcp_flags"], 0)
    carries = tcp & ((cols["payload_len"] > 0) | ((flags & 0x01) != 0))
    seq_or_ack = np.where(carries, cols["seq"], np.where(tcp, cols["ack"], 0))
    acks = np.where(tcp & (((flags & 0x10) != 0) | ~carries), cols["ack"], 0)
    return seq_or_ack, acks


def _shuffled(path: Path, out: Path, seed: int) -> Path:
    """A copy of the capture with some records moved (timestamps out of file order)."""
    data = path.read_bytes()
    records, pos = [], 24
    while pos < len(data):
        caplen = int.from_bytes(data[pos + 8 : pos + 12], "little")
        records.append(data[pos : pos + 16 + caplen])
        pos += 16 + caplen
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(records) - 50, size=len(records) // 20, replace=False):
        j = i + int(rng.integers(1, 50))
        records[i], records[j] = records[j], records[i]
    out.write_bytes(data[:24] + b"".join(records))
    return out


@pytest.mark.parametrize("window", [False, True], ids=["whole", "window"])
def test_flow_counters_of_a_scan(pair: tuple[Path, Path], tmp_path: Path, window: bool) -> None:
    """flow_counters of a scan are tcp_flow_counters of read_pcap's columns, captures in
    time order or not, with or without a window; scans into the memory of an earlier one
    (which kept other columns: a crossing scan) give the same; packets are counted in time
    order, so the capture with some records moved gives the original's numbers."""
    prev = None
    tables = []
    for path in (pair[0], pair[1], _shuffled(pair[0], tmp_path / "shuffled.pcap", seed=4)):
        cols = read_columns(path, COLUMNS)
        bounds = {}
        if window:
            t = np.sort(cols["ts_ns"])
            bounds = {"start_ns": int(t[len(t) // 3]), "end_ns": int(t[2 * len(t) // 3])}
        ref = tcp_flow_counters(cols, **bounds)
        cap = scan(path, reuse=prev, crossing=[] if path == pair[1] else None)
        seq_or_ack, acks = _tcp_numbers(cols)
        assert np.array_equal(cap.ts_ns, cols["ts_ns"])
        assert np.array_equal(cap.seq_or_ack, seq_or_ack) and np.array_equal(ack_column(cap), acks)
        assert len(cap.data_acks["row"]) < 100  # bulk flows: their data packets repeat an ack
        assert cap.in_order == (path.name != "shuffled.pcap")
        got = flow_counters(cap, **bounds)
        assert list(got) == list(ref)
        for c in ref:
            assert np.array_equal(got[c], ref[c]), (path.name, c)
        assert ref["retransmitted_packets"].sum() > 0
        prev = cap
        tables.append(ref)
    original, moved = (
        pd.DataFrame(t).sort_values(["src", "dst", "sport", "dport"], ignore_index=True)
        for t in (tables[0], tables[2])
    )  # flows are numbered in file order: the moved records may change their order
    pd.testing.assert_frame_equal(moved, original)


def _conversations(path: Path, seed: int, connections: int) -> Path:
    """Request-response TCP connections, interleaved: both ends send data, each data packet
    ACKing what its end has received (several in a row with one ack, or the ack moving on);
    pure ACKs, a few data packets without the ACK flag, sequence numbers that wrap, a FIN
    each way."""
    rng = np.random.default_rng(seed)
    records = []
    for c in range(connections):
        ends = (("198.18.0.1", 40_000 + c), ("198.19.0.1", 5001))
        nxt = [int(rng.integers(2**32 - 50_000, 2**32)), int(rng.integers(2**32))]
        sends = []  # (side, flags, payload bytes)
        for _ in range(int(rng.integers(20, 60))):
            side = int(rng.integers(2))
            for _ in range(int(rng.integers(1, 5))):
                flags = 0x08 if rng.random() < 0.05 else 0x18
                sends.append((side, flags, int(rng.choice([1, 100, 1448]))))
            if rng.random() < 0.5:
                sends.append((1 - side, 0x10, 0))
        sends += [(0, 0x11, 0), (1, 0x11, 0)]
        ts = T0 + c * 7_000
        for side, flags, size in sends:
            ts += int(rng.integers(1, 500)) * 1000
            (src, sport), (dst, dport) = ends[side], ends[1 - side]
            acked = nxt[1 - side] % 2**32  # everything the other end sent has arrived
            seg = tcp_segment(sport, dport, nxt[side] % 2**32, acked, flags, b"x" * size)
            records.append((ts, ethernet(ipv4(src, dst, 6, seg))))
            nxt[side] += size + (flags & 0x01)
    records.sort(key=lambda r: r[0])
    return write_pcap(path, records)


@pytest.mark.parametrize("threads", [1, 2], ids=["one-reading", "two-halves"])
def test_flow_counters_of_request_response_flows(
    tmp_path: Path, joins: list[int], threads: int
) -> None:
    """Data packets that also ACK the other direction's data (both ends send): a scan keeps
    their acks where they change (data_acks, fewer than the packets) and flow_counters gives
    tcp_flow_counters of read_columns' columns, with and without a window, the capture in
    time order and with records moved (then the acks are filled in first, in file order)."""
    path = _conversations(tmp_path / "c.pcap", seed=3, connections=40)
    for p in (path, _shuffled(path, tmp_path / "moved.pcap", seed=5)):
        cols = read_columns(p, COLUMNS)
        cap = scan(p, threads=threads)
        assert cap.in_order == (p == path)
        seq_or_ack, acks = _tcp_numbers(cols)
        assert np.array_equal(cap.seq_or_ack, seq_or_ack)
        assert np.array_equal(ack_column(cap), acks)
        acked_data = (cols["payload_len"] > 0) & ((cols["tcp_flags"] & 0x10) != 0)
        assert 80 <= len(cap.data_acks["row"]) < acked_data.sum()
        assert cap.data_acks["row"].dtype == np.int32  # 8 bytes a listed ack
        t = np.sort(cols["ts_ns"])
        for bounds in ({}, {"start_ns": int(t[len(t) // 3]), "end_ns": int(t[2 * len(t) // 3])}):
            ref = tcp_flow_counters(cols, **bounds)
            got = flow_counters(cap, **bounds)
            assert len(ref["src"]) == 80 and (ref["bytes"] > 0).sum() >= 40
            for c in ref:
                assert np.array_equal(got[c], ref[c]), (p.name, bounds, c)
    assert len(joins) == (2 if threads == 2 else 0)


@pytest.mark.parametrize("snaplen", [65535, 50], ids=["whole", "cut-in-ports"])
def test_crossing_scan_keeps_the_packets_of_its_pairs(tmp_path: Path, snaplen: int) -> None:
    """A scan given (src, dst) pairs keeps the chosen columns of exactly the packets from src
    to dst of one of them, in file order, and the flow-counter columns of every packet, but
    not key_hash and ip_len of every packet; an unknown column is refused by name."""
    path = write_pcap(tmp_path / "r.pcap", random_capture(seed=7, n=6000), snaplen=snaplen)
    cols = read_columns(path, [*COLUMNS, "key_hash"])
    ends = cols["src"].astype(np.uint64) << np.uint64(32) | cols["dst"]
    pairs = np.unique(ends)[::3]  # a third of the (src, dst) pairs seen
    inside = np.isin(ends, pairs)
    assert 0 < inside.sum() < len(ends)
    full = scan(path)
    cap = scan(path, crossing=pairs)
    assert set(cap.crossing) == {"direction", "ts_ns", "key_hash", "ip_len"}
    for c in ("ts_ns", "key_hash", "ip_len"):
        assert np.array_equal(cap.crossing[c], cols[c][inside]), c
    assert np.array_equal(cap.crossing["direction"], cap.direction[inside])
    assert len(cap.key_hash) == len(cap.ip_len) == 0 and full.crossing is None
    for c in ("direction", "ts_ns", "seq_or_ack", "payload_len", "tcp_flags"):
        assert np.array_equal(getattr(cap, c), getattr(full, c)), c
    for c in ("row", "ack"):
        assert np.array_equal(cap.data_acks[c], full.data_acks[c]), c
    two = scan(path, reuse=cap, crossing=pairs, crossing_columns=("ts_ns", "key_hash"))
    assert set(two.crossing) == {"ts_ns", "key_hash"}
    assert np.array_equal(two.crossing["key_hash"], cols["key_hash"][inside])
    assert len(scan(path, crossing=[]).crossing["ts_ns"]) == 0
    with pytest.raises(ValueError, match=r"crossing_columns: \['size'\] not among"):
        scan(path, crossing=pairs, crossing_columns=("ts_ns", "size"))


@pytest.mark.parametrize("threads", [1, 2])
def test_crossing_times_taken_from_a_spent_capture(
    tmp_path: Path, joins: list[int], threads: int
) -> None:
    """crossing_times (a copy) and take_crossing_times give what a crossing scan keeps as
    ts_ns (read whole or as two halves), from the capture's own column; taken, the capture
    is left without ts_ns, its other
    columns as they were, and a scan reusing it allocates that column anew (the times
    taken stay as they are); the pages past the times taken are given back."""
    from analysis import fastpath

    path = write_pcap(tmp_path / "r.pcap", random_capture(seed=5, n=40_000))
    ends = scan(path, threads=1).directions
    pairs = np.unique(ends["src"].astype(np.uint64) << np.uint64(32) | ends["dst"])[::3]
    kept = scan(path, crossing=pairs, threads=threads)
    cap = scan(path, crossing=pairs, crossing_columns=("key_hash",), threads=threads)
    assert set(cap.crossing) == {"key_hash"}
    flags = cap.tcp_flags.copy()
    copied = fastpath.crossing_times(cap)  # a copy: cap keeps its times
    assert np.array_equal(copied, kept.crossing["ts_ns"])
    assert np.array_equal(cap.ts_ns, kept.ts_ns) and len(flow_counters(cap)["src"])
    taken = fastpath.take_crossing_times(cap)
    assert 0 < len(taken) < len(kept.ts_ns)
    assert np.array_equal(taken, kept.crossing["ts_ns"])
    assert len(cap.ts_ns) == 0 and np.array_equal(cap.tcp_flags, flags)
    copy = taken.copy()
    with pytest.raises(ValueError, match="its times were taken"):
        flow_counters(cap)
    with pytest.raises(ValueError, match="its times were taken"):
        fastpath.take_crossing_times(cap)
    again = scan(path, reuse=cap, crossing=pairs, threads=threads)
    assert np.array_equal(again.ts_ns, kept.ts_ns) and np.array_equal(taken, copy)
    seq = again.seq_or_ack.copy()
    other = write_pcap(tmp_path / "o.pcap", random_capture(seed=6, n=40_000))
    scan(other, reuse=cap, threads=threads)  # cap's memory is again's now: not taken twice
    assert np.array_equal(again.seq_or_ack, seq) and np.array_equal(taken, copy)
    assert len(joins) == (4 if threads == 2 else 0)
    big = _alloc(1 << 20, np.int64)  # 8 MB of times, a crossing packet in 64
    rows = len(big) - 1000  # as a scan's columns: the rows, a view of a longer allocation
    big[:rows] = np.arange(rows)
    spent = fastpath.Capture(
        "", (np.arange(rows) % 64 != 0).astype(np.int32), big[:rows], *[np.empty(0)] * 5, {},
        {"crossing": np.array([True, False])}, True,
        buffers=[None, big],
    )  # fmt: skip
    before = _resident_kib()
    taken = fastpath.take_crossing_times(spent)
    assert np.array_equal(taken, np.arange(0, rows, 64))
    assert before - _resident_kib() > 6000  # KiB: all but the 128 KB taken


def _resident_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0])


def test_scan_of_a_truncated_or_corrupt_capture(tmp_path: Path) -> None:
    """As read_columns: a truncated capture keeps its complete records and warns, naming the
    file and the offset; a corrupt record header is an error."""
    data = write_pcap(tmp_path / "v.pcap", random_capture(seed=1, n=20)).read_bytes()
    path = tmp_path / "cut.pcap"
    path.write_bytes(data[:-10])
    with pytest.warns(PcapTruncatedWarning, match=r"cut\.pcap: truncated packet record") as w:
        cut = scan(path)
    with pytest.warns(PcapTruncatedWarning) as w_ref:
        ref = read_columns(path, ["ts_ns"])
    assert str(w[0].message) == str(w_ref[0].message)
    assert np.array_equal(cut.ts_ns, ref["ts_ns"]) and len(ref["ts_ns"]) > 10
    bad = bytearray(data)
    bad[24 + 8 : 24 + 12] = (10**9).to_bytes(4, "little")  # the first record's caplen
    path.write_bytes(bytes(bad))
    with pytest.raises(PcapError, match=r"cut\.pcap: corrupt record header at byte 24"):
        scan(path)


def _flows_capture(path: Path, flows) -> Path:
    """One TCP data packet per entry of ``flows`` (flow numbers), a microsecond apart; flow i
    is a direction of its own (its source address and port)."""
    records = [
        (
            T0 + j * 1000,
            ethernet(
                ipv4(
                    f"198.18.{i // 60_000}.1", "198.19.0.1", 6,
                    tcp_segment(1024 + i % 60_000, 5001, 7 * j, 0, 0x18, b"x" * 9),
                )
            ),
        )
        for j, i in enumerate(flows)
    ]  # fmt: skip
    return write_pcap(path, records)


def test_direction_ids_in_the_narrowest_type(tmp_path: Path, joins: list[int]) -> None:
    """A scan numbers directions in 8 bits while they fit and widens its direction columns
    (16, then 32 bits) when it meets more, reading on: 300 and 70,000 flows give
    read_columns' flow counters, read whole or as two halves whether the first half, the
    second or only both together need the wider type (one join each: nothing read twice); a
    scan into a capture's memory keeps its (wider) type, its crossing direction column too."""
    few = _flows_capture(tmp_path / "few.pcap", [*range(200), *range(200)])
    assert scan(few, threads=1).direction.dtype == np.uint8
    for n, kind in ((300, np.uint16), (70_000, np.int32)):
        path = _flows_capture(tmp_path / f"{n}.pcap", range(n))
        ref = tcp_flow_counters(read_columns(path, COLUMNS))
        for threads in (1, 2):
            joins.clear()
            cap = scan(path, threads=threads)
            assert len(joins) == threads - 1
            assert cap.direction.dtype == kind and len(cap.directions["src"]) == n
            assert np.array_equal(cap.direction, np.arange(n))
            got = flow_counters(cap)
            for c in ref:
                assert np.array_equal(got[c], ref[c]), (n, threads, c)
    cases = {  # the flows of each half (the halves split at the middle record)
        "first": [*range(300), *np.arange(300) % 10],
        "second": [*np.arange(300) % 10, *range(10, 310)],
        "together": [*range(200), *range(200, 400)],
    }
    for case, flows in cases.items():
        path = _flows_capture(tmp_path / f"{case}.pcap", flows)
        pairs = np.array([0xC612_0001 << 32 | 0xC613_0001], np.uint64)
        alone = scan(path, threads=1, crossing=pairs)
        joins.clear()
        both = scan(path, threads=2, crossing=pairs)
        assert len(joins) == 1, case
        assert both.direction.dtype == alone.direction.dtype == np.uint16, case
        assert both.crossing["direction"].dtype == np.uint16, case
        _assert_same_scan(both, alone)
        assert np.array_equal(both.crossing["direction"], alone.crossing["direction"]), case
    donor = scan(tmp_path / "together.pcap", threads=1)  # as long as few: its memory fits
    pairs = np.array([0xC612_0001 << 32 | 0xC613_0001], np.uint64)
    wide = scan(few, reuse=donor, crossing=pairs, threads=1)
    assert wide.direction.dtype == wide.crossing["direction"].dtype == np.uint16
    ref = scan(few, crossing=pairs, threads=1)
    _assert_same_scan(wide, ref)
    assert np.array_equal(wide.crossing["direction"], ref.crossing["direction"])
    with pytest.raises(ValueError, match="a later scan took its memory"):
        crossing_times(donor)


def test_a_half_pauses_while_the_other_widens(
    tmp_path: Path, joins: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In blocks of about ten records, the half that meets a 257th direction stops, the
    other pauses at its next block, and both read on at once in 16 bits: the scan of one
    thread, whichever half widens, or both. The half that does not widen takes its second
    block only once the other has stopped to widen: on a loaded machine one thread can
    otherwise read its whole half before the other starts (a CI run saw it)."""
    from analysis import fastpath

    monkeypatch.setattr(fastpath, "_BLOCK", 1000)
    codes: list[int] = []
    widened = threading.Event()
    read = fastpath._read

    def logged(*args, **kwargs) -> None:
        read(*args, **kwargs)
        codes.append(args[5].code)
        if args[5].code == fastpath._WIDE:
            widened.set()

    held = {"first": "second half", "second": "first half", "both": None}
    holding: list[str | None] = [None]  # the half held in the two-thread scan under way

    class HeldBlocks(fastpath._Blocks):
        def __iter__(self):
            half = "first half" if self.offset == fastpath._GLOBAL_HDR else "second half"
            for i, block in enumerate(super().__iter__()):
                if i == 1 and half == holding[0]:
                    assert widened.wait(60), f"{case}: the other half never widened"
                yield block

    monkeypatch.setattr(fastpath, "_read", logged)
    monkeypatch.setattr(fastpath, "_Blocks", HeldBlocks)
    cases = {
        "first": [*range(3000), *np.arange(3000) % 10],
        "second": [*np.arange(3000) % 10, *range(10, 3010)],
        "both": list(range(6000)),
    }
    for case, flows in cases.items():
        path = _flows_capture(tmp_path / f"{case}.pcap", flows)
        alone = scan(path, threads=1)
        codes.clear()
        joins.clear()
        widened.clear()
        holding[0] = held[case]
        both = scan(path, threads=2)
        holding[0] = None
        assert len(joins) == 1 and fastpath._WIDE in codes, case
        if case != "both":
            assert fastpath._PAUSED in codes, case
        assert both.direction.dtype == np.uint16, case
        _assert_same_scan(both, alone)


def test_a_truncated_capture_read_with_wider_ids(tmp_path: Path, joins: list[int]) -> None:
    """A capture cut in its last record whose directions need 16 bits: its complete records,
    read whole or as two halves, with the truncation's warning."""
    path = _flows_capture(tmp_path / "cut.pcap", range(600))
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.warns(PcapTruncatedWarning):
        alone = scan(path, threads=1)
    with pytest.warns(PcapTruncatedWarning):
        both = scan(path, threads=2)
    assert len(alone.ts_ns) == 599 and alone.direction.dtype == np.uint16
    _assert_same_scan(both, alone)


def test_scan_in_small_blocks(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records cut by the end of a block (read by scan's reader thread while the one before
    is parsed) are parsed whole from the next; a truncated end and a corrupt header deep in
    the file are found at their file offsets."""
    from analysis import fastpath

    monkeypatch.setattr(fastpath, "_BLOCK", 1000)  # about ten records a block
    cols = read_columns(pair[0], COLUMNS)
    cap = scan(pair[0])
    for c in ("ts_ns", "ip_len"):
        assert np.array_equal(getattr(cap, c), cols[c]), c
    seq_or_ack, acks = _tcp_numbers(cols)
    assert np.array_equal(cap.seq_or_ack, seq_or_ack) and np.array_equal(ack_column(cap), acks)
    data = pair[0].read_bytes()
    path = tmp_path / "deep.pcap"
    path.write_bytes(data[: len(data) // 2 + 7])
    with pytest.warns(PcapTruncatedWarning) as w:
        cut = scan(path)
    with pytest.warns(PcapTruncatedWarning) as w_ref:
        ref = read_columns(path, ["ts_ns"])
    assert str(w[0].message) == str(w_ref[0].message)
    assert np.array_equal(cut.ts_ns, ref["ts_ns"])
    offsets = _record_offsets(data)  # corrupt a record past the middle of the file
    at = offsets[len(offsets) // 2]
    bad = bytearray(data)
    bad[at + 8 : at + 12] = (10**9).to_bytes(4, "little")
    path.write_bytes(bytes(bad))
    with pytest.raises(PcapError, match=rf"corrupt record header at byte {at} "):
        scan(path)


@pytest.mark.parametrize("thread", ["pcap-blocks", "pcap-half"], ids=["reader", "second-half"])
def test_a_read_that_fails_is_raised_by_scan(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, thread: str
) -> None:
    """The error of the reader thread, or of the thread reading a second half, whatever it
    is, reaches the caller: scan does not wait for a block forever, nor keeps the rows read
    before it."""
    from analysis import fastpath

    monkeypatch.setattr(fastpath, "_SPLIT_MIN", 0 if thread == "pcap-half" else 1 << 40)

    real_open = open

    class Failing:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def close(self):
            self.f.close()

        def seek(self, offset):
            self.f.seek(offset)

        def readinto(self, _buffer):
            raise ValueError("I/O operation on closed file")

    def failing_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return Failing(f) if threading.current_thread().name.startswith(thread) else f

    monkeypatch.setattr("builtins.open", failing_open)
    pool = ThreadPoolExecutor(max_workers=1)  # a scan that waits forever fails the test
    with pytest.raises(ValueError, match="closed file"):
        pool.submit(fastpath.scan, pair[0], threads=2).result(timeout=30)
    pool.shutdown(wait=False)


def test_flows_without_losses(tmp_path: Path) -> None:
    """The generator writes flows that lose nothing (no hole to fill), and their counters are
    its truth: every byte once, no retransmission."""
    truth = generate(
        tmp_path / "b.pcap", tmp_path / "a.pcap", packets=6000, flows=2, loss=0.0,
        duration_ns=10**9,
    )  # fmt: skip
    got = flow_counters(scan(tmp_path / "b.pcap"))
    assert got["retransmitted_packets"].tolist() == [0, 0]
    assert got["bytes"].tolist() == [f["bytes"] for f in truth.flows]


def resident_bytes(column: np.ndarray, length: int | None = None) -> int:
    """Resident bytes of the pages from ``column``'s first byte over ``length`` bytes (its
    own by default), by mincore(2)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    at = column.__array_interface__["data"][0]
    start = at - at % page
    length = column.nbytes if length is None else length
    pages = -(-(at + length - start) // page)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) * page


def test_give_back_takes_only_the_pages_of_a_view() -> None:
    """_give_back finds a view's rows in its mapping (offsets into it at both levels) and
    gives back only the whole pages they fill: the rows around the view keep their values;
    a view that is not contiguous is left alone."""
    import mmap

    from analysis.pcapscan import _give_back

    memory = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE)
    root = np.frombuffer(memory, np.int64, offset=3 * mmap.PAGESIZE)
    root[:] = 7
    view = root[1000:300_000]
    _give_back(view, 0, len(view))
    assert (root[:1000] == 7).all() and (root[300_000:] == 7).all()
    assert (view == 0).mean() > 0.99 and (view[:500] == 7).any()  # a partial page kept
    root[:] = 7
    _give_back(np.ndarray((100_000,), np.int64, memory, 3 * mmap.PAGESIZE, (0,)), 0, 100_000)
    _give_back(root[::2], 0, len(root) // 2)
    assert (root == 7).all()


def test_a_column_cut_to_its_rows_gives_back_the_rest() -> None:
    """A column's capacity is an upper bound of its rows: cut to them, the pages past its
    rows are given back (a huge page is otherwise resident whole), and its rows keep their
    values."""
    from analysis.pcapscan import _alloc, _fit

    column = _alloc(8 << 20, np.int64)  # 64 MB, every page written
    column[:] = np.arange(len(column))
    assert resident_bytes(column) >= 60 << 20
    cut = _fit(column, 1000)
    assert resident_bytes(cut, column.nbytes) <= 2 * 4096
    assert np.array_equal(cut, np.arange(1000))


@pytest.mark.parametrize("threads", [1, 2], ids=["one-reading", "two-halves"])
def test_read_columns_keep_only_their_rows_resident(
    tmp_path: Path, joins: list[int], threads: int
) -> None:
    """Each column read (read_columns, the fast path's scan) holds about its own bytes,
    however large the capacity allocated for the file's worst case (one record per 16
    bytes): on 300 k packets, without the cut, the huge pages holding the columns' ends were
    resident whole. Read as two halves, the same holds once the second half's rows have
    moved down."""
    truth = generate(tmp_path / "b.pcap", tmp_path / "a.pcap", packets=300_000, flows=2)
    read = read_columns(tmp_path / "b.pcap", [*COLUMNS, "key_hash"])
    fast = scan(tmp_path / "b.pcap", crossing=truth.crossing, threads=threads)
    assert len(joins) == threads - 1
    cols = {**read, **{f"scan {c}": getattr(fast, c) for c in ("ts_ns", "seq_or_ack", "direction")}}
    cols.update({f"crossing {c}": v for c, v in fast.crossing.items()})
    mapped = [c for c, column in cols.items() if isinstance(column.base.base, memoryview)]
    assert {"ts_ns", "scan ts_ns", "crossing ts_ns"} <= set(mapped)  # mappings of their own
    for name in mapped:
        column, memory = cols[name], cols[name].base.base.obj
        assert resident_bytes(column, len(memory)) <= column.nbytes + 4096, name


@pytest.fixture
def joins(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Captures of any size read as two halves at once where a scan may use two threads
    (_SPLIT_MIN 0), and a list that grows by one each time scan joins two halves."""
    from analysis import fastpath

    monkeypatch.setattr(fastpath, "_SPLIT_MIN", 0)
    joins: list[int] = []
    join = fastpath._join

    def counted(whole, second, *args):
        joins.append(second.row0)
        return join(whole, second, *args)

    monkeypatch.setattr(fastpath, "_join", counted)
    return joins


def _assert_same_scan(got, ref) -> None:
    for c in ("direction", "ts_ns", "key_hash", "ip_len", "seq_or_ack", "payload_len"):
        assert np.array_equal(getattr(got, c), getattr(ref, c)), c
    assert np.array_equal(got.tcp_flags, ref.tcp_flags)
    assert np.array_equal(ack_column(got), ack_column(ref))
    assert list(got.directions) == list(ref.directions)
    for c in ref.directions:
        assert np.array_equal(got.directions[c], ref.directions[c]), c
    assert got.in_order == ref.in_order
    assert (got.crossing is None) == (ref.crossing is None)
    for c in ref.crossing or {}:
        assert np.array_equal(got.crossing[c], ref.crossing[c]), c


def _record_offsets(data: bytes) -> list[int]:
    offsets, pos = [], 24
    while pos + 16 <= len(data):
        offsets.append(pos)
        pos += 16 + int.from_bytes(data[pos + 8 : pos + 12], "little")
    return offsets


@pytest.mark.parametrize("block", [1 << 20, 3000], ids=["blocks", "small-blocks"])
def test_a_capture_read_as_two_halves(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, joins: list[int], block: int
) -> None:
    """Two halves read at once (the second from a record found near the middle) give the
    scan of one reading, column for column: directions numbered in order of appearance
    across the halves, first rows, crossing packets, a scan into an earlier one's memory;
    the guess at the middle is a record's start."""
    from analysis import fastpath
    from analysis.pcap import _read_global_header

    monkeypatch.setattr(fastpath, "_BLOCK", block)
    ends = scan(pair[0], threads=1).directions
    pairs = np.unique(ends["src"].astype(np.uint64) << np.uint64(32) | ends["dst"])[::2]
    prev = {1: None, 2: None}
    for path, crossing, columns in (
        (pair[0], None, fastpath._CROSSING),
        (pair[0], pairs, fastpath._CROSSING),
        (pair[1], pairs, ("ts_ns", "key_hash")),
    ):
        caps = {
            t: scan(path, reuse=prev[t], crossing=crossing, crossing_columns=columns, threads=t)
            for t in (1, 2)
        }
        _assert_same_scan(caps[2], caps[1])
        prev = caps
    assert len(joins) == 3
    data = pair[0].read_bytes()
    with open(pair[0], "rb") as f:
        fmt = _read_global_header(f, str(pair[0]))
    split, expected = fastpath._split_point(str(pair[0]), fmt, len(data))
    offsets = _record_offsets(data)
    assert split in offsets and abs(split - len(data) / 2) < 4096
    assert offsets.index(split) <= expected <= 1.1 * offsets.index(split)


def test_halves_with_many_directions_and_time_going_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, joins: list[int]
) -> None:
    """Directions first seen in the second half join the first half's table (thousands: it
    grows while they do), those seen in both keep the first half's number and first rows,
    and time going back where the halves meet, or inside the second, is seen."""
    from analysis import fastpath

    records = random_capture(seed=11, n=9000)  # nearly every packet a new direction
    records += [(ts + 10**10, frame) for ts, frame in records[:3000]]  # seen again
    records += [(ts + 2 * 10**10, frame) for ts, frame in random_capture(seed=12, n=3000)]
    middle = 7000
    for name, back in (("meet", middle), ("second", middle + 2000), ("none", None)):
        shifted = list(records)
        if back is not None:  # this record is earlier than the one before it
            shifted[back] = (shifted[back - 1][0] - 1000, shifted[back][1])
        path = write_pcap(tmp_path / f"{name}.pcap", shifted)
        split = _record_offsets(path.read_bytes())[middle]
        monkeypatch.setattr(fastpath, "_split_point", lambda *_a, s=split: (s, middle + 100))
        joins.clear()
        ref, got = scan(path, threads=1), scan(path, threads=2)
        _assert_same_scan(got, ref)
        assert joins and ref.in_order == (back is None)
        first = ref.directions["first"]
        assert len(first) > 4096 and (first > len(first) // 2).any()  # new in the second half


@pytest.mark.parametrize("guess", ["inside-a-record", "too-few-rows"])
def test_a_wrong_guess_reads_on_from_the_first_half(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, joins: list[int], guess: str
) -> None:
    """A guessed middle that is not a record's start (the look of record headers inside a
    payload), or a first half with more rows than guessed, is found by the first half's
    reading, which then reads on alone: the same scan, no halves joined."""
    from analysis import fastpath

    offsets = _record_offsets(pair[0].read_bytes())
    middle = len(offsets) // 2
    split = offsets[middle] + 1 if guess == "inside-a-record" else offsets[middle]
    rows = middle + 100 if guess == "inside-a-record" else middle // 2
    monkeypatch.setattr(fastpath, "_split_point", lambda *_a: (split, rows))
    _assert_same_scan(scan(pair[0], threads=2), scan(pair[0], threads=1))
    assert joins == []


def test_a_damaged_second_half(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, joins: list[int]
) -> None:
    """A truncated end or a corrupt header in the second half is reported as one reading
    reports it (the same offset, the same message); a corrupt header in the first half
    too, whatever the second half read."""
    from analysis import fastpath

    data = pair[0].read_bytes()
    offsets = _record_offsets(data)
    split = offsets[len(offsets) // 2]
    monkeypatch.setattr(fastpath, "_split_point", lambda *_a: (split, len(offsets) // 2 + 9))
    path = tmp_path / "cut.pcap"
    path.write_bytes(data[:-7])
    with pytest.warns(PcapTruncatedWarning) as w_ref:
        ref = scan(path, threads=1)
    with pytest.warns(PcapTruncatedWarning) as w:
        got = scan(path, threads=2)
    assert str(w[0].message) == str(w_ref[0].message) and len(joins) == 1
    _assert_same_scan(got, ref)
    for at in (offsets[-100], offsets[100]):  # in the second half, in the first
        bad = bytearray(data)
        bad[at + 8 : at + 12] = (10**9).to_bytes(4, "little")
        path.write_bytes(bytes(bad))
        for threads in (1, 2):
            with pytest.raises(PcapError, match=rf"corrupt record header at byte {at} "):
                scan(path, threads=threads)


def test_a_flow_whose_data_begins_in_the_second_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, joins: list[int]
) -> None:
    """A flow whose SYN is in the first half and whose first payload is in the second keeps
    its first half's number and takes the second half's first payload row (the common case
    at a split: flows open early and carry data throughout)."""
    from analysis import fastpath

    t0 = 1_763_700_000 * 10**9

    def frame(i: int) -> bytes:
        if i == 10:  # the flow's SYN
            return ethernet(
                ipv4("198.18.1.1", "198.18.2.2", 6, tcp_segment(1000, 5201, 7, 0, 0x02))
            )
        if i == 150:  # its first payload, after the split
            seg = tcp_segment(1000, 5201, 8, 1, 0x18, b"x" * 100)
            return ethernet(ipv4("198.18.1.1", "198.18.2.2", 6, seg))
        return ethernet(ipv4("198.18.1.9", "198.18.2.9", 17, udp_datagram(2000 + i % 7, 9)))

    path = write_pcap(tmp_path / "f.pcap", [(t0 + i * 1000, frame(i)) for i in range(200)])
    split = _record_offsets(path.read_bytes())[100]
    monkeypatch.setattr(fastpath, "_split_point", lambda *_a: (split, 100))
    ref, got = scan(path, threads=1), scan(path, threads=2)
    _assert_same_scan(got, ref)
    flow = int(ref.direction[10])
    assert len(joins) == 1 and ref.directions["first_data"][flow] == 150


def test_an_exact_guess_after_packets_that_take_no_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, joins: list[int]
) -> None:
    """A guess of exactly the first half's rows is enough when the records just before the
    middle are not IPv4 (ARP, IPv6: they take no row): the halves are joined."""
    from analysis import fastpath

    t0 = 1_763_700_000 * 10**9
    udp = ethernet(ipv4("198.18.1.9", "198.18.2.9", 17, udp_datagram(2000, 9)))
    frames = [udp] * 100 + [arp_frame()] * 3 + [udp] * 100
    path = write_pcap(tmp_path / "arp.pcap", [(t0 + i * 1000, f) for i, f in enumerate(frames)])
    split = _record_offsets(path.read_bytes())[103]  # after the three ARP frames
    monkeypatch.setattr(fastpath, "_split_point", lambda *_a: (split, 100))
    _assert_same_scan(scan(path, threads=2), scan(path, threads=1))
    assert len(joins) == 1


def test_a_crossing_scan_into_a_smaller_full_one(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A scan given crossing pairs, into the memory of an earlier scan of a smaller capture
    that kept every packet's key and length, keeps no key or length of every packet (it
    wrote them past the smaller capture's columns before: memory corrupted, the process
    crashed) and reads what a scan into new memory reads."""
    small = write_pcap(tmp_path / "small.pcap", random_capture(seed=2, n=50))
    prev = scan(small)
    ends = scan(pair[0]).directions
    pairs = np.unique(ends["src"].astype(np.uint64) << np.uint64(32) | ends["dst"])
    got = scan(pair[0], reuse=prev, crossing=pairs)
    assert len(got.key_hash) == len(got.ip_len) == 0
    _assert_same_scan(got, scan(pair[0], crossing=pairs))


def test_the_middle_of_a_capture_that_breaks_its_snaplen(tmp_path: Path) -> None:
    """Records longer than the file header's snaplen (some writers do that) do not hide the
    middle: the guess is a record's start, as it is for a file that keeps it."""
    from analysis import fastpath
    from analysis.pcap import _read_global_header

    for snaplen in (60, None):
        path = write_pcap(
            tmp_path / f"s{snaplen}.pcap", random_capture(seed=9, n=3000), header_snaplen=snaplen
        )
        data = path.read_bytes()
        with open(path, "rb") as f:
            fmt = _read_global_header(f, str(path))
        split, rows = fastpath._split_point(str(path), fmt, len(data))
        assert split in _record_offsets(data) and rows > 1000, snaplen
