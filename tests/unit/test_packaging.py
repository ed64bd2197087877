"""trialbed installs like a tool: the `trialbed` command make setup puts in the venv lists the
subcommands, and requirements.txt is the lock of pyproject.toml's dependencies (each declared
pin in it as declared, every package pinned with hashes: what `make lock` writes)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = ("run", "batch", "report", "results", "record", "nightly", "preflight", "status")


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", requirement.split("==")[0].strip()).lower()


def declared() -> dict[str, str]:
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    pins = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    assert all("==" in p for p in pins), pins  # pinned exactly
    return {_name(p): p.split("==")[1].strip() for p in pins}


def locked() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of every package requirements.txt pins."""
    out, current = {}, None
    for line in (PROJECT / "requirements.txt").read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line):
            current = _name(m[1])
            out[current] = (m[2], 0)
        elif "--hash=sha256:" in line and current:
            version, hashes = out[current]
            out[current] = (version, hashes + 1)
    return out


def test_the_lock_holds_every_declared_pin_and_hashes_for_every_package():
    lock = locked()
    for name, version in declared().items():
        assert lock.get(name, (None,))[0] == version, f"{name}: make lock after changing it"
    assert all(hashes for _, hashes in lock.values()), lock
    assert "invoke" not in declared()  # fabric's own: pinned by the lock alone
    assert "duckdb" in declared() and "fabric" in lock and "invoke" in lock


def test_the_trialbed_command_lists_its_subcommands():
    command = Path(sys.executable).parent / "trialbed"
    assert command.exists(), f"{command}: make setup installs it"
    done = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listed = re.search(r"\{([a-z,-]+)\}", done.stdout)
    assert listed and set(SUBCOMMANDS) <= set(listed[1].split(",")), done.stdout
