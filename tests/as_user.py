"""Run a piece of Python as another user of this machine from wherever the checkout lives. The
child starts as root, so it can import the project and its .venv and read the checkout's files
even where that user cannot (a clone in root's 0700 home); it becomes the user, all its ids and
no supplementary groups, when the code calls become_the_user(). Tests that use it are marked
`changes_user` (pyproject.toml), which tests/unit/test_checkout_anywhere.py runs from such a
clone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]

BECOME = """\
import os as _os, pwd as _pwd


def become_the_user():
    _user = _pwd.getpwnam({user!r})
    _os.setgroups([])
    _os.setresgid(_user.pw_gid, _user.pw_gid, _user.pw_gid)
    _os.setresuid(_user.pw_uid, _user.pw_uid, _user.pw_uid)


"""


def run_as(
    user: str, code: str, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run `code` (python -c, with `args`) in `cwd`, a directory `user` may enter: as root up
    to its call of become_the_user(), as `user` after. The project is on its import path,
    whatever the working directory."""
    if "become_the_user()" not in code:
        raise ValueError("the code must call become_the_user() once it has read what it needs")
    base = env if env is not None else dict(os.environ)
    path = os.pathsep.join(p for p in (str(PROJECT), base.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", BECOME.format(user=user) + code, *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, stdin=subprocess.DEVNULL,
        env={**base, "PYTHONPATH": path},
    )  # fmt: skip
