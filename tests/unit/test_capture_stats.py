"""The runner's reading of tcpdump's closing counters: a capture that lost packets (a full disk,
or stopped before it had read what its filter passed) fails the trial, naming the point."""

from __future__ import annotations

from pathlib import Path

from trials.network import CaptureSite, ResolvedNetwork
from trials.record import capture_stats, truncated_captures

POINT = CaptureSite(name="bottleneck_in", node="R", host="R", iface="left", clock="R")
NET = ResolvedNetwork(source="test", nodes={"R": "R"}, hosts={}, routers={"R"}, captures=[POINT])


def closing_lines(captured: int, received: int, dropped: int) -> str:
    """tcpdump's last three lines on stderr, as it prints them when it ends."""
    return (
        f"tcpdump: listening on left, link-type EN10MB (Ethernet), snapshot length 128 bytes\n"
        f"{captured} packets captured\n{received} packets received by filter\n"
        f"{dropped} packets dropped by kernel\n"
    )


def stats(tmp_path: Path, captured: int, received: int, dropped: int) -> dict:
    (tmp_path / "R").mkdir(exist_ok=True)
    log = tmp_path / "R" / "bottleneck_in.tcpdump.log"
    log.write_text(closing_lines(captured, received, dropped))
    return capture_stats(tmp_path, NET)


def test_counters_are_read_from_the_log(tmp_path):
    got = stats(tmp_path, 2030, 2031, 1)
    assert got == {
        "bottleneck_in": {"captured": 2030, "received_by_filter": 2031, "dropped_by_kernel": 1}
    }  # no pcap file here: a missing file counts as holding nothing
    got["bottleneck_in"]["in_file"] = 2030
    assert truncated_captures(got, NET) == []


def test_packets_left_in_the_ring_at_the_stop_fail_the_trial(tmp_path):
    got = stats(tmp_path, 0, 5, 0)
    got["bottleneck_in"]["in_file"] = 0
    problems = truncated_captures(got, NET)
    assert problems == [
        "capture bottleneck_in on R: tcpdump captured 0 of the 5 packets its filter passed "
        "and the kernel kept (stopped before it had read them all)"
    ]


def test_a_file_shorter_than_the_count_fails_the_trial(tmp_path):
    got = stats(tmp_path, 3, 3, 0)
    got["bottleneck_in"]["in_file"] = 1
    assert truncated_captures(got, NET) == [
        "capture bottleneck_in on R: its file holds 1 of the 3 packets tcpdump captured "
        "(was its disk full?)"
    ]
