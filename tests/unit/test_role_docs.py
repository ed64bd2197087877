"""Each role's README lists every variable its entry points declare, with the default its
defaults/main.yml gives; a variable set in defaults but declared nowhere is a defect."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(PROJECT / "scripts"))

import role_docs  # noqa: E402

ROLES = role_docs.roles()


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_the_readme_is_generated_from_the_current_specs(role):
    readme = role / "README.md"
    assert readme.exists(), f"{readme} is missing: run make docs"
    assert readme.read_text() == role_docs.render(role), f"{readme} is stale: run make docs"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_default_is_declared_and_described(role):
    assert role_docs.undeclared_defaults(role) == []
    readme = (role / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    assert rows and not [r for r in rows if r.endswith("|  |")]  # every variable has a meaning


def test_a_role_variable_shows_its_unit_and_default():
    readme = (PROJECT / "roles/linux_router/README.md").read_text()
    (row,) = [
        line for line in readme.splitlines() if line.startswith("| `linux_router_links[].rate`")
    ]
    assert "kbit" in row and "mbps is refused" in row
    (row,) = [line for line in readme.splitlines() if line.startswith("| `linux_router_htb_burst`")]
    assert "`1600b`" in row
