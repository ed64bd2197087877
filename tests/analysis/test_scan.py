"""The one reader of captures (analysis/scan.py): what it keeps of every packet, of matched
and detailed directions, read whole or as two halves at once, in small blocks, from damaged
files; read_pcap (built on it) is checked against tcpdump in test_pcap.py."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from analysis.pcap import COLUMNS, PcapError, PcapTruncatedWarning, read_columns
from analysis.scan import ALL, rows_of, scan

from .pcapgen import arp_frame, ethernet, ipv4, tcp_segment, udp_datagram, write_pcap
from .scans import assert_same_scan, flows_capture, record_offsets, resident_bytes
from .tcpgen import generate
from .test_pcap import random_capture


def _pairs(cap, step: int) -> np.ndarray:
    """Every ``step``-th (src, dst) pair of a scan's directions, as src << 32 | dst."""
    d = cap.directions
    return np.unique(d["src"].astype(np.uint64) << np.uint64(32) | d["dst"])[::step]


@pytest.mark.parametrize("snaplen", [65535, 60, 50], ids=["whole", "cut-in-tcp", "cut-in-ports"])
def test_a_scan_keeps_read_pcaps_values(tmp_path: Path, snaplen: int) -> None:
    """The PACKET columns are read_pcap's (TCP fields 0 on other packets, payload lengths
    below 0 as 0); every packet's direction holds its addresses, ports and protocol; its
    first row, first payload row, latest time and reverse; thousands of directions (the table
    grows while scanning); frames cut inside the headers; the matched and detailed groups
    hold their directions' packets, in file order."""
    path = write_pcap(tmp_path / "r.pcap", random_capture(seed=5, n=6000), snaplen=snaplen)
    cols = read_columns(path, [*COLUMNS, "key_hash"])
    plain = scan(path, threads=1)
    pairs = _pairs(plain, 3)
    cap = scan(path, matched=pairs, detailed=pairs[::2], threads=1)
    assert plain.matched is None and plain.detailed is None
    for c in ("ts_ns", "tos", "seq", "ack", "tcp_flags"):
        assert np.array_equal(getattr(cap, c), cols[c]), c
    assert np.array_equal(cap.payload_len, np.maximum(cols["payload_len"], 0))
    d = cap.directions
    assert len(d["src"]) > 2 * 2048 and cap.in_order
    for c in ("src", "dst", "sport", "dport", "proto"):
        assert np.array_equal(d[c][cap.direction], cols[c]), c
    assert np.array_equal(d["first"], np.unique(cap.direction, return_index=True)[1])
    payload = (cap.payload_len > 0) & (cols["proto"] == 6)  # TCP payload
    first_data = np.full(len(d["src"]), -1)
    dirs, rows = np.unique(cap.direction[payload], return_index=True)
    first_data[dirs] = np.flatnonzero(payload)[rows]
    assert np.array_equal(d["first_data"], first_data) and (first_data >= 0).any()
    last = np.full(len(d["src"]), np.iinfo(np.int64).min)
    np.maximum.at(last, cap.direction, cap.ts_ns)
    assert np.array_equal(d["last_ns"], last)
    has = d["reverse"] >= 0
    assert has.any() and np.array_equal(d["reverse"][d["reverse"][has]], np.flatnonzero(has))
    assert np.array_equal(d["src"][d["reverse"][has]], d["dst"][has])
    ends = cols["src"].astype(np.uint64) << np.uint64(32) | cols["dst"]
    for group, chosen, names in (
        ("matched", pairs, ("key_hash", "ip_len")),
        ("detailed", pairs[::2], ("caplen", "wirelen", "ip_len", "ip_id", "ip_hl", "payload_len",
                                  "payload_head")),
    ):  # fmt: skip
        inside = np.isin(ends, chosen)
        assert 0 < inside.sum() < len(ends)
        assert np.array_equal(rows_of(cap, d[group]), np.flatnonzero(inside)), group
        for c in names:
            assert np.array_equal(getattr(cap, group)[c], cols[c][inside]), (group, c)
    assert np.array_equal(cap.matched["direction"], cap.direction[np.isin(ends, pairs)])
    for c in plain.directions:  # the groups change nothing else
        if c not in ("matched", "detailed"):
            assert np.array_equal(cap.directions[c], plain.directions[c]), c
    every = scan(path, detailed=ALL, threads=1)
    for c in every.detailed:
        assert np.array_equal(every.detailed[c], cols[c]), c


def test_a_growing_capture_is_read_up_to_its_size_at_the_start(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """tcpdump may still be writing: bytes appended while reading are not read (the columns
    were sized for the file as it was)."""
    from analysis import scan as scanning

    data = pair[0].read_bytes()
    path = pair[0].parent / "growing.pcap"
    path.write_bytes(data[: len(data) // 2])
    real = scanning.os.path.getsize
    grown = []

    def size_then_grow(p):  # the file is completed right after its size was taken
        size = real(p)
        if not grown:
            with open(p, "ab") as f:
                f.write(data[len(data) // 2 :])
            grown.append(size)
        return size

    monkeypatch.setattr(scanning.os.path, "getsize", size_then_grow)
    with pytest.warns(UserWarning, match="truncated"):
        half = scan(path).ts_ns
    monkeypatch.undo()
    whole = scan(path).ts_ns
    assert 0 < len(half) < len(whole) and np.array_equal(half, whole[: len(half)])


def test_a_truncated_or_corrupt_capture(tmp_path: Path) -> None:
    """A truncated capture keeps its complete records and warns, naming the file and the
    offset; a corrupt record header is an error naming its offset."""
    whole = write_pcap(tmp_path / "v.pcap", random_capture(seed=1, n=20))
    data = whole.read_bytes()
    path = tmp_path / "cut.pcap"
    path.write_bytes(data[:-10])
    last = record_offsets(data)[-1]
    with pytest.warns(
        PcapTruncatedWarning, match=rf"cut\.pcap: truncated packet record at byte {last} "
    ):
        cut = scan(path)
    full = scan(whole).ts_ns
    assert len(full) - 1 <= len(cut.ts_ns) <= len(full) and len(cut.ts_ns) > 10
    assert np.array_equal(cut.ts_ns, full[: len(cut.ts_ns)])
    bad = bytearray(data)
    bad[24 + 8 : 24 + 12] = (10**9).to_bytes(4, "little")  # the first record's caplen
    path.write_bytes(bytes(bad))
    with pytest.raises(PcapError, match=r"cut\.pcap: corrupt record header at byte 24"):
        scan(path)


def test_direction_ids_in_the_narrowest_type(tmp_path: Path, joins: list[int]) -> None:
    """A scan numbers directions in 8 bits while they fit and widens its direction columns
    (16, then 32 bits) when it meets more, reading on: 300 and 70,000 flows, read whole or as
    two halves whether the first half, the second or only both together need the wider type
    (one join each: nothing read twice), its matched direction column too."""
    few = flows_capture(tmp_path / "few.pcap", [*range(200), *range(200)])
    assert scan(few, threads=1).direction.dtype == np.uint8
    for n, kind in ((300, np.uint16), (70_000, np.int32)):
        path = flows_capture(tmp_path / f"{n}.pcap", range(n))
        for threads in (1, 2):
            joins.clear()
            cap = scan(path, threads=threads)
            assert len(joins) == threads - 1
            assert cap.direction.dtype == kind and len(cap.directions["src"]) == n
            assert np.array_equal(cap.direction, np.arange(n))
    cases = {  # the flows of each half (the halves split at the middle record)
        "first": [*range(300), *np.arange(300) % 10],
        "second": [*np.arange(300) % 10, *range(10, 310)],
        "together": [*range(200), *range(200, 400)],
    }
    for case, flows in cases.items():
        path = flows_capture(tmp_path / f"{case}.pcap", flows)
        pairs = np.array([0xC612_0001 << 32 | 0xC613_0001], np.uint64)
        alone = scan(path, threads=1, matched=pairs)
        joins.clear()
        both = scan(path, threads=2, matched=pairs)
        assert len(joins) == 1, case
        assert both.direction.dtype == alone.direction.dtype == np.uint16, case
        assert both.matched["direction"].dtype == np.uint16, case
        assert_same_scan(both, alone)


def test_a_half_pauses_while_the_other_widens(
    tmp_path: Path, joins: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In blocks of about ten records, the half that meets a 257th direction stops, the
    other pauses at its next block, and both read on at once in 16 bits: the scan of one
    thread, whichever half widens, or both. The half that does not widen takes its second
    block only once the other has stopped to widen: on a loaded machine one thread can
    otherwise read its whole half before the other starts (a CI run saw it)."""
    from analysis import blocks, halves, recordpass, records

    monkeypatch.setattr(blocks, "BLOCK", 1000)
    codes: list[int] = []
    widened = threading.Event()
    read = halves._read

    def logged(*args, **kwargs) -> None:
        read(*args, **kwargs)
        codes.append(args[3].code)
        if args[3].code == recordpass.WIDE:
            widened.set()

    held = {"first": "second half", "second": "first half", "both": None}
    holding: list[str | None] = [None]  # the half held in the two-thread scan under way

    class HeldBlocks(blocks.Blocks):
        def __iter__(self):
            half = "first half" if self.offset == records.GLOBAL_HDR else "second half"
            for i, block in enumerate(super().__iter__()):
                if i == 1 and half == holding[0]:
                    assert widened.wait(60), f"{case}: the other half never widened"
                yield block

    monkeypatch.setattr(halves, "_read", logged)
    monkeypatch.setattr(halves, "Blocks", HeldBlocks)
    cases = {
        "first": [*range(3000), *np.arange(3000) % 10],
        "second": [*np.arange(3000) % 10, *range(10, 3010)],
        "both": list(range(6000)),
    }
    for case, flows in cases.items():
        path = flows_capture(tmp_path / f"{case}.pcap", flows)
        alone = scan(path, threads=1)
        codes.clear()
        joins.clear()
        widened.clear()
        holding[0] = held[case]
        both = scan(path, threads=2)
        holding[0] = None
        assert len(joins) == 1 and recordpass.WIDE in codes, case
        if case != "both":
            assert halves.PAUSED in codes, case
        assert both.direction.dtype == np.uint16, case
        assert_same_scan(both, alone)


def test_a_truncated_capture_read_with_wider_ids(tmp_path: Path, joins: list[int]) -> None:
    """A capture cut in its last record whose directions need 16 bits: its complete records,
    read whole or as two halves, with the truncation's warning."""
    path = flows_capture(tmp_path / "cut.pcap", range(600))
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.warns(PcapTruncatedWarning):
        alone = scan(path, threads=1)
    with pytest.warns(PcapTruncatedWarning):
        both = scan(path, threads=2)
    assert len(alone.ts_ns) == 599 and alone.direction.dtype == np.uint16
    assert_same_scan(both, alone)


def test_a_scan_in_small_blocks(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records cut by the end of a block (read by the reader thread while the one before is
    parsed) are parsed whole from the next; a truncated end and a corrupt header deep in the
    file are found at their file offsets."""
    from analysis import blocks

    ref = scan(pair[0], detailed=ALL, threads=1)
    monkeypatch.setattr(blocks, "BLOCK", 1000)  # about ten records a block
    assert_same_scan(scan(pair[0], detailed=ALL, threads=1), ref)
    data = pair[0].read_bytes()
    path = tmp_path / "deep.pcap"
    offsets = record_offsets(data)
    cut_at = offsets[len(offsets) // 2] + 7  # inside a record's header
    path.write_bytes(data[:cut_at])
    with pytest.warns(PcapTruncatedWarning, match=rf"record header at byte {cut_at - 7} "):
        cut = scan(path, threads=1)
    assert np.array_equal(cut.ts_ns, ref.ts_ns[: len(offsets) // 2])
    at = offsets[len(offsets) // 2]  # corrupt a record past the middle of the file
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
    from analysis import scan as scanning

    monkeypatch.setattr(scanning, "_SPLIT_MIN", 0 if thread == "pcap-half" else 1 << 40)
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
        pool.submit(scan, pair[0], threads=2).result(timeout=30)
    pool.shutdown(wait=False)


def test_give_back_takes_only_the_pages_of_a_view() -> None:
    """give_back finds a view's rows in its mapping (offsets into it at both levels) and
    gives back only the whole pages they fill: the rows around the view keep their values;
    a view that is not contiguous is left alone."""
    import mmap

    from analysis.resources import give_back

    memory = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE)
    root = np.frombuffer(memory, np.int64, offset=3 * mmap.PAGESIZE)
    root[:] = 7
    view = root[1000:300_000]
    give_back(view, 0, len(view))
    assert (root[:1000] == 7).all() and (root[300_000:] == 7).all()
    assert (view == 0).mean() > 0.99 and (view[:500] == 7).any()  # a partial page kept
    root[:] = 7
    give_back(np.ndarray((100_000,), np.int64, memory, 3 * mmap.PAGESIZE, (0,)), 0, 100_000)
    give_back(root[::2], 0, len(root) // 2)
    assert (root == 7).all()


def test_a_column_cut_to_its_rows_gives_back_the_rest() -> None:
    """A column's capacity is an upper bound of its rows: cut to them, the pages past its
    rows are given back (a huge page is otherwise resident whole), and its rows keep their
    values."""
    from analysis.resources import alloc, fit

    column = alloc(8 << 20, np.int64)  # 64 MB, every page written
    column[:] = np.arange(len(column))
    assert resident_bytes(column) >= 60 << 20
    cut = fit(column, 1000)
    assert resident_bytes(cut, column.nbytes) <= 2 * 4096
    assert np.array_equal(cut, np.arange(1000))


@pytest.mark.parametrize("threads", [1, 2], ids=["one-reading", "two-halves"])
def test_a_scan_keeps_only_its_rows_resident(
    tmp_path: Path, joins: list[int], threads: int
) -> None:
    """Each column of a scan holds about its own bytes, however large the capacity allocated
    for the file's worst case (one record per 16 bytes): on 300 k packets, without the cut,
    the huge pages holding the columns' ends were resident whole. Read as two halves, the
    same holds once the second half's rows have moved down."""
    truth = generate(tmp_path / "b.pcap", tmp_path / "a.pcap", packets=300_000, flows=2)
    cap = scan(tmp_path / "b.pcap", matched=truth.crossing, detailed=ALL, threads=threads)
    assert len(joins) == threads - 1
    cols = {c: getattr(cap, c) for c in ("direction", "ts_ns", "seq", "ack", "payload_len")}
    cols.update({f"matched {c}": v for c, v in cap.matched.items()})
    cols.update({f"detailed {c}": v for c, v in cap.detailed.items()})
    mapped = [c for c, column in cols.items() if isinstance(column.base.base, memoryview)]
    assert {"ts_ns", "matched key_hash", "detailed caplen"} <= set(mapped)  # mappings of their own
    for name in mapped:
        column, memory = cols[name], cols[name].base.base.obj
        assert resident_bytes(column, len(memory)) <= column.nbytes + 4096, name


@pytest.mark.parametrize("block", [1 << 20, 3000], ids=["blocks", "small-blocks"])
def test_a_capture_read_as_two_halves(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, joins: list[int], block: int
) -> None:
    """Two halves read at once (the second from a record found near the middle) give the
    scan of one reading, column for column: directions numbered in order of appearance
    across the halves, first rows, matched and detailed packets; the guess at the middle is
    a record's start."""
    from analysis import blocks, halves
    from analysis.pcapfile import read_global_header

    monkeypatch.setattr(blocks, "BLOCK", block)
    pairs = _pairs(scan(pair[0], threads=1), 2)
    for path, matched, detailed in (
        (pair[0], None, None),
        (pair[0], pairs, pairs[::2]),
        (pair[1], pairs, ALL),
    ):
        caps = {t: scan(path, matched=matched, detailed=detailed, threads=t) for t in (1, 2)}
        assert_same_scan(caps[2], caps[1])
    assert len(joins) == 3
    data = pair[0].read_bytes()
    with open(pair[0], "rb") as f:
        fmt = read_global_header(f, str(pair[0]))
    split, expected = halves.split_point(str(pair[0]), fmt, len(data))
    offsets = record_offsets(data)
    assert split in offsets and abs(split - len(data) / 2) < 4096
    assert offsets.index(split) <= expected <= 1.1 * offsets.index(split)


def test_halves_with_many_directions_and_time_going_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, joins: list[int]
) -> None:
    """Directions first seen in the second half join the first half's table (thousands: it
    grows while they do), those seen in both keep the first half's number and first rows,
    and time going back where the halves meet, or inside the second, is seen."""
    from analysis import scan as scanning

    records = random_capture(seed=11, n=9000)  # nearly every packet a new direction
    records += [(ts + 10**10, frame) for ts, frame in records[:3000]]  # seen again
    records += [(ts + 2 * 10**10, frame) for ts, frame in random_capture(seed=12, n=3000)]
    middle = 7000
    for name, back in (("meet", middle), ("second", middle + 2000), ("none", None)):
        shifted = list(records)
        if back is not None:  # this record is earlier than the one before it
            shifted[back] = (shifted[back - 1][0] - 1000, shifted[back][1])
        path = write_pcap(tmp_path / f"{name}.pcap", shifted)
        split = record_offsets(path.read_bytes())[middle]
        monkeypatch.setattr(scanning, "split_point", lambda *_a, s=split: (s, middle + 100))
        joins.clear()
        pairs = _pairs(scan(path, threads=1), 5)
        ref = scan(path, threads=1, matched=pairs, detailed=pairs[::3])
        got = scan(path, threads=2, matched=pairs, detailed=pairs[::3])
        assert_same_scan(got, ref)
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
    from analysis import scan as scanning

    offsets = record_offsets(pair[0].read_bytes())
    middle = len(offsets) // 2
    split = offsets[middle] + 1 if guess == "inside-a-record" else offsets[middle]
    rows = middle + 100 if guess == "inside-a-record" else middle // 2
    monkeypatch.setattr(scanning, "split_point", lambda *_a: (split, rows))
    assert_same_scan(scan(pair[0], threads=2), scan(pair[0], threads=1))
    assert joins == []


def test_a_damaged_second_half(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, joins: list[int]
) -> None:
    """A truncated end or a corrupt header in the second half is reported as one reading
    reports it (the same offset, the same message); a corrupt header in the first half
    too, whatever the second half read."""
    from analysis import scan as scanning

    data = pair[0].read_bytes()
    offsets = record_offsets(data)
    split = offsets[len(offsets) // 2]
    monkeypatch.setattr(scanning, "split_point", lambda *_a: (split, len(offsets) // 2 + 9))
    path = tmp_path / "cut.pcap"
    path.write_bytes(data[:-7])
    with pytest.warns(PcapTruncatedWarning) as w_ref:
        ref = scan(path, threads=1)
    with pytest.warns(PcapTruncatedWarning) as w:
        got = scan(path, threads=2)
    assert str(w[0].message) == str(w_ref[0].message) and len(joins) == 1
    assert_same_scan(got, ref)
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
    from analysis import scan as scanning

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
    split = record_offsets(path.read_bytes())[100]
    monkeypatch.setattr(scanning, "split_point", lambda *_a: (split, 100))
    ref, got = scan(path, threads=1), scan(path, threads=2)
    assert_same_scan(got, ref)
    flow = int(ref.direction[10])
    assert len(joins) == 1 and ref.directions["first_data"][flow] == 150


def test_an_exact_guess_after_packets_that_take_no_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, joins: list[int]
) -> None:
    """A guess of exactly the first half's rows is enough when the records just before the
    middle are not IPv4 (ARP, IPv6: they take no row): the halves are joined."""
    from analysis import scan as scanning

    t0 = 1_763_700_000 * 10**9
    udp = ethernet(ipv4("198.18.1.9", "198.18.2.9", 17, udp_datagram(2000, 9)))
    frames = [udp] * 100 + [arp_frame()] * 3 + [udp] * 100
    path = write_pcap(tmp_path / "arp.pcap", [(t0 + i * 1000, f) for i, f in enumerate(frames)])
    split = record_offsets(path.read_bytes())[103]  # after the three ARP frames
    monkeypatch.setattr(scanning, "split_point", lambda *_a: (split, 100))
    assert_same_scan(scan(path, threads=2), scan(path, threads=1))
    assert len(joins) == 1


def test_the_middle_of_a_capture_that_breaks_its_snaplen(tmp_path: Path) -> None:
    """Records longer than the file header's snaplen (some writers do that) do not hide the
    middle: the guess is a record's start, as it is for a file that keeps it."""
    from analysis import halves
    from analysis.pcapfile import read_global_header

    for snaplen in (60, None):
        path = write_pcap(
            tmp_path / f"s{snaplen}.pcap", random_capture(seed=9, n=3000), header_snaplen=snaplen
        )
        data = path.read_bytes()
        with open(path, "rb") as f:
            fmt = read_global_header(f, str(path))
        split, rows = halves.split_point(str(path), fmt, len(data))
        assert split in record_offsets(data) and rows > 1000, snaplen
