"""The SIFTR reader on logs written by hand from siftr(4)'s "Log Format" section: FreeBSD 14's
manual (siftrver 1.3.0: 27 CSV fields, srtt and rto in microseconds, no packet hash) and
FreeBSD 8-13's (siftrver 1.2.x: 25 fields, a packet hash second, srtt in units of
1 / (tcp_rtt_scale * hz) seconds). No FreeBSD host has run here: these samples follow the
documented field order, not a recorded log."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.siftr import FREEBSD_UNSET_SSTHRESH, SiftrError, read_siftr
from analysis.tcp_probe import COLUMNS, INFINITE_SSTHRESH, congestion_events, for_flows

MSS = 1448
FLOW = "198.18.1.11,40001,198.18.3.13,5201"
UNSET = FREEBSD_UNSET_SSTHRESH  # 1073725440 bytes


def enable_13(secs: int = 1795400000) -> str:
    return "\t".join(
        [f"enable_time_secs={secs}", "enable_time_usecs=120000", "siftrver=1.3.0",
         "sysname=FreeBSD", "sysver=1400097", "ipmode=4"]
    )  # fmt: skip


def data_13(direction: str, time: str, ssthresh: int, cwnd: int, srtt_us: int) -> str:
    # dir, time, local ip/port, foreign ip/port, ssthresh, cwnd, t_flags2, snd_wnd, rcv_wnd,
    # snd_scale, rcv_scale, state (4 = ESTABLISHED), mss, srtt, sack, flags, rto, snd_buf
    # size/used, rcv_buf size/used, in flight, reassembly queue, flowid, flowtype
    return (
        f"{direction},{time},{FLOW},{ssthresh},{cwnd},0,65536,65700,7,7,4,{MSS},{srtt_us},1,"
        f"0,230000,32768,4096,65536,0,{cwnd},0,0,0"
    )


DISABLE = "\t".join(
    ["disable_time_secs=1795400003", "disable_time_usecs=5", "num_inbound_tcp_pkts=4",
     "num_outbound_tcp_pkts=1", "total_tcp_pkts=5", "total_skipped_tcp_pkts=0",
     f"flow_list={FLOW.replace(',', ';', 1).replace(',', '-', 1).replace(',', ';', 1)},"]
)  # fmt: skip


@pytest.fixture
def log_13(tmp_path):
    path = tmp_path / "siftr.log"
    lines = [
        enable_13(),
        data_13("o", "1795400000.000100", UNSET, 10 * MSS, 0),
        data_13("i", "1795400000.050250", UNSET, 10 * MSS, 50250),
        data_13("i", "1795400000.100500", UNSET, 20 * MSS, 50100),
        # a loss: ssthresh and cwnd to 15 segments (NewReno halves 30 after a flight of 30)
        data_13("i", "1795400001.000007", 15 * MSS, 15 * MSS, 61000),
        DISABLE,
        "i,1795400001.3,198.18.1.11,40001,198.18",  # a line cut short: skipped
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_version_13_into_the_tcp_probe_table(log_13):
    events = read_siftr(log_13)
    assert list(events.columns) == list(COLUMNS)
    for column, dtype in COLUMNS.items():
        if dtype == "object":  # addresses: strings (pandas 3 stores them as its str dtype)
            assert pd.api.types.is_string_dtype(events[column]), column
        else:
            assert str(events[column].dtype) == dtype, column
    # inbound only (tcp_probe's events are the sender's state as a segment arrives)
    assert events.ts_ns.tolist() == [
        1795400000_050250000, 1795400000_100500000, 1795400001_000007000
    ]  # fmt: skip
    assert events.snd_cwnd.tolist() == [10, 20, 15]  # bytes // mss
    assert events.ssthresh.tolist() == [INFINITE_SSTHRESH, INFINITE_SSTHRESH, 15]
    assert events.srtt_us.tolist() == [50250, 50100, 61000]
    assert (events.src == "198.18.1.11").all() and (events.dport == 5201).all()
    assert (events[["data_len", "snd_nxt", "snd_una", "sock_cookie"]] == 0).all().all()
    both = read_siftr(log_13, directions="io")
    assert len(both) == 4 and both.ts_ns.is_monotonic_increasing


def test_the_congestion_epochs_are_found_as_on_linux(log_13):
    flows = pd.DataFrame({"src": ["198.18.1.11"], "dst": ["198.18.3.13"], "dport": [5201]})
    epochs = congestion_events(for_flows(read_siftr(log_13), flows))
    assert len(epochs) == 1
    assert epochs.iloc[0][["cwnd_before", "snd_cwnd", "ssthresh"]].tolist() == [20, 15, 15]


def test_version_12_with_the_hash_and_srtt_in_ticks(tmp_path):
    enable = "\t".join(
        ["enable_time_secs=1300000000", "enable_time_usecs=5", "siftrver=1.2.3", "hz=1000",
         "tcp_rtt_scale=32", "sysname=FreeBSD", "sysver=1300139", "ipmode=4"]
    )  # fmt: skip
    # dir, hash, time, local ip/port, foreign ip/port, ssthresh, cwnd, bandwidth-controlled
    # window, snd_wnd, rcv_wnd, snd_scale, rcv_scale, state, mss, srtt (1600 = 50 ms at
    # 32 * 1000 per second), sack, flags, rto (ticks), snd_buf size/used, rcv_buf size/used,
    # in flight
    line = (
        f"i,0x8a3f01c2,1300000000.250000,{FLOW},{UNSET},{4 * MSS},1073725440,65536,65700,7,7,"
        f"4,{MSS},1600,1,996,230,32768,0,65536,0,{4 * MSS}"
    )
    path = tmp_path / "siftr.log"
    path.write_text(f"{enable}\n{line}\n")
    (row,) = read_siftr(path).itertuples()
    assert (row.ts_ns, row.snd_cwnd, row.ssthresh, row.srtt_us) == (
        1300000000_250000000, 4, INFINITE_SSTHRESH, 50000
    )  # fmt: skip


def test_several_enable_cycles_and_an_empty_one(tmp_path):
    path = tmp_path / "siftr.log"
    first = [enable_13(), data_13("i", "1795400000.000001", UNSET, 2 * MSS, 900), DISABLE]
    second = [enable_13(1795400100), DISABLE]  # enabled, no packet of a TCP flow
    third = [enable_13(1795400200), data_13("i", "1795400200.5", UNSET, 3 * MSS, 800)]
    path.write_text("\n".join(first + second + third) + "\n")
    events = read_siftr(path)
    assert events.snd_cwnd.tolist() == [2, 3]
    assert events.ts_ns.tolist() == [1795400000_000001000, 1795400200_500000000]
    assert read_siftr(tmp_path / "siftr.log", directions="o").empty


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (enable_13().replace("1.3.0", "2.0.1") + "\n" + data_13("i", "1.0", 1, 1, 1),
         r"siftr\.log: SIFTR version 2\.0\.1: known are 1\.2\.x, 1\.3\.x"),
        (data_13("i", "1.0", 1, 1, 1) + "\n" + enable_13(),
         r"siftr\.log:1: a data line before SIFTR's enable line"),
    ],
)  # fmt: skip
def test_what_it_cannot_read_is_refused_naming_the_file(tmp_path, text, message):
    path = tmp_path / "siftr.log"
    path.write_text(text + "\n")
    with pytest.raises(SiftrError, match=message):
        read_siftr(path)


def test_an_unset_ssthresh_is_freebsds_largest_window():
    # TCP_MAXWIN (65535) shifted by TCP_MAX_WINSHIFT (14), tcp.h / tcp_var.h
    assert FREEBSD_UNSET_SSTHRESH == 1073725440 == np.int64(65535) << 14


def test_a_freebsd_senders_log_gives_the_bulk_tcp_cwnd_table(log_13):
    """analysis.traffic.bulk_tcp reads a sender's siftr.log where a Linux sender's
    tcp_probe.txt would be: the same cwnd table and congestion epochs."""
    from analysis.pcap import ip_to_int
    from analysis.traffic.bulk_tcp import SIFTR_LOG, sender_state

    assert log_13.name == SIFTR_LOG
    flows = pd.DataFrame(
        {"src": [ip_to_int("198.18.1.11")], "sport": [40001],
         "dst": [ip_to_int("198.18.3.13")], "dport": [5201]}
    )  # fmt: skip
    cwnd, epochs = sender_state(log_13, flows, {"src": "198.18.1.11"})
    assert cwnd.snd_cwnd.tolist() == [10, 20, 15]
    assert len(epochs) == 1
