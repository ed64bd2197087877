"""Filters that list the project's host-side programs (hostside/) for role remote_daemons,
which ships them: the files and their sha256 come from core/hostside.py, as the runner sees
them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

# core/hostside.py of this checkout, by path, and the core it imports (core.command) from this
# checkout too, ahead of any other on the path: another `core` (an editable install of another
# checkout) must not stand in for it.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
_spec = importlib.util.spec_from_file_location(
    "trialbed_hostside_core", Path(__file__).resolve().parents[2] / "core/hostside.py"
)
hostside = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hostside)


def hostside_files(root: str) -> list[dict]:
    """Every file the folder `root` ships: its path in the folder, its path here, its mode on
    the host (0755 where it is executable here, else 0644) and its sha256."""
    top = Path(root).resolve()
    return [
        {
            "path": path,
            "src": str(top / path),
            "mode": "0755" if (top / path).stat().st_mode & 0o111 else "0644",
            "sha256": digest,
        }
        for path, digest in hostside.shipped_files(top).items()
    ]


def hostside_folders(root: str, dest: str) -> list[str]:
    """`dest` and each of its folders that will hold a file `root` ships, parents first."""
    folders = {""}
    for path in hostside.shipped_files(Path(root).resolve()):
        parts = path.split("/")[:-1]
        folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return [f"{dest}/{folder}" if folder else dest for folder in sorted(folders)]


def hostside_sums(root: str) -> str:
    """SHA256SUMS of what `root` ships (sha256sum's format)."""
    return hostside.sums_text(hostside.shipped_files(Path(root).resolve()))


def hostside_sha256(path: str, root: str | None = None) -> str:
    """The sha256 of the file `path` of the folder (default: the project's hostside/)."""
    top = Path(root).resolve() if root else hostside.SOURCE
    try:
        return hostside.shipped_files(top)[path]
    except KeyError:
        raise AnsibleFilterError(f"{top}: ships no file {path!r}") from None


def hostside_folder_files(folder: str) -> list[str]:
    """The paths, relative to `folder`, of the files the folder of hostside/ ships."""
    try:
        return list(hostside.folder_files(folder))
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from None


def hostside_folder_sha256(folder: str) -> str:
    """One sha256 for the files of a folder of hostside/ (a program built from several)."""
    try:
        return hostside.folder_sha256(folder)
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from None


class FilterModule:
    def filters(self):
        return {
            "trialbed_hostside_files": hostside_files,
            "trialbed_hostside_folders": hostside_folders,
            "trialbed_hostside_sums": hostside_sums,
            "trialbed_hostside_sha256": hostside_sha256,
            "trialbed_hostside_folder_files": hostside_folder_files,
            "trialbed_hostside_folder_sha256": hostside_folder_sha256,
        }
