"""Results directories generated without captures: batches of analysed trials as the runner
and the analysis leave them (trial.json with its provenance, analysis/summary.json, the
per-flow table analysis/flows.parquet), with metric values the caller chooses. For the
catalog, regression and trend tests; what a real trial's files hold is tests/data's."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

KERNEL = "6.1.0-28-amd64"
INVENTORY = "/lab/inventory/hosts.yml"


def record(
    name: str,
    overrides: dict,
    repetition: int,
    *,
    commit: str = "c0ffee",
    dirty: bool = False,
    status: str = "complete",
    started: str = "2026-12-01T02:00:00+00:00",
    experiment_file: str = "experiments/smoke.yml",
    buffer: str = "60000B",
    family: str = "collateral_damage",
) -> dict:
    """A trial.json of the collateral-damage dumbbell (cubic on A and C, the router R)."""
    return {
        "format_version": 2,
        "trial": name,
        "id": hashlib.sha256(name.encode()).hexdigest()[:12],
        "status": status,
        "experiment_file": experiment_file,
        "family": family,
        "overrides": overrides,
        "repetition": repetition,
        "parameters": {"duration": "8s", "network": {"links": [{"name": "downstream",
                                                               "buffer": buffer}]}},
        "git": {"commit": commit, "dirty": dirty},
        "inventory": [INVENTORY],
        "network": {
            "nodes": {"A": "A", "C": "C", "R": "R"},
            "egress": [{"link": "downstream", "host": "R", "iface": "right",
                        "qdisc": "droptail", "buffer": buffer}],
        },
        "host_settings": {"A": {"cc": "cubic"}, "C": {"cc": "cubic"}},
        "hosts": {h: {"kernel": KERNEL} for h in ("A", "C", "R")},
        "delay": {"R": {"backend": "netem"}},
        "cc_implementation": {"A": {"cubic": {"cc": "cubic", "implementation": "module"}}},
        "times": {"started": started, "t0_ns": 1},
        "errors": [] if status == "complete" else ["interrupted (SIGINT)"],
    }  # fmt: skip


def summary(name: str, metrics: dict[str, float], flows: int) -> dict:
    """analysis/summary.json with the metrics under a bulk_tcp generator ``tcp``, one queue
    ``downstream`` (its metrics begin with queue_), per-flow goodputs as a list."""
    gen = {k: v for k, v in metrics.items() if not k.startswith("queue_")}
    queue = {k: v for k, v in metrics.items() if k.startswith("queue_")}
    gen_rates = [metrics.get("goodput_kBps", 0.0) / flows] * flows
    return {
        "trial": name,
        "status": "complete",
        "generators": {"tcp": {"type": "bulk_tcp", **gen, "flow_goodput_kBps": gen_rates}},
        "queues": {"downstream": {"link": "downstream", **queue}},
    }


def batch(
    batch_dir: Path,
    cells: list[dict],
    repetitions: int,
    metrics: Callable[[dict, int], dict[str, float]],
    *,
    flows: int = 2,
    created: str | None = None,
    **record_args,
) -> Path:
    """A batch of ``cells`` x ``repetitions`` analysed trials, each trial's metrics as
    ``metrics(overrides, repetition)`` gives them; batch.json says when it was created."""
    names = []
    for overrides in cells:
        label = "_".join(f"{k.split('.')[-1]}-{v}" for k, v in overrides.items()) or "r"
        for rep in range(1, repetitions + 1):
            name = f"{label}_r{rep}" if overrides else f"r{rep}"
            names.append(name)
            d = batch_dir / "trials" / name
            (d / "analysis").mkdir(parents=True)
            (d / "trial.json").write_text(
                json.dumps(record(name, overrides, rep, **record_args), indent=1)
            )
            values = metrics(overrides, rep)
            (d / "analysis" / "summary.json").write_text(json.dumps(summary(name, values, flows)))
            per = values.get("goodput_kBps", 0.0) / flows
            pd.DataFrame(
                {
                    "src": pd.Categorical([f"198.18.1.{10 + f}" for f in range(flows)]),
                    "dst": pd.Categorical([f"198.18.2.{10 + f}" for f in range(flows)]),
                    "sport": np.arange(flows, dtype=np.uint16) + 40000,
                    "steady_goodput_bps": np.full(flows, per * 8000.0),
                    "generator": ["tcp"] * flows,
                }
            ).to_parquet(d / "analysis" / "flows.parquet")
    meta = {"experiment": "experiments/smoke.yml", "trials": [{"name": n} for n in names]}
    if created:
        meta["created"] = created
    (batch_dir / "batch.json").write_text(json.dumps(meta))
    return batch_dir
