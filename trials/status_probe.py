"""Runs ON a rack host (sent over SSH as source, standard library only): prints a JSON object
with what the host is doing now: per experiment interface its qdiscs and classes with their
counters (`tc -s -j`), the delay backend the router role recorded and whether its delay line
and NFQUEUE rules are in place, the daemons of trialbed running there, and trial directories
left behind (a trial's files are removed once the controller has verified its copy), and
the host's own settings that configure recorded before changing them (teardown gives them
back). Reads only; `python -m trials status` renders it."""

import glob
import json
import os
import subprocess
import sys


def run_json(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True).stdout
        return json.loads(out) if out.strip() else []
    except (OSError, ValueError):
        return None


def run_text(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True).stdout
    except OSError:
        return None


def alive(pidfile):
    """The pid of a trialbed-daemon pid file ("pid starttime") if that process still runs."""
    try:
        with open(pidfile) as f:
            pid, start = f.read().split()[:2]
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    return int(pid) if stat[19] == start and stat[0] != "Z" else None


def main(workdir, interfaces):
    router = os.path.join(workdir, "router")
    backend = None
    try:
        with open(os.path.join(router, "delay_backend.json")) as f:
            backend = json.load(f)
    except (OSError, ValueError):
        pass
    try:
        rules = subprocess.run(["iptables", "-t", "mangle", "-S"], capture_output=True, text=True)
        rules = rules.stdout
    except OSError:  # no iptables (a FreeBSD router)
        rules = ""
    daemons = []
    for pidfile in sorted(glob.glob(f"{workdir}/**/*.pid", recursive=True)):
        pid = alive(pidfile)
        if pid is not None:
            name = os.path.basename(pidfile)[: -len(".pid")]
            daemons.append({"name": name, "pid": pid, "dir": os.path.dirname(pidfile)})
    # testbed_host's record of the host's own settings: present from the first configure until
    # teardown gave them back.
    try:
        with open(os.path.join(workdir, "baseline.json")) as f:
            own = json.load(f)
    except (OSError, ValueError):
        own = None
    leftovers = sorted(
        os.path.relpath(d, workdir) for d in glob.glob(f"{workdir}/trials/*/*") if os.path.isdir(d)
    )
    print(
        json.dumps(
            {
                "qdiscs": {
                    i: run_json(["tc", "-s", "-j", "qdisc", "show", "dev", i]) for i in interfaces
                },
                # iproute2 6.1 prints HTB classes as text even with -j.
                "classes": {i: run_text(["tc", "class", "show", "dev", i]) for i in interfaces},
                "delay_backend": backend,
                "nfqueue_rules": sum("NFQUEUE" in line for line in rules.splitlines()),
                "daemons": daemons,
                "leftover_trials": leftovers,
                "own_settings": own,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
