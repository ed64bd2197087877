"""A whole capture read by the record pass (analysis/recordpass.py), as two halves at once
where the file is large and two CPUs may be used: the second half from a record found near
the middle, its rows written where the first half's are guessed to end; the first half's
reading checks that it ends exactly at the second's first record (else it reads on alone, the
second's reading dropped), then the second half's rows and directions are joined to the
first's. The result is the same in every way as one reading from start to end.

Direction columns start at 8 bits and are widened (to 16, then 32) when a reading meets more
directions; while one half widens, the other pauses between two blocks.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from analysis.blocks import Blocks
from analysis.directions import find, rehash
from analysis.pcapfile import Format
from analysis.recordpass import FULL, ROWS, WIDE, record_pass
from analysis.records import GLOBAL_HDR, MAX_CAPLEN, REC_HDR, record_at, u32
from analysis.resources import alloc, give_back

__all__ = ["Columns", "Reading", "read_whole", "split_point"]

PAUSED = 6  # a reading stopped between blocks: the other half's stopped with WIDE
ID_KINDS = (np.uint8, np.uint16, np.int32)  # direction ids: the narrowest that numbers them
_TABLE0 = 1 << 12  # initial slots of the direction table (it doubles when half full)
_CHAIN = 8  # whole record headers in a row that mark where the second half begins
_SAMPLE = 1 << 18  # bytes read at the start and the middle to guess the first half's rows
_MARGIN = 1.05  # the first half's rows: its bytes over the smaller sample's bytes a record, +5 %
_SEC_RANGE = (86_400, 366 * 86_400)  # a record's time around the first one's (seconds)
_MOVE = 1 << 22  # bytes of a column moved at a time when the halves are joined
_PER_DIRECTION = ("keys1", "keys2", "first", "first_data", "last_ns", "matched", "detailed")


@dataclass
class Columns:
    """The arrays a reading writes: recordpass's PACKET, MATCHED and DETAILED groups, in that
    order each (the first of the first two: the direction column)."""

    packet: list[np.ndarray]
    matched: list[np.ndarray]
    detailed: list[np.ndarray]

    def groups(self):
        """(columns, counter of Reading) of each group."""
        return ((self.packet, "n"), (self.matched, "k"), (self.detailed, "j"))


@dataclass
class Reading:
    """One reading of a capture's records (the state record_pass carries, so that it
    resumes): the packet, matched and detailed rows written from ``row0`` on up to ``n``,
    ``k`` and ``j``, its own table of directions (``m`` of them) and where it stopped:
    ``base`` (a file offset), ``code`` (record_pass's) and ``tail`` (the bytes it left
    unparsed: the record it stopped at)."""

    row0: int
    n: int
    k: int
    j: int
    base: int
    table: np.ndarray
    keys1: np.ndarray
    keys2: np.ndarray
    first: np.ndarray
    first_data: np.ndarray
    last_ns: np.ndarray
    matched: np.ndarray
    detailed: np.ndarray
    m: int = 0
    last_ts: int = np.iinfo(np.int64).min
    in_order: bool = True
    code: int = 0
    tail: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint8))
    rows: int = 0  # its rows stay below this one (the first half's: the second half's first)
    cancelled: bool = False  # set while the second half is read: its reading is not used

    @classmethod
    def at(cls, row: int, base: int, rows: int) -> Reading:
        half = _TABLE0 // 2
        kinds = (np.uint64, np.uint64, np.int64, np.int64, np.int64, np.bool_, np.bool_)
        table = np.full(_TABLE0, -1, np.int64)
        per_direction = (np.empty(half, t) for t in kinds)
        return cls(row, row, row, row, base, table, *per_direction, rows=rows)

    def grow(self) -> None:
        """Twice the room for directions (the table half full)."""
        self.table = np.full(2 * len(self.table), -1, np.int64)
        for name in _PER_DIRECTION:
            setattr(self, name, np.resize(getattr(self, name), len(self.table) // 2))
        rehash(self.table, self.keys1, self.keys2, self.m)


def ids(kind) -> int:
    """How many direction ids (0 on) a column of ``kind`` holds."""
    return int(np.iinfo(kind).max) + 1


def _read(
    name, args, cols: Columns, r: Reading, size: int, stop: int = -1, ahead: bool = True,
    halt: list[bool] | None = None,
) -> None:  # fmt: skip
    """Parse the file's records from byte r.base on into the columns from r's rows on (see
    record_pass); with ``stop``: up to the first record that begins at or after that byte;
    ``ahead``: see Blocks; ``halt``: shared with another reading, set when this one stops
    with WIDE, and while set this one stops between blocks (code PAUSED). A reading that
    stops keeps the record header it stopped at as ``tail`` (what an error message reads)."""
    with Blocks(name, r.base, size - r.base, ahead) as blocks:
        for buf, start, end in blocks:  # buf[start:end]: an unparsed record tail, then a block
            while True:
                room = end - start
                limit = room if stop < 0 else min(room, stop - r.base)
                state = (r.n, r.k, r.j, r.m, r.last_ts, r.in_order, r.rows)
                state = (*state, ids(cols.packet[0].dtype), r.table, r.keys1, r.keys2, r.first)
                state = (*state, r.first_data, r.last_ns, r.matched, r.detailed)
                pos, r.n, r.k, r.j, r.m, r.last_ts, r.in_order, r.code = record_pass(
                    buf[start:end], limit, room, *args, *state, *cols.packet, *cols.matched,
                    *cols.detailed,
                )  # fmt: skip
                start += pos
                r.base += pos
                if r.code != FULL:
                    break
                r.grow()
            if r.code == WIDE and halt is not None:
                halt[0] = True
            elif r.code in (0, 1) and halt is not None and halt[0] and not r.base >= stop >= 0:
                r.code = PAUSED  # it reads on from r.base (a record's start) when resumed
            if r.code in (2, ROWS, WIDE, PAUSED) or r.base >= stop >= 0 or r.cancelled:
                r.tail = buf[start : min(end, start + REC_HDR)].copy()  # not the block's rest
                return
            blocks.carry(buf[start:end])
    r.tail = blocks.tail


@njit(cache=True, nogil=True)
def _record_chain(b, little, frac_limit, sec_lo, sec_hi, chain):
    """The first offset in b where ``chain`` whole records follow one another, each header
    plausible (time within [sec_lo, sec_hi] s, fraction below frac_limit, caplen at most
    libpcap's maximum and origlen: not the header's snaplen, which some files break); -1 if
    none."""
    for p in range(len(b)):
        q = p
        for _ in range(chain):
            code, caplen = record_at(b, q, len(b), little)  # whole, caplen at most the maximum
            if code:
                break
            sec, frac = u32(b, q, little), u32(b, q + 4, little)
            if (
                sec < sec_lo
                or sec > sec_hi
                or frac >= frac_limit
                or caplen > u32(b, q + 12, little)
            ):
                break
            q += REC_HDR + caplen
        else:
            return p
    return -1


def split_point(name: str, fmt: Format, size: int) -> tuple[int, int]:
    """A guess at a record's start near the middle of the file, where _CHAIN plausible
    record headers follow one another (-1 if none), and at the rows before it (the records
    of _SAMPLE bytes at the start and from the guess on: the smaller bytes a record). The
    reading checks both guesses."""
    little = fmt.endian == "<"
    with open(name, "rb") as f:
        f.seek(GLOBAL_HDR)
        start = np.frombuffer(f.read(_SAMPLE), np.uint8)
        middle = GLOBAL_HDR + (size - GLOBAL_HDR) // 2
        if len(start) < REC_HDR:
            return -1, 0
        sec = u32(start, 0, little)
        frac_limit = 1_000_000_000 // fmt.frac_ns
        lo, hi = sec - _SEC_RANGE[0], sec + _SEC_RANGE[1]
        for length in (_SAMPLE, _CHAIN * (MAX_CAPLEN + REC_HDR)):  # the second: long records
            f.seek(middle)
            window = np.frombuffer(f.read(length), np.uint8)
            at = _record_chain(window, little, frac_limit, lo, hi, _CHAIN)
            if at >= 0:
                break
    if at < 0:
        return -1, 0
    record = max(min(_record_bytes(start, 0, little), _record_bytes(window, at, little)), 1)
    return middle + at, int((middle + at - GLOBAL_HDR) / record * _MARGIN) + 1


@njit(cache=True, nogil=True)
def _record_bytes(b, p, little):
    """The mean size of the whole records of b from p on (header included; 0 if none)."""
    q, n = p, 0
    while True:
        code, caplen = record_at(b, q, len(b), little)
        if code:
            break
        q, n = q + REC_HDR + caplen, n + 1
    return (q - p) / n if n else 0.0


@njit(cache=True, nogil=True)
def _adopt(
    table, keys1, keys2, first, first_data, last_ns, matched, detailed, m,
    b_keys1, b_keys2, b_first, b_first_data, b_last_ns, b_matched, b_detailed, mb, shift,
    number, start,
):  # fmt: skip
    """The directions of the second half from ``start`` on into the first half's table (new
    ones appended in their order; the first row of payload kept from the first half where
    it has one; the latest time of both), their rows moved down by ``shift``, and each one's
    number in it (``number``); returns (directions, next): next < mb when the table must grow
    first."""
    for d in range(start, mb):
        k1, k2 = b_keys1[d], b_keys2[d]
        s = find(table, keys1, keys2, k1, k2)
        a = table[s]
        if a < 0:
            if 2 * (m + 1) > len(table) or m >= len(keys1):
                return m, d
            table[s] = m
            keys1[m], keys2[m], first[m], last_ns[m] = k1, k2, b_first[d] - shift, b_last_ns[d]
            first_data[m] = b_first_data[d] - shift if b_first_data[d] >= 0 else -1
            matched[m], detailed[m] = b_matched[d], b_detailed[d]
            a = m
            m += 1
        else:
            if first_data[a] < 0 and b_first_data[d] >= 0:
                first_data[a] = b_first_data[d] - shift
            last_ns[a] = max(last_ns[a], b_last_ns[d])
        number[d] = a
    return m, mb


def _join(whole: Reading, second: Reading, cols: Columns) -> None:
    """The second half's reading appended to the first's: its directions renumbered into the
    first's table (the direction columns widened first where the two halves' directions
    together need it), its rows moved down to follow the first half's."""
    number = np.empty(second.m, np.int32)
    done = 0
    shift = second.row0 - whole.n
    b = tuple(getattr(second, name) for name in _PER_DIRECTION)
    while True:
        whole.m, done = _adopt(
            whole.table, *(getattr(whole, name) for name in _PER_DIRECTION), whole.m, *b,
            second.m, shift, number, done,
        )  # fmt: skip
        if done == second.m:
            break
        whole.grow()
    if whole.m > ids(cols.packet[0].dtype):
        _widen(cols, (whole, second), whole.m)
    if second.n > second.row0:
        ts = cols.packet[1]
        whole.in_order = bool(
            whole.in_order and second.in_order and ts[second.row0] >= whole.last_ts
        )
        whole.last_ts = second.last_ts
    for group, end in cols.groups():
        rows = getattr(second, end) - second.row0
        for i, column in enumerate(group):
            renumber = number if i == 0 and group is not cols.detailed else None
            _move(column, second.row0, getattr(whole, end), rows, renumber)
        setattr(whole, end, getattr(whole, end) + rows)
    whole.code, whole.base, whole.tail = second.code, second.base, second.tail


def _move(column: np.ndarray, src: int, dst: int, n: int, number: np.ndarray | None) -> None:
    """column[dst:dst + n] = column[src:src + n] (src > dst; directions renumbered through
    ``number``), a piece at a time (numpy copies an overlapping piece through a temporary),
    each piece's source pages given back once no row will land on them."""
    if not len(column):  # a column this scan does not keep
        return
    step = max(_MOVE // column.itemsize, 1)
    for i in range(0, n, step):
        rows = min(step, n - i)
        if number is None:
            column[dst + i : dst + i + rows] = column[src + i : src + i + rows]
        else:  # numpy's number[piece] takes 5 ns a row
            _renumber(column, src + i, dst + i, rows, number)
        give_back(column, max(src + i, dst + n), src + i + rows)


@njit(cache=True, nogil=True)
def _renumber(column, src, dst, n, number):
    """column[dst:dst + n] = number[column[src:src + n]], forward (dst < src)."""
    for i in range(n):
        column[dst + i] = number[column[src + i]]


def read_whole(name, args, cols: Columns, size: int, cap: int, split: int, expected: int):
    """The whole capture read into the columns (a Reading), as two halves at once where
    ``split`` (a record's offset, from split_point) is given. A reading that meets more
    directions than its direction column numbers stops there (WIDE), and the other half
    pauses at its next block; once no thread writes, the direction columns are widened
    (_widen) and both read on, again at once."""
    whole = Reading.at(0, GLOBAL_HDR, cap)
    if split < 0:
        _read_widening(name, args, cols, whole, size)
        return whole
    # The second half's rows go where the first half's should end (guessed from the records'
    # sizes), at most above any row of it (a record takes 16 bytes at least); the first
    # half's reading stops there if it has more rows, and reads on alone.
    above = (split - GLOBAL_HDR) // REC_HDR + 1
    second = Reading.at(min(expected, above), split, cap)
    whole.rows = second.row0
    halt, error = [False], None  # see _read
    todo_whole = todo_second = True
    while todo_whole or todo_second:  # both halves at once; again after a widening
        halt[0] = False
        with ThreadPoolExecutor(1, thread_name_prefix="pcap-half") as pool:
            half = None
            if todo_second:
                half = pool.submit(_read, name, args, cols, second, size, -1, False, halt)
            try:  # both halves read their blocks themselves: see Blocks
                if todo_whole:
                    _read(name, args, cols, whole, size, split, False, halt)
            finally:
                second.cancelled = not _used(whole, split)
                if half is not None:
                    error = half.exception()  # the second half is done before anything else
        if WIDE in (whole.code, second.code):  # no thread writes now
            _widen(cols, (whole, second), max(whole.m, second.m) + 1)
        todo_whole = whole.code in (WIDE, PAUSED)
        todo_second = error is None and second.code in (WIDE, PAUSED) and _used(whole, split)
    second.cancelled = not _used(whole, split)
    if not second.cancelled:  # the second half began at a record, the rows fit
        if error is not None:
            raise error
        _join(whole, second, cols)
    elif whole.code in (0, ROWS):  # a guess was wrong: the first half reads on alone
        whole.rows = cap
        _read_widening(name, args, cols, whole, size)
    return whole


def _used(whole: Reading, split: int) -> bool:
    """The second half's reading is still to be joined to the first's (as far as it got): the
    first half ended at the second's start, or stopped to widen and reads on."""
    return whole.code in (WIDE, PAUSED) or (whole.code == 0 and whole.base == split)


def _read_widening(name, args, cols: Columns, r: Reading, size: int) -> None:
    """_read to the end of the file, the direction columns widened where it needs."""
    _read(name, args, cols, r, size)
    while r.code == WIDE:
        _widen(cols, (r,), r.m + 1)
        _read(name, args, cols, r, size)


def _widen(cols: Columns, readings, directions: int) -> None:
    """The direction columns (of the packet and matched groups) replaced by ones of the
    narrowest type that numbers ``directions``, holding the rows the ``readings`` wrote."""
    least = max(directions, ids(cols.packet[0].dtype) + 1)  # wider than now, always
    kind = next((k for k in ID_KINDS if ids(k) >= least), None)
    if kind is None:
        raise ValueError(f"{directions} directions: more than 32-bit ids number")
    for group, end in cols.groups()[:2]:
        old = group[0]
        new = alloc(len(old), kind)
        for r in readings:
            new[r.row0 : getattr(r, end)] = old[r.row0 : getattr(r, end)]
        group[0] = new
