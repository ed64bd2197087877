"""The array fast path (read_columns, match_times, queue_levels, tcp_flow_counters) gives
the numbers of the DataFrame API exactly, on a capture pair with real TCP dynamics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.match import key_hash, match_packets
from analysis.metrics import (
    match_times,
    queue_levels,
    tcp_flow_counters,
    tcp_goodput,
    tcp_retransmissions,
)
from analysis.pcap import COLUMNS, read_columns, read_pcap
from analysis.queue import EVENTS, queue_occupancy

from .tcpgen import generate

DELAY = 2 * 10**9


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("fast")
    generate(d / "b.pcap", d / "a.pcap", packets=40_000, flows=3, duration_ns=5 * 10**9)
    return d / "b.pcap", d / "a.pcap"


def test_read_columns_is_read_pcap(pair: tuple[Path, Path]) -> None:
    frame = read_pcap(pair[0])
    cols = read_columns(pair[0], [*COLUMNS, "key_hash"])
    for c in COLUMNS:
        assert cols[c].dtype == frame[c].dtype and np.array_equal(cols[c], frame[c].to_numpy())
    assert np.array_equal(cols["key_hash"], key_hash(frame))
    assert list(read_columns(pair[0], ["seq"])) == ["seq"]


@pytest.mark.parametrize("shuffle", [False, True], ids=["time-order", "shuffled"])
def test_match_times_is_match_packets(pair: tuple[Path, Path], shuffle: bool) -> None:
    b, a = read_pcap(pair[0]), read_pcap(pair[1])
    if shuffle:  # out of time order: the matching must still follow time
        b, a = b.sample(frac=0.5, random_state=1), a.sample(frac=0.7, random_state=2)
    for delay in (DELAY, 30_000_000):
        ref = match_packets(b, a, max_delay_ns=delay)["ts_out_ns"].to_numpy()
        got = match_times(
            key_hash(b), b.ts_ns.to_numpy(), key_hash(a), a.ts_ns.to_numpy(), max_delay_ns=delay
        )
        assert np.array_equal(got, ref)
        assert (ref >= 0).sum() > (len(b) // 3 if delay == DELAY else 100)


@pytest.mark.parametrize("shuffle", [False, True], ids=["merge", "sort"])
def test_queue_levels_is_queue_occupancy(pair: tuple[Path, Path], shuffle: bool) -> None:
    b, a = read_pcap(pair[0]), read_pcap(pair[1])
    matched = match_packets(b, a, max_delay_ns=DELAY)
    if shuffle:  # not in time order: the sorting path
        matched = matched.sample(frac=1, random_state=3)
    ref = queue_occupancy(matched, delay_ns=1000, max_delay_ns=DELAY)
    got = queue_levels(
        matched.ts_ns.to_numpy(),
        matched.ts_out_ns.to_numpy(),
        matched.ip_len.to_numpy().astype(np.int64) + 14,
        delay_ns=1000,
        max_delay_ns=DELAY,
    )
    for c in ("ts_ns", "frame_bytes", "packets", "bytes"):
        assert np.array_equal(got[c], ref[c].to_numpy()), c
    assert np.array_equal(got["event"], ref.event.cat.codes.to_numpy())
    assert list(EVENTS.categories) == ["departure", "arrival", "drop"]
    assert (got["event"] == 2).sum() > 10  # drops happened


def test_flow_counters_are_the_frame_metrics(pair: tuple[Path, Path]) -> None:
    frame = read_pcap(pair[0])
    c = pd.DataFrame(tcp_flow_counters(read_columns(pair[0], COLUMNS)))
    retx = tcp_retransmissions(frame)
    good = tcp_goodput(frame)
    pd.testing.assert_frame_equal(c[retx.columns], retx)
    assert c.bytes.tolist() == good.bytes.tolist()
    assert (c.span_ns / 1e9).tolist() == good.seconds.tolist()


def test_a_growing_capture_is_read_up_to_its_size_at_the_start(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """tcpdump may still be writing: bytes appended while reading are not read (the columns
    were sized for the file as it was)."""
    from analysis import pcapscan

    data = pair[0].read_bytes()
    path = pair[0].parent / "growing.pcap"
    path.write_bytes(data[: len(data) // 2])
    real = pcapscan.os.path.getsize

    grown = []

    def size_then_grow(p):  # the file is completed right after its size was taken
        size = real(p)
        if not grown:
            with open(p, "ab") as f:
                f.write(data[len(data) // 2 :])
            grown.append(size)
        return size

    monkeypatch.setattr(pcapscan.os.path, "getsize", size_then_grow)
    with pytest.warns(UserWarning, match="truncated"):
        half = read_columns(path, ["ts_ns"])["ts_ns"]
    monkeypatch.undo()
    whole = read_columns(path, ["ts_ns"])["ts_ns"]
    assert 0 < len(half) < len(whole) and np.array_equal(half, whole[: len(half)])
