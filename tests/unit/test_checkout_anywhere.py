"""`make test` passes wherever a user clones, root's home included (mode 0700: the most natural
place on a fresh machine, and one no other user can read). The tests that run a child as
another user (marked changes_user, tests/as_user.py) are run again from a copy of this
checkout in a 0700 home directory, its .venv inside it, as CI would from such a clone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.as_user import run_as

PROJECT = Path(__file__).resolve().parents[2]
MARK = "changes_user"
OPEN_AS_NOBODY = """
import sys
become_the_user()
try:
    open(sys.argv[1])
except PermissionError:
    print("denied")
"""


def copy_checkout(to: Path) -> None:
    """The files a clone of this checkout has, as they are in this working tree: those git
    tracks and new ones it does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=PROJECT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        if name == ".venv":  # a link to a shared one (a git worktree's): made afresh below
            continue
        source = PROJECT / name
        if source.is_file() or source.is_symlink():  # not one deleted in the working tree
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name, follow_symlinks=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="the tests it runs switch to the user nobody")
@pytest.mark.skipif(not (PROJECT / ".git").exists(), reason="not a git checkout")
def test_the_tests_that_change_user_pass_from_a_checkout_in_a_private_home(tmp_path):
    home = tmp_path / "root"
    home.mkdir(mode=0o700)
    checkout = home / "trialbed"
    copy_checkout(checkout)
    (checkout / ".venv").symlink_to(Path(sys.prefix))  # `make setup` puts it in the checkout
    python = checkout / ".venv" / "bin" / Path(sys.executable).name
    done = run_as("nobody", OPEN_AS_NOBODY, str(checkout / "core/rack.py"), cwd=Path("/"))
    assert done.stdout.strip() == "denied", done.stdout + done.stderr  # the case in point
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the copy's modules only
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", MARK,
         f"--basetemp={tmp_path / 'inner'}", "tests"],
        cwd=checkout, capture_output=True, text=True, timeout=600, env=env,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert re.search(r"\b[1-9]\d* passed", summary) and "skipped" not in summary, summary
