"""One compiled pass over a classic pcap file: record headers, link, IPv4 and L4 fields.

``scan`` walks the records of a file in order (each header's caplen gives the next offset)
and writes the requested columns of ``analysis.pcap.COLUMNS`` (plus ``key_hash``, the
packet key of ``analysis.match.key_hash``) into preallocated arrays, in a numba-compiled
loop. The file is read in blocks into one reused buffer (a memory map would make every page
of the file resident in this process: more RSS than the file's size), up to the size it had
when reading began. Compiled code is cached on disk (``cache=True``): the first run in a
fresh checkout compiles for about 10 s, later processes load it.
"""

from __future__ import annotations

import mmap
import os

import numpy as np
from numba import njit

__all__ = ["BLOCK_BYTES", "scan"]

BLOCK_BYTES = 8 << 20  # bytes read at a time (the buffer is reused: memory stays flat)
_REC_HDR = 16
_GLOBAL_HDR = 24
_MAX_CAPLEN = 262144
_U = np.uint64


@njit(cache=True, nogil=True, inline="always")
def _mix(x):
    x = (x ^ (x >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U(27))) * _U(0x94D049BB133111EB)
    return x ^ (x >> _U(31))


@njit(cache=True, nogil=True, inline="always")
def _key_hash(addrs, proto, sport, dport, ip_id, seq, head):
    """analysis.match.key_hash of one packet: splitmix64 rounds over four words (``addrs``:
    src << 32 | dst; protocol, ports and IP ID; sequence number; payload head)."""
    h = _mix(_U(0x9E3779B97F4A7C15) ^ addrs)
    h = _mix(
        h ^ (_U(proto) << _U(56) | _U(sport) << _U(40) | _U(dport) << _U(24) | _U(ip_id) << _U(8))
    )
    h = _mix(h ^ _U(seq))
    return _mix(h ^ _U(head))


@njit(cache=True, nogil=True, inline="always")
def _u32(b, i, little):
    if little:
        return (
            np.int64(b[i])
            | np.int64(b[i + 1]) << 8
            | np.int64(b[i + 2]) << 16
            | (np.int64(b[i + 3]) << 24)
        )
    return (
        np.int64(b[i]) << 24
        | np.int64(b[i + 1]) << 16
        | np.int64(b[i + 2]) << 8
        | (np.int64(b[i + 3]))
    )


@njit(cache=True, nogil=True, inline="always")
def _at(b, i, left):
    """Byte i if it was captured (i < left), else 0."""
    return np.int64(b[i]) if i < left else np.int64(0)


@njit(cache=True, nogil=True, inline="always")
def _record(b, pos, size, little):
    """The record at ``pos`` of b[:size]: (code, caplen), code 0 when it is whole, 1 when it
    is incomplete (the file ends in it), 2 when its caplen is above libpcap's maximum (a
    corrupt header)."""
    if size - pos < _REC_HDR:
        return 1, np.int64(0)
    caplen = _u32(b, pos + 8, little)
    if caplen > _MAX_CAPLEN:
        return 2, caplen
    if pos + _REC_HDR + caplen > size:
        return 1, caplen
    return 0, caplen


@njit(cache=True, nogil=True, inline="always")
def _ipv4_at(b, frame, left, l3_base, et_off, vlan):
    """Where the IPv4 header of the frame b[frame:left] starts, or -1 when the frame is not
    IPv4 or too short to hold a 20-byte header."""
    l3 = l3_base
    if et_off >= 0:
        e = frame + et_off
        et = _at(b, e, left) << 8 | _at(b, e + 1, left)
        if vlan:  # up to two 802.1Q / 802.1ad tags shift IP by 4 bytes each
            for tag in (16, 20):
                if et != 0x8100 and et != 0x88A8:
                    break
                et = _at(b, frame + tag, left) << 8 | _at(b, frame + tag + 1, left)
                l3 += 4
        if et != 0x0800:
            return -1
    ip = frame + l3
    if left - frame < l3 + 20 or b[ip] >> 4 != 4:
        return -1
    return ip


@njit(cache=True, nogil=True, inline="always")
def _headers(b, ip, left):
    """The IPv4 packet at ``ip`` (its record ending at ``left``): (ip_hl, ip_len, proto,
    sport, dport, seq, ack, flags, l4_hl). Ports for TCP and UDP, sequence, ACK and flags
    for TCP, on a first fragment only (else 0, with l4_hl 0); bytes the snap length cut
    off read as 0."""
    ip_hl = (np.int64(b[ip]) & 0x0F) * 4
    ip_len = np.int64(b[ip + 2]) << 8 | np.int64(b[ip + 3])
    proto = np.int64(b[ip + 9])
    first_frag = ((np.int64(b[ip + 6]) << 8 | np.int64(b[ip + 7])) & 0x1FFF) == 0
    is_tcp = proto == 6 and first_frag and ip_hl >= 20
    is_udp = proto == 17 and first_frag and ip_hl >= 20
    l4 = ip + ip_hl
    sport = dport = seq = ack = flags = np.int64(0)
    l4_hl = np.int64(0)
    if (is_tcp or is_udp) and l4 + 20 <= left:  # the usual case: no byte is missing
        sport = np.int64(b[l4]) << 8 | np.int64(b[l4 + 1])
        dport = np.int64(b[l4 + 2]) << 8 | np.int64(b[l4 + 3])
        l4_hl = np.int64(8)
        if is_tcp:
            seq = _u32(b, l4 + 4, False)
            ack = _u32(b, l4 + 8, False)
            flags = np.int64(b[l4 + 13])
            l4_hl = (np.int64(b[l4 + 12]) >> 4) * 4
    elif is_tcp or is_udp:  # snapped inside the header
        sport = _at(b, l4, left) << 8 | _at(b, l4 + 1, left)
        dport = _at(b, l4 + 2, left) << 8 | _at(b, l4 + 3, left)
        l4_hl = np.int64(8)
        if is_tcp:
            seq = _at(b, l4 + 4, left) << 24 | _at(b, l4 + 5, left) << 16
            seq |= _at(b, l4 + 6, left) << 8 | _at(b, l4 + 7, left)
            ack = _at(b, l4 + 8, left) << 24 | _at(b, l4 + 9, left) << 16
            ack |= _at(b, l4 + 10, left) << 8 | _at(b, l4 + 11, left)
            flags = _at(b, l4 + 13, left)
            l4_hl = (_at(b, l4 + 12, left) >> 4) * 4
    return ip_hl, ip_len, proto, sport, dport, seq, ack, flags, l4_hl


@njit(cache=True, nogil=True, inline="always")
def _plain_tcp(b, ip, left):
    """Whether the IPv4 packet at ``ip`` is TCP, a first fragment, with an IP header of at
    least 20 bytes and its TCP header's first 20 bytes captured: nearly every packet of a
    trial, which _tcp_headers reads unchecked."""
    ip_hl = (np.int64(b[ip]) & 0x0F) * 4
    first_frag = (np.int64(b[ip + 6]) & 0x1F | np.int64(b[ip + 7])) == 0
    return b[ip + 9] == 6 and first_frag and ip_hl >= 20 and ip + ip_hl + 20 <= left


@njit(cache=True, nogil=True, inline="always")
def _tcp_headers(b, ip):
    """_headers of a packet for which _plain_tcp holds (the same values, no check).

    The scans branch between this and _headers in their own loop: numba compiles a helper
    that merges both results into one returned tuple into much slower code for the whole
    pass (README, make bench)."""
    ip_hl = (np.int64(b[ip]) & 0x0F) * 4
    l4 = ip + ip_hl
    return (
        ip_hl,
        np.int64(b[ip + 2]) << 8 | np.int64(b[ip + 3]),
        np.int64(6),
        np.int64(b[l4]) << 8 | np.int64(b[l4 + 1]),
        np.int64(b[l4 + 2]) << 8 | np.int64(b[l4 + 3]),
        _u32(b, l4 + 4, False),
        _u32(b, l4 + 8, False),
        np.int64(b[l4 + 13]),
        (np.int64(b[l4 + 12]) >> 4) * 4,
    )


@njit(cache=True, nogil=True, inline="always")
def _payload_head(b, at, left, plen):
    """The payload's first 8 bytes (fewer if it is shorter or cut off) as a big-endian
    integer, missing bytes 0."""
    if left - at >= 8 and plen >= 8:  # the usual case: eight bytes at once
        return (
            _U(b[at]) << _U(56) | _U(b[at + 1]) << _U(48) | _U(b[at + 2]) << _U(40)
            | _U(b[at + 3]) << _U(32) | _U(b[at + 4]) << _U(24) | _U(b[at + 5]) << _U(16)
            | _U(b[at + 6]) << _U(8) | _U(b[at + 7])
        )  # fmt: skip
    head = _U(0)
    for i in range(max(min(min(left - at, plen), 8), 0)):
        head |= _U(b[at + i]) << _U(56 - 8 * i)
    return head


@njit(cache=True, nogil=True, boundscheck=False)
def _scan(  # one array per column keeps the loop free of Python objects
    b, pos, limit, size, little, frac_ns, l3_base, et_off, vlan, n,
    o_ts, o_caplen, o_wirelen, o_src, o_dst, o_proto, o_tos, o_ip_len, o_ip_id, o_ip_hl,
    o_sport, o_dport, o_seq, o_ack, o_flags, o_plen, o_head, o_hash,
):  # fmt: skip
    """Parse records from ``pos`` while pos < limit; returns (pos, rows, code): code 0 when
    ``limit`` was reached, else _record's code for the record at pos."""
    w_ts, w_cap, w_wire = len(o_ts) > 0, len(o_caplen) > 0, len(o_wirelen) > 0
    w_src, w_dst, w_proto, w_tos = len(o_src) > 0, len(o_dst) > 0, len(o_proto) > 0, len(o_tos) > 0
    w_len, w_id, w_hl = len(o_ip_len) > 0, len(o_ip_id) > 0, len(o_ip_hl) > 0
    w_sp, w_dp, w_seq, w_ack = len(o_sport) > 0, len(o_dport) > 0, len(o_seq) > 0, len(o_ack) > 0
    w_fl, w_pl, w_head, w_hash = len(o_flags) > 0, len(o_plen) > 0, len(o_head) > 0, len(o_hash) > 0
    while pos < limit:
        code, caplen = _record(b, pos, size, little)
        if code:
            return pos, n, code
        rec = pos
        frame = pos + _REC_HDR
        left = pos = frame + caplen
        ip = _ipv4_at(b, frame, left, l3_base, et_off, vlan)
        if ip < 0:
            continue
        if _plain_tcp(b, ip, left):  # branched here, not in a helper: see _tcp_headers
            ip_hl, ip_len, proto, sport, dport, seq, ack, flags, l4_hl = _tcp_headers(b, ip)
        else:
            ip_hl, ip_len, proto, sport, dport, seq, ack, flags, l4_hl = _headers(b, ip, left)
        plen = ip_len - ip_hl - l4_hl
        head = _payload_head(b, ip + ip_hl + l4_hl, left, plen)
        src = _u32(b, ip + 12, False)
        dst = _u32(b, ip + 16, False)
        ip_id = np.int64(b[ip + 4]) << 8 | np.int64(b[ip + 5])
        if w_ts:
            o_ts[n] = _u32(b, rec, little) * 1_000_000_000 + _u32(b, rec + 4, little) * frac_ns
        if w_cap:
            o_caplen[n] = caplen
        if w_wire:
            o_wirelen[n] = _u32(b, rec + 12, little)
        if w_src:
            o_src[n] = src
        if w_dst:
            o_dst[n] = dst
        if w_proto:
            o_proto[n] = proto
        if w_tos:
            o_tos[n] = b[ip + 1]
        if w_len:
            o_ip_len[n] = ip_len
        if w_id:
            o_ip_id[n] = ip_id
        if w_hl:
            o_ip_hl[n] = ip_hl
        if w_sp:
            o_sport[n] = sport
        if w_dp:
            o_dport[n] = dport
        if w_seq:
            o_seq[n] = seq
        if w_ack:
            o_ack[n] = ack
        if w_fl:
            o_flags[n] = flags
        if w_pl:
            o_plen[n] = plen
        if w_head:
            o_head[n] = head
        if w_hash:
            o_hash[n] = _key_hash(
                _U(src) << _U(32) | _U(dst), proto, sport, dport, ip_id, seq, head
            )
        n += 1
    return pos, n, 0


_ORDER = (
    "ts_ns", "caplen", "wirelen", "src", "dst", "proto", "tos", "ip_len", "ip_id", "ip_hl",
    "sport", "dport", "seq", "ack", "tcp_flags", "payload_len", "payload_head", "key_hash",
)  # fmt: skip


def _alloc(n: int, dtype: str, huge: bool = True) -> np.ndarray:
    """An uninitialized array in its own private anonymous mapping, in transparent huge
    pages: only the rows written become resident (the capacity is an upper bound), 2 MB at
    a time, and the memory goes back to the system when the array is freed. A 4 KB page
    fault costs about 3.5 µs in this VM: on a 3.2 M-packet capture 4 KB pages took 0.21 s
    of CPU for the fast path's scan and 0.36 s for read_columns, huge pages 0.14 s and
    0.21 s. (mmap.mmap(-1, n) alone is a shared mapping, which gets no huge pages with the
    kernel's default shmem setting; numpy's own allocations come from malloc, whose freed
    blocks below its threshold stay resident.) ``huge=False``: 4 KB pages, also where the
    system gives huge pages unasked, for an array that usually holds far fewer rows than
    its capacity (a huge page would make its first write cost 2 MB)."""
    size = n * np.dtype(dtype).itemsize
    if size < 1 << 20:
        return np.empty(n, dtype=dtype)
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    memory.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype=dtype)


def _fit(column: np.ndarray, n: int) -> np.ndarray:
    """``column[:n]``, and the pages of an :func:`_alloc` mapping past those rows given back
    to the system: the huge page holding a column's last row is otherwise resident whole,
    2 MB whatever the rows (measured: a 0.98 M-packet capture's 17 read_pcap columns took
    100 MB for 55 MB of rows, a 0.13 M-packet one 35 MB for 7 MB). The kernel splits that
    huge page; later writes past n fault in zeroed pages."""
    _give_back(column, n, len(column))
    return column[:n]


def _give_back(column: np.ndarray, lo: int, hi: int) -> None:
    """The pages of an :func:`_alloc` mapping that hold only rows lo to hi of ``column`` (the
    mapping's array, or a contiguous view of it) given back to the system (the kernel gives
    zeroed pages if they are written again): whole pages, and the last one too where hi is
    the mapping's end; nothing for an array of another kind."""
    root = column
    while isinstance(root.base, np.ndarray):
        root = root.base
    memory = root.base.obj if isinstance(root.base, memoryview) else None
    if not isinstance(memory, mmap.mmap) or column.strides != (column.itemsize,):
        return
    offset = column.ctypes.data - np.frombuffer(memory, np.uint8).ctypes.data  # into the mapping
    start = -(-(offset + lo * column.itemsize) // mmap.PAGESIZE) * mmap.PAGESIZE
    end = offset + hi * column.itemsize
    stop = len(memory) if end >= len(memory) else end // mmap.PAGESIZE * mmap.PAGESIZE
    if stop > start:
        memory.madvise(mmap.MADV_DONTNEED, start, stop - start)


def scan(
    path: str,
    columns: list[str] | tuple[str, ...],
    dtypes: dict[str, str],
    *,
    little: bool,
    frac_ns: int,
    ip_offset: int,
    ethertype_offset: int | None,
    vlan: bool,
    block_bytes: int = BLOCK_BYTES,
) -> tuple[dict[str, np.ndarray], int, int, int, int]:
    """The ``columns`` (names and dtypes as in ``dtypes``; any of ``_ORDER``) of every IPv4
    packet of the classic pcap file ``path`` (global header already checked), in file order.

    Returns (columns, stop, code, caplen, size): ``stop`` is the file offset where reading
    ended; code 0: the file ended on a record boundary; 1: the record at ``stop`` is
    incomplete; 2: its caplen (``caplen``) is above libpcap's maximum; ``size``: the file's
    size when reading began (the bytes read).
    """
    size = os.path.getsize(path)
    cap = max((size - _GLOBAL_HDR) // _REC_HDR, 0) + 1  # at most one packet per 16 bytes
    out = {c: _alloc(cap if c in columns else 0, dtypes[c]) for c in _ORDER}
    args = (little, frac_ns, ip_offset, -1 if ethertype_offset is None else ethertype_offset, vlan)
    cols = tuple(out[c] for c in _ORDER)
    buf = np.empty(block_bytes + _MAX_CAPLEN + _REC_HDR, dtype=np.uint8)
    view = memoryview(buf)
    n, carry, base = 0, 0, _GLOBAL_HDR  # base: file offset of buf[0]
    left = size - _GLOBAL_HDR  # a capture still being written: only the bytes cap counted
    with open(path, "rb") as f:
        f.seek(_GLOBAL_HDR)
        while True:
            got = f.readinto(view[carry : carry + min(block_bytes, max(left, 0))])
            left -= got
            end = carry + got
            pos, n, code = _scan(buf, 0, end, end, *args, n, *cols)
            if code == 2 or not got:
                break
            carry = end - pos
            buf[:carry] = buf[pos:end]
            base += pos
    caplen = int.from_bytes(buf[pos + 8 : pos + 12].tobytes(), "little" if little else "big")
    return {c: _fit(out[c], n) for c in columns}, base + pos, code, caplen, size
