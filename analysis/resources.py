"""What the compiled passes may use: memory in arrays of their own mappings (resident only as
rows are written, handed back to the system page by page as a pass goes), and how many threads
a pass may run (the CPUs this process shares with the other analysis workers)."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from contextlib import suppress

import numpy as np

__all__ = ["alloc", "cpus", "fit", "give_back", "give_memory_back", "share_cpus"]


def alloc(n: int, dtype: str, huge: bool = True) -> np.ndarray:
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


def fit(column: np.ndarray, n: int) -> np.ndarray:
    """``column[:n]``, and the pages of an :func:`alloc` mapping past those rows given back
    to the system: the huge page holding a column's last row is otherwise resident whole,
    2 MB whatever the rows (measured: a 0.98 M-packet capture's 17 read_pcap columns took
    100 MB for 55 MB of rows, a 0.13 M-packet one 35 MB for 7 MB). The kernel splits that
    huge page; later writes past n fault in zeroed pages."""
    give_back(column, n, len(column))
    return column[:n]


def give_back(column: np.ndarray, lo: int, hi: int) -> None:
    """The pages of an :func:`alloc` mapping that hold only rows lo to hi of ``column`` (the
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


_sharing = 1  # processes analysing side by side on this process's CPUs (see share_cpus)


def share_cpus(processes: int) -> None:
    """This process is one of ``processes`` that analyse side by side on the same CPUs
    (analysis.workers' worker processes): its compiled passes take their share of the CPUs
    by default, not two threads each in every process."""
    global _sharing
    _sharing = max(int(processes), 1)


def cpus() -> int:
    """Threads a compiled pass may use by default: 2 where the process's share of the CPUs
    it may run on (all of them, unless share_cpus said otherwise) is two or more."""
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(min(2, (mine or 1) // _sharing), 1)


def give_memory_back() -> None:
    """Hand back to the system what an analysis freed but the allocators keep for later:
    pyarrow's pool (parquet writing) and the C library's heap (pandas' small arrays and
    strings). Without it a process that analyses trials itself (TRIALBED_ANALYSIS_JOBS=1, a
    notebook, a worker between trials) stays at its largest trial's high-water mark: 407 MB
    after a 60-s high-rate trial (startup_hswan, 8 pairs), 248 MB with it (2026-11-27)."""
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    with suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)
