"""Run the project's playbooks against the rack's inventory plus a trial's host variables."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from core.link_rules import CONFIGURE_TAGS
from core.rack import PROJECT_DIR

_RECAP = re.compile(
    r"^(?P<host>\S+)\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.M,
)


class PlaybookError(RuntimeError):
    """A playbook failed; the message carries the failing part of its output."""


def configure_tags(applied: dict[str, Any] | None, wanted: dict[str, Any]) -> set[str] | None:
    """The configure.yml tags that take a host from `applied` to `wanted` (its variables, each
    tagged by core/link_rules.py's CONFIGURE_TAGS); None when the whole playbook must run
    (nothing known to be applied, or a variable without a tag changed)."""
    if applied is None:
        return None
    tags = set()
    for key in applied.keys() | wanted.keys():
        if applied.get(key) != wanted.get(key):
            if key not in CONFIGURE_TAGS:
                return None
            tags.add(CONFIGURE_TAGS[key])
    return tags


def write_host_vars(path: Path, host_vars: dict[str, dict]) -> Path:
    """An inventory overlay holding only host variables (added as a second -i source)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"all": {"hosts": host_vars}}, sort_keys=True))
    return path


def failure_lines(output: str) -> list[str]:
    """Each failed task's host line and its message (the YAML callback puts it below)."""
    lines = output.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith(("fatal:", "failed:")):
            out.append(line)
            msg = next(
                (
                    j
                    for j in range(i + 1, min(i + 40, len(lines)))
                    if lines[j].lstrip().startswith("msg:")
                ),
                None,
            )
            if msg is not None:
                out += [lines[msg].strip()] + [
                    m.strip() for m in lines[msg + 1 : msg + 4] if m.startswith("        ")
                ]
    return out


def run_playbook(
    playbook: str,
    inventory: list[Path],
    log: Path,
    extra_args: tuple[str, ...] = (),
    unreachable_ok: bool = False,
) -> dict[str, dict[str, int]]:
    """Run a playbook, log its output, return the recap {host: {ok, changed, unreachable,
    failed}}. With `unreachable_ok`, hosts that did not answer (and nothing else) are left to
    the caller, who finds them in the recap."""
    cmd = [
        str(PROJECT_DIR / ".venv/bin/ansible-playbook"),
        str(PROJECT_DIR / "playbooks" / playbook),
    ]
    for path in inventory:
        cmd += ["-i", str(path)]
    cmd += list(extra_args)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(PROJECT_DIR / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
    }
    done = subprocess.run(
        cmd, capture_output=True, text=True, env=env, check=False, stdin=subprocess.DEVNULL
    )
    text = f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}\n"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(text)
    except OSError:  # e.g. the results disk full: the playbook ran, its log goes elsewhere
        with tempfile.NamedTemporaryFile(
            "w", prefix=f"trialbed-{log.stem}-", suffix=".log", delete=False
        ) as f:
            f.write(text)
        log = Path(f.name)
    recap = {
        m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"}
        for m in _RECAP.finditer(done.stdout)
    }
    # ansible-playbook exits 4 when hosts were unreachable (2 when a task failed).
    only_unreachable = done.returncode == 4 and not any(r["failed"] for r in recap.values())
    if done.returncode != 0 and not (unreachable_ok and only_unreachable):
        detail = (
            "\n".join(failure_lines(done.stdout)[-12:])
            or (done.stderr or done.stdout).strip()[-1500:]
        )
        raise PlaybookError(f"ansible-playbook {playbook} failed (log: {log}):\n{detail}")
    return recap
