"""`trials nightly run` without --rack (the virtual rack, as `make nightly-install` without
RACKS= schedules it): it reaches the rack it should bring up with the kind asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

import trials.__main__ as cli
from trials import commands, nightly

PROJECT = Path(__file__).resolve().parents[2]


class RackUp(Exception):
    pass


@pytest.mark.parametrize("kind", [None, "namespaces", "vm"])
def test_nightly_run_on_the_virtual_rack_brings_up_the_rack_kind_asked(tmp_path, monkeypatch, kind):
    asked = []

    def ensure_virtual_rack(topology, rack_kind="namespaces"):
        asked.append((topology, rack_kind))
        raise RackUp  # no rack is brought up here

    monkeypatch.setattr(commands, "ensure_virtual_rack", ensure_virtual_rack)
    monkeypatch.setattr(
        nightly, "dated_batch", lambda exp: tmp_path / "nightly" / "smoke" / "today"
    )
    monkeypatch.delenv("RACK", raising=False)
    argv = ["nightly", "run", str(PROJECT / "experiments/smoke.yml")]
    with pytest.raises(RackUp):  # it crashed here without --rack (no rack_kind for nightly)
        cli.main(argv + (["--rack-kind", kind] if kind else []))
    (topology, chosen) = asked[0]
    assert topology == "dumbbell" and chosen == (kind or chosen) and chosen in ("namespaces", "vm")


@pytest.mark.parametrize("planted", [False, True])
def test_the_nightly_run_says_a_change_in_report_txt_and_its_exit_status(
    tmp_path, monkeypatch, planted
):
    """Tonight's batch (run_batch stood in for: it ran fine) is catalogued, tested against the
    nights before it, and the verdict goes into report.txt, the page and the exit status:
    nightly.CHANGE_FOUND when a metric changed, 0 when none did."""
    import pandas as pd

    from analysis.dataset import add_batch
    from core.layout import BatchDir
    from tests.analysis.test_regressions import nightly_series

    monkeypatch.delenv("TRIALBED_CATALOG", raising=False)
    made = nightly_series(tmp_path, [0, 0, 0, -30 if planted else 0])
    tonight = made[-1]
    monkeypatch.setattr(nightly, "NIGHTLY_DIR", tonight.parent.parent)
    monkeypatch.setattr(nightly, "dated_batch", lambda exp: tonight)
    monkeypatch.setattr(commands, "run_batch", lambda args: 0)
    # its trials have no captures to analyse again: the batch as it is goes to the catalog
    monkeypatch.setattr(commands, "analyse_batch", lambda b: (add_batch(b), pd.DataFrame())[1])
    code = cli.main(["nightly", "run", str(PROJECT / "experiments/smoke.yml")])
    assert code == (nightly.CHANGE_FOUND if planted else 0)
    text = BatchDir(tonight).report_text.read_text()
    assert f"Regressions: nightly/smoke/{tonight.name} against the baseline" in text
    said = "verdict: CHANGED: 1 metric(s)" if planted else "verdict: no change found"
    assert said in text
    page = (BatchDir(tonight).report / "index.html").read_text()
    assert ("Changed: 1 metric(s)" in page) == planted
