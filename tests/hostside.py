"""The project's host-side programs (hostside/) for the tests: imported by path as a host runs
them (core.hostside.load_program), so that a test checks the very file the hosts get."""

from __future__ import annotations

from types import ModuleType

from core.hostside import load_program


def load(path: str) -> ModuleType:
    """hostside/`path` as a module (one module per file: loading it again returns it)."""
    return load_program(path)
