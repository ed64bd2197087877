"""Check that the pinned Ansible collections are installed at the pinned versions.

Exit 0 when every collection in requirements.yml is present at its version, 1 otherwise
(scripts/setup.sh then falls back to `ansible-galaxy collection install`).
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


def main(argv: list[str]) -> int:
    requirements = Path(argv[0] if argv else "requirements.yml")
    wanted = yaml.safe_load(requirements.read_text())["collections"]
    galaxy = str(Path(sys.executable).with_name("ansible-galaxy"))
    have = installed_collections(galaxy)
    wrong = [
        f"{c['name']} {have.get(c['name'], 'missing')} (want {c['version']})"
        for c in wanted
        if have.get(c["name"]) != c["version"]
    ]
    if wrong:
        print(f"{requirements}: collections not at the pinned version: {', '.join(wrong)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
