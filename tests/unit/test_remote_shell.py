"""Commands reach the host's POSIX shell unchanged whatever the login shell: each is run here
as sshd runs it (``<login shell> -c <command>``) by every login shell this machine has,
csh and tcsh included (FreeBSD 13's root shell), and must print what ``sh -c`` prints."""

from __future__ import annotations

import shutil
import signal
import subprocess

import pytest

from core.hostside import PROBES, SOURCE
from core.program_source import program_source
from core.rack import Rack, RackError
from core.remote_shell import for_login_shell, shell_settings

LOGIN_SHELLS = [s for s in ("sh", "bash", "dash", "zsh", "csh", "tcsh", "fish") if shutil.which(s)]

COMMANDS = {
    "multi-line python": "python3 -c 'import sys\nprint(\"args\", sys.argv[1:])\n' a 'b c'",
    "bang": "echo 'a!b' \"x!\"",
    "quotes and $": 'X=1; echo "$X" \'$HOME\' "it\'s"',
    "sh syntax": "echo $(echo sub) 2>/dev/null; false || echo or; printf '%s\\n' 1 2 | wc -l",
    "exit status": "echo out; exit 3",
    "background": "(sleep 0.01; echo late) & wait; echo done",
    "backslash": "printf '%s\\n' 'a\\b' \"c\\\\d\"",
    # through the host's Python (a newline): signals ignored as sh's are (Python ignores
    # SIGPIPE and SIGXFSZ, and an exec keeps that)
    "signals": "awk '/SigIgn/ {print $2}' /proc/self/status\n",
}


def test_a_source_as_long_as_host_facts_goes_through_tcsh():
    """FreeBSD's csh is tcsh, which takes a word as long as the host facts' text (about 50 kB
    with the core modules it carries). Debian's csh (4.4BSD's) would not ("Word too long"): no
    lab host runs it."""
    facts = program_source(SOURCE / PROBES["host_facts"])
    command = "python3 -c 'import sys\nprint(len(sys.argv))' a b\n# " + "x" * len(facts) + "\n"
    got = subprocess.run(["tcsh", "-c", for_login_shell(command)], capture_output=True, text=True)
    assert (got.returncode, got.stdout) == (0, "3\n"), got.stderr


def test_the_strict_shells_are_here():
    assert {"csh", "tcsh"} <= set(LOGIN_SHELLS), "make setup installs csh and tcsh"
    # what the runner used to send: csh refuses it
    raw = subprocess.run(["tcsh", "-c", COMMANDS["multi-line python"]], capture_output=True)
    assert raw.returncode != 0 and b"Unmatched" in raw.stderr
    raw = subprocess.run(["tcsh", "-c", "echo 'a!b'"], capture_output=True)
    assert b"Event not found" in raw.stderr


@pytest.mark.parametrize("login", LOGIN_SHELLS)
@pytest.mark.parametrize("what", COMMANDS)
def test_every_login_shell_passes_the_command_on_unchanged(login, what):
    command = COMMANDS[what]
    # Both started as sshd starts a session: SIGHUP at its default. Under nohup (a test run
    # started so) sh keeps SIGHUP ignored and csh does not, a difference no session has.
    as_sshd = {"capture_output": True, "text": True, "preexec_fn": _sighup_default}
    want = subprocess.run(["/bin/sh", "-c", command], **as_sshd)
    got = subprocess.run([login, "-c", for_login_shell(command)], **as_sshd)
    assert (got.stdout, got.returncode) == (want.stdout, want.returncode), got.stderr


def test_only_what_needs_it_pays_a_python_start():
    assert for_login_shell("tc -s qdisc show") == "/bin/sh -c 'tc -s qdisc show'"
    assert for_login_shell("a\nb", "/usr/local/bin/bash", "/usr/local/bin/python3.11").startswith(
        '/usr/local/bin/python3.11 -c "import base64,os,signal as s;s.signal(s.SIGPIPE,s.SIG_DFL);'
    )


def test_shell_settings_come_from_ansible_and_bad_ones_are_named():
    with pytest.raises(ValueError, match="ansible_shell_executable is 'bash'; the runner takes "
                       "a plain absolute path"):  # fmt: skip
        shell_settings({"ansible_shell_executable": "bash"}, "h")
    assert shell_settings({}, "host R") == ("/bin/sh", "python3")
    assert shell_settings({"ansible_python_interpreter": "auto_silent"}, "h") == (
        "/bin/sh",
        "python3",
    )
    given = {"ansible_shell_executable": "/usr/local/bin/bash",
             "ansible_python_interpreter": "/usr/local/bin/python3.11"}  # fmt: skip
    assert shell_settings(given, "h") == ("/usr/local/bin/bash", "/usr/local/bin/python3.11")
    with pytest.raises(ValueError, match=r"host R \(inv\): ansible_shell_executable is "
                       r"'\{\{ sh \}\}'; the runner takes a plain absolute path"):  # fmt: skip
        shell_settings({"ansible_shell_executable": "{{ sh }}"}, "host R (inv)")


def test_an_unusable_setting_is_named_when_the_host_is_first_asked(tmp_path):
    """The inventory loads (a localhost entry's templated interpreter must not stop a rack);
    the host's first command names the host, the inventory and the variable."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    R:\n      ansible_host: 198.18.0.1\n"
        '      ansible_python_interpreter: "/usr/bin/python3 -u"\n'
    )
    rack = Rack.load([inventory])
    with pytest.raises(RackError, match=r"host R \(.*hosts.yml\): ansible_python_interpreter is "
                       r"'/usr/bin/python3 -u'"):  # fmt: skip
        rack.run("R", "true")


def _sighup_default() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
