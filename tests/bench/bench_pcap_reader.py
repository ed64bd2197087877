"""Benchmark (not a test): read_pcap vs tcpdump -r vs cat on a 3,000,000-packet capture.

    .venv/bin/python tests/bench/bench_pcap_reader.py [--packets N] [--keep DIR]

Writes a snaplen-96 pcap of mixed TCP data / TCP ACK / UDP packets (some VLAN-tagged, UDP
payloads carrying pcap-like timestamps to exercise the false-candidate path) into a temp dir.
Target: read_pcap at ~3 M packets/s or better on a 2-core machine.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import as_strided

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))

from pcapgen import ethernet, ipv4, tcp_segment, udp_datagram, write_pcap

from analysis.pcap import read_pcap

SNAPLEN = 96
T0_NS = 1_763_700_000 * 10**9


def _templates() -> list[tuple[float, bytes, int, int]]:
    """(share, frame, offset of IP header, offset of L4 payload) per packet kind."""
    ts_opt = b"\x01\x01\x08\x0a" + bytes(8)  # NOP NOP timestamps: a 32-byte TCP header
    data = tcp_segment(5201, 40000, 0, 0, 0x10, bytes(1448), options=ts_opt)
    ack = tcp_segment(40000, 5201, 0, 0, 0x10, options=ts_opt)
    udp = udp_datagram(40001, 5202, bytes(1200))
    small = udp_datagram(40002, 5203, bytes(16))
    a, b = "198.18.1.11", "198.18.2.22"
    return [
        (0.50, ethernet(ipv4(a, b, 6, data)), 14, 14 + 20 + 32),
        (0.30, ethernet(ipv4(b, a, 6, ack)), 14, 14 + 20 + 32),
        (0.15, ethernet(ipv4(a, b, 17, udp), vlan=100), 18, 18 + 28),
        (0.05, ethernet(ipv4(a, b, 17, small)), 14, 14 + 28),
    ]


def write_big_pcap(path: Path, packets: int, seed: int = 1) -> None:
    """Vectorized writer: records of one kind are filled as a 2-D array, then scattered."""
    kinds = _templates()
    rng = np.random.default_rng(seed)
    write_pcap(path, [], snaplen=SNAPLEN)  # global header
    chunk = 250_000
    with open(path, "ab") as f:
        for first in range(0, packets, chunk):
            n = min(chunk, packets - first)
            kind = rng.choice(len(kinds), size=n, p=[k[0] for k in kinds])
            caplen = np.array([min(len(k[1]), SNAPLEN) for k in kinds])[kind]
            ends = np.cumsum(16 + caplen)
            starts = ends - 16 - caplen
            out = np.zeros(int(ends[-1]), dtype=np.uint8)
            ts = T0_NS + (first + np.arange(n)) * 10_000 + rng.integers(0, 5_000, n)
            for i, (_, frame, l3, l4p) in enumerate(kinds):
                sel = np.flatnonzero(kind == i)
                if not len(sel):
                    continue
                cap = frame[:SNAPLEN]
                rows = np.tile(np.frombuffer(cap, np.uint8), (len(sel), 1))
                hdr = np.empty((len(sel), 4), "<u4")
                hdr[:, 0] = ts[sel] // 10**9
                hdr[:, 1] = ts[sel] % 10**9 // 1000
                hdr[:, 2] = len(cap)
                hdr[:, 3] = len(frame)
                ip_id = ((first + sel) & 0xFFFF).astype(">u2")
                rows[:, l3 + 4 : l3 + 6] = ip_id.view(np.uint8).reshape(-1, 2)
                if frame[l3 + 9] == 6:
                    seq = ((first + sel) * 1448 & 0xFFFFFFFF).astype(">u4")
                    rows[:, l3 + 24 : l3 + 28] = seq.view(np.uint8).reshape(-1, 4)
                    rows[:, l3 + 28 : l3 + 32] = seq.view(np.uint8).reshape(-1, 4)
                payload = rows[:, l4p:]
                payload[:] = rng.integers(0, 256, payload.shape, dtype=np.uint8)
                if frame[l3 + 9] == 17 and payload.shape[1] >= 8:  # a send timestamp, LE
                    payload[:, :8] = hdr[:, :2].copy().view(np.uint8)
                recs = np.concatenate([hdr.view(np.uint8), rows], axis=1)
                width = recs.shape[1]
                windows = as_strided(out, (len(out) - width + 1, width), (1, 1), writeable=True)
                windows[starts[sel]] = recs
            f.write(out.tobytes())


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=3_000_000)
    ap.add_argument("--keep", type=Path, help="write the pcap here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = (args.keep or Path(tmp)) / "bench.pcap"
        t_write = timed(lambda: write_big_pcap(path, args.packets))
        size = path.stat().st_size
        print(f"wrote {args.packets:,} packets, {size / 1e6:.0f} MB in {t_write:.1f} s: {path}")

        def sh(cmd: str) -> None:
            subprocess.run(cmd, shell=True, check=True, stderr=subprocess.DEVNULL)

        t_cat = timed(lambda: sh(f"cat {path} > /dev/null"))
        frames = []

        def read() -> None:
            frames[:] = []  # drop the previous frame first so runs do not stack memory
            frames.append(read_pcap(path))

        times = [timed(read) for _ in range(3)]
        t_read = min(times)
        df = frames[-1]
        assert len(df) == args.packets, (len(df), args.packets)
        assert (df["ip_id"].to_numpy() == (np.arange(args.packets) & 0xFFFF)).all()
        t_tcpdump = timed(lambda: sh(f"tcpdump -n -r {path} > /dev/null"))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"read_pcap: {t_read:.2f} s ({args.packets / t_read / 1e6:.1f} M packets/s, "
            f"best of 3, first run {times[0]:.2f} s, peak RSS {rss:.0f} MB); "
            f"tcpdump -r: {t_tcpdump:.1f} s ({t_tcpdump / t_read:.0f}x slower); "
            f"cat: {t_cat:.2f} s (read_pcap = {t_read / t_cat:.1f}x cat)"
        )


if __name__ == "__main__":
    main()
