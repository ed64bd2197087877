#!/usr/bin/python
"""Ansible module: every virtual-rack host's sshd, in one call.

Each host gets its own host key, and an sshd that runs inside the host's network namespace and
a UTS namespace of its own (so that the host has its own hostname). All hosts share one
sshd_config; what differs per host (listen address, host key, pid file) is given on sshd's
command line, so the command line says which host an sshd serves. A running sshd with the
expected command line is left alone unless `restart` says the shared configuration changed.
The module waits until every sshd it started accepts connections, all hosts at once.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.virtual_rack_cpus import unpin, unpin_process

DOCUMENTATION = r"""
module: virtual_rack_sshd
short_description: Host keys and sshd processes of the virtual rack's hosts
options:
  topology: {description: The topology (hosts with their management address)., type: dict,
             required: true}
  prefix: {description: Prefix of the namespace names., type: str, default: ""}
  state_dir: {description: The rack's state directory (hosts/<name>/ per host)., type: path,
              required: true}
  config: {description: The shared sshd_config., type: path, required: true}
  restart: {description: Restart every sshd (the shared configuration changed)., type: bool,
            default: false}
  timeout: {description: Seconds to wait for the sshds started., type: float, default: 20}
"""

SSHD = "/usr/sbin/sshd"


class Host:
    def __init__(self, name: str, namespace: str, address: str, state_dir: str, config: str):
        self.name = name
        self.namespace = namespace
        self.address = address
        self.dir = Path(state_dir) / "hosts" / self.name
        self.key = self.dir / "ssh_host_ed25519_key"
        self.pidfile = self.dir / "sshd.pid"
        self.argv = [
            SSHD,
            *("-f", config),
            *("-o", f"ListenAddress={self.address}:22"),
            *("-o", f"HostKey={self.key}"),
            *("-o", f"PidFile={self.pidfile}"),
        ]

    def pid(self) -> int | None:
        """The pid of this host's sshd if it runs with the expected command line."""
        try:
            pid = int(self.pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            return None
        # sshd rewrites its process title to "sshd: <command line> [listener] ...".
        return pid if " ".join(self.argv) in cmdline else None

    def stale_pid(self) -> int | None:
        """An sshd of this host with another command line (e.g. an old address)."""
        try:
            pid = int(self.pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            return None
        return pid if "sshd" in cmdline and f"PidFile={self.pidfile}" in cmdline else None


def stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 2
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)


def accepts(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=0.5):
            return True
    except OSError:
        return False


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "topology": {"type": "dict", "required": True},
            "prefix": {"type": "str", "default": ""},
            "state_dir": {"type": "path", "required": True},
            "config": {"type": "path", "required": True},
            "restart": {"type": "bool", "default": False},
            "timeout": {"type": "float", "default": 20.0},
        },
        supports_check_mode=True,
    )
    p = module.params
    hosts = [
        Host(name, p["prefix"] + name, spec["mgmt"], p["state_dir"], p["config"])
        for name, spec in p["topology"]["hosts"].items()
    ]
    changes: list[str] = []
    check = module.check_mode

    def run(*args: str) -> str:
        rc, out, err = module.run_command(list(args))
        if rc != 0:
            module.fail_json(msg=f"{' '.join(args)} failed: {(err or out).strip()}", rc=rc)
        return out

    for host in hosts:
        if not host.key.exists():
            changes.append(f"{host.name}: host key")
            if not check:
                host.dir.mkdir(parents=True, exist_ok=True)
                run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f",
                    str(host.key))  # fmt: skip

    started = []
    if not check:
        os.makedirs("/run/sshd", exist_ok=True)
        unpin()  # the sshd started below, and every command of a trial, use every CPU
    for host in hosts:
        pid = host.pid()
        if pid and not p["restart"]:
            if not check:
                unpin_process(pid)  # one started pinned by an earlier version
            continue
        old = pid or host.stale_pid()
        changes.append(f"{host.name}: sshd {'restarted' if old else 'started'}")
        if check:
            continue
        if old:
            stop(old)
        host.pidfile.unlink(missing_ok=True)
        run(
            "ip", "netns", "exec", host.namespace, "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$1" && shift && exec "$@"', "sh", host.name, *host.argv,
        )  # fmt: skip
        started.append(host)

    deadline = time.monotonic() + p["timeout"]
    waiting = list(started)
    while waiting:
        waiting = [h for h in waiting if not accepts(h.address)]
        if waiting and time.monotonic() > deadline:
            module.fail_json(
                msg=f"sshd does not answer after {p['timeout']:.0f} s on: "
                + ", ".join(f"{h.name} ({h.address}:22)" for h in waiting)
            )
        if waiting:
            time.sleep(0.05)

    keys = {}
    for host in hosts:
        pub = host.key.with_name(host.key.name + ".pub")
        if pub.exists():
            keys[host.name] = pub.read_text().split()[:2]
    module.exit_json(
        changed=bool(changes),
        changes=changes,
        host_keys={name: " ".join(key) for name, key in keys.items()},
        diff={"before": "", "after": "\n".join(changes) + "\n"} if changes else {},
    )


if __name__ == "__main__":
    main()
