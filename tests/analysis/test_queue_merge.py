"""Matching packets across a router (analysis/match.py) and merging a queue's events
(analysis/queuemerge.py), against plain greedy matchings (tests/analysis/greedy.py), a numpy
oracle of the events (tests/analysis/queue_oracle.py) and the DataFrame functions; the
queue's figures read piece by piece (analysis/queuestats.py) against those of the whole
table."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import queuemerge
from analysis.match import key_hash, match_packets, match_rows, match_times
from analysis.pcap import COLUMNS, read_columns, read_pcap
from analysis.queue import EVENTS, occupancy_at, queue_occupancy, queue_summary
from analysis.queuemerge import _departure_order, queue_levels, queue_pieces
from analysis.queuestats import AtTimes, Window
from analysis.resources import alloc

from .greedy import greedy_match
from .queue_oracle import queue_events
from .scans import resident_bytes

DELAY = 2 * 10**9


def departure_order(rows: np.ndarray, out_ts: np.ndarray, n_fwd: int) -> np.ndarray:
    return _departure_order(rows.copy(), out_ts, n_fwd)


def test_read_columns_is_read_pcap(pair: tuple[Path, Path]) -> None:
    frame = read_pcap(pair[0])
    cols = read_columns(pair[0], [*COLUMNS, "key_hash"])
    for c in COLUMNS:
        assert cols[c].dtype == frame[c].dtype and np.array_equal(cols[c], frame[c].to_numpy())
    assert np.array_equal(cols["key_hash"], key_hash(frame))
    assert list(read_columns(pair[0], ["seq"])) == ["seq"]


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
    monkeypatch.setattr(queuemerge, "_QUEUE_SPLIT_MIN", 0 if threads == 2 else 1 << 40)
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
    monkeypatch.setattr(queuemerge, "_QUEUE_SPLIT_MIN", 0)
    splits = []
    state = queuemerge._queue_state

    def counted(*args):
        splits.append(args[-1])
        return state(*args)

    monkeypatch.setattr(queuemerge, "_queue_state", counted)
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
    monkeypatch.setattr(queuemerge, "_QUEUE_SPLIT_MIN", 0)
    n = 40_000
    ts = np.arange(n, dtype=np.int64) * 1000
    out = ts + 10**9  # every packet arrives before the first leaves
    size = np.full(n, 60_000)
    given = alloc(1 << 17, np.int64)[:n]  # a mapping of its own (1 MB): given back as passed
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
    monkeypatch.setattr(queuemerge, "_QUEUE_SPLIT_MIN", 0 if threads == 2 else 1 << 40)
    monkeypatch.setattr(queuemerge, "_QUEUE_PIECE", 5000)
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
    mapping = alloc(n + 70_000, np.int64)
    given_ts = mapping[50_000 : 50_000 + n]  # a view, pages of the mapping on both sides
    given_ts[:] = ts
    mapping[:50_000] = mapping[-20_000:] = 7
    given_dep = alloc(len(order), np.int64 if departures == "copied" else np.int32)
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
    monkeypatch.setattr(queuemerge, "_QUEUE_SPLIT_MIN", 0)
    monkeypatch.setattr(queuemerge, "ThreadPoolExecutor", _SecondHalfFirst)
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
    given_ts = alloc(n, np.int64) if where == "sparse-drops" else ts.copy()  # (kept whole)
    given_ts[:] = ts
    middle = queuemerge._next_arrival(out, n // 2)
    cut, last_fwd = int(out.max()) - 10**8, int(ts[out >= 0].max())
    half = queuemerge._queue_state(ts, out, size, 0, 0, order, len(order), cut, last_fwd, middle)
    pad = -half[3] % 1024  # the first half's next departure, order[half[3]], begins a page
    mapping = alloc(len(order) + pad + 300_000, np.int32)
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


@pytest.mark.parametrize("order", ["fifo", "departures", "unsorted"])
def test_queue_pieces_are_queue_levels_and_their_figures_the_tables(
    fifo_pair: tuple[Path, Path], pair: tuple[Path, Path], order: str
) -> None:
    """The queue's events a piece at a time (what a trial writes to queue.parquet) are
    queue_levels' events one after the other, for one FIFO, departures given by match_rows,
    arrivals out of time order (several captures before the queue), the last ones undecided;
    and the figures read piece by piece (queue_summary's over a window, the occupancy and
    drops at sample times) are those of the whole table."""
    b, a = (
        read_pcap((fifo_pair if order == "fifo" else pair)[0]),
        read_pcap((fifo_pair if order == "fifo" else pair)[1]),
    )
    hb, ha = key_hash(b), key_hash(a)
    ts_out, departures = match_rows(
        hb, b.ts_ns.to_numpy(), ha, a.ts_ns.to_numpy(), max_delay_ns=DELAY
    )
    ts, size = b.ts_ns.to_numpy(), b.ip_len.to_numpy()
    if order == "unsorted":  # two captures' rows, one after the other
        rows = np.r_[np.arange(0, len(ts), 2), np.arange(1, len(ts), 2)]
        ts, ts_out, size, departures = ts[rows], ts_out[rows], size[rows], None
    end = int(np.quantile(a.ts_ns, 0.95))  # the capture after the router ends early
    options = {"delay_ns": 1000, "max_delay_ns": DELAY, "end_ns": end, "header_bytes": 14}
    whole = queue_levels(ts, ts_out, size, rows=True, **options)
    pieces = [
        {k: v.copy() for k, v in p.items()}
        for p in queue_pieces(ts, ts_out, size, departures=departures, piece=7000, **options)
    ]
    assert len(pieces) > 5
    for c in whole:
        got = np.concatenate([p[c] for p in pieces])
        assert np.array_equal(got, whole[c]), c
    assert (whole["event"] == 2).sum() > 10
    table = pd.DataFrame(
        {
            "ts_ns": whole["ts_ns"],
            "event": pd.Categorical.from_codes(whole["event"], dtype=EVENTS),
            "packets": whole["packets"].astype(np.int64),
            "bytes": whole["bytes"].astype(np.int64),
        }
    )
    t = whole["ts_ns"]
    windows = [(int(t[len(t) // 3]), int(t[2 * len(t) // 3])), (int(t[0]) - 5, int(t[0])),
               (int(t[-1]), int(t[-1]) + 10**9), (0, 1)]  # fmt: skip
    times = np.sort(np.r_[t[:: len(t) // 50], t[0] - 1, t[-1] + 1, t[7000], t[7000] + 1])
    stats = [Window(*w) for w in windows]
    at = AtTimes(times)
    for p in pieces:
        args = (p["ts_ns"], p["event"], p["packets"].astype(np.int64), p["bytes"])
        for s in stats:
            s.add(*args)
        at.add(*args)
    at.finish()
    for s, w in zip(stats, windows, strict=True):
        want = queue_summary(table, start_ns=w[0], end_ns=w[1])
        got = s.result()
        assert list(got) == list(want)
        for k, v in want.items():  # exactly: the same float, or both NaN
            assert got[k] == v or (np.isnan(got[k]) and np.isnan(v)), (w, k)
    levels = occupancy_at(table, times)
    drops = np.searchsorted(t[whole["event"] == 2], times, side="right")
    assert np.array_equal(at.packets, levels.packets) and np.array_equal(at.bytes, levels.bytes)
    assert np.array_equal(at.drops, drops) and (at.first_ns, at.last_ns) == (t[0], t[-1])
