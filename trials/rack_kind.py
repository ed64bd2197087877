"""Which rack runs an experiment (RACK=auto: the namespace rack when this machine's kernel has
everything the trials need, or can take it as BPF (hostside/bpf_cc), else the VM rack with
Debian's stock kernel), and what a VM rack adds to a trial's metadata (the VM, its clock offset
now, its calibration)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.hostside import PROBES, load_program
from core.layout import PROJECT_DIR
from core.link_rules import QDISCS
from trials.bpf_cc import bpf_cc_names, bpf_cc_problem

if TYPE_CHECKING:  # (the command line reads KINDS without the rack's and plan's imports)
    from core.rack import Rack
    from trials.plan import Trial

KINDS = ("auto", "namespaces", "vm")
VM_CLOCK = PROJECT_DIR / "roles/virtual_rack/files/vm/vm-clock.py"


def needs(trials: list[Trial]) -> dict[str, set[str]]:
    """What the trials ask of the kernel: congestion controls and queue disciplines. A
    congestion control named only in `cc_params` is not asked for: the runner sets the module
    parameters of the selected one alone (collateral_damage.yml keeps H-TCP's while a batch
    runs reno and cubic)."""
    cc: set[str] = set()
    qdiscs: set[str] = set()
    for trial in trials:
        exp = trial.experiment
        for gen in exp.traffic:
            if getattr(gen, "cc", None):
                cc.add(gen.cc)
        for s in exp.hosts.values():
            if s.cc:
                cc.add(s.cc)
            if s.pacing:
                qdiscs.add("fq")
        for link in exp.network.links:
            directions = ["forward"] + ([] if link.one_way else ["reverse"])
            for which in directions:
                # The kernel qdisc a link's qdisc is built from (droptail's is always there).
                kernel_qdisc = QDISCS[link.direction(which).qdisc].linux_qdisc
                if kernel_qdisc:
                    qdiscs.add(kernel_qdisc)
    return {"cc": cc, "qdiscs": qdiscs}


def local_offers() -> dict[str, set[str]]:
    """What this machine's kernel has (the namespace rack's hosts share it): its congestion
    controls, those it can take as BPF programs (configure registers them), its qdiscs."""
    host_facts = load_program(PROBES["host_facts"])  # this machine is the rack's every host
    release = platform.release()
    loaded = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    modules = host_facts.module_names(release)
    cc = set(loaded) | set(host_facts.cc_modules(modules))
    facts = {"cc_loaded": loaded, "cc_modules": sorted(cc), "kernel": release,
             "bpf_cc_kernel": host_facts.bpf_cc_kernel()}  # fmt: skip
    as_bpf = {name for name in bpf_cc_names() if name not in cc and not bpf_cc_problem(facts, name)}
    return {
        "cc": cc | as_bpf,
        "bpf_cc": as_bpf,
        "qdiscs": set(host_facts.qdiscs_available(release, modules)),
    }


def choose(trials: list[Trial], asked: str) -> tuple[str, str]:
    """(kind, why) for RACK=asked; auto picks the namespace rack when it has everything."""
    if asked != "auto":
        return asked, f"RACK={asked}"
    need, have = needs(trials), local_offers()
    missing = sorted(need["cc"] - have["cc"]) + [
        f"sch_{q}" for q in sorted(need["qdiscs"] - have["qdiscs"])
    ]
    if not missing:
        as_bpf = ", ".join(sorted(need["cc"] & have.get("bpf_cc", set())))
        return "namespaces", (
            f"namespace rack: this machine's kernel ({platform.release()}) has everything "
            "the experiment needs" + (f" ({as_bpf}: registered as BPF)" if as_bpf else "")
        )
    return "vm", (
        f"VM rack (Debian's stock kernel under qemu): this machine's kernel "
        f"({platform.release()}) lacks {', '.join(missing)}"
    )


def running_kind(inventory: Path) -> str | None:
    import yaml

    if not inventory.exists():
        return None
    data = yaml.safe_load(inventory.read_text()) or {}
    kind = (data.get("all", {}).get("vars") or {}).get("trialbed_rack_kind")
    return {"virtual": "namespaces", "vm": "vm"}.get(kind)


def vm_calibration(rack: Rack) -> dict[str, Any] | None:
    """The VM rack's calibration (None on another rack, or before one was made)."""
    vm = rack.vars.get("trialbed_vm")
    if rack.vars.get("trialbed_rack_kind") != "vm" or not vm:
        return None
    path = Path(vm["record"]).with_name("calibration.json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def vm_max_rate(rack: Rack) -> str | None:
    """The highest rate the VM rack carried faithfully at its calibration."""
    return (vm_calibration(rack) or {}).get("max_faithful_rate")


def vm_record(rack: Rack) -> dict[str, Any] | None:
    """For a VM rack: the VM as rack-up recorded it, its calibration, and its clock's offset
    from the controller's, measured and stepped away before the trial (None on another
    rack). Every capture point is in the VM, so OWD needs no correction; T0 and the start
    times come from the controller's clock."""
    vm = rack.vars.get("trialbed_vm")
    if rack.vars.get("trialbed_rack_kind") != "vm" or not vm:
        return None
    record: dict[str, Any] = {}
    try:
        record = json.loads(Path(vm["record"]).read_text())
    except (OSError, ValueError, KeyError) as exc:
        record = {"error": f"no VM record: {exc}"}
    record["calibration"] = vm_calibration(rack)
    done = subprocess.run(
        [
            str(PROJECT_DIR / ".venv/bin/python"),
            str(VM_CLOCK),
            vm["address"],
            rack.vars["ansible_ssh_private_key_file"],
            vm["known_hosts"],
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ},
        timeout=60,
    )
    record["clock_at_trial"] = (
        json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-300:]}
    )
    return record
