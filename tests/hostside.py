"""The project's host-side programs (hostside/) for the tests: imported by path as a host runs
them, each a top-level module of its file's name with its folder importable (edge_marker.py
imports the markers.py beside it), so that a test checks the very file the hosts get."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from core.hostside import SOURCE


def load(path: str) -> ModuleType:
    """hostside/`path` as a module (one module per file: loading it again returns it)."""
    file = SOURCE / path
    loaded = sys.modules.get(file.stem)
    if loaded is not None and getattr(loaded, "__file__", None) == str(file):
        return loaded
    spec = importlib.util.spec_from_file_location(file.stem, file)
    assert spec and spec.loader, file
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module  # before it runs: dataclasses look their module up
    sys.path.insert(0, str(file.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[file.stem]
        raise
    finally:
        sys.path.remove(str(file.parent))
    return module
