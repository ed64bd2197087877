"""Check that the pinned Ansible collections (and ansible-core) are installed at the pinned
versions.

Exit 0 when every collection in requirements.yml is present at its version, 1 otherwise
(scripts/setup.sh then falls back to `ansible-galaxy collection install`). The preflight
(`make preflight`, every batch) asks `controller_problems` the same of ansible-core too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml


def installed_collections(galaxy: str) -> dict[str, str]:
    out = subprocess.run(
        [galaxy, "collection", "list", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    versions: dict[str, str] = {}
    # The first path listed wins, as it does for ansible-core's own lookup.
    for path_entries in json.loads(out).values():
        for name, info in path_entries.items():
            versions.setdefault(name, info["version"])
    return versions


def wrong_collections(requirements: Path) -> list[str]:
    wanted = yaml.safe_load(requirements.read_text())["collections"]
    galaxy = str(Path(sys.executable).with_name("ansible-galaxy"))
    have = installed_collections(galaxy)
    return [
        f"{c['name']} {have.get(c['name'], 'missing')} (want {c['version']})"
        for c in wanted
        if have.get(c["name"]) != c["version"]
    ]


def controller_problems(project: Path) -> list[str]:
    """ansible-core and the collections on this controller against the project's pins, one
    line each with the fix."""
    from ansible.release import __version__ as core

    problems = []
    pins = (project / "requirements.txt").read_text().splitlines()
    want = next(
        (ln.split("==")[1].split()[0] for ln in pins if ln.startswith("ansible-core==")), None
    )
    if want and core != want:
        problems.append(
            f"controller: ansible-core {core}, the project pins {want} (requirements.txt): "
            "run make setup"
        )
    wrong = wrong_collections(project / "requirements.yml")
    if wrong:
        problems.append(
            f"controller: Ansible collections not at the pinned version: {', '.join(wrong)} "
            "(requirements.yml): run make setup"
        )
    return problems


def main(argv: list[str]) -> int:
    requirements = Path(argv[0] if argv else "requirements.yml")
    wrong = wrong_collections(requirements)
    if wrong:
        print(f"{requirements}: collections not at the pinned version: {', '.join(wrong)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
