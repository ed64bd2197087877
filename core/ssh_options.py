"""How the runner reaches a host over SSH, read from the inventory variables Ansible's ssh
connection reads: port, user and key (VARIABLES), then the options in ansible_ssh_args,
ansible_ssh_common_args and ansible_ssh_extra_args, the first value of each option winning as
in ssh(1) (Ansible puts port, key and user before the arguments).

The runner (paramiko, through Fabric) honours the options that decide where it connects and
whom it trusts: Port, User, IdentityFile, ProxyJump, ProxyCommand, UserKnownHostsFile,
StrictHostKeyChecking. Options that only shape how OpenSSH keeps or logs a
connection are left to Ansible (IGNORED). Any other option is refused with the host, the
variable and these lists: the runner would otherwise reach a host other than Ansible's, or in
another way, without a word.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean

HONOURED = (
    "Port",
    "User",
    "IdentityFile",
    "ProxyJump",
    "ProxyCommand",
    "UserKnownHostsFile",
    "StrictHostKeyChecking",
)
# How OpenSSH shares, keeps alive, times, logs or authenticates a connection: the runner keeps
# its own connection per host, with its own keepalive and timeouts (core/rack.py), and
# authenticates with the key alone.
IGNORED = (
    "ConnectTimeout",
    "ControlMaster",
    "ControlPersist",
    "ControlPath",
    "ServerAliveInterval",
    "ServerAliveCountMax",
    "TCPKeepAlive",
    "LogLevel",
    "Compression",
    "IdentitiesOnly",
    "BatchMode",
    "PasswordAuthentication",
    "KbdInteractiveAuthentication",
    "PreferredAuthentications",
    "GSSAPIAuthentication",
    "PubkeyAuthentication",
    "ForwardAgent",
    "HashKnownHosts",
    "CheckHostIP",
    "UpdateHostKeys",
    "ConnectionAttempts",
)
_BY_LOWER_NAME = {n.lower(): n for n in HONOURED + IGNORED}
# ssh(1) flags: the ones that set an option, and the ones without effect on where or whom.
_FLAG_OPTIONS = {"-p": "Port", "-l": "User", "-i": "IdentityFile", "-J": "ProxyJump"}
_QUIET_FLAGS = {"-q", "-v", "-vv", "-vvv", "-C", "-T", "-x", "-a", "-4", "-A"}
# Ansible's variables for a setting, in the order its ssh plugin reads them (the last wins),
# all placed before the arguments on its ssh command line (so they win over those).
VARIABLES = {
    "Port": ("ansible_port", "ansible_ssh_port"),
    "User": ("ansible_user", "ansible_ssh_user"),
    "IdentityFile": ("ansible_private_key_file", "ansible_ssh_private_key_file"),
}
ARG_VARIABLES = ("ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args")


class SshOptionError(ValueError):
    """An option in a host's SSH arguments the runner cannot honour."""


@dataclass(frozen=True)
class Hop:
    """One ProxyJump host: [user@]host[:port]."""

    host: str
    user: str | None = None
    port: int | None = None


@dataclass(frozen=True)
class SshOptions:
    port: int | None = None  # None: ssh_config's, else 22
    user: str = "root"
    key: str | None = None
    jump: tuple[Hop, ...] = ()  # hosts to go through, first to last
    proxy_command: str | None = None  # %h, %p, %r expanded; run by /bin/sh as ssh runs it
    known_hosts: str | None = None  # UserKnownHostsFile
    strict: str | None = None  # StrictHostKeyChecking as given (yes, no, accept-new, ...)
    host_key_checking: bool = True  # Ansible's: False takes an unknown key


def _words(text: Any, where: str, variable: str) -> list[str]:
    if text is None:
        return []
    if not isinstance(text, str):
        raise SshOptionError(f"{where}: {variable} must be a string of ssh arguments")
    if "{{" in text or "{%" in text:  # ansible-inventory --export gives variables unrendered
        raise SshOptionError(
            f"{where}: {variable} is a template ({text!r}); the runner reads it as written: "
            "give the arguments themselves"
        )
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise SshOptionError(f"{where}: {variable}: {exc} in {text!r}") from None


def _pairs(words: list[str], where: str, variable: str) -> list[tuple[str, str]]:
    """(option, value) pairs from ssh(1) arguments: -o Name=value, -oName=value, -o "Name
    value", and the flags of _FLAG_OPTIONS."""
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        flag, attached = word[:2], word[2:]
        if word in _QUIET_FLAGS:
            i += 1
            continue
        if flag == "-o" or flag in _FLAG_OPTIONS:
            value = attached
            if not value:
                if i + 1 >= len(words):
                    raise SshOptionError(f"{where}: {variable}: {word} without a value")
                i += 1
                value = words[i]
            if flag == "-o":  # Name=value or "Name value": split at the first of them
                name, rest = [*re.split(r"\s*=\s*|\s+", value.strip(), maxsplit=1), ""][:2]
                pairs.append((name, rest))
            else:
                pairs.append((_FLAG_OPTIONS[flag], value))
            i += 1
            continue
        raise SshOptionError(
            f"{where}: {variable}: the runner cannot honour the ssh argument {word!r}; it "
            f"takes -o options, {', '.join(_FLAG_OPTIONS)} and {', '.join(sorted(_QUIET_FLAGS))}"
        )
    return pairs


def _hop(text: str, where: str) -> Hop:
    """[user@]host[:port] or ssh://[user@]host[:port] (ssh(1) -J)."""
    rest = text.removeprefix("ssh://")
    user, _, rest = rest.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):  # [v6 address]:port
        host, _, tail = rest[1:].partition("]")
        port = tail.removeprefix(":") or None
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    if not host or (port is not None and not port.isdigit()):
        raise SshOptionError(f"{where}: ProxyJump {text!r} is not [user@]host[:port]")
    return Hop(host, user or None, int(port) if port else None)


def _expand(command: str, host: str, port: int, user: str) -> str:
    """ssh_config(5)'s tokens of a ProxyCommand: %h, %p, %r, %%."""
    out, i = [], 0
    while i < len(command):
        if command[i] == "%" and i + 1 < len(command):
            token = command[i + 1]
            out.append({"h": host, "p": str(port), "r": user, "%": "%"}.get(token, "%" + token))
            i += 2
        else:
            out.append(command[i])
            i += 1
    return "".join(out)


def _flag(value: Any) -> bool | None:
    """An Ansible boolean as Ansible reads it (yes, no, true, off, 1, ...); None if not one."""
    try:
        return boolean(value, strict=True)  # a string lowered and stripped first
    except TypeError:
        return None


def ansible_host_key_checking(config: Path) -> bool:
    """Ansible's host_key_checking before any inventory variable: ANSIBLE_SSH_HOST_KEY_CHECKING,
    else ANSIBLE_HOST_KEY_CHECKING (where both are set, Ansible takes the first), else
    ``config`` (the project's ansible.cfg, which every playbook runs with), else True."""
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
    parser.read(config)
    given = [
        os.environ.get(n) for n in ("ANSIBLE_SSH_HOST_KEY_CHECKING", "ANSIBLE_HOST_KEY_CHECKING")
    ]
    given += [
        parser.get(s, "host_key_checking", fallback=None) for s in ("ssh_connection", "defaults")
    ]
    return next((f for f in map(_flag, given) if f is not None), True)


def ssh_options(
    variables: dict[str, Any], address: str, where: str, host_key_checking: bool = True
) -> SshOptions:
    """The SSH options of a host from its merged inventory variables (``where`` names the
    host and inventory in errors). Of two variables for one setting, the one Ansible reads
    last wins (ansible_ssh_port over ansible_port, ...). ``host_key_checking``: Ansible's
    setting from its environment and ansible.cfg (ansible_host_key_checking), unless the
    host's variables set it."""
    given: dict[str, str] = {}
    for name, aliases in VARIABLES.items():
        for variable in aliases[::-1]:
            if variables.get(variable) not in (None, ""):
                given[name] = str(variables[variable])
                break
    for variable in ARG_VARIABLES:
        for name, value in _pairs(
            _words(variables.get(variable), where, variable), where, variable
        ):
            known = _BY_LOWER_NAME.get(name.lower())  # option names are case-insensitive
            if known is None:
                raise SshOptionError(
                    f"{where}: {variable}: the runner cannot honour the ssh option {name!r}; "
                    f"it honours {', '.join(HONOURED)} and leaves {', '.join(IGNORED)} to "
                    "Ansible"
                )
            if known in HONOURED:
                given.setdefault(known, value)
    try:
        port = int(given["Port"]) if "Port" in given else None
    except ValueError:
        raise SshOptionError(f"{where}: port {given['Port']!r} is not a number") from None
    user = given.get("User", "root")
    for variable in ("ansible_ssh_host_key_checking", "ansible_host_key_checking"):
        if (flag := _flag(variables.get(variable))) is not None:
            host_key_checking = flag
            break
    # ProxyJump and ProxyCommand: whichever comes first is the one (ssh_config(5))
    proxy = next((k for k in given if k in ("ProxyJump", "ProxyCommand")), None)
    value = given.get(proxy or "", "none")
    if value.lower() == "none":
        proxy = None
    return SshOptions(
        port=port,
        user=user,
        key=given.get("IdentityFile"),
        jump=tuple(_hop(h, where) for h in value.split(",")) if proxy == "ProxyJump" else (),
        proxy_command=_expand(value, address, port or 22, user)
        if proxy == "ProxyCommand"
        else None,
        known_hosts=given.get("UserKnownHostsFile"),
        strict=given.get("StrictHostKeyChecking"),
        host_key_checking=host_key_checking,
    )
