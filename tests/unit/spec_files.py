"""Experiment files written for a test, and the error a bad one gets (shared by the schema
tests: test_spec, test_marking, test_rio)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trials.plan import load_plan
from trials.spec import SpecError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str, sets: tuple[str, ...] = ()) -> str:
    """The message loading `text` fails with, on one line; it must name the file."""
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as exc:
        load_plan(path, sets)
    message = " ".join(str(exc.value).split())
    assert str(path) in message  # every message names the file
    return message
