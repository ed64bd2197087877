"""A command for a host, as its login shell must receive it, whatever that shell is.

The runner's commands are POSIX sh: pipes, ``2>/dev/null``, ``$(...)``, multi-line
``python3 -c`` sources. sshd hands a command to the user's login shell, and on a FreeBSD 13
host root's is csh: csh refuses a newline inside quotes ("Unmatched '"), knows neither ``2>``
nor ``$(...)``, and expands ``!`` even inside single quotes ("Event not found"). So every
command goes to the host's POSIX shell, as Ansible sends its own (``/bin/sh -c '...'``, or
``ansible_shell_executable``): single-quoted, which a login shell passes on unchanged, when
it holds no newline, ``!`` or backslash (fish reads ``\\`` and ``\'`` in single quotes); else
base64-encoded and handed to that shell by the host's Python (``ansible_python_interpreter``,
or python3), which Ansible needs on every host too. Only those commands pay the Python
start. tests/unit/test_remote_shell.py runs them under sh, bash, dash, csh and tcsh.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping
from typing import Any

_PATH = re.compile(r"[\w./+-]+", re.ASCII)
DEFAULT_SHELL = "/bin/sh"
DEFAULT_PYTHON = "python3"


class ShellSettingError(ValueError):
    """A host's shell or Python setting the runner cannot use."""


def shell_settings(variables: Mapping[str, Any], where: str) -> tuple[str, str]:
    """(POSIX shell, Python) of a host, from its Ansible variables; a value that is not a
    plain path is refused, naming ``where`` (the host and its inventory) and the variable."""
    shell = variables.get("ansible_shell_executable") or DEFAULT_SHELL
    python = variables.get("ansible_python_interpreter") or DEFAULT_PYTHON
    if isinstance(python, str) and python.startswith("auto"):  # Ansible's discovery
        python = DEFAULT_PYTHON
    for key, value in (("ansible_shell_executable", shell), ("ansible_python_interpreter", python)):
        absolute = key == "ansible_shell_executable"  # Python's execv searches no PATH
        if (
            not isinstance(value, str)
            or not _PATH.fullmatch(value)
            or (absolute and not value.startswith("/"))
        ):
            raise ShellSettingError(
                f"{where}: {key} is {value!r}; the runner takes a plain "
                f"{'absolute ' if absolute else ''}path (letters, digits and . / + - _), not a "
                "templated or quoted value"
            )
    return shell, python


def for_login_shell(command: str, shell: str = DEFAULT_SHELL, python: str = DEFAULT_PYTHON) -> str:
    """``command`` run by ``shell``, written so that any login shell passes it on unchanged."""
    if not any(c in command for c in "\n!\\"):
        return f"{shell} -c {shlex.quote(command)}"
    encoded = base64.b64encode(command.encode()).decode()  # [A-Za-z0-9+/=]: no shell reads it
    # Python ignores SIGPIPE and SIGXFSZ and execv would pass that on: put them back first
    return (
        f'{python} -c "import base64,os,signal as s;s.signal(s.SIGPIPE,s.SIG_DFL);'
        f"s.signal(s.SIGXFSZ,s.SIG_DFL);os.execv('{shell}',['{shell}','-c',"
        f"base64.b64decode('{encoded}').decode()])\""
    )
