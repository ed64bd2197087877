"""The virtual rack's daemons run on every CPU of the machine.

On the controller, Mitogen pins the processes it starts to CPUs (ansible_mitogen/affinity.py)
and every child inherits the mask: on a 2-CPU machine a module run on localhost, and whatever
it starts, may use CPU 1 only. Inherited by the rack's sshd and qemu, that put every command of
a trial (delay line, iperf3, tcpdump) on one CPU, and both of the VM's vCPUs on the same one
(measured: each vCPU thread got 45 % of a core while the guest was busy).
"""

from __future__ import annotations

import os
from pathlib import Path


def every_cpu() -> set[int]:
    return set(range(os.cpu_count() or 1))


def unpin(pid: int = 0) -> None:
    """Let a thread (0: the calling one; a child inherits its mask) run on every CPU."""
    os.sched_setaffinity(pid, every_cpu())


def unpin_process(pid: int) -> list[int]:
    """Every thread of a running process; the CPUs it may use afterwards."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            unpin(int(task.name))
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
    return sorted(os.sched_getaffinity(pid))
