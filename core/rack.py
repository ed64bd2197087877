"""The rack as the inventory describes it, and SSH access to its hosts through Fabric.

The runner reaches hosts only through this module, so a virtual rack, a rack inside a VM and
a physical rack differ in their inventory alone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shlex
import socket
import subprocess
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from fabric import Connection

from core.command import Command, command
from core.inventory import host_problems
from core.layout import PROJECT_DIR
from core.remote_shell import (
    DEFAULT_PYTHON,
    DEFAULT_SHELL,
    ShellSettingError,
    for_login_shell,
    shell_settings,
)
from core.ssh_options import SshOptionError, SshOptions, ansible_host_key_checking, ssh_options

DEFAULT_INVENTORY = PROJECT_DIR / "inventory" / "virtual" / "hosts.yml"
# ssh's known hosts files when no UserKnownHostsFile is given (ssh_config(5)).
SSH_KNOWN_HOSTS = (
    "~/.ssh/known_hosts",
    "~/.ssh/known_hosts2",
    "/etc/ssh/ssh_known_hosts",
    "/etc/ssh/ssh_known_hosts2",
)


class RackError(RuntimeError):
    """The rack cannot do what was asked (unreachable host, missing inventory, ...)."""


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    user: str
    groups: tuple[str, ...]  # every group it is in, parents first (core.rack.group_chain)
    workdir: str
    interfaces: Mapping[str, ipaddress.IPv4Interface]
    vars: Mapping[str, Any] = field(repr=False)
    ssh: SshOptions = field(default_factory=SshOptions, repr=False)
    shell: str = DEFAULT_SHELL  # the POSIX shell that runs the runner's commands
    python: str = DEFAULT_PYTHON
    shell_problem: str | None = None  # why the two cannot be used (said on the first command)

    def login_command(self, command: Command) -> str:
        """``command`` (built by core.command) as this host's login shell must receive it
        (core.remote_shell)."""
        if self.shell_problem:
            raise RackError(self.shell_problem)
        return for_login_shell(command, self.shell, self.python)

    def interface_towards(self, address: ipaddress.IPv4Address) -> str | None:
        """The interface whose subnet holds `address` (None when not directly attached)."""
        for name, itf in self.interfaces.items():
            if address in itf.network:
                return name
        return None

    def experiment_address(self) -> ipaddress.IPv4Address:
        if len(self.interfaces) != 1:
            raise RackError(
                f"host {self.name} has {len(self.interfaces)} experiment interfaces; "
                "an end host needs exactly one"
            )
        return next(iter(self.interfaces.values())).ip


def group_chain(data: dict[str, Any], groups: list[str]) -> list[str]:
    """Every group a host is in (``groups``: the ones that list it) and their parents, as
    Ansible counts membership, from `all` down: by depth (the longest path from `all`: a
    parent before its children), then name, the order in which Ansible merges their vars.
    ``data``: `ansible-inventory --list --export`."""
    parents: dict[str, set[str]] = {}
    for group, body in data.items():
        for child in body.get("children", []) if isinstance(body, dict) else []:
            parents.setdefault(child, set()).add(group)

    def depth(group: str, seen: frozenset[str] = frozenset()) -> int:
        up = parents.get(group, set()) - seen
        return 0 if group == "all" or not up else 1 + max(depth(p, seen | {group}) for p in up)

    chain, todo = {"all"}, list(groups)
    while todo:
        group = todo.pop()
        if group not in chain:
            chain.add(group)
            todo += parents.get(group, ())
    return sorted(chain, key=lambda g: (depth(g), g))


def group_vars(data: dict[str, Any], chain: list[str]) -> dict[str, Any]:
    """The variables a host gets from its groups (``chain``: group_chain's), merged as Ansible
    merges them: each group's vars (its group_vars/ included) over its parents'."""
    merged: dict[str, Any] = {}
    for group in chain:
        body = data.get(group)
        merged.update((body.get("vars") or {}) if isinstance(body, dict) else {})
    return merged


class Rack:
    """Hosts from an Ansible inventory; SSH sessions to them on demand."""

    def __init__(self, inventory: list[Path], hosts: dict[str, Host], all_vars: dict[str, Any]):
        self.inventory = inventory
        self.hosts = hosts
        self.vars = all_vars
        self._connections: dict[str, Connection] = {}

    @classmethod
    def load(cls, inventory: list[Path] | None = None) -> Rack:
        inventory = inventory or [DEFAULT_INVENTORY]
        for path in inventory:
            if not path.exists():
                hint = (
                    " (run `make rack-up` to build the virtual rack)"
                    if path == DEFAULT_INVENTORY
                    else " (check INVENTORY= or -i; a lab rack's starts as a copy of "
                    "inventory/lab.example/)"
                )
                raise RackError(f"{path}: inventory not found{hint}")
        cmd = [str(PROJECT_DIR / ".venv/bin/ansible-inventory"), "--list", "--export"]
        for path in inventory:
            cmd += ["-i", str(path)]
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "ANSIBLE_CONFIG": str(PROJECT_DIR / "ansible.cfg")},
        )
        if done.returncode != 0:
            raise RackError(f"ansible-inventory failed: {done.stderr.strip()}")
        data = json.loads(done.stdout)
        hostvars = data.get("_meta", {}).get("hostvars", {})
        groups_of: dict[str, list[str]] = {}
        for group, body in data.items():
            for name in body.get("hosts", []) if isinstance(body, dict) else []:
                groups_of.setdefault(name, []).append(group)
        all_vars = data.get("all", {}).get("vars", {})
        hosts = {}
        checking = ansible_host_key_checking(PROJECT_DIR / "ansible.cfg")
        files = ", ".join(map(str, inventory))
        merged_vars = {}
        for name, hv in hostvars.items():
            chain = group_chain(data, groups_of.get(name, []))
            merged_vars[name] = chain, {**group_vars(data, chain), **hv}
        problems = [
            f"{files}: host {name}: {problem}"
            for name, (chain, merged) in merged_vars.items()
            for problem in host_problems(name, merged, chain)
        ]
        if problems:  # before any host is asked anything
            raise RackError("\n".join(problems))
        for name, (chain, merged) in merged_vars.items():
            # of two, the one Ansible reads last
            address = merged.get("ansible_ssh_host") or merged.get("ansible_host") or name
            where = f"host {name} ({', '.join(map(str, inventory))})"
            try:
                ssh = ssh_options(merged, address, where, checking)
            except SshOptionError as exc:
                raise RackError(str(exc)) from None
            try:  # a bad one is said when the host is first asked to run a command: a
                # localhost entry's "{{ ansible_playbook_python }}" must not stop the rack
                shell, python, shell_problem = *shell_settings(merged, where), None
            except ShellSettingError as exc:
                shell, python, shell_problem = DEFAULT_SHELL, DEFAULT_PYTHON, str(exc)
            hosts[name] = Host(
                name=name,
                address=address,
                user=ssh.user,
                # a group's members include its child groups' (freebsd_hosts under
                # testbed_hosts): parents first, as experiments layer hosts.<group> settings
                groups=tuple(g for g in chain if g != "all"),
                workdir=merged.get("trialbed_dir", "/var/lib/trialbed"),
                interfaces={
                    k: ipaddress.IPv4Interface(v["address"])
                    for k, v in (merged.get("trialbed_interfaces") or {}).items()
                },
                vars=merged,
                ssh=ssh,
                shell=shell,
                python=python,
                shell_problem=shell_problem,
            )
        return cls(inventory, hosts, all_vars)

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise RackError(
                f"host {name!r} is not in the inventory "
                f"({', '.join(map(str, self.inventory))}); it has: "
                f"{', '.join(sorted(self.hosts))}"
            ) from None

    def interface_with_address(self, address: str) -> tuple[Host, str] | None:
        """The host and interface that own an experiment address, if any."""
        for host in self.hosts.values():
            for name, itf in host.interfaces.items():
                if str(itf.ip) == address:
                    return host, name
        return None

    def connection(self, name: str) -> Connection:
        """The host's SSH connection (opened at its first use, then kept), as its inventory
        variables say (core.ssh_options): port, user, key, a ProxyJump or ProxyCommand, its
        known hosts. Each ProxyJump host is reached with the host's own key and known hosts."""
        if name not in self._connections:
            host = self.host(name)
            ssh = host.ssh
            kwargs: dict[str, Any] = {"look_for_keys": False, "allow_agent": False}
            if ssh.key:  # ~ as Ansible reads it (paramiko takes paths literally)
                kwargs["key_filename"] = os.path.expanduser(ssh.key)
            gateway: Connection | str | None = ssh.proxy_command
            for hop in ssh.jump:  # the first hop first: each later one through it
                gateway = self._trusting(
                    host,
                    _Connection(
                        hop.host,
                        user=hop.user,  # None: ssh_config's or the local user, as ssh -J
                        port=hop.port,
                        connect_kwargs=dict(kwargs),
                        connect_timeout=15,
                        gateway=gateway,
                    ),
                )
            conn = self._trusting(
                host,
                _Connection(
                    host.address,
                    user=host.user,
                    port=ssh.port,
                    connect_kwargs=kwargs,
                    connect_timeout=15,
                    gateway=gateway,
                ),
            )
            self._connections[name] = conn
        return self._connections[name]

    @staticmethod
    def _trusting(host: Host, conn: Connection) -> Connection:
        """conn failing fast, trusting the host keys the inventory names. trialbed_known_hosts
        (the project's: it must exist) refuses every key it lacks, as Ansible here does
        (host_key_checking, which mitogen enforces over the inventory's arguments). Else, with
        Ansible's host_key_checking off, any key, as mitogen takes it (it reads no known hosts
        file then). Else the UserKnownHostsFile ones that exist, or with none given ssh's own
        (SSH_KNOWN_HOSTS), all read and never written, refusing an unknown key unless
        StrictHostKeyChecking is no or accept-new (a changed key is always refused). Fabric's
        default took any key: it reads no known hosts file and adds every key."""
        conn.open = _failing_fast(conn.open, conn)  # type: ignore[method-assign]
        ours = host.vars.get("trialbed_known_hosts")
        if ours:
            conn.client.load_host_keys(os.path.expanduser(ours))
            conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
            return conn
        if not host.ssh.host_key_checking:
            conn.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
            return conn
        files = shlex.split(host.ssh.known_hosts) if host.ssh.known_hosts else SSH_KNOWN_HOSTS
        for path in files:
            if os.path.exists(os.path.expanduser(path)):  # as ssh: a missing file holds none
                _read_known_hosts(conn.client.get_host_keys(), os.path.expanduser(path))
        accept = (host.ssh.strict or "").lower() in ("no", "off", "accept-new")
        conn.client.set_missing_host_key_policy(
            paramiko.AutoAddPolicy() if accept else paramiko.RejectPolicy()
        )
        return conn

    def run(
        self, name: str, command: Command, *, check: bool = True, timeout: float | None = 120
    ) -> str:
        """Run a command (built by core.command) on a host; return stdout. A failure names the
        host and command."""
        shown = command if len(command) < 160 else command[:150] + " ..."
        try:
            result = self.connection(name).run(
                self.host(name).login_command(command), hide=True, warn=True, timeout=timeout,
                in_stream=False,
            )  # fmt: skip
        except Exception as exc:  # paramiko/socket errors: name the host
            raise RackError(f"{name}: cannot run {shown!r}: {exc}") from exc
        if check and result.exited != 0:
            raise RackError(
                f"{name}: {shown!r} exited {result.exited}: "
                f"{(result.stderr or result.stdout).strip()[-800:]}"
            )
        return result.stdout

    def run_parallel(
        self, commands: Mapping[str, Command], *, check: bool = True
    ) -> dict[str, str]:
        """Run one command per host concurrently (one SSH session each)."""
        with ThreadPoolExecutor(max_workers=max(1, len(commands))) as pool:
            futures = {
                name: pool.submit(self.run, name, cmd, check=check)
                for name, cmd in commands.items()
            }
            return {name: f.result() for name, f in futures.items()}

    def get(self, name: str, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        self.connection(name).get(remote, str(local))

    def put(self, name: str, local: Path, remote: str) -> None:
        self.run(name, command("mkdir", "-p", str(Path(remote).parent)))
        self.connection(name).put(str(local), remote)

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()


def _read_known_hosts(keys: paramiko.HostKeys, path: str) -> None:
    """The keys of one known_hosts file into ``keys``, which is never saved: a line paramiko
    cannot take (@cert-authority, @revoked, a key type it lacks) is passed over, where its own
    HostKeys.load fails on the whole file. A host presenting a certificate is refused."""
    with open(path, errors="replace") as lines:
        for line in lines:
            line = line.strip()
            if not line or line.startswith(("#", "@")):
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
            except Exception:  # SSHException, InvalidHostKey, bad base64: passed over
                continue
            for name in entry.hostnames if entry is not None else ():
                keys.add(name, entry.key.get_name(), entry.key)


class _Connection(Connection):
    """Fabric's Connection, running a ProxyCommand as ssh does (``/bin/sh -c "exec ..."``, the
    command as written: Fabric's own would split it without a shell and expand %h and ~ in it
    again), and ending on close what it started: the proxy's process, reaped, and the
    connection to the jump host before it (Fabric closes neither)."""

    _proxy: paramiko.ProxyCommand | None = None

    def open_gateway(self) -> Any:
        if isinstance(self.gateway, str):
            command = shlex.join(["/bin/sh", "-c", f"exec {self.gateway}"])
            self._proxy = paramiko.ProxyCommand(command)
            return self._proxy
        return super().open_gateway()

    def close(self) -> None:
        transport = self.client.get_transport()
        super().close()
        if self._proxy is not None:
            process, self._proxy = self._proxy.process, None
            if transport is not None:  # its thread ends by closing the proxy: SIGTERM
                transport.join(timeout=5)
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        if isinstance(self.gateway, Connection):
            self.gateway.close()


# A host whose link goes down (a cable pulled, a host hung) must fail a call within seconds:
# without this, opening a channel to it waited for TCP's retransmissions (about 15 minutes),
# since neither Fabric's command timeout nor paramiko's channel open covers that wait.
UNACKED_LIMIT_MS = 15_000  # data unacknowledged this long ends the connection
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 5, 3, 3  # idle: about 14 s


def _failing_fast(open_connection: Any, conn: Connection) -> Any:
    """Wrap Connection.open: once open, its TCP socket gives up on an unreachable peer, and
    sends each small SSH message at once (Nagle's wait for the peer's delayed ACK added about
    40 ms to every channel a command opens)."""

    def opened(*args: Any, **kwargs: Any) -> Any:
        result = open_connection(*args, **kwargs)
        sock = getattr(conn.client.get_transport(), "sock", None)
        if isinstance(sock, socket.socket):  # not through a ProxyCommand or ProxyJump
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, UNACKED_LIMIT_MS)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return result

    return opened
