"""`trials nightly run` without --rack (the virtual rack, as `make nightly-install` without
RACKS= schedules it): it reaches the rack it should bring up with the kind asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

import trials.__main__ as cli
from trials import nightly

PROJECT = Path(__file__).resolve().parents[2]


class RackUp(Exception):
    pass


@pytest.mark.parametrize("kind", [None, "namespaces", "vm"])
def test_nightly_run_on_the_virtual_rack_brings_up_the_rack_kind_asked(tmp_path, monkeypatch, kind):
    asked = []

    def ensure_virtual_rack(topology, rack_kind="namespaces"):
        asked.append((topology, rack_kind))
        raise RackUp  # no rack is brought up here

    monkeypatch.setattr(cli, "ensure_virtual_rack", ensure_virtual_rack)
    monkeypatch.setattr(
        nightly, "dated_batch", lambda exp: tmp_path / "nightly" / "smoke" / "today"
    )
    monkeypatch.delenv("RACK", raising=False)
    argv = ["nightly", "run", str(PROJECT / "experiments/smoke.yml")]
    with pytest.raises(RackUp):  # it crashed here without --rack (no rack_kind for nightly)
        cli.main(argv + (["--rack-kind", kind] if kind else []))
    (topology, chosen) = asked[0]
    assert topology == "dumbbell" and chosen == (kind or chosen) and chosen in ("namespaces", "vm")
