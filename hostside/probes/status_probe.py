"""Runs ON a rack host (sent over SSH as source, standard library only, with the core modules
it imports inside: core/program_source.py): prints a JSON object with what the host is doing
now: per experiment interface its qdiscs and classes with their counters (`tc -s -j`), the
delay backend the router role recorded and whether its delay line and NFQUEUE rules are in
place, the daemons of trialbed running there, and trial directories left behind (a trial's
files are removed once the controller has verified its copy), and the host's own settings
that configure recorded before changing them (teardown gives them back). Reads only;
`python -m trials status` renders it.

On FreeBSD (a dummynet router, a FreeBSD end host) the same object, with "platform":
"FreeBSD", no tc: "dummynet" gives per experiment interface the dummynet pipe (or queue,
scheduler and pipe) that trialbed's ipfw rule sends its outgoing packets to, with its rate,
delay, queue limit, AQM and counters (freebsd_dummynet); for qdisc rio, approximated there by
two RED queues (IN and OUT, each fed by its own rule) on the link's pipe, both queues under
"rio" (freebsd_rio), "cc" the congestion control (`sysctl -n net.inet.tcp.cc.algorithm`);
"own_settings" merges the records of roles/freebsd_host and roles/freebsd_router. A command
missing or failing gives None."""

import glob
import json
import os
import platform
import shutil
import subprocess
import sys

# status.py sends this file with these modules inside (core/program_source.py): the host has
# no checkout. How ipfw's text reads, and the label of roles/freebsd_router's rio record where
# the record is not there to say it.
from core.ipfw_text import (
    DSCP_MATCH,
    FLOW_LINE,
    FLOWSET_LINE,
    LINK_LINE,
    RED_LINE,
    RULE_LINE,
    SCHED_LIMIT_LINE,
    SCHED_LINE,
    link_rate,
)
from core.link_rules import DUMMYNET_RIO_LABEL


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


def running_daemons(workdir, alive_pid):
    """The daemons whose pid files under workdir name a live process (alive_pid: the pid, or
    None), as {name, pid, dir}."""
    daemons = []
    for pidfile in sorted(glob.glob(f"{workdir}/**/*.pid", recursive=True)):
        pid = alive_pid(pidfile)
        if pid is not None:
            name = os.path.basename(pidfile)[: -len(".pid")]
            daemons.append({"name": name, "pid": pid, "dir": os.path.dirname(pidfile)})
    return daemons


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
    daemons = running_daemons(workdir, alive)
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


# -- FreeBSD ------------------------------------------------------------------------------
# Where FreeBSD keeps its system commands, searched after PATH (an SSH session's may lack
# /sbin), as in hostside/probes/host_facts.py.
FREEBSD_COMMAND_DIRS = ["/sbin", "/usr/sbin", "/bin", "/usr/bin", "/usr/local/sbin"]


def run_soft(argv):
    """argv's stdout; None where the command is missing, fails or hangs."""
    search = os.pathsep.join([os.environ.get("PATH", ""), *FREEBSD_COMMAND_DIRS])
    path = shutil.which(argv[0], path=search)
    if not path:
        return None
    try:
        done = subprocess.run([path, *argv[1:]], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def aqm_of(text):
    """droptail, red, gred, codel, pie (the roles' names) from a flowset's AQM words."""
    words = text.split()
    if not words:
        return None
    if words[0] == "droptail":
        return "droptail"
    if words[:2] == ["AQM", "CoDel"]:
        return "codel"
    if words[:3] == ["AQM", "type", "PIE"]:
        return "pie"
    return text.strip()


def parse_dummynet(text):
    """`ipfw pipe|sched|queue show` -> {"links": {N: {...}}, "flowsets": {N: {...}},
    "scheds": {N: {...}}}. A link (pipe, or a scheduler's link) has rate, delay_ms, the
    flowset, scheduler and counters printed under it; a flowset its queue size, AQM, sched
    and counters (flows under it before a link or sched line); a scheduler its type, limit
    (FQ_CODEL, FQ_PIE) and counters. Counters: packets, bytes, qlen, backlog, drops, summed
    over the flows; None where no flow line came (no packet yet)."""
    out = {"links": {}, "flowsets": {}, "scheds": {}}
    link = flowset = sched = None

    def counters(obj, values):
        for i, key in enumerate(("packets", "bytes", "qlen", "backlog", "drops")):
            obj[key] = (obj.get(key) or 0) + values[i]

    for line in (text or "").splitlines():
        found = LINK_LINE.match(line)
        if found:
            link = out["links"][int(found[1])] = {
                "rate": link_rate(found),
                "delay_ms": int(found[2]),
            }
            flowset = sched = None
            continue
        found = FLOWSET_LINE.match(line)
        if found:
            size, unit = found[2].split(" ", 1)
            flowset = {
                "queue": int(size),
                "queue_unit": {"KB": "KB", "B": "B", "sl.": "pkt"}[unit],
                "aqm": aqm_of(found[4]),
                "sched": int(found[3]),
            }
            out["flowsets"][int(found[1])] = flowset
            if link is not None and "flowset" not in link:
                link["flowset"] = flowset
            continue
        found = RED_LINE.match(line)
        if found and flowset is not None:
            flowset["aqm"] = "gred" if found[1] else "red"
            if found[2]:
                w_q, min_th, max_th, max_p = found.groups()[1:]
                flowset["red"] = {"w_q": float(w_q), "min_th": int(min_th),
                                  "max_th": int(max_th), "max_p": float(max_p)}  # fmt: skip
            continue
        found = SCHED_LINE.match(line)
        if found:
            sched = out["scheds"][int(found[1])] = {"type": found[2].lower(), "limit": None}
            if link is not None:
                link["sched"] = sched
                sched["link"] = link
            continue
        found = SCHED_LIMIT_LINE.match(line)
        if found and sched is not None:
            sched["limit"] = int(found[1])
            continue
        found = FLOW_LINE.match(line)
        if found and not line.lstrip().startswith(("q", "BKT")):
            values = [int(v) for v in found.groups()]
            owner = link if link is not None else flowset
            if owner is not None:
                counters(owner, values)
            if sched is not None and owner is not sched:
                counters(sched, values)
    return out


COUNTERS = ("packets", "bytes", "qlen", "backlog", "drops")


def rio_record(record, iface):
    """roles/freebsd_router's rio record of an interface (delay_backend.json "rio"), {}."""
    rio = record.get("rio") if isinstance(record, dict) else None
    found = rio.get(iface) if isinstance(rio, dict) else None
    return found if isinstance(found, dict) else {}


def rio_rules(iface, rules, record):
    """qdisc rio's two rules of an interface, {"in": rule, "out": rule} (rule: number, kind,
    queue number, its text), or None for any other shaping. The queues are those the router's
    record names (delay_backend.json "rio"); without it, the two `queue` rules that match a
    DSCP list, IN, and its negation, OUT (roles/freebsd_router's ipfw.rules.j2)."""
    queued = [r for r in rules if r[1] == "queue"]
    numbers = rio_record(record, iface).get("queues")
    found = {}
    if isinstance(numbers, dict):
        for part in ("in", "out"):
            found[part] = next((r for r in queued if r[2] == numbers.get(part)), None)
    elif len(queued) == 2:
        for rule in queued:
            match = DSCP_MATCH.search(rule[3])
            if match:
                found["out" if match[1].startswith("not") else "in"] = rule
    return found if found.get("in") and found.get("out") else None


def freebsd_rio(iface, parts, record, pipes, queues, scheds):
    """The entry of a rio interface: the pipe's rate and delay, per queue (in, out) its rule,
    number, DSCP match, size, RED settings and counters, and the two queues' counters summed
    at the top (None where a queue could not be read), labelled as the approximation."""
    rio = rio_record(record, iface)
    out = {"approximation": rio.get("rio") or DUMMYNET_RIO_LABEL, "pipe": None, "sched": None}
    for part, (rule, _, number, text) in parts.items():
        flowset = queues["flowsets"].get(number)
        match = DSCP_MATCH.search(text)
        entry = {"rule": rule, "number": number, "match": match[1] if match else None,
                 "queue": None, "queue_unit": None, "aqm": None, "red": None}  # fmt: skip
        if flowset is not None:
            for key in ("queue", "queue_unit", "aqm", "red"):
                entry[key] = flowset.get(key)
            out["pipe"] = out["pipe"] or flowset["sched"]  # `queue N config pipe P`: sched P
        for key in COUNTERS:
            entry[key] = (flowset or {}).get(key, 0 if flowset is not None else None)
        out[part] = entry
    pipe = out["pipe"] or rio.get("pipe") or parts["in"][2]
    out["pipe"] = pipe
    sched = scheds["scheds"].get(pipe)
    out["sched"] = sched["type"] if sched else None
    link = (sched or {}).get("link") or pipes["links"].get(pipe)
    first = out["in"]
    report = {"rule": first["rule"],
              "chain": [f"queue {out['in']['number']}", f"queue {out['out']['number']}",
                        f"pipe {pipe}"],
              "rate": link["rate"] if link else None,
              "delay_ms": link["delay_ms"] if link else None,
              "queue": first["queue"], "queue_unit": first["queue_unit"], "aqm": "rio"}  # fmt: skip
    for key in COUNTERS:
        values = [out[p][key] for p in ("in", "out")]
        report[key] = None if None in values else sum(values)
    report["rio"] = out
    return report


def freebsd_dummynet(interfaces, record):
    """Per interface: what trialbed's ipfw rule sends its outgoing packets to. The rules are
    those the router's record (delay_backend.json, "owned") names, every rule without one.
    None for an interface when ipfw cannot be read; {"chain": []} when no rule shapes it. A
    rio interface (two rules, to its IN and OUT queues) has both under "rio" (freebsd_rio)."""
    rules = run_soft(["ipfw", "list"])
    if rules is None:
        return {i: None for i in interfaces}
    owned = record.get("owned") if isinstance(record, dict) else None
    owned = owned.get("rules") if isinstance(owned, dict) else None
    owned = {int(r) for r in owned if str(r).isdigit()} if isinstance(owned, list) else None
    chains = {}
    for line in rules.splitlines():
        found = RULE_LINE.match(line.strip())
        if found and (owned is None or int(found[1]) in owned):
            rule = (int(found[1]), found[2], int(found[3]), line.strip())
            chains.setdefault(found[4], []).append(rule)
    first = {iface: chain[0][:3] for iface, chain in chains.items()}
    pipes = parse_dummynet(run_soft(["ipfw", "pipe", "show"]))
    queued = any(kind == "queue" for _, kind, _ in first.values())
    queues = parse_dummynet(run_soft(["ipfw", "queue", "show"]) if queued else "")
    scheds = parse_dummynet(run_soft(["ipfw", "sched", "show"]) if queued else "")
    report = {}
    for iface in interfaces:
        if iface not in first:
            report[iface] = {"chain": []}
            continue
        rio = rio_rules(iface, chains[iface], record)
        if rio is not None:
            report[iface] = freebsd_rio(iface, rio, record, pipes, queues, scheds)
            continue
        rule, kind, number = first[iface]
        entry = {"rule": rule, "chain": [f"{kind} {number}"], "rate": None, "delay_ms": None,
                 "queue": None, "queue_unit": None, "aqm": None}  # fmt: skip
        counted = None
        if kind == "pipe":
            link = pipes["links"].get(number)
            if link is not None:
                flowset = link.get("flowset") or {}
                entry.update(rate=link["rate"], delay_ms=link["delay_ms"])
                for key in ("aqm", "queue", "queue_unit"):
                    entry[key] = flowset.get(key)
                counted = link
        else:  # a queue fed to a scheduler (fq_codel) and its pipe
            flowset = queues["flowsets"].get(number)
            sched_nr = flowset["sched"] if flowset else number
            sched = scheds["scheds"].get(sched_nr)
            link = (sched or {}).get("link") or pipes["links"].get(sched_nr)
            entry["chain"].append(f"sched {sched_nr} {sched['type'] if sched else '?'}")
            if link is not None:
                entry.update(rate=link["rate"], delay_ms=link["delay_ms"])
            if sched is not None and sched["limit"] is not None:
                entry.update(queue=sched["limit"], queue_unit="pkt")
            elif flowset is not None:
                entry.update(queue=flowset["queue"], queue_unit=flowset["queue_unit"])
            counted = sched if sched and "packets" in sched else flowset
            entry["aqm"] = sched["type"] if sched else None
        for key in ("packets", "bytes", "qlen", "backlog", "drops"):
            entry[key] = (counted or {}).get(key, 0 if counted is not None else None)
        report[iface] = entry
    return report


def freebsd_alive(pidfile):
    """The pid of a trialbed-daemon pid file if that process still runs. FreeBSD has no /proc
    (trialbed-daemon records no start time there): the pid exists (kill 0) and ps(1) does
    not show it a zombie (state Z)."""
    try:
        with open(pidfile) as f:
            pid = int(f.read().split()[0])
        if pid <= 0:
            return None
        os.kill(pid, 0)
    except PermissionError:
        pass
    except (OSError, ValueError, IndexError, OverflowError):
        return None
    state = run_soft(["ps", "-o", "state=", "-p", str(pid)])
    return pid if state is None or not state.strip().startswith("Z") else None


def read_json(path):
    """A JSON object from a file; None where it is missing, unreadable or not an object."""
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def freebsd_main(workdir, interfaces):
    backend = read_json(os.path.join(workdir, "router", "delay_backend.json"))
    daemons = running_daemons(workdir, freebsd_alive)
    # The records of roles/freebsd_host (sysctls, interfaces) and roles/freebsd_router
    # (sysctls, offloads it turned off per interface), as one.
    host = read_json(os.path.join(workdir, "freebsd_host", "baseline.json")) or {}
    router = read_json(os.path.join(workdir, "router", "baseline.json")) or {}
    own = None
    if host or router:

        def part(record, key):
            value = record.get(key)
            return value if isinstance(value, dict) else {}

        changed = {i for i, on in part(router, "offloads").items() if on}
        own = {
            "sysctls": {**part(router, "sysctls"), **part(host, "sysctls")},
            "interfaces": sorted(set(part(host, "interfaces")) | changed),
        }
    leftovers = sorted(
        os.path.relpath(d, workdir) for d in glob.glob(f"{workdir}/trials/*/*") if os.path.isdir(d)
    )
    cc = run_soft(["sysctl", "-n", "net.inet.tcp.cc.algorithm"])
    print(
        json.dumps(
            {
                "platform": "FreeBSD",
                "qdiscs": {},
                "classes": {},
                "dummynet": freebsd_dummynet(interfaces, backend),
                "cc": (cc or "").strip() or None,
                "delay_backend": backend,
                "nfqueue_rules": 0,
                "daemons": daemons,
                "leftover_trials": leftovers,
                "own_settings": own,
            }
        )
    )


if __name__ == "__main__":
    if platform.system() == "FreeBSD":
        freebsd_main(sys.argv[1], sys.argv[2:])
    else:
        main(sys.argv[1], sys.argv[2:])
