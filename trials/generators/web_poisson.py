"""web_poisson: seed 004's web-like TCP workload. Flows arrive as a Poisson process at an
offered load (a fraction of a link rate), each sends a size drawn from the 15-group table
(equal probability per group), plus one backlogged flow; seeded, so a trial repeats exactly.

The schedule is drawn on the controller (`flow_schedule`), put on the sender as JSON and
played there by hostside/traffic/web_flows.py (client; role remote_daemons ships it to every
host); a sink of the same program on the receiver reads every connection to its end. Flow
completion times come from the captures (analysis/traffic/web_poisson.py).

Offered load counts payload (application) bytes: arrivals per second = load * rate /
(8 * mean flow bytes). RTTs: every flow of one generator has its path's RTT (the experiment's
link delays); the paper's spread of RTTs (124-198 ms) comes from several generators, one per
sender behind its own access link with its own delay (topology chain2: S1..S8), each with its
share of the load (one seed for all: each generator draws its own stream of it, by its
index in `traffic`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, StrictBool, field_validator

from core.command import Command
from core.hostside import WEB_FLOWS, program_command, remote_dir
from trials.fields import LOAD, MAX_SEED, LinkRate, Port, TrafficDuration, shown
from trials.generators.base import (
    CONNECTION_PACKETS,
    Direction,
    GeneratorSpec,
    OneWay,
    TrafficGenerator,
)

BASE_PORT = 8000
# Seed 004's Table I: (bytes, packets of 1500 B) per group, each group equally likely.
FLOW_GROUPS: tuple[tuple[int, int], ...] = (
    (119, 1),
    (179, 1),
    (251, 1),
    (334, 1),
    (428, 1),
    (529, 1),
    (658, 1),
    (948, 1),
    (1650, 2),
    (2861, 2),
    (4706, 4),
    (8015, 6),
    (13681, 10),
    (26641, 18),
    (284454, 190),
)
GROUP_BYTES = np.array([b for b, _ in FLOW_GROUPS], dtype=np.int64)
MEAN_FLOW_BYTES = float(GROUP_BYTES.mean())
_BLOCK = 4096  # inter-arrival times are drawn in blocks: a longer trial extends the schedule


def arrival_rate(load: float, rate_bps: int) -> float:
    """Flows per second that offer `load` of `rate_bps` as payload."""
    return load * rate_bps / (8 * MEAN_FLOW_BYTES)


def flow_schedule(
    load: float, rate_bps: int, duration_ns: int, seed: int, stream: int = 0
) -> dict[str, np.ndarray]:
    """Start offsets (ns from the generator's start), groups (1..15) and sizes of every flow
    starting within `duration_ns`. Arrivals and sizes come from two independent streams of
    (seed, stream), drawn in order: a shorter duration's schedule is a prefix of a longer one's.
    `stream` tells apart the generators of one trial that share a seed."""
    lam = arrival_rate(load, rate_bps)
    streams = np.random.SeedSequence([seed, stream]).spawn(2)
    arrivals_rng, sizes_rng = (np.random.default_rng(s) for s in streams)
    limit_s, total, gaps = duration_ns / 1e9, 0.0, []
    while total < limit_s:
        block = arrivals_rng.exponential(1.0 / lam, _BLOCK)
        gaps.append(block)
        total += float(block.sum())
    t_s = np.cumsum(np.concatenate(gaps))
    t_ns = (t_s[t_s < limit_s] * 1e9).astype(np.int64)
    group = sizes_rng.integers(0, len(FLOW_GROUPS), len(t_ns)) + 1
    return {"t_ns": t_ns, "group": group, "bytes": GROUP_BYTES[group - 1]}


def parse_load(value: object) -> float:
    """0 < load <= 1, given as a fraction (0.64) or a percentage ("64%")."""
    text = str(value).strip()
    try:
        load = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        load = float("nan")
    if not LOAD.holds(load):
        raise ValueError(
            f"load {shown(value)}: allowed a fraction of the link rate in (0, 1] or a percentage "
            "in (0%, 100%], e.g. 0.64 or 64%"
        )
    return load


class WebPoissonSpec(GeneratorSpec):
    type: Literal["web_poisson"]
    load: Annotated[float | str, LOAD] = Field(
        description="offered web load: fraction of link_rate (0.64, 64%)"
    )
    link_rate: LinkRate | None = Field(
        None, description="the rate load is a fraction of (default: the path's bottleneck)"
    )
    seed: int = Field(1, ge=0, le=MAX_SEED, strict=True, description="same seed, same flows")
    backlogged: StrictBool = Field(
        True, description="one more flow that sends for the whole duration"
    )
    duration: TrafficDuration | None = Field(None, description="default: until the trial ends")
    port: Port | None = Field(None, description="default: 8000 + index")

    @field_validator("load")
    @classmethod
    def _load(cls, value: float | str) -> float:
        return parse_load(value)

    def tools(self) -> dict[str, list[str]]:
        return {self.from_: ["python3"], self.to: ["python3"]}

    def offered(self, bottleneck_bps: int | None) -> dict[Direction, OneWay]:
        """Data (and the backlogged flow) as fast as the path carries it; beyond that, per flow,
        each end's handshake and teardown, and the client's last, partial segment."""
        rate = self.link_rate if self.link_rate is not None else bottleneck_bps
        flows = arrival_rate(float(self.load), rate) if rate else 0.0
        return {
            "forward": OneWay(
                "tcp",
                pps=flows * (CONNECTION_PACKETS + 1),
                what=f"{flows:.1f} web flows/s: each one's handshake, teardown and last segment",
                full_frames_of=("forward",),
            ),
            "reverse": OneWay(
                "tcp",
                pps=flows * CONNECTION_PACKETS,
                what=f"{flows:.1f} web flows/s: the server's handshake and teardown of each",
                full_frames_of=("forward",),
            ),
        }


class WebPoisson(TrafficGenerator):
    type = "web_poisson"
    spec_class = WebPoissonSpec
    metrics = ("flow_completion_time",)
    spec: WebPoissonSpec

    @property
    def port(self) -> int:
        return self.spec.port or BASE_PORT + self.index

    @cached_property
    def rate_bps(self) -> int:
        if self.spec.link_rate is not None:
            return self.spec.link_rate
        path = self.ctx.network.path_summary(self.spec.from_, self.spec.to)
        if not path["bottleneck"]:
            raise ValueError(
                f"traffic {self.name}: no shaped link between {self.spec.from_} and "
                f"{self.spec.to}; give link_rate (the rate load is a fraction of)"
            )
        return int(path["bottleneck"]["rate_bps"])

    @cached_property
    def schedule(self) -> dict[str, np.ndarray]:
        s = self.spec
        return flow_schedule(float(s.load), self.rate_bps, self.duration_ns, s.seed, self.index)

    @property
    def files(self) -> dict[str, str]:
        return {
            "schedule": f"{self.name}_schedule.json",
            "flows": f"{self.name}_flows.jsonl",
        }

    def prepare(self) -> None:
        """The schedule on the sender (a short command line at launch: the senders of one
        trial start within milliseconds)."""
        scratch = Path(tempfile.mkdtemp(prefix="trialbed-web-"))
        try:
            path = scratch / self.files["schedule"]
            path.write_text(json.dumps({k: v.tolist() for k, v in self.schedule.items()}))
            remote = self.ctx.daemons.remote[self.sender]
            self.ctx.rack.put(self.sender, path, f"{remote}/{path.name}")
        finally:
            shutil.rmtree(scratch)

    def _program(self, host: str, *args: str) -> Command:
        """web_flows.py from the host's shipped programs."""
        return program_command(remote_dir(self.ctx.rack.host(host).workdir), WEB_FLOWS, *args)

    def arm(self) -> None:
        args = ("server", "--bind", str(self.dst), "--port", str(self.port))
        command = self._program(self.receiver, *args)
        self.ctx.daemons.spawn(self.receiver, f"{self.name}_server", command, ready="ready")

    def launch(self, t0: float) -> None:
        args = [
            "client",
            "--schedule",
            self.files["schedule"],
            "--bind",
            str(self.src),
            "--connect",
            str(self.dst),
            "--port",
            str(self.port),
            "--duration-s",
            f"{self.duration_ns / 1e9:g}",
            "--start-at",
            repr(t0 + self.spec.start / 1e9),
            "--out",
            self.files["flows"],
        ]
        if self.spec.backlogged:
            args.append("--backlogged")
        # Started now, in the lead, and waiting for its start itself: a Python start took 8 s
        # under TCG (the VM rack), which a client started at T0 took from its schedule.
        self.ctx.daemons.spawn(
            self.sender, f"{self.name}_client", self._program(self.sender, *args)
        )

    def daemon_names(self) -> list[tuple[str, str]]:
        return [(self.sender, f"{self.name}_client"), (self.receiver, f"{self.name}_server")]

    def problems(self, trial_dir: Path) -> list[str]:
        flows = trial_dir / self.sender / self.files["flows"]
        if not flows.exists():
            log = trial_dir / self.sender / f"{self.name}_client.log"
            said = log.read_text(errors="replace").strip()[-300:] if log.exists() else ""
            return [f"{self.name}: the web client on {self.sender} wrote no flow list {said}"]
        rows = [json.loads(line) for line in flows.read_text().splitlines() if line.strip()]
        errors = [r for r in rows if r["status"] == "error"]
        if errors:
            what = sorted({r["error"] for r in errors})
            return [f"{self.name}: {len(errors)} of {len(rows)} flows failed: {', '.join(what)}"]
        return []

    def record(self) -> dict[str, Any]:
        path = self.ctx.network.path_summary(self.spec.from_, self.spec.to)
        load = float(self.spec.load)
        return {
            **super().record(),
            "proto": 6,
            "port": self.port,
            "load": load,
            "link_rate_bps": self.rate_bps,
            "seed": self.spec.seed,
            "stream": self.index,  # the generator's index: same seed, another flow sequence
            "arrivals_per_s": arrival_rate(load, self.rate_bps),
            "mean_flow_bytes": MEAN_FLOW_BYTES,
            "flows_scheduled": len(self.schedule["t_ns"]),
            "backlogged": self.spec.backlogged,
            # Per-flow access delays: every flow of this generator crosses the same links.
            "rtt_ns": path["rtt_ns"],
            "rtt_note": "all flows of this generator share its path's propagation RTT; a spread "
            "of RTTs needs one generator per sender behind an access link with its own delay",
            "schedule_file": f"{self.sender}/{self.files['schedule']}",
            "flows_file": f"{self.sender}/{self.files['flows']}",
        }
