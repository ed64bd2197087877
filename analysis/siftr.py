"""cwnd, ssthresh and srtt of TCP senders on FreeBSD hosts, from a SIFTR log (siftr(4): the
kernel module that writes a TCP control block's state whenever one of its packets passes the
IP layer), read into the table analysis.tcp_probe reads from Linux's tcp:tcp_probe (its
COLUMNS), so that the analysis and the figures do not know which kernel sent.

A log holds, per enable/disable cycle of the module: an enable line of tab-separated
key=value pairs (siftrver, and before 1.3 hz and tcp_rtt_scale), one CSV data line per
logged packet, and a disable line. The data line's fields by version (siftr(4) "Log
Format" of FreeBSD 8-13 and of FreeBSD 14 onwards):

    1.2.x  dir, hash, time, local ip, local port, foreign ip, foreign port, ssthresh, cwnd,
           bandwidth-controlled window, snd_wnd, rcv_wnd, snd_scale, rcv_scale, state, mss,
           srtt (in TCP_RTT_SCALE * HZ per second), sack, flags, rto (ticks), snd_buf size,
           snd_buf used, rcv_buf size, rcv_buf used, bytes in flight            (25 fields)
    1.3.x  dir, time, local ip, local port, foreign ip, foreign port, ssthresh, cwnd,
           t_flags2, snd_wnd, rcv_wnd, snd_scale, rcv_scale, state, mss, srtt (us), sack,
           flags, rto (us), snd_buf size, snd_buf used, rcv_buf size, rcv_buf used, bytes in
           flight, reassembly queue segments, flowid, flowtype                  (27 fields)

What differs from tcp_probe, and how it is mapped:
- cwnd and ssthresh are bytes in FreeBSD; the table has segments (Linux's unit): bytes // mss.
  FreeBSD's "not yet set" ssthresh (TCP_MAXWIN << TCP_MAX_WINSHIFT, 1 073 725 440 bytes)
  becomes tcp_probe's INFINITE_SSTHRESH.
- Only inbound packets ("i") are kept by default: tcp_probe's events are the sending socket's
  state as a segment arrives.
- SIFTR logs neither the segment's data length nor snd_nxt/snd_una nor a socket cookie:
  those columns are 0.
- time is the pfil hook's wall clock (CLOCK_REALTIME), the captures' clock.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from analysis.lazy import pd
from analysis.tcp_probe import COLUMNS, INFINITE_SSTHRESH, open_recording

__all__ = ["FREEBSD_UNSET_SSTHRESH", "SiftrError", "read_siftr"]

FREEBSD_UNSET_SSTHRESH = 65535 << 14  # TCP_MAXWIN << TCP_MAX_WINSHIFT (tcp_var.h)

# Per major.minor version: the data line's field count and the index of each field used.
_LAYOUTS: dict[str, dict[str, int | bool]] = {
    "1.2": {
        "fields": 25, "dir": 0, "time": 2, "src": 3, "sport": 4, "dst": 5, "dport": 6,
        "ssthresh": 7, "cwnd": 8, "snd_wnd": 10, "rcv_wnd": 11, "mss": 15, "srtt": 16,
        "srtt_in_ticks": True,
    },
    "1.3": {
        "fields": 27, "dir": 0, "time": 1, "src": 2, "sport": 3, "dst": 4, "dport": 5,
        "ssthresh": 6, "cwnd": 7, "snd_wnd": 9, "rcv_wnd": 10, "mss": 14, "srtt": 15,
        "srtt_in_ticks": False,
    },
}  # fmt: skip


class SiftrError(ValueError):
    """A SIFTR log this reader cannot take; the message names the file and the line."""


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS.items()})


def _header(line: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in line.split("\t") if "=" in kv)


def read_siftr(path: str | Path, directions: str = "i") -> pd.DataFrame:
    """The data lines of a SIFTR log whose direction is in ``directions`` ("i", "o" or
    "io"), in file order, as tcp_probe's table (COLUMNS; see the module's mapping).

    A data line that is cut short (the last line of a log still being written) is skipped;
    data before any enable line, or of a SIFTR version without a known layout, is refused."""
    path = Path(path)
    with open_recording(path) as f:
        lines = f.read().splitlines()
    cycles: list[tuple[dict[str, str], list[str]]] = []
    for number, line in enumerate(lines, 1):
        if line.startswith("enable_time_secs="):
            cycles.append((_header(line), []))
        elif line[:2] in ("i,", "o,"):
            if not cycles:
                raise SiftrError(f"{path}:{number}: a data line before SIFTR's enable line")
            cycles[-1][1].append(line)
    tables = [_cycle(path, header, data, directions) for header, data in cycles if data]
    if not tables:
        return _empty()
    return pd.concat(tables, ignore_index=True)


def _cycle(path: Path, header: dict[str, str], data: list[str], directions: str) -> pd.DataFrame:
    version = header.get("siftrver", "?")
    layout = _LAYOUTS.get(".".join(version.split(".")[:2]))
    if layout is None:
        raise SiftrError(
            f"{path}: SIFTR version {version}: known are " + ", ".join(f"{v}.x" for v in _LAYOUTS)
        )
    rows = [line for line in data if line.count(",") + 1 == layout["fields"]]
    if not rows:
        return _empty()
    frame = pd.read_csv(io.StringIO("\n".join(rows)), header=None, dtype=str)
    frame = frame[frame[layout["dir"]].isin(list(directions))]
    if frame.empty:
        return _empty()

    def col(name: str) -> pd.Series:
        return frame[layout[name]]

    time = col("time").str.split(".", n=1, expand=True).reindex(columns=[0, 1]).fillna("0")
    micros = time[1].str.ljust(6, "0").str[:6].astype(np.int64).to_numpy()
    ts_ns = time[0].astype(np.int64).to_numpy() * 10**9 + micros * 1000
    mss = col("mss").astype(np.int64).to_numpy()
    ssthresh_bytes = col("ssthresh").astype(np.int64).to_numpy()
    ssthresh = np.where(
        ssthresh_bytes >= FREEBSD_UNSET_SSTHRESH, INFINITE_SSTHRESH, ssthresh_bytes // mss
    )
    srtt = col("srtt").astype(np.int64).to_numpy()
    if layout["srtt_in_ticks"]:  # 1.2: srtt in units of 1 / (TCP_RTT_SCALE * HZ) seconds
        per_second = int(header["tcp_rtt_scale"]) * int(header["hz"])
        srtt_us = srtt * 10**6 // per_second
    else:
        srtt_us = srtt
    zeros = np.zeros(len(frame), dtype=np.int64)
    out = {
        "ts_ns": ts_ns,
        "src": col("src").to_numpy(dtype=object),
        "sport": col("sport").astype(np.int64).to_numpy(),
        "dst": col("dst").to_numpy(dtype=object),
        "dport": col("dport").astype(np.int64).to_numpy(),
        "data_len": zeros,
        "snd_nxt": zeros,
        "snd_una": zeros,
        "snd_cwnd": col("cwnd").astype(np.int64).to_numpy() // mss,
        "ssthresh": ssthresh,
        "snd_wnd": col("snd_wnd").astype(np.int64).to_numpy(),
        "srtt_us": srtt_us,
        "rcv_wnd": col("rcv_wnd").astype(np.int64).to_numpy(),
        "sock_cookie": zeros,
    }
    return pd.DataFrame(
        {c: out[c] if t == "object" else np.asarray(out[c]).astype(t) for c, t in COLUMNS.items()}
    )
