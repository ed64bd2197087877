"""Which process is a VM rack's qemu: the one started with the rack's pid file.

The pid file names it while the rack's state directory exists. A checkout deleted (or
cleaned) with its VM rack up takes the pid file with it, while qemu runs on: it is then
found by its own command line (``-pidfile <path>``), so that a rack-down elsewhere can still
end it, by its pid.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

QEMU = "qemu-system-x86_64"


def _started_with(pid: int, pidfile: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    wanted = str(pidfile).encode()
    return (
        bool(argv)
        and argv[0].decode(errors="replace").endswith(QEMU)
        and any(a == b"-pidfile" and b == wanted for a, b in pairwise(argv))
    )


def qemu_pid(pidfile: Path) -> int | None:
    """The pid of the qemu started with ``pidfile``: the one the file names, else (the file
    gone) the one whose command line names it; None when no such qemu runs."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None:
        return pid if _started_with(pid, pidfile) else None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _started_with(int(entry.name), pidfile):
            return int(entry.name)
    return None
