"""RIO as the tc BPF program hostside/bpf_tc/rio/ runs it, where the kernel has no GRED: its
load-time parameters, integers in the program's fixed point, from a rio link's settings (the
same thresholds, in bytes, that core/rio.py gives GRED), and the fixed point itself.

The program and its Python reference (analysis/rio_model.py) share these numbers: the
reference imports them, the program has them as constants (rio.bpf.c), and the tests that
compare the two packet by packet fail on any difference.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.hostside import SOURCE as HOSTSIDE
from core.hostside import shipped_files, sums_text
from core.rio import HIGH, VirtualQueue, high_dscp, in_dscp, virtual_queues
from core.units import parse_rate

SOURCE = "bpf_tc/rio/rio.bpf.c"  # under hostside/
# Every file the object is built from (the program and the header of every tc program here).
SOURCES = (SOURCE, "bpf_tc/bpf_tc.h")
LOADER = "bpf_tc/rio/trialbed_rio.py"  # under hostside/: attach, detach, show
# The runner's snapshots of the loader's `show`, per rio egress, in the router's trial folder.
SHOWN = "rio_bpf_{iface}_{tag}.json"
TAGS = ("before", "after")
PROGRAM = "rio"  # its SEC("tc") function
# The fixed point (rio.bpf.c): a byte is BYTE_WORK units of work (bits x 10^9, so that work /
# rate is nanoseconds), averages are bytes << AVG_SHIFT, w_q << W_SHIFT, max_p << P_SHIFT.
BYTE_WORK = 8 * 10**9
AVG_SHIFT = 16
W_SHIFT = 20
P_SHIFT = 32
RATIO_SHIFT = 20
D_SHIFT = 31  # the idle decay's fractions (each product below 2^63)
RING = 1 << 16  # packets the virtual FIFO holds
MAX_LIMIT = 1 << 26  # bytes: the largest FIFO the fixed point allows
LEVELS = 3
LEVEL_NAMES = ("in", "out", HIGH)
PREFIX = {"in": "in", "out": "out", HIGH: "high"}  # of the program's per-level parameters
# How the averages are built (enum rio_mode), and what they count as the queue (enum
# rio_backlog); the first of each is the default, and what GRED does.
MODES = ("gred", "coupled")
BACKLOGS = ("queued", "fluid")
# What a Linux host needs for it: the kernel's clsact qdisc and BPF classifier, and (names of
# host_facts' tools) a compiler for the object and Python for the loader (with libbpf-dev's
# headers, which bring libbpf). PROBE: its name among the qdiscs preflight asks a kernel for.
KERNEL_MODULES = ("sch_ingress", "cls_bpf")
PROBE = "rio_bpf"
# Why the program dropped a packet (enum reason; PASS: it did not).
REASONS = ("pass", "early", "forced", "limit", "ring_full")
# Its per-level counters (map stats) under the names core/rio.py gives GRED's per-VQ ones, so
# that a trial's RIO counters read the same whichever ran: every packet that arrived, early and
# forced drops, the FIFO's tail drops (GRED's pdrop), and the packets the ring had no room for.
STATS_AS_GRED = {
    "packets": "packets",
    "bytes": "bytes",
    "early": "early_drops",
    "forced": "forced_drops",
    "limit": "pdrop",
    "ring_full": "other_drops",
}


class RioBpfError(ValueError):
    """Settings the BPF RIO cannot take; the message names the key."""


def source_sha256(root: Path = HOSTSIDE) -> str:
    """The sha256 of the SOURCES' sha256sum lines (hostside/`root`): what the object is
    built from, named in its record and in the router's build (one object per source)."""
    files = shipped_files(root)
    return hashlib.sha256(sums_text({p: files[p] for p in SOURCES}).encode()).hexdigest()


def fixed_wq(w_q: float) -> int:
    """w_q in the program's fixed point (0.0012 -> 1258, i.e. 0.00119972)."""
    return round(w_q * (1 << W_SHIFT))


def fixed_p(p: float) -> int:
    """A probability in the program's fixed point (0.1 -> 429496730)."""
    return round(p * (1 << P_SHIFT))


def dscp_mask(codes: list[int]) -> int:
    """Bit d set for each DSCP d: how the program takes a level's code points."""
    return sum(1 << c for c in set(codes))


@dataclass(frozen=True)
class Level:
    """One drop precedence in the program's units."""

    min_bytes: int
    max_bytes: int
    maxp: int  # << P_SHIFT
    wq: int  # << W_SHIFT


@dataclass(frozen=True)
class BpfRio:
    """Everything the program is loaded with."""

    rate_bps: int
    limit_bytes: int
    mean_packet: int
    levels: tuple[Level, ...]  # IN, OUT (, high)
    in_dscp: int = 0  # mask
    high_dscp: int = 0
    mode: str = MODES[0]
    backlog: str = BACKLOGS[0]
    ns2_guard: bool = False  # no RED drop while at most one packet waits (ns-2's RED)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise RioBpfError(f"mode {self.mode!r}: one of {', '.join(MODES)}")
        if self.backlog not in BACKLOGS:
            raise RioBpfError(f"backlog {self.backlog!r}: one of {', '.join(BACKLOGS)}")
        if not 2 <= len(self.levels) <= LEVELS:
            raise RioBpfError(f"{len(self.levels)} levels: 2 (IN, OUT) or 3 (and high)")
        if self.rate_bps <= 0:
            raise RioBpfError(f"rate {self.rate_bps} bit/s: must be above 0")
        if not 0 < self.limit_bytes <= MAX_LIMIT:
            raise RioBpfError(
                f"buffer {self.limit_bytes} B: the BPF RIO takes 1 B to {MAX_LIMIT} B"
            )
        for name, level in zip(LEVEL_NAMES, self.levels, strict=False):
            if not 0 <= level.min_bytes < level.max_bytes <= MAX_LIMIT:
                raise RioBpfError(f"rio.{name}: min must be below max, max at most {MAX_LIMIT} B")
            if not 0 < level.maxp <= 1 << P_SHIFT or not 0 < level.wq < 1 << W_SHIFT:
                raise RioBpfError(f"rio.{name}: pmax in (0, 1], w_q at least 2^-{W_SHIFT}")

    def program_params(self) -> dict[str, int]:
        """The program's .rodata parameters by name (what the loader sets)."""
        out = {
            "rate_bps": self.rate_bps,
            "limit_bytes": self.limit_bytes,
            "mean_packet": self.mean_packet,
            "levels": len(self.levels),
            "in_dscp": self.in_dscp,
            "high_dscp": self.high_dscp,
            "mode": MODES.index(self.mode),
            "backlog": BACKLOGS.index(self.backlog),
            "ns2_guard": int(self.ns2_guard),
        }
        for name, level in zip(LEVEL_NAMES, self.levels, strict=False):
            p = PREFIX[name]
            out |= {
                f"{p}_min": level.min_bytes,
                f"{p}_max": level.max_bytes,
                f"{p}_maxp": level.maxp,
                f"{p}_wq": level.wq,
            }
        return out

    def record(self) -> dict[str, Any]:
        """What a trial records of it: the settings in readable units beside the integers."""
        return {
            "implementation": "bpf",
            "source": f"hostside/{SOURCE}",
            "mode": self.mode,
            "backlog": self.backlog,
            "ns2_guard": self.ns2_guard,
            "levels": {
                name: {
                    "min_bytes": level.min_bytes,
                    "max_bytes": level.max_bytes,
                    "pmax": level.maxp / (1 << P_SHIFT),
                    "w_q": level.wq / (1 << W_SHIFT),
                }
                for name, level in zip(LEVEL_NAMES, self.levels, strict=False)
            },
            "params": self.program_params(),
        }


def level_of(vq: VirtualQueue, weight: str = "asked") -> Level:
    """A GRED virtual queue's thresholds for the program; `weight` asked: w_q as the
    experiment gives it; gred: the power of two GRED uses instead (to compare the two)."""
    w_q = {"asked": vq.w_q, "gred": vq.w_q_effective}[weight]
    return Level(vq.min_bytes, vq.max_bytes, fixed_p(vq.pmax), fixed_wq(w_q))


def from_link(
    link: dict[str, Any],
    mode: str = MODES[0],
    backlog: str = BACKLOGS[0],
    weight: str = "asked",
    ns2_guard: bool = False,
) -> BpfRio:
    """The program's settings for a rio link (rate, buffer, rio: as role linux_router takes
    them); RioError or RioBpfError names what cannot be built."""
    rio = link.get("rio") or {}
    vqs = virtual_queues(rio, link["buffer"])
    return BpfRio(
        rate_bps=parse_rate(link["rate"]),
        limit_bytes=vqs[0].limit,
        mean_packet=vqs[0].mean_packet,
        levels=tuple(level_of(vq, weight) for vq in vqs),
        in_dscp=dscp_mask(in_dscp(rio)),
        high_dscp=dscp_mask(high_dscp(rio)),
        mode=mode,
        backlog=backlog,
        ns2_guard=ns2_guard,
    )


def counters_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[int, dict[str, int]]:
    """Per level, what the program counted between two `trialbed_rio.py show` answers, in
    GRED's names (core/rio.counters_delta's shape: drops their sum; the gauges of `after`:
    prio, the level's average and its backlog as the last packet saw it, in bytes). {} when
    `after` shows no program."""
    if not after.get("prog_id"):
        return {}
    levels = int((after.get("params") or {}).get("levels", 2))
    was = before.get("stats") if before.get("prog_id") == after["prog_id"] else None
    state = after.get("state") or {}
    out = {}
    for level in range(levels):
        row = {
            ours: after["stats"][theirs][level] - ((was or {}).get(theirs) or [0] * LEVELS)[level]
            for theirs, ours in STATS_AS_GRED.items()
        }
        row["drops"] = sum(row[k] for k in ("forced_drops", "early_drops", "pdrop", "other_drops"))
        row["prio"] = level + 1
        if state:
            row["qave_bytes"] = state["sub"][level]["avg"] >> AVG_SHIFT
            row["backlog_bytes"] = state["last"]["queue"][level]
        out[level] = row
    return out


def shown(host_dir: Path, iface: str) -> dict[str, dict[str, Any]]:
    """The loader's answers for `iface` before and after a trial ({} for one missing or not
    JSON: a router that ran GRED answers prog_id null)."""
    out: dict[str, dict[str, Any]] = {}
    for tag in TAGS:
        f = host_dir / SHOWN.format(iface=iface, tag=tag)
        try:
            out[tag] = json.loads(f.read_text()) if f.exists() else {}
        except ValueError:
            out[tag] = {}
    return out


def drops(host_dir: Path, iface: str) -> int | None:
    """Every packet the BPF RIO on `iface` dropped during the trial (all levels, all reasons);
    None where it did not run."""
    answers = shown(host_dir, iface)
    counted = counters_delta(answers["before"], answers["after"])
    return sum(row["drops"] for row in counted.values()) if counted else None
