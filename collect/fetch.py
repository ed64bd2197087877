"""Pull a trial's files from the hosts into results/, verified against their sha256 sums.

A file counts as collected only when the sum computed on the host equals the sum of the
local copy; only then is the host's copy removed. The trial's MANIFEST.sha256 lists every
file of the trial directory (sha256sum format: `sha256sum -c MANIFEST.sha256` checks it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from core.command import command, script
from core.layout import MANIFEST, sha256_file
from core.rack import Rack, RackError


class CollectError(RuntimeError):
    """A file could not be brought back intact."""


# sha256sum's lines for the regular files in $1 (nothing when it does not exist).
_SUMS_IN = (
    'test -d "$1" && cd "$1" && find . -maxdepth 1 -type f -printf \'%P\\0\' '
    "| sort -z | xargs -0 -r sha256sum"
)


def remote_sums(rack: Rack, host: str, remote_dir: str) -> dict[str, str]:
    """sha256 of every regular file in remote_dir, computed on the host."""
    out = rack.run(host, script(_SUMS_IN, remote_dir), check=False)
    sums = {}
    for line in out.splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.lstrip("*")] = digest
    return sums


def pull_host(
    rack: Rack,
    host: str,
    remote_dir: str,
    local_dir: Path,
    *,
    remove_remote: bool = True,
    attempts: int = 2,
) -> dict[str, str]:
    """Copy every file of remote_dir into local_dir; return {name: sha256}. A full local
    disk is a CollectError saying where the host keeps its copies."""
    sums = remote_sums(rack, host, remote_dir)
    for name, digest in sums.items():
        local = local_dir / name
        for attempt in range(1, attempts + 1):
            try:
                rack.get(host, f"{remote_dir}/{name}", local)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                raise CollectError(
                    f"the results disk is full ({shutil.disk_usage(local_dir).free} bytes free "
                    f"in {local_dir.parent}): {host} keeps its copies in {remote_dir}"
                ) from None
            if sha256_file(local) == digest:
                break
            if attempt == attempts:
                raise CollectError(
                    f"{host}:{remote_dir}/{name}: sha256 of the copy differs "
                    f"after {attempts} attempts; the host's copy is kept"
                )
    if remove_remote and sums:
        # The local copies are verified; a leftover remote copy loses nothing.
        with contextlib.suppress(RackError):
            rack.run(host, command("rm", "-rf", remote_dir))
    return sums


def write_manifest(trial_dir: Path) -> Path:
    """sha256 of every file under trial_dir (except the manifest itself)."""
    lines = [
        f"{sha256_file(p)}  {p.relative_to(trial_dir).as_posix()}"
        for p in sorted(trial_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    ]
    manifest = trial_dir / MANIFEST
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def manifest_entries(trial_dir: Path) -> dict[str, str]:
    """The trial's manifest as {file name: sha256}."""
    entries = {}
    for line in (trial_dir / MANIFEST).read_text().splitlines():
        if line:
            digest, name = line.split(maxsplit=1)
            entries[name] = digest
    return entries


def verify_manifest(trial_dir: Path) -> list[str]:
    """Names of files whose sum no longer matches the manifest (empty when intact)."""
    return [
        name
        for name, digest in manifest_entries(trial_dir).items()
        if not (trial_dir / name).is_file() or sha256_file(trial_dir / name) != digest
    ]


def write_whole(path: Path, text: str) -> None:
    """Write ``path`` beside it, then rename it into place: a full disk leaves the old file
    whole (or none), never one cut short."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        partial.write_text(text)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
