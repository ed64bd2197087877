"""The suite's order, and the VM rack booting while the first tests run.

The tests that need no rack (analysis, unit) run first; the VM rack's module next; then every
other test that builds namespaces or measures timing (delay line, edge marker, the end-to-end
tests), in their usual order. When the VM rack's module is selected (`make test-long`; `make
test` leaves it out: marker long), its rack-up (minutes under TCG, one host CPU) runs in the
background during the first group, whose tests measure no timing, and so does the module's
first batch once the rack is up.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import vm_boot

TESTS = Path(__file__).resolve().parent
NO_RACK = {"analysis", "unit", "test_rack_kind.py"}
VM_MODULE = "test_vm_rack.py"


def suite_group(item: pytest.Item) -> int:
    parts = Path(item.path).relative_to(TESTS).parts
    if parts[0] in NO_RACK:
        return 0
    return 1 if parts[-1] == VM_MODULE else 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=suite_group)  # stable: each group keeps its files' order


@pytest.fixture(scope="session", autouse=True)
def vm_rack_boots_meanwhile(request, tmp_path_factory):
    """Start the VM rack's rack-up when the session will run its module; take the rack down
    at the end if that module never took it over."""
    wanted = any(suite_group(item) == 1 for item in request.session.items)
    ready = wanted and vm_boot.missing() is None
    boot = vm_boot.start(tmp_path_factory, first_batch=True) if ready else None
    yield
    if boot:
        boot.abandon()
