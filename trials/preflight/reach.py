"""Whether each host answers over SSH, and, for one that does not, what went wrong and what
to check."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import paramiko

from core.command import command
from core.rack import Rack, RackError


def reachability(rack: Rack, names: list[str]) -> tuple[list[str], list[str]]:
    """Run `true` on every host at once: the hosts that answered, and one line per host that
    did not, saying what to check."""
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        futures = {n: pool.submit(answers, rack, n) for n in names}
    answered, problems = [], []
    for name, future in futures.items():
        try:
            future.result()
            answered.append(name)
        except RackError as exc:
            problems.append(ssh_problem(rack, name, exc))
    return answered, problems


def answers(rack: Rack, name: str) -> None:
    """`true` on the host, within 30 s."""
    rack.run(name, command("true"), timeout=30)


def ssh_problem(rack: Rack, name: str, exc: RackError) -> str:
    """What went wrong reaching a host over SSH, and what to check."""
    host = rack.host(name)
    ssh = host.ssh
    port = f":{ssh.port}" if ssh.port not in (None, 22) else ""
    through = (
        f" through {', '.join(h.host for h in ssh.jump)} (ProxyJump)"
        if ssh.jump
        else (f" through ProxyCommand {ssh.proxy_command!r}" if ssh.proxy_command else "")
    )
    where = f"host {name} ({host.user}@{host.address}{port}{through})"
    cause = exc.__cause__
    key = ssh.key
    if isinstance(cause, paramiko.AuthenticationException):
        return (
            f"{where}: the SSH key {key or '(none: set ansible_ssh_private_key_file)'} was "
            f"refused. Check that {key + '.pub' if key else 'its public key'} is in "
            f"~{host.user}/.ssh/authorized_keys there, and that sshd may read it: with "
            "StrictModes it refuses keys below a group- or world-writable directory (a rack "
            "whose checkout is under /tmp)"
        )
    known = host.vars.get("trialbed_known_hosts") or ssh.known_hosts
    if isinstance(cause, FileNotFoundError):
        return (
            f"{where}: {cause.filename} does not exist (trialbed_known_hosts or "
            "ansible_ssh_private_key_file in the inventory): write it first, e.g. "
            f"ssh-keyscan {host.address} >> {known or '~/.ssh/known_hosts'} for the host key"
        )
    if "not found in known_hosts" in str(cause):  # paramiko's RejectPolicy: an unknown key
        port = f"-p {ssh.port} " if ssh.port else ""
        return (
            f"{where}: its host key is in none of "
            f"{known or '~/.ssh/known_hosts, /etc/ssh/ssh_known_hosts'}, and Ansible's "
            f"host_key_checking refuses an unknown key: add it (ssh-keyscan {port}"
            f"{host.address} >> {known or '~/.ssh/known_hosts'}, once you trust it), or turn "
            "host_key_checking off for Ansible and the runner alike"
        )
    if isinstance(cause, paramiko.BadHostKeyException) or "known_hosts" in str(cause):
        return (
            f"{where}: its host key is not the one in {known or 'known_hosts'}. If the host was "
            "reinstalled, remove its old line there and add the new key (ssh-keyscan); "
            "otherwise something else answers at that address"
        )
    return (
        f"{where} is unreachable over SSH ({cause or exc}). Check the address (ansible_host), "
        f"that the host is up and its sshd listens (port {ssh.port or 22}: ansible_port), "
        + ("the jump host or proxy, " if through else "")
        + "and the management network"
    )
