"""tcp_probe parsing on a real recording (tests/data/router_run: iperf3 reno through a shaped
router namespace on this machine, tcp:tcp_probe recorded by hostside/recorders/tcp_probe.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.pcap import ip_to_int, read_pcap
from analysis.startup import loss_events
from analysis.tcp_probe import (
    INFINITE_SSTHRESH,
    congestion_events,
    for_flows,
    read_tcp_probe,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "router_run"
SENDER, RECEIVER = "198.18.250.1", "198.18.251.2"
MS = 1_000_000


def lines() -> list[str]:
    with gzip.open(DATA / "tcp_probe.txt.gz", "rt") as f:
        return f.read().splitlines()


def data_port() -> int:
    report = json.loads((DATA / "iperf3_client.json").read_text())
    return report["start"]["connected"][0]["local_port"]


def test_every_event_parsed_with_its_fields() -> None:
    text = lines()
    events = read_tcp_probe(DATA / "tcp_probe.txt.gz")
    raw = [line for line in text if ": tcp_probe: " in line]
    assert len(events) == len(raw) > 100
    header = json.loads(text[0].removeprefix("# trialbed-tcp-probe "))
    # Each row against the key=value pairs of its own line, split here independently.
    for row, line in zip(events.itertuples(), raw, strict=True):
        head, body = line.split(": tcp_probe: ")
        kv = dict(item.split("=", 1) for item in body.split())
        sec, usec = head.split()[-1].split(".")
        assert row.ts_ns == int(sec) * 10**9 + int(usec) * 1000 + header["realtime_minus_clock_ns"]
        assert f"{row.src}:{row.sport}" == kv["src"] and f"{row.dst}:{row.dport}" == kv["dest"]
        assert row.snd_cwnd == int(kv["snd_cwnd"]) and row.ssthresh == int(kv["ssthresh"])
        assert row.srtt_us == int(kv["srtt"]) and row.snd_una == int(kv["snd_una"], 16)
        assert row.sock_cookie == int(kv["sock_cookie"], 16)
    assert events["src"].map(type).eq(str).all()


def test_events_on_the_captures_clock() -> None:
    """Converted to CLOCK_REALTIME, the sender's events fall inside the capture's span."""
    events = read_tcp_probe(DATA / "tcp_probe.txt.gz")
    cap = read_pcap(DATA / "router_in.pcap")
    mine = events[events.src == SENDER]
    assert cap.ts_ns.min() - 50 * MS <= mine.ts_ns.min()
    assert mine.ts_ns.max() <= cap.ts_ns.max() + 50 * MS


def test_cwnd_falls_at_each_loss() -> None:
    events = read_tcp_probe(DATA / "tcp_probe.txt.gz")
    port = data_port()
    flows = pd.DataFrame({"src": [SENDER], "dst": [RECEIVER], "sport": [port], "dport": [5201]})
    flow = for_flows(events, flows)
    assert len(flow) > 100 and (flow.src == SENDER).all() and (flow.sport == port).all()
    assert flow.ts_ns.is_monotonic_increasing
    assert flow.ssthresh.iloc[0] == INFINITE_SSTHRESH  # slow start until the first loss
    epochs = congestion_events(flow)
    # The capture before the router shows each loss episode: a burst of retransmissions.
    cap = read_pcap(DATA / "router_in.pcap")
    pk = cap[(cap.proto == 6) & ((cap.sport == port) | (cap.dport == port))]
    retx = loss_events(pk, rto_threshold_ns=200 * MS)
    retx = retx[retx.src == ip_to_int(SENDER)]
    assert len(epochs) >= 3 and len(retx) >= len(epochs)
    ends = np.r_[epochs.ts_ns.to_numpy()[1:], flow.ts_ns.max() + 1]
    for epoch, end in zip(epochs.itertuples(), ends, strict=True):
        # ssthresh is set below the window the loss hit, and cwnd comes down to it
        assert epoch.ssthresh < epoch.cwnd_before
        during = flow[(flow.ts_ns >= epoch.ts_ns) & (flow.ts_ns < end)]
        assert during.snd_cwnd.min() <= epoch.ssthresh + 1
        # a retransmission was sent shortly before the sender's state showed the reduction
        # (tcp_probe fires on the next ACK's arrival, before it is processed)
        gap = epoch.ts_ns - retx.ts_ns.to_numpy()
        assert ((gap >= 0) & (gap < 200 * MS)).any(), epoch


def test_only_the_flows_asked_for() -> None:
    events = read_tcp_probe(DATA / "tcp_probe.txt.gz")
    both_ways = for_flows(events, pd.DataFrame({"src": [SENDER], "dst": [RECEIVER]}))
    ports = set(both_ways.sport)  # iperf3's control and data connections
    assert data_port() in ports and len(ports) == 2
    assert for_flows(events, pd.DataFrame({"src": ["198.18.9.9"], "dst": [RECEIVER]})).empty


def test_the_compiled_pass_reads_what_the_regular_expression_reads(tmp_path: Path) -> None:
    """read_tcp_probe (a compiled pass over the bytes, the regular expression for the lines it
    does not take) gives exactly the regular expression's reading of every line, in file
    order: on the real recording with lines changed into forms the pass leaves over (IPv6,
    bracketed or zero-padded addresses, a tab before the time, seven digits of microseconds,
    uppercase hex, two markers, 0x on a field that takes none, a line cut short) and into
    forms it reads (hex without 0x)."""
    from analysis.tcp_probe import _regex_events

    text = lines()
    events = [i for i, line in enumerate(text) if ": tcp_probe: " in line]
    changes = [
        ("src=198.18.250.1:", "src=[2001:db8::1]:"),
        ("src=198.18.250.1:", "src=[198.18.250.1]:"),
        ("dest=198.18.251.2:", "dest=198.18.251.02:"),
        ("] ..s2. ", "] ..s2.\t"),
        (": tcp_probe:", "1: tcp_probe:"),
        ("snd_una=0x", "snd_una=0xAB"),
        ("sock_cookie=", "sock_cookie=0x"),
        ("snd_nxt=0x", "snd_nxt="),
        ("family=AF_INET", "family=AF_INET x: tcp_probe: family=AF_INET"),
    ]
    at = 5
    for old, new in changes:  # each on an event line of its own, in order through the file
        at = next(k for k in range(at + 7, len(events)) if old in text[events[k]])
        text[events[at]] = text[events[at]].replace(old, new, 1)
    text[-1] = text[-1][: len(text[-1]) // 2]  # the recorder stopped mid-line
    path = tmp_path / "probe.txt"
    path.write_text("\n".join(text))
    header = json.loads(text[0].removeprefix("# trialbed-tcp-probe "))
    want = _regex_events(pd.Series(text, dtype=object), header["realtime_minus_clock_ns"])
    got = read_tcp_probe(path)
    pd.testing.assert_frame_equal(got, want.reset_index(drop=True))
    assert "2001:db8::1" in set(got.src) and len(got) < len(events)  # some read, some not
    path.write_text("\n".join(text[1:]))  # no header: the trace clock as it is
    bare = read_tcp_probe(path)
    assert (got.ts_ns - bare.ts_ns == header["realtime_minus_clock_ns"]).all()
