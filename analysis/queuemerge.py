"""The events and occupancy of a bottleneck queue, merged in compiled passes (numba) from the
packets entering it (capture before the router), their departure times (matched in the
capture after it, analysis.match) and their sizes: ``queue_levels`` gives every event at once
(analysis.queue.queue_occupancy's table); the trial analysis reads them piece by piece.

At equal times departures come first, then arrivals, then drops; then row order.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from analysis.match import undecided
from analysis.resources import alloc, cpus, give_back

__all__ = ["departure_rows", "queue_levels", "queue_pieces"]

_QUEUE_SPLIT_MIN = 1 << 20  # queue events from which queue_levels merges two halves at once
_QUEUE_PIECE = 1 << 18  # events merged between two give-backs of what the merge passed (consume)


def queue_levels(
    ts_ns: np.ndarray,
    ts_out_ns: np.ndarray,
    frame_bytes: np.ndarray,
    *,
    delay_ns: int = 0,
    max_delay_ns: int,
    end_ns: int | None = None,
    departures: np.ndarray | None = None,
    header_bytes: int = 0,
    rows: bool = False,
    threads: int | None = None,
    consume: bool = False,
) -> dict[str, np.ndarray]:
    """The events and occupancy of ``analysis.queue.queue_occupancy`` as arrays (ts_ns,
    event code 0 departure / 1 arrival / 2 drop, frame_bytes, packets, bytes), from the
    packets arriving at the queue (time, ``match_times`` result, frame size): the same
    numbers without building the per-event table with address strings. Arrivals in time
    order (as a capture is written) are merged with the departures in one compiled pass;
    departures not in arrival order (several FIFOs, or none) are taken in the order of
    ``departures`` (the rows by departure time, as :func:`match_rows` gives them), else
    sorted first; a writable int32 ``departures`` is put in that order in place, not copied
    (4 bytes a departure less at the peak), and holds the same rows afterwards, perhaps
    reordered. ``header_bytes`` is added to every frame_bytes value (14 when they are IP
    lengths). Sizes come in the narrowest integers that hold them; the occupancy is first
    written in 16-bit packets and 32-bit bytes (16-bit where the frame sizes bound them so), a
    queue rarely holding more, and counted again from the events (running sums) in the
    narrowest types its measured range needs where it did not fit (4.1 M events: 25 MB less
    at the peak than 32-bit packets and 64-bit bytes; arithmetic on them wants a wider type
    first). ``rows``: also each event's row in the input (``row``: whose packet arrived, left
    or was dropped).
    ``threads``: 2 (the default where the process may run on two CPUs) merges the two halves
    of _QUEUE_SPLIT_MIN events or more at once, the second from the state before its first
    arrival, counted from the arrivals, drops and departures before it (the same events).
    ``consume``: for a caller done with ``ts_ns`` and ``departures``: the pages of their rows
    the merge has passed are given back to the system as it goes (they read as zeros
    afterwards; only arrays of analysis.resources.alloc, such as scan's and match_rows', and
    ``departures`` only where it is put in order in place, or whole when the merge does not
    read it): 8 bytes an arrival and 4 a departure less at the end, when the events are all
    held."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    out_ts = np.asarray(ts_out_ns, dtype=np.int64)
    size = np.asarray(frame_bytes)
    add = int(header_bytes)
    low, high = (int(size.min()) + add, int(size.max()) + add) if len(size) else (0, 0)
    if low < -(2**31) or high >= 2**31:
        raise ValueError("frame sizes beyond 32 bits")
    if len(ts) >= 2**31:
        raise ValueError(f"{len(ts)} packets: queue_levels counts occupancy in 32 bits")
    end_ns, last_fwd, n_fwd, n_cut, arr_sorted, dep_sorted = _queue_plan(
        ts, out_ts, -1 if end_ns is None else int(end_ns), end_ns is None, int(max_delay_ns)
    )
    if arr_sorted:  # arrivals in time order: merge them with the departures
        order = _departures(out_ts, departures, n_fwd, dep_sorted)
        given = np.asarray([] if departures is None else departures)
        if consume and not np.shares_memory(order, given):
            give_back(given, 0, len(given))  # the merge does not read it
        n = len(ts) - n_cut + n_fwd
        total = max(abs(low), abs(high)) * len(size)  # bound of the occupancy in bytes
        sizes = alloc(n, np.uint16 if low >= 0 and high < 2**16 else np.int32)
        t, code = alloc(n, np.int64), alloc(n, np.int8)
        row = alloc(n if rows else 0, np.int32)
        cut = end_ns - int(max_delay_ns)
        streams = (ts, out_ts, size, add, int(delay_ns), order, n_fwd, cut, last_fwd)
        threads = cpus() if threads is None else threads
        bound = _signed(-total, total, np.int16)  # what the sizes allow, else 32 bits first
        kinds = (np.int16, bound if np.dtype(bound).itemsize < 4 else np.int32)
        packets, nbytes = alloc(n, kinds[0]), alloc(n, kinds[1])
        outputs = (sizes, nbytes, t, code, packets, row)
        seen = _queue_merged(streams, outputs, n, threads, consume)
        need = (_signed(*seen[:2], np.int16), _signed(*seen[2:], np.int16))
        if not all(_wide_enough(k, w) for k, w in zip(kinds, need, strict=True)):
            # written in too few bits: counted again from the events, in the types it needs
            packets = nbytes = outputs = None  # not held beside the wider ones
            packets, nbytes = alloc(n, need[0]), alloc(n, need[1])
            _levels(code, sizes, packets, nbytes)
        return {
            "ts_ns": t,
            "event": code,
            "frame_bytes": sizes,
            "packets": packets,
            "bytes": nbytes,
            **({"row": row} if rows else {}),
        }
    fwd = out_ts >= 0
    keep = np.flatnonzero(~undecided(ts, fwd, max_delay_ns=max_delay_ns, end_ns=end_ns))
    ts, fwd, out_ts = ts[keep], fwd[keep], out_ts[keep]
    size = size[keep].astype(np.int32) + add
    dep = out_ts[fwd]
    n_fwd = len(dep)
    t = np.r_[ts + delay_ns, dep]
    code = np.r_[np.where(fwd, 1, 2), np.zeros(n_fwd, np.int64)].astype(np.int8)
    sign = np.r_[fwd.astype(np.int64), -np.ones(n_fwd, np.int64)]
    size = np.r_[size, size[fwd]]
    by_code = np.argsort(code, kind="stable")  # at equal times: departures, arrivals, drops
    order = by_code[np.argsort(t[by_code], kind="stable")]
    sign, size = sign[order], size[order]
    return {
        "ts_ns": t[order],
        "event": code[order],
        "frame_bytes": size,
        "packets": np.cumsum(sign),
        "bytes": np.cumsum(sign * size),
        **({"row": np.r_[keep, keep[fwd]][order].astype(np.int32)} if rows else {}),
    }


def _departures(out_ts, departures, n_fwd: int, dep_sorted: bool) -> np.ndarray:
    """The forwarded rows by (departure time, row), or none when row order is that order
    (one FIFO, arrivals in time order): ``departures`` (match_rows') put in order, in place
    where it is a writable int32 array, else sorted."""
    order = np.empty(0, np.int32)  # departures in row order
    if not dep_sorted and departures is not None:
        listed = np.asarray(departures)
        flags = listed.flags
        own = listed.dtype == np.int32 and flags.writeable and flags.c_contiguous
        if not own:
            listed = alloc(len(listed), np.int32)
            listed[:] = departures
        order = _departure_order(listed, out_ts, n_fwd)
    if not dep_sorted and not len(order):  # not one FIFO: by time, stably
        order = np.argsort(out_ts, kind="stable")[len(out_ts) - n_fwd :]
    return order


def departure_rows(ts_out_ns: np.ndarray, departures: np.ndarray | None = None) -> np.ndarray:
    """The forwarded rows (ts_out_ns >= 0) by (departure time, row): the order of the queue's
    departure events. ``departures``: match_rows' (put in order in place where it can be)."""
    out_ts = np.asarray(ts_out_ns, dtype=np.int64)
    fwd = out_ts >= 0
    n_fwd = int(fwd.sum())
    dep_sorted = not (np.diff(out_ts[fwd]) < 0).any()
    order = _departures(out_ts, departures, n_fwd, dep_sorted)
    return order if len(order) else np.flatnonzero(fwd)


def queue_pieces(
    ts_ns: np.ndarray,
    ts_out_ns: np.ndarray,
    frame_bytes: np.ndarray,
    *,
    delay_ns: int = 0,
    max_delay_ns: int,
    end_ns: int | None = None,
    departures: np.ndarray | None = None,
    header_bytes: int = 0,
    piece: int = 1 << 16,
):
    """:func:`queue_levels`' events (with ``rows``), ``piece`` at a time: one dict of arrays
    (ts_ns, event, frame_bytes int32, packets and bytes int64, row) per piece, in order, each
    in arrays of its own. Only the pieces the caller keeps are held, whatever the number of
    events."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    out_ts = np.asarray(ts_out_ns, dtype=np.int64)
    size = np.asarray(frame_bytes)
    if len(ts) >= 2**31:
        raise ValueError(f"{len(ts)} packets: a queue's rows are counted in 32 bits")
    end_ns, last_fwd, n_fwd, n_cut, arr_sorted, dep_sorted = _queue_plan(
        ts, out_ts, -1 if end_ns is None else int(end_ns), end_ns is None, int(max_delay_ns)
    )
    if not arr_sorted:  # arrivals of several captures: merged at once (rare, and small)
        whole = queue_levels(
            ts, out_ts, size, delay_ns=delay_ns, max_delay_ns=max_delay_ns, end_ns=end_ns,
            departures=departures, header_bytes=header_bytes, rows=True, threads=1,
        )  # fmt: skip
        whole["frame_bytes"] = whole["frame_bytes"].astype(np.int32)
        whole["packets"], whole["bytes"] = (whole[k].astype(np.int64) for k in ("packets", "bytes"))
        for lo in range(0, max(len(whole["ts_ns"]), 1), piece):
            yield {k: v[lo : lo + piece] for k, v in whole.items()}
        return
    order = _departures(out_ts, departures, n_fwd, dep_sorted)
    n = len(ts) - n_cut + n_fwd
    cut = end_ns - int(max_delay_ns)
    streams = (ts, out_ts, size, int(header_bytes), int(delay_ns), order, n_fwd, cut, last_fwd)
    state = _queue_start(ts, out_ts, cut, last_fwd)[1:]
    kinds = (np.int32, np.int64, np.int64, np.int8, np.int64, np.int32)
    for k0 in range(0, max(n, 1), piece):
        k1 = min(k0 + piece, n)
        sizes, nbytes, t, code, packets, row = (np.empty(k1 - k0, k) for k in kinds)
        got = _queue_merge(*streams, sizes, nbytes, t, code, packets, row, k0, k1, k0, *state)
        state = got[4:]
        w = k1 - k0
        yield {
            "ts_ns": t[:w], "event": code[:w], "frame_bytes": sizes[:w], "packets": packets[:w],
            "bytes": nbytes[:w], "row": row[:w],
        }  # fmt: skip


def _signed(lo: int, hi: int, narrowest) -> type:
    """The narrowest signed integer type from ``narrowest`` up that holds lo to hi."""
    for kind in (np.int16, np.int32, np.int64):
        if np.dtype(kind).itemsize >= np.dtype(narrowest).itemsize:
            info = np.iinfo(kind)
            if info.min <= lo and hi <= info.max:
                return kind
    raise ValueError(f"queue occupancy {lo} to {hi}: beyond 64 bits")


def _wide_enough(kind, needed) -> bool:
    return np.dtype(kind).itemsize >= np.dtype(needed).itemsize


def _queue_merged(streams, outputs, n: int, threads: int, consume: bool) -> tuple:
    """_queue_merge over all n events, as two halves at once where ``threads`` and n allow;
    the least and most packets and bytes queued (the levels written must hold them).
    ``consume``: see queue_levels."""
    ts, out_ts, *_, order, _, cut, last_fwd = streams
    start = _queue_start(ts, out_ts, cut, last_fwd)
    middle = _next_arrival(out_ts, len(ts) // 2)
    ends = (len(ts), len(order))  # rows of ts and of order a merge may give back below
    if threads > 1 and n >= _QUEUE_SPLIT_MIN and middle < len(ts):
        # Two halves at once: the second from the state before the middle arrival.
        half = _queue_state(*streams, middle)
        bound = (min(half[1], half[2]), half[3])  # the first row and departure it reads
        # The first half reads up to the second's first arrival, drop and departure (its
        # next ones when it ends): the second gives back only what lies past them.
        after = (min(max(half[1], half[2]) + 1, len(ts)), min(half[3] + 1, len(order)))
        with ThreadPoolExecutor(1, thread_name_prefix="queue-half") as pool:
            later = pool.submit(
                _merge_range, streams, outputs, half[0], n, half[1:], consume and (after, ends)
            )
            first = _merge_range(
                streams, outputs, 0, half[0], start[1:], consume and ((0, 0), bound)
            )
            second = later.result()
        if consume:  # what both read
            give_back(ts, bound[0], after[0])
            give_back(order, bound[1], after[1])
        return _both(first, second)
    return _merge_range(streams, outputs, 0, n, start[1:], consume and ((0, 0), ends))


def _merge_range(streams, outputs, k0: int, k1: int, state, passed) -> tuple:
    """_queue_merge of events k0 to k1 from ``state``: the least and most levels. With
    ``passed`` ((first row, first departure), (end row, end departure): the rows of ts and of
    order that only this range reads), a piece at a time, the rows of ts and order among
    them before the merge's next arrival, drop and departure given back after each piece."""
    if not passed:
        return _queue_merge(*streams, *outputs, k0, k1, 0, *state)[:4]
    ts, order = streams[0], streams[5]
    (row0, dep0), (row_end, dep_end) = passed
    seen = None
    for a in range(k0, max(k1, k0 + 1), _QUEUE_PIECE):
        got = _queue_merge(*streams, *outputs, a, min(a + _QUEUE_PIECE, k1), 0, *state)
        state = got[4:]
        i_arr, i_drop, i_dep = state[:3]
        give_back(ts, row0, min(i_arr, i_drop, row_end))
        give_back(order, dep0, min(i_dep, dep_end))
        seen = got[:4] if seen is None else _both(seen, got)
    return seen


def _both(a, b) -> tuple:
    """The least and most packets and bytes of two merges' (lo_p, hi_p, lo_b, hi_b)."""
    return min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3])


@njit(cache=True, nogil=True)
def _levels(code, size, packets, nbytes):
    """The occupancy after each event (packets, bytes) from the events' codes and frame
    sizes: what _queue_merge wrote, again, in the types of ``packets`` and ``nbytes``."""
    level = level_bytes = 0
    for k in range(len(code)):
        if code[k] == 1:
            level, level_bytes = level + 1, level_bytes + size[k]
        elif code[k] == 0:
            level, level_bytes = level - 1, level_bytes - size[k]
        packets[k], nbytes[k] = level, level_bytes


@njit(cache=True, nogil=True)
def _queue_plan(ts, out_ts, end_ns, default_end, max_delay_ns):
    """end_ns (default: the last departure, else the last arrival), the last forwarded
    packet's arrival, how many were forwarded and how many are undecided (see
    :func:`undecided`), whether arrivals are in time order, and departures too (in row
    order)."""
    last_fwd = np.iinfo(np.int64).min
    last_ts = last_dep = np.iinfo(np.int64).min
    n_fwd = 0
    arr_sorted = dep_sorted = True
    for i in range(len(ts)):
        arr_sorted &= ts[i] >= last_ts
        last_ts = ts[i]
        if out_ts[i] >= 0:
            n_fwd += 1
            dep_sorted &= out_ts[i] >= last_dep
            last_dep = out_ts[i]
            last_fwd = max(last_fwd, ts[i])
    if default_end:
        end_ns = np.int64(0)
        for i in range(len(ts)):
            end_ns = max(end_ns, out_ts[i] if n_fwd else ts[i])
    n_cut = 0
    for i in range(len(ts)):
        n_cut += out_ts[i] < 0 and ts[i] > end_ns - max_delay_ns and ts[i] > last_fwd
    return end_ns, last_fwd, n_fwd, n_cut, arr_sorted, dep_sorted


@njit(cache=True, nogil=True)
def _departure_order(out, out_ts, n_fwd):
    """``out`` (every forwarded row once, in the order the capture after the router saw
    them) put in order by (departure time, row), in place, or an empty array when it is not
    that (``out`` then holds the same rows, perhaps partly reordered). Packets that
    left within one timestamp tick (µs in a classic pcap) may be listed out of row order:
    those short runs are put in order by insertion, which stays linear while the list is
    nearly in order; beyond a budget of moves the caller sorts instead."""
    none = out[:0]
    if len(out) != n_fwd:
        return none
    budget = 8 * len(out) + 64  # element moves; a general shuffle exhausts it quickly
    for k in range(len(out)):
        r = out[k]
        if r < 0 or r >= len(out_ts) or out_ts[r] < 0:
            return none
        t = out_ts[r]
        j = k
        while j > 0 and (out_ts[out[j - 1]] > t or (out_ts[out[j - 1]] == t and out[j - 1] > r)):
            out[j] = out[j - 1]
            j -= 1
            budget -= 1
            if budget < 0:
                out[j] = r  # the same rows, for a caller that reads them again
                return none
        out[j] = r
    for k in range(1, len(out)):  # strictly increasing: no row twice
        if out[k] == out[k - 1]:
            return none
    return out


@njit(cache=True, nogil=True)  # as _row: inlined by LLVM, not numba
def _next_arrival(out_ts, i):
    """The first forwarded row from i on (len(out_ts) if none)."""
    while i < len(out_ts) and out_ts[i] < 0:
        i += 1
    return i


@njit(cache=True, nogil=True, inline="always")
def _next_drop(ts, out_ts, i, cut, last_fwd):
    while i < len(out_ts) and (out_ts[i] >= 0 or (ts[i] > cut and ts[i] > last_fwd)):
        i += 1
    return i


@njit(cache=True, nogil=True)
def _queue_start(ts, out_ts, cut, last_fwd):
    """_queue_merge's state before its first event: (0, first arrival, first drop, 0, first
    departure in row order, level 0, 0 bytes)."""
    first = _next_arrival(out_ts, 0)
    return 0, first, _next_drop(ts, out_ts, 0, cut, last_fwd), 0, first, 0, 0


@njit(cache=True, nogil=True)
def _queue_state(ts, out_ts, size, add, delay, order, n_fwd, cut, last_fwd, j):
    """_queue_merge's state before the event of the arrival of forwarded row j: (its event's
    number, j, the next drop, departures before, the next departure in row order, packets
    and bytes queued). Before it: the arrivals of the forwarded rows before j (rows are in
    time order), the drops before its time (at its time, drops come after it), the
    departures up to its time (at its time, they come first)."""
    tj = ts[j]
    arrivals, queued_bytes, drops = 0, 0, 0
    for r in range(j):
        if out_ts[r] >= 0:
            arrivals += 1
            queued_bytes += size[r] + add
        elif ts[r] < tj and not (ts[r] > cut and ts[r] > last_fwd):
            drops += 1
    s = j
    while s > 0 and ts[s - 1] == tj:
        s -= 1
    i_drop = _next_drop(ts, out_ts, s, cut, last_fwd)
    ta = tj + delay
    left, r_dep = 0, 0
    if len(order) > 0:  # departures by time: the first after ta, by bisection
        lo, hi = 0, n_fwd
        while lo < hi:
            mid = (lo + hi) // 2
            if out_ts[order[mid]] <= ta:
                lo = mid + 1
            else:
                hi = mid
        left = lo
        for i in range(left):
            queued_bytes -= size[order[i]] + add
    else:  # departures in row order are in time order
        r = _next_arrival(out_ts, 0)
        while r < len(out_ts) and out_ts[r] <= ta:
            left += 1
            queued_bytes -= size[r] + add
            r = _next_arrival(out_ts, r + 1)
        r_dep = r
    return arrivals + drops + left, j, i_drop, left, r_dep, arrivals - left, queued_bytes


@njit(cache=True, nogil=True)
def _queue_merge(
    ts, out_ts, size, add, delay, order, n_fwd, cut, last_fwd, out_size, nbytes, t, code, packets,
    row, k0, k1, shift, i_arr, i_drop, i_dep, r_dep, level, level_bytes,
):  # fmt: skip
    """queue_levels' events for arrivals in time order: a three-way merge of departures (in
    ``order``, else in row order), arrivals (forwarded rows) and drops (the others, but the
    undecided: after ``cut`` and ``last_fwd``); at equal times in that order, then in row
    order. Each event's time goes to ``t``, its code to ``code``, its frame size (size + add)
    to ``out_size``, the occupancy after it to ``packets`` and ``nbytes`` (the least and
    most of both are returned: the caller checks their types held them), and its packet's
    row to ``row`` if it has room, each at its number less ``shift``. Events k0 to k1 from the
    state before event k0 (see _queue_start and _queue_state); then the state after them
    (i_arr, i_drop, i_dep, r_dep, level, level_bytes) follows the least and most."""
    big = np.iinfo(np.int64).max
    lo_p = hi_p = np.int64(level)
    lo_b = hi_b = np.int64(level_bytes)
    rows = len(ts)
    by_order = len(order) > 0
    rows_too = len(row) > 0
    for k in range(k0, k1):
        w = k - shift  # where event k is written
        ta = ts[i_arr] + delay if i_arr < rows else big
        tx = ts[i_drop] + delay if i_drop < rows else big
        r = order[i_dep] if by_order and i_dep < n_fwd else r_dep
        td = out_ts[r] if i_dep < n_fwd else big
        if i_dep < n_fwd and td <= ta and td <= tx:
            t[w], code[w], s = td, 0, size[r] + add
            level, level_bytes = level - 1, level_bytes - s
            if rows_too:
                row[w] = r
            i_dep += 1
            if not by_order:
                r_dep = _next_arrival(out_ts, r_dep + 1)
        elif i_arr < rows and ta <= tx:
            t[w], code[w], s = ta, 1, size[i_arr] + add
            level, level_bytes = level + 1, level_bytes + s
            if rows_too:
                row[w] = i_arr
            i_arr = _next_arrival(out_ts, i_arr + 1)
        else:
            t[w], code[w], s = tx, 2, size[i_drop] + add
            if rows_too:
                row[w] = i_drop
            i_drop = _next_drop(ts, out_ts, i_drop + 1, cut, last_fwd)
        out_size[w], packets[w], nbytes[w] = s, level, level_bytes
        lo_p, hi_p = min(lo_p, level), max(hi_p, level)
        lo_b, hi_b = min(lo_b, level_bytes), max(hi_b, level_bytes)
    return lo_p, hi_p, lo_b, hi_b, i_arr, i_drop, i_dep, r_dep, level, level_bytes
