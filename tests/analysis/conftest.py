"""Fixtures of the analysis tests: generated capture pairs, and two-halves reading counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from .tcpgen import generate


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Captures before and after a router (tests/analysis/tcpgen.py): 3 flows, a queue each."""
    d = tmp_path_factory.mktemp("pair")
    generate(d / "b.pcap", d / "a.pcap", packets=40_000, flows=3, duration_ns=5 * 10**9)
    return d / "b.pcap", d / "a.pcap"


@pytest.fixture(scope="module")
def fifo_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """As ``pair``, but the flows share one FIFO queue, as at a real bottleneck."""
    d = tmp_path_factory.mktemp("fifo")
    generate(
        d / "b.pcap", d / "a.pcap", packets=40_000, flows=3, duration_ns=5 * 10**9,
        loss=0.005, shared_queue=True,
    )  # fmt: skip
    return d / "b.pcap", d / "a.pcap"


@pytest.fixture
def joins(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Captures of any size read as two halves at once where a scan may use two threads
    (_SPLIT_MIN 0), and a list that grows by one each time a scan joins two halves."""
    from analysis import halves, scan

    monkeypatch.setattr(scan, "_SPLIT_MIN", 0)
    joins: list[int] = []
    join = halves._join

    def counted(whole, second, *args):
        joins.append(second.row0)
        return join(whole, second, *args)

    monkeypatch.setattr(halves, "_join", counted)
    return joins
