"""A trial's captures go as soon as its analysis has read them, without the cycle collector."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from analysis import trial

from .trialgen import write_trial


def test_a_trials_captures_go_without_the_cycle_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a capture makes no reference cycle: each scan of a trial's analysis is freed
    as soon as the analyses have taken what they keep of it, before the next capture is read
    and before the tables are written (a cycle kept every capture of a trial until the
    cyclic collector ran, and a process analysing trials one after another grew by hundreds
    of MB per trial)."""
    generated = write_trial(tmp_path / "t", packets=6000)
    scans: list[weakref.ref] = []
    alive_at_next: list[int] = []
    real = trial.scan

    def kept(*args, **kwargs):
        alive_at_next.append(sum(r() is not None for r in scans))
        cap = real(*args, **kwargs)
        scans.append(weakref.ref(cap))
        return cap

    monkeypatch.setattr(trial, "scan", kept)
    gc.disable()
    try:
        trial.analyse_trial(generated.dir)
        assert len(scans) == 2 and alive_at_next == [0, 0]
        assert all(r() is None for r in scans)
    finally:
        gc.enable()
