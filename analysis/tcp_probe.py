"""cwnd, ssthresh and srtt of TCP senders from the ``tcp:tcp_probe`` tracepoint, as recorded by
collect/remote/tcp_probe.py (trace_pipe text; the kernel 6.x format is

    <task>-<pid> [cpu] flags <sec>.<usec>: tcp_probe: family=AF_INET src=A:p dest=B:q mark=0x0
    data_len=0 snd_nxt=0x.. snd_una=0x.. snd_cwnd=10 ssthresh=2147483647 snd_wnd=64512
    srtt=23 rcv_wnd=65160 sock_cookie=1003 [skbaddr=.. skaddr=..]

srtt in microseconds, cwnd and ssthresh in segments). An event is the sending socket's state
when an ACK (any segment) arrives; ``src`` is the socket's own address, so a data flow
src:sport -> dst:dport is followed by the events with that same src/dest.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["COLUMNS", "INFINITE_SSTHRESH", "congestion_events", "for_flows", "read_tcp_probe"]

INFINITE_SSTHRESH = 2**31 - 1  # TCP_INFINITE_SSTHRESH: not yet set (slow start)
_HEADER = "# trialbed-tcp-probe "
_EVENT = re.compile(
    r"\s(?P<sec>\d+)\.(?P<usec>\d+): tcp_probe: family=(?P<family>\S+) "
    r"src=\[?(?P<src>[^\s\]]+?)\]?:(?P<sport>\d+) dest=\[?(?P<dst>[^\s\]]+?)\]?:(?P<dport>\d+) "
    r"mark=\S+ data_len=(?P<data_len>\d+) snd_nxt=(?:0x)?(?P<snd_nxt>[0-9a-f]+) "
    r"snd_una=(?:0x)?(?P<snd_una>[0-9a-f]+) snd_cwnd=(?P<snd_cwnd>\d+) "
    r"ssthresh=(?P<ssthresh>\d+) snd_wnd=(?P<snd_wnd>\d+) srtt=(?P<srtt_us>\d+) "
    r"rcv_wnd=(?P<rcv_wnd>\d+) sock_cookie=(?P<sock_cookie>[0-9a-f]+)"
)
COLUMNS: dict[str, str] = {
    "ts_ns": "int64",
    "src": "object",
    "sport": "uint16",
    "dst": "object",
    "dport": "uint16",
    "data_len": "uint16",
    "snd_nxt": "uint32",
    "snd_una": "uint32",
    "snd_cwnd": "uint32",
    "ssthresh": "uint32",
    "snd_wnd": "uint32",
    "srtt_us": "uint32",
    "rcv_wnd": "uint32",
    "sock_cookie": "uint64",
}
_HEX = ("snd_nxt", "snd_una", "sock_cookie")


def open_text(path: Path):
    """A recording as text, gzipped (.gz) or not."""
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def read_tcp_probe(path: str | Path) -> pd.DataFrame:
    """All tcp_probe events of a recording, in file order, one row each (see COLUMNS).

    ts_ns is CLOCK_REALTIME (the captures' clock): the trace clock plus the offset the
    recorder wrote in its header line (without a header, the trace timestamps as they are).
    Lines that are not tcp_probe events (comments, other events, a last line cut short)
    are skipped.
    """
    path = Path(path)
    offset = 0
    with open_text(path) as f:
        text = f.read()
    for line in text.splitlines()[:5]:
        if line.startswith(_HEADER):
            offset = int(json.loads(line[len(_HEADER) :])["realtime_minus_clock_ns"])
    events = pd.Series(text.splitlines(), dtype=object)
    parts = events.str.extract(_EVENT).dropna(subset=["sock_cookie"])
    out = {}
    sec = parts["sec"].astype(np.int64).to_numpy()
    usec = parts["usec"].str.ljust(6, "0").str[:6].astype(np.int64).to_numpy()
    out["ts_ns"] = sec * 10**9 + usec * 1000 + offset
    for col, dtype in COLUMNS.items():
        if col == "ts_ns":
            continue
        values = parts[col]
        if col in _HEX:
            out[col] = np.array([int(v, 16) for v in values], dtype=dtype)
        elif dtype == "object":
            out[col] = values.to_numpy(dtype=object)
        else:
            out[col] = values.astype(np.int64).to_numpy().astype(dtype)
    return pd.DataFrame(out, columns=list(COLUMNS)).reset_index(drop=True)


def for_flows(events: pd.DataFrame, flows: pd.DataFrame) -> pd.DataFrame:
    """The events of the sending sockets of ``flows`` (columns src, dst as dotted-quad strings,
    and optionally sport, dport), each tagged with its flow's row of ``flows`` columns; events
    are sorted by (flow, time)."""
    keys = [c for c in ("src", "dst", "sport", "dport") if c in flows.columns]
    flows = flows[keys].drop_duplicates().astype({k: events[k].dtype for k in keys})
    picked = events.merge(flows, on=keys, how="inner")
    return picked.sort_values(["src", "sport", "dst", "dport", "ts_ns"], kind="stable").reset_index(
        drop=True
    )


def congestion_events(events: pd.DataFrame) -> pd.DataFrame:
    """The events where a flow's ssthresh fell (a loss or ECN reduction, or HyStart leaving
    slow start; not the raises of an undo or of an application-limited period): one row per
    congestion epoch, with the cwnd just before and at it. ``events`` sorted by flow and time
    (as ``for_flows`` returns them)."""
    key = ["src", "sport", "dst", "dport"]
    same = np.ones(len(events), dtype=bool)
    for k in key:
        col = events[k].to_numpy()
        same[1:] &= col[1:] == col[:-1]
    same[0] = False
    ss = events["ssthresh"].to_numpy(np.int64)
    cwnd = events["snd_cwnd"].to_numpy(np.int64)
    prev_ss = np.r_[INFINITE_SSTHRESH, ss[:-1]]
    prev_cwnd = np.r_[0, cwnd[:-1]]
    change = same & (ss < prev_ss)
    out = events.loc[change, [*key, "ts_ns", "snd_cwnd", "ssthresh"]].copy()
    out.insert(out.columns.get_loc("snd_cwnd"), "cwnd_before", prev_cwnd[change])
    return out.reset_index(drop=True)
