"""The fields of one pcap record, in compiled helpers (numba, inlined into the record pass of
analysis/recordpass.py): the record header, the link layer up to IPv4 (VLAN tags included),
IPv4 and the TCP/UDP header, the payload's first bytes and the packet's matching key
(analysis.match.key_hash)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "GLOBAL_HDR",
    "MAX_CAPLEN",
    "REC_HDR",
    "byte_at",
    "headers",
    "ipv4_at",
    "key_hash",
    "mix",
    "payload_head",
    "plain_tcp",
    "record_at",
    "tcp_headers",
    "u32",
]

REC_HDR = 16
GLOBAL_HDR = 24
MAX_CAPLEN = 262144  # libpcap rejects records larger than this: a corrupt header, not a packet
_U = np.uint64


@njit(cache=True, nogil=True, inline="always")
def mix(x):
    x = (x ^ (x >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U(27))) * _U(0x94D049BB133111EB)
    return x ^ (x >> _U(31))


@njit(cache=True, nogil=True, inline="always")
def key_hash(addrs, proto, sport, dport, ip_id, seq, head):
    """analysis.match.key_hash of one packet: splitmix64 rounds over four words (``addrs``:
    src << 32 | dst; protocol, ports and IP ID; sequence number; payload head)."""
    h = mix(_U(0x9E3779B97F4A7C15) ^ addrs)
    h = mix(
        h ^ (_U(proto) << _U(56) | _U(sport) << _U(40) | _U(dport) << _U(24) | _U(ip_id) << _U(8))
    )
    h = mix(h ^ _U(seq))
    return mix(h ^ _U(head))


@njit(cache=True, nogil=True, inline="always")
def u32(b, i, little):
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
def byte_at(b, i, left):
    """Byte i if it was captured (i < left), else 0."""
    return np.int64(b[i]) if i < left else np.int64(0)


@njit(cache=True, nogil=True, inline="always")
def record_at(b, pos, size, little):
    """The record at ``pos`` of b[:size]: (code, caplen), code 0 when it is whole, 1 when it
    is incomplete (the file ends in it), 2 when its caplen is above libpcap's maximum (a
    corrupt header)."""
    if size - pos < REC_HDR:
        return 1, np.int64(0)
    caplen = u32(b, pos + 8, little)
    if caplen > MAX_CAPLEN:
        return 2, caplen
    if pos + REC_HDR + caplen > size:
        return 1, caplen
    return 0, caplen


@njit(cache=True, nogil=True, inline="always")
def ipv4_at(b, frame, left, l3_base, et_off, vlan):
    """Where the IPv4 header of the frame b[frame:left] starts, or -1 when the frame is not
    IPv4 or too short to hold a 20-byte header."""
    l3 = l3_base
    if et_off >= 0:
        e = frame + et_off
        et = byte_at(b, e, left) << 8 | byte_at(b, e + 1, left)
        if vlan:  # up to two 802.1Q / 802.1ad tags shift IP by 4 bytes each
            for tag in (16, 20):
                if et != 0x8100 and et != 0x88A8:
                    break
                et = byte_at(b, frame + tag, left) << 8 | byte_at(b, frame + tag + 1, left)
                l3 += 4
        if et != 0x0800:
            return -1
    ip = frame + l3
    if left - frame < l3 + 20 or b[ip] >> 4 != 4:
        return -1
    return ip


@njit(cache=True, nogil=True, inline="always")
def headers(b, ip, left):
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
            seq = u32(b, l4 + 4, False)
            ack = u32(b, l4 + 8, False)
            flags = np.int64(b[l4 + 13])
            l4_hl = (np.int64(b[l4 + 12]) >> 4) * 4
    elif is_tcp or is_udp:  # snapped inside the header
        sport = byte_at(b, l4, left) << 8 | byte_at(b, l4 + 1, left)
        dport = byte_at(b, l4 + 2, left) << 8 | byte_at(b, l4 + 3, left)
        l4_hl = np.int64(8)
        if is_tcp:
            seq = byte_at(b, l4 + 4, left) << 24 | byte_at(b, l4 + 5, left) << 16
            seq |= byte_at(b, l4 + 6, left) << 8 | byte_at(b, l4 + 7, left)
            ack = byte_at(b, l4 + 8, left) << 24 | byte_at(b, l4 + 9, left) << 16
            ack |= byte_at(b, l4 + 10, left) << 8 | byte_at(b, l4 + 11, left)
            flags = byte_at(b, l4 + 13, left)
            l4_hl = (byte_at(b, l4 + 12, left) >> 4) * 4
    return ip_hl, ip_len, proto, sport, dport, seq, ack, flags, l4_hl


@njit(cache=True, nogil=True, inline="always")
def plain_tcp(b, ip, left):
    """Whether the IPv4 packet at ``ip`` is TCP, a first fragment, with an IP header of at
    least 20 bytes and its TCP header's first 20 bytes captured: nearly every packet of a
    trial, which tcp_headers reads unchecked."""
    ip_hl = (np.int64(b[ip]) & 0x0F) * 4
    first_frag = (np.int64(b[ip + 6]) & 0x1F | np.int64(b[ip + 7])) == 0
    return b[ip + 9] == 6 and first_frag and ip_hl >= 20 and ip + ip_hl + 20 <= left


@njit(cache=True, nogil=True, inline="always")
def tcp_headers(b, ip):
    """headers of a packet for which plain_tcp holds (the same values, no check).

    The record pass branches between this and headers in their own loop: numba compiles a helper
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
        u32(b, l4 + 4, False),
        u32(b, l4 + 8, False),
        np.int64(b[l4 + 13]),
        (np.int64(b[l4 + 12]) >> 4) * 4,
    )


@njit(cache=True, nogil=True, inline="always")
def payload_head(b, at, left, plen):
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
