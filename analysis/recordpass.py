"""The compiled pass over a block of pcap records (numba): each IPv4 packet's direction (its
row in a table of directions the pass builds, analysis/directions.py) and its columns, in three
groups (the names and types below):

- PACKET, for every packet: what the flow, DSCP and transaction metrics read;
- MATCHED, for the packets of the matched directions (those of given (src, dst) pairs: the
  traffic crossing a bottleneck, a UDP stream whose one-way delay is measured): what pairs a
  packet with itself in another capture (analysis.match) and what the queue counts;
- DETAILED, for the packets of the detailed directions (given pairs, or all of them): the rest
  of read_pcap's columns.

Per direction it keeps its first row, its first TCP row with payload, its latest time and
whether it is matched and detailed. analysis/halves.py runs it over a file's blocks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from analysis.directions import find
from analysis.records import (
    REC_HDR,
    headers,
    ipv4_at,
    key_hash,
    payload_head,
    plain_tcp,
    record_at,
    tcp_headers,
    u32,
)

__all__ = ["DETAILED", "FULL", "MATCHED", "PACKET", "ROWS", "WIDE", "record_pass"]

# Column groups: name -> dtype (the direction columns' type is the narrowest that numbers the
# directions: see analysis/halves.py).
PACKET = {
    "direction": np.uint8,
    "ts_ns": np.int64,
    "payload_len": np.uint16,  # 0 where the IP length is below the headers (read_pcap: < 0)
    "tcp_flags": np.uint8,
    "tos": np.uint8,
    "seq": np.uint32,
    "ack": np.uint32,
}
MATCHED = {"direction": np.uint8, "key_hash": np.uint64, "ip_len": np.uint16}
DETAILED = {
    "caplen": np.uint32,
    "wirelen": np.uint32,
    "ip_len": np.uint16,
    "ip_id": np.uint16,
    "ip_hl": np.uint8,
    "payload_len": np.int32,
    "payload_head": np.uint64,
}
FULL = 3  # the pass stopped before a packet of a new direction: the table must grow first
ROWS = 4  # it stopped before an IPv4 packet: its row would be the second half's first
WIDE = 5  # it stopped before a new direction whose id the direction column cannot hold

_U = np.uint64


@njit(cache=True, nogil=True, inline="always")
def _among(sorted_keys, key):
    """Whether ``key`` is in the sorted array (a handful of pairs: a binary search)."""
    i = np.searchsorted(sorted_keys, key)
    return i < len(sorted_keys) and sorted_keys[i] == key


@njit(cache=True, nogil=True, boundscheck=False)
def record_pass(
    b, limit, size, little, frac_ns, l3_base, et_off, vlan, detail_all, match_pairs, detail_pairs,
    n, k, j, m, last_ts, in_order, rows, ids,
    table, keys1, keys2, first, first_data, last_ns, matched, detailed,
    o_dir, o_ts, o_plen, o_flags, o_tos, o_seq, o_ack,
    c_dir, c_hash, c_len,
    d_caplen, d_wirelen, d_len, d_id, d_hl, d_plen, d_head,
):  # fmt: skip
    """Parse the records of b[:size] from 0 while pos < limit into the PACKET columns o_* from
    row n, the MATCHED columns c_* from row k (packets of directions whose src << 32 | dst is
    in the sorted ``match_pairs``) and the DETAILED columns d_* from row j (directions in
    ``detail_pairs``, or every one with ``detail_all``); a group whose columns are empty is
    not written. Returns (pos, n, k, j, m, last_ts, in_order, code): code 0 when ``limit`` was
    reached, 1 when the record at pos is incomplete, 2 when its caplen is above libpcap's
    maximum, FULL when its direction is new and the table is half full, WIDE when it is new
    and ``ids`` directions are numbered already, ROWS when row n would be ``rows``."""
    pos = 0
    cap = len(keys1)
    w_match, w_detail = len(c_hash) > 0, len(d_caplen) > 0
    last_k1, last_k2, last_d = _U(0), _U(1) << _U(63), np.int64(0)  # no packet's k2
    while pos < limit:
        code, caplen = record_at(b, pos, size, little)
        if code:
            return pos, n, k, j, m, last_ts, in_order, code
        rec = pos
        frame = pos + REC_HDR
        left = frame + caplen
        ip = ipv4_at(b, frame, left, l3_base, et_off, vlan)
        if ip < 0:
            pos = left
            continue
        if n >= rows:
            return rec, n, k, j, m, last_ts, in_order, ROWS
        if plain_tcp(b, ip, left):  # branched here, not in a helper: see tcp_headers
            ip_hl, ip_len, proto, sport, dport, seq, ack, flags, l4_hl = tcp_headers(b, ip)
        else:
            ip_hl, ip_len, proto, sport, dport, seq, ack, flags, l4_hl = headers(b, ip, left)
        k1 = _U(u32(b, ip + 12, False)) << _U(32) | _U(u32(b, ip + 16, False))
        k2 = _U(proto) << _U(32) | _U(sport) << _U(16) | _U(dport)
        if k1 == last_k1 and k2 == last_k2:  # a burst of one direction: no lookup
            d = last_d
        else:
            s = find(table, keys1, keys2, k1, k2)
            d = table[s]
        if d < 0:
            if m >= ids:
                return rec, n, k, j, m, last_ts, in_order, WIDE
            if 2 * (m + 1) > len(table) or m >= cap:
                return rec, n, k, j, m, last_ts, in_order, FULL
            table[s] = m
            keys1[m], keys2[m], first[m], first_data[m], last_ns[m] = k1, k2, n, -1, -(2**63)
            matched[m] = w_match and _among(match_pairs, k1)
            detailed[m] = w_detail and (detail_all or _among(detail_pairs, k1))
            d = m
            m += 1
        last_k1, last_k2, last_d = k1, k2, d
        pos = left
        plen = ip_len - ip_hl - l4_hl
        ts = u32(b, rec, little) * 1_000_000_000 + u32(b, rec + 4, little) * frac_ns
        if ts < last_ts:
            in_order = False
        last_ts = ts
        if ts > last_ns[d]:
            last_ns[d] = ts
        o_dir[n], o_ts[n], o_plen[n], o_tos[n] = d, ts, max(plen, 0), b[ip + 1]
        o_flags[n], o_seq[n], o_ack[n] = flags, seq, ack  # 0 where not TCP (as read_pcap)
        if proto == 6 and plen > 0 and first_data[d] < 0:
            first_data[d] = n
        if matched[d] or detailed[d]:
            head = payload_head(b, ip + ip_hl + l4_hl, left, plen)
            if matched[d]:
                ip_id = np.int64(b[ip + 4]) << 8 | np.int64(b[ip + 5])
                c_dir[k] = d
                c_hash[k] = key_hash(k1, proto, sport, dport, ip_id, seq, head)
                c_len[k] = ip_len
                k += 1
            if detailed[d]:
                d_caplen[j], d_wirelen[j], d_len[j] = caplen, u32(b, rec + 12, little), ip_len
                d_id[j] = np.int64(b[ip + 4]) << 8 | np.int64(b[ip + 5])
                d_hl[j], d_plen[j], d_head[j] = ip_hl, plen, head
                j += 1
        n += 1
    return pos, n, k, j, m, last_ts, in_order, 0
