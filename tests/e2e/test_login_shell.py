"""A lab host whose login shell is not POSIX: FreeBSD 13's root logs in to csh (tcsh), and
FreeBSD keeps a uid-0 `toor` account for another shell. On the test rack a uid-0 user of this
machine with tcsh logs in (the rack's sshd reads this machine's /etc/passwd): the runner's
commands (a multi-line python3 -c, `2>/dev/null`, `$(...)`, `!`) print what they print for
root under bash, preflight reads the host's facts, and Ansible (mitogen) runs a module. Sent
as they were before core/remote_shell.py, tcsh refused three of four and silently misread
the fourth (`2>` is an argument and a redirect of stdout there)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import yaml

from core.rack import Rack
from tests.e2e.conftest import ad_hoc
from trials.preflight import host_facts

pytestmark = pytest.mark.rack

USER = "trialbed-toor"
COMMAND = 'python3 -c "import sys\nprint(sys.argv[1:])" x; echo a!b 2>/dev/null; echo $(id -u)'


@pytest.fixture
def tcsh_root():
    """A uid-0 account of this machine whose login shell is tcsh (removed afterwards)."""
    tcsh = shutil.which("tcsh")
    assert tcsh, "make setup installs tcsh"
    remove_the_account()  # a killed run's
    subprocess.run(
        ["useradd", "-o", "-u", "0", "-g", "0", "-M", "-d", "/root", "-s", tcsh, USER],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        # '*': no password logs in (only the rack's key), but the account is not locked,
        # whose key sshd would refuse
        subprocess.run(["usermod", "-p", "*", USER], check=True, capture_output=True)
        yield tcsh
    finally:
        remove_the_account()


def remove_the_account() -> None:
    """Remove USER if it is there, and make sure it is gone."""
    for _ in range(10):
        if subprocess.run(["getent", "passwd", USER], capture_output=True).returncode:
            return
        # -f: the uid is root's, whose processes userdel would otherwise count as the user's;
        # it exits 10 while another program holds /etc/passwd's lock
        subprocess.run(["userdel", "-f", USER], capture_output=True)
        time.sleep(0.5)
    raise AssertionError(f"cannot remove the account {USER}: remove it by hand (userdel -f)")


def test_a_tcsh_login_runs_the_runners_commands_and_ansibles(test_rack, tmp_path, tcsh_root):
    overlay = tmp_path / "toor.yml"
    overlay.write_text(yaml.safe_dump({"all": {"vars": {"ansible_user": USER}}}))
    inventories = [test_rack.inventory, overlay]
    as_root = Rack.load([test_rack.inventory])
    as_toor = Rack.load(inventories)
    try:
        assert as_toor.run("A", "echo $SHELL").strip() == tcsh_root  # the login shell
        assert as_toor.run("A", COMMAND) == as_root.run("A", COMMAND) == "['x']\na!b\n0\n"
        # a 23-kB Python source, through the base64 path: the same facts but the free disk
        toor, root = host_facts(as_toor, ["A", "R"]), host_facts(as_root, ["A", "R"])
        for facts in (toor, root):
            for host in facts.values():
                del host["free_disk_bytes"]
        assert toor == root and toor["A"]["addresses"] and toor["R"]["tools"]
    finally:
        as_root.close()
        as_toor.close()
    done = ad_hoc(inventories, "A", "command", "printenv LOGNAME SHELL")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split()[-2:] == [USER, tcsh_root], done.stdout  # as USER, from tcsh
