"""hostside/bpf_tc's programs for the tests: built with the hosts' own build.sh and run on
crafted frames with BPF_PROG_TEST_RUN through the hosts' loader (`trialbed-bpf-tc run`):
root and the build tools, but no interface, namespace or rack."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.hostside import SOURCE

BPF_TC = SOURCE / "bpf_tc"
LOADER = "trialbed-bpf-tc"
LIBBPF_HEADER = Path("/usr/include/bpf/libbpf.h")


def missing() -> str | None:
    """Why the programs cannot be built and run here, or None."""
    if os.geteuid() != 0:
        return "needs root: loading a BPF program"
    lacking = [pkg for tool, pkg in (("clang", "clang"), ("cc", "gcc")) if not shutil.which(tool)]
    if not LIBBPF_HEADER.exists():
        lacking.append("libbpf-dev")
    if lacking:
        return f"building hostside/bpf_tc needs {', '.join(lacking)} (Debian packages)"
    return None


def build(out: Path, *programs: str) -> Path:
    """hostside/bpf_tc/build.sh OUT PROGRAMS...: the objects and the loader in `out`."""
    done = subprocess.run(
        ["sh", str(BPF_TC / "build.sh"), str(out), *programs], capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"build.sh {' '.join(programs)} failed:\n{done.stderr}")
    return out


@dataclass
class Run:
    verdicts: list[int]
    frames: list[bytes]
    summary: dict[str, Any]  # the loader's JSON: packets, params, stats, maps


def run(built: Path, program: str, packets: Iterable[tuple[int, bytes]], **params: object) -> Run:
    """Each (now_ns, frame) of `packets` through `program` loaded once with `params`."""
    src, out = built / f"{program}.in", built / f"{program}.out"
    with src.open("wb") as f:
        for now, frame in packets:
            f.write(struct.pack("<QI", now, len(frame)) + frame)
    args = [f"{k}={v}" for k, v in params.items()]
    done = subprocess.run(
        [str(built / LOADER), "run", str(built / f"{program}.bpf.o"), str(src), str(out), *args],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"{LOADER} run {program} {' '.join(args)}: {done.stderr}")
    data = out.read_bytes()
    verdicts, frames, at = [], [], 0
    while at < len(data):
        verdict, length = struct.unpack_from("<iI", data, at)
        verdicts.append(verdict)
        frames.append(data[at + 8 : at + 8 + length])
        at += 8 + length
    return Run(verdicts, frames, json.loads(done.stdout))
