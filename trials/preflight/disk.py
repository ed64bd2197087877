"""What the trials' captures write, at most, and whether the controller's disk under the
results directory holds what a trial brings back (MIN_FREE_DISK the floor on every disk).

The bound is a worst case (every direction through a capture point at its link's rate), several
times what TCP trials write: a batch is not refused for its whole worst case, only for its
largest trial's; its workers check again before each trial (batch_worker) and stop, resumable,
when the next one would not fit."""

from __future__ import annotations

import shutil
from pathlib import Path

from core.rack import Rack
from trials.network import CaptureSite, ResolvedNetwork, resolve_network
from trials.plan import Trial

MIN_FREE_DISK = 200 * 10**6
# What a capture writes per packet: the capture role's snaplen (128) and pcap's 16-byte record
# header; packets are taken as 500 bytes on average (full-size data and 66-byte ACKs mixed).
CAPTURE_BYTES_PER_PACKET = 128 + 16
MEAN_PACKET_BYTES = 500


def free_bytes(results: Path) -> int:
    """Free bytes on the disk that holds (or will hold) `results`."""
    existing = results.resolve()
    while not existing.exists():  # it is made by the run
        existing = existing.parent
    return shutil.disk_usage(existing).free


def results_disk_problems(results: Path, volume: float, trial: str) -> list[str]:
    """The controller's disk under `results` must hold what one trial brings back (`volume`
    of captures at most, `trial` its name), with MIN_FREE_DISK as a floor."""
    free = free_bytes(results)
    need = max(MIN_FREE_DISK, int(volume))
    if free >= need:
        return []
    return [
        f"results {results}: only {free / 1e6:.0f} MB free on its disk; trial {trial} brings "
        f"back up to {volume / 1e6:.0f} MB of captures (at least "
        f"{MIN_FREE_DISK / 1e6:.0f} MB must be free): free space there or give --results "
        "a larger disk"
    ]


def trial_capture_bytes(net: ResolvedNetwork, duration_ns: int) -> float:
    """What every capture point of one trial writes, at most (capture_bytes summed)."""
    return sum(capture_bytes(net, c, duration_ns) for c in net.captures)


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


def batch_capture_line(trials: list[Trial], rack: Rack, source: str, results: Path) -> str:
    """The worst case of what the trials to run bring back, against the free disk."""
    volume = sum(
        trial_capture_bytes(
            resolve_network(t.experiment, rack, source), t.experiment.duration + t.experiment.drain
        )
        for t in trials
    )
    free = free_bytes(results)
    line = (
        f"captures: up to {volume / 1e6:.0f} MB for {len(trials)} trial(s), "
        f"{free / 1e6:.0f} MB free under {results}"
    )
    if volume > free:
        line += (
            " (a worst case: every direction at its link's rate); a worker stops before a "
            "trial that no longer fits, and the batch resumes with BATCH= once there is room"
        )
    return line
