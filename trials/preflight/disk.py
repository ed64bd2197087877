"""What the trials' captures write, at most, and whether the controller's disk under the
results directory holds what they bring back (MIN_FREE_DISK the floor on every disk)."""

from __future__ import annotations

import shutil
from pathlib import Path

from trials.network import CaptureSite, ResolvedNetwork

MIN_FREE_DISK = 200 * 10**6
# What a capture writes per packet: the capture role's snaplen (128) and pcap's 16-byte record
# header; packets are taken as 500 bytes on average (full-size data and 66-byte ACKs mixed).
CAPTURE_BYTES_PER_PACKET = 128 + 16
MEAN_PACKET_BYTES = 500


def results_disk_problems(results: Path, volume: float, trials: int) -> list[str]:
    """The controller's disk under `results` must hold what the trials bring back: their
    captures (`volume`, at most), with MIN_FREE_DISK as a floor."""
    existing = results.resolve()
    while not existing.exists():  # it is made by the run
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    need = max(MIN_FREE_DISK, int(volume))
    if free >= need:
        return []
    return [
        f"results {results}: only {free / 1e6:.0f} MB free on its disk; the {trials} trial(s) "
        f"bring back up to {volume / 1e6:.0f} MB of captures (at least "
        f"{MIN_FREE_DISK / 1e6:.0f} MB must be free): free space there or give --results "
        "a larger disk"
    ]


def capture_bytes(net: ResolvedNetwork, site: CaptureSite, duration_ns: int) -> float:
    """What a capture point writes in one trial, at most: both directions through its
    interface for the whole trial, CAPTURE_BYTES_PER_PACKET per MEAN_PACKET_BYTES on the wire.
    A direction without a rate of its own counts at the fastest rate of the experiment (its
    traffic crosses a shaped link somewhere); with no rate anywhere, 0 (MIN_FREE_DISK
    applies)."""
    fastest = max((e.shaping.rate or 0 for e in net.egress), default=0)
    out = net.shaping_of(site.host, site.iface)
    inbound = [e for e in net.egress if e.peer == site.node and (out is None or e.link == out.link)]
    rates = [
        out.shaping.rate if out and out.shaping.rate else fastest,
        inbound[0].shaping.rate if len(inbound) == 1 and inbound[0].shaping.rate else fastest,
    ]
    return sum(rates) * duration_ns / 1e9 / 8 / MEAN_PACKET_BYTES * CAPTURE_BYTES_PER_PACKET
