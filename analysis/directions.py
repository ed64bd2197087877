"""Directions of packets: (src, dst, proto, sport, dport), numbered in order of first
appearance in an open-addressing table (compiled, numba), and each one's reverse. A capture's
record pass (analysis/recordpass.py) numbers them while it reads; ``directions_of`` numbers the
TCP packets of columns given as arrays (a read_pcap frame's), for the same flow kernels
(analysis/tcpflows.py).

A direction's keys: k1 = src << 32 | dst, k2 = proto << 32 | sport << 16 | dport.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["directions_of", "find", "keys_of", "rehash", "reverse_of"]

_U = np.uint64


@njit(cache=True, nogil=True, inline="always")
def _slot(k1, k2, mask):
    h = (k1 * np.uint64(0x9E3779B97F4A7C15)) ^ (k2 * np.uint64(0xBF58476D1CE4E5B9))
    return np.int64((h ^ (h >> np.uint64(29))) & np.uint64(mask))


@njit(cache=True, nogil=True)
def find(table, keys1, keys2, k1, k2):
    """Slot of (k1, k2) in the open-addressing table, or of the empty slot it would take."""
    mask = len(table) - 1
    s = _slot(k1, k2, mask)
    while table[s] >= 0 and not (keys1[table[s]] == k1 and keys2[table[s]] == k2):
        s = (s + 1) & mask
    return s


@njit(cache=True, nogil=True)
def rehash(table, keys1, keys2, m):
    """The ``m`` directions of keys1/keys2 placed in an empty (larger) table."""
    for d in range(m):
        table[find(table, keys1, keys2, keys1[d], keys2[d])] = d


@njit(cache=True, nogil=True)
def reverse_of(table, keys1, keys2, m):
    """Each direction's reverse (ports and addresses swapped, same protocol), -1 if none."""
    rev = np.full(m, -1, np.int64)
    for d in range(m):
        k1 = keys1[d] << np.uint64(32) | keys1[d] >> np.uint64(32)
        p = keys2[d]
        k2 = (
            (p >> np.uint64(32)) << np.uint64(32)
            | (p & np.uint64(0xFFFF)) << np.uint64(16)
            | (p >> np.uint64(16)) & np.uint64(0xFFFF)
        )
        rev[d] = table[find(table, keys1, keys2, k1, k2)]
    return rev


@njit(cache=True, nogil=True)
def _ids_until_full(src, dst, sport, dport, proto, ids, start, table, keys1, keys2, m):
    """directions_of's ids of the TCP rows from ``start`` on, until a new direction would
    fill the table past half: (the row reached, directions so far). The table grows in
    directions_of, not here: numba compiles a loop that reassigns its arrays into much slower
    code (docs/analysis-performance.md)."""
    for i in range(start, len(src)):
        if proto[i] != 6:
            continue
        k1 = np.uint64(src[i]) << np.uint64(32) | np.uint64(dst[i])
        k2 = np.uint64(6) << np.uint64(32) | np.uint64(sport[i]) << np.uint64(16)
        k2 |= np.uint64(dport[i])
        s = find(table, keys1, keys2, k1, k2)
        if table[s] >= 0:
            ids[i] = table[s]
            continue
        if 2 * (m + 1) > len(table):
            return i, m
        table[s] = m
        keys1[m], keys2[m] = k1, k2
        ids[i] = m
        m += 1
    return len(src), m


def directions_of(src, dst, sport, dport, proto) -> tuple[np.ndarray, int, np.ndarray]:
    """Direction id of each TCP row (-1 for the others), ids in order of first appearance;
    the number of directions; the id of each direction's reverse (-1 if never seen)."""
    table = np.full(1024, -1, np.int64)  # grows at half full: sized by directions, not rows
    keys1, keys2 = np.empty(512, _U), np.empty(512, _U)
    ids = np.full(len(src), -1, np.int32)
    i, m = _ids_until_full(src, dst, sport, dport, proto, ids, 0, table, keys1, keys2, 0)
    while i < len(src):
        keys1 = np.concatenate((keys1, np.empty(len(keys1), _U)))
        keys2 = np.concatenate((keys2, np.empty(len(keys2), _U)))
        table = np.full(2 * len(table), -1, np.int64)
        rehash(table, keys1, keys2, m)
        i, m = _ids_until_full(src, dst, sport, dport, proto, ids, i, table, keys1, keys2, m)
    return ids, m, reverse_of(table, keys1, keys2, m)


def keys_of(keys1: np.ndarray, keys2: np.ndarray) -> dict[str, np.ndarray]:
    """src, dst, sport, dport and proto of directions from their keys."""
    return {
        "src": (keys1 >> _U(32)).astype(np.uint32),
        "dst": (keys1 & _U(0xFFFFFFFF)).astype(np.uint32),
        "sport": (keys2 >> _U(16) & _U(0xFFFF)).astype(np.uint16),
        "dport": (keys2 & _U(0xFFFF)).astype(np.uint16),
        "proto": (keys2 >> _U(32)).astype(np.uint8),
    }
