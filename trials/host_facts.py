"""Runs ON a rack host (sent over SSH as source, standard library only): prints a JSON
object with what a trial depends on: kernel, congestion controls, tool versions, sysctls,
offloads, MTUs, link speeds, interfaces, IPv4 routes with their metrics (initcwnd, rto_min,
...), free disk. Used both by the preflight and for each trial's metadata."""

import glob
import json
import os
import platform
import shutil
import subprocess
import sys

SYSCTLS = [
    "net.ipv4.tcp_congestion_control",
    "net.ipv4.tcp_available_congestion_control",
    "net.ipv4.tcp_no_metrics_save",
    "net.ipv4.tcp_ecn",
    "net.ipv4.tcp_sack",
    "net.ipv4.tcp_timestamps",
    "net.ipv4.tcp_window_scaling",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_mtu_probing",
    "net.ipv4.ip_forward",
    "net.core.default_qdisc",
]
TOOLS = {
    "iperf3": ["iperf3", "--version"],
    "tcpreplay": ["tcpreplay", "-V"],
    "tcpdump": ["tcpdump", "--version"],
    "tc": ["tc", "-V"],
    "python3": ["python3", "--version"],
    "gcc": ["gcc", "--version"],  # builds the transaction generator (transactions role)
    "nft": ["nft", "--version"],  # renders the DSCP marking table (dscp_marker role)
}


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def first_line(cmd):
    if not shutil.which(cmd[0]):
        return None
    done = subprocess.run(cmd, capture_output=True, text=True)
    return ((done.stdout or done.stderr).strip().splitlines() or [""])[0]


def ipv4_routes():
    """The IPv4 routes of every table but `local` (`ip -4 -d -j route show table all`), each
    with its metrics as one dict ({"initcwnd": 10, "rto_min": 200}, rto_min in ms; {} for the
    kernel's defaults) instead of ip's list of one dict. None where ip is missing."""
    if not shutil.which("ip"):
        return None
    out = subprocess.run(
        ["ip", "-4", "-d", "-j", "route", "show", "table", "all"], capture_output=True, text=True
    ).stdout
    routes = [r for r in json.loads(out or "[]") if r.get("table") != "local"]
    for route in routes:
        metrics = {}
        for entry in route.get("metrics", []):
            metrics.update(entry)
        route["metrics"] = metrics
    return routes


# Queue disciplines an experiment may name (and the shaping's own).
QDISCS = ["netem", "htb", "tbf", "red", "gred", "fq", "fq_codel", "pie", "cake", "sfq"]
TRACEPOINTS = ["tcp/tcp_probe"]


def qdiscs_available(release):
    """The qdiscs of QDISCS this kernel has: loaded, built in, or a module to load."""
    builtin = read(f"/lib/modules/{release}/modules.builtin") or ""
    have = []
    for q in QDISCS:
        if (
            os.path.isdir(f"/sys/module/sch_{q}")
            or f"/sch_{q}.ko" in builtin
            or glob.glob(f"/lib/modules/{release}/**/sch_{q}.ko*", recursive=True)
        ):
            have.append(q)
    return have


def tracepoints_available():
    """Which of TRACEPOINTS exist: from tracefs where it is mounted, else from the kernel's
    symbols (`ip netns exec` gives a namespace a /sys without tracefs); None if neither."""
    for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        if os.path.isdir(f"{root}/events"):
            return [t.replace("/", ":") for t in TRACEPOINTS if os.path.isdir(f"{root}/events/{t}")]
    # __tracepoint_X is data, listed only with CONFIG_KALLSYMS_ALL; __traceiter_X (the
    # tracepoint's iterator function, 5.10 on) is listed without it (this machine's kernel).
    wanted = {t.split("/")[1]: t.replace("/", ":") for t in TRACEPOINTS}
    try:
        with open("/proc/kallsyms") as f:
            found = {
                symbol.split("_", 3)[3]
                for symbol in (line.rsplit(None, 1)[-1] for line in f)
                if symbol.startswith(("__tracepoint_", "__traceiter_"))
            }
    except OSError:
        return None
    return [name for event, name in wanted.items() if event in found]


def mtu(interface):
    value = read(f"/sys/class/net/{interface}/mtu")
    return int(value) if value else None


def speed(interface):
    """The NIC's link speed in Mbit/s; None where it has none (veth, a link that is down)."""
    value = read(f"/sys/class/net/{interface}/speed")
    try:
        return int(value) if int(value) > 0 else None
    except (TypeError, ValueError):
        return None


# What does not change while the kernel and the packages stay: `--changing` leaves these out
# (a runner reads them once per host and keeps them for its later trials).
STATIC = ("hostname", "kernel", "cc_modules", "qdiscs", "tracepoints", "tools")


def main(workdir, interfaces, changing_only=False):
    release = platform.release()
    offloads = {}
    for itf in interfaces:
        out = subprocess.run(["ethtool", "-k", itf], capture_output=True, text=True).stdout
        offloads[itf] = {
            k: f"{k}: on" in out
            for k in (
                "tcp-segmentation-offload",
                "generic-segmentation-offload",
                "generic-receive-offload",
            )
        }
    # Module parameters of every congestion control the kernel has (H-TCP's use_rtt_scaling,
    # CUBIC's beta, ...): what a trial actually ran with. CUBIC's old "max increment" is gone.
    cc_params = {}
    for path in sorted(glob.glob("/sys/module/tcp_*/parameters/*")):
        module, _, name = path.split("/")[3:6]
        cc_params.setdefault(module[4:], {})[name] = read(path)
    os.makedirs(workdir, exist_ok=True)
    usage = shutil.disk_usage(workdir)
    facts = {
        "cc_loaded": (read("/proc/sys/net/ipv4/tcp_available_congestion_control") or "").split(),
        "cc_params": cc_params,
        "sysctls": {k: read("/proc/sys/" + k.replace(".", "/")) for k in SYSCTLS},
        "offloads": offloads,
        "mtu": {itf: mtu(itf) for itf in interfaces},
        "speed": {itf: speed(itf) for itf in interfaces},
        "interfaces": sorted(os.listdir("/sys/class/net")),
        "routes": ipv4_routes(),
        "free_disk_bytes": usage.free,
    }
    if not changing_only:
        facts.update(
            hostname=platform.node(),
            kernel=release,
            cc_modules=sorted(
                os.path.basename(p).split(".")[0][4:]
                for p in glob.glob(f"/lib/modules/{release}/**/tcp_*.ko*", recursive=True)
            ),
            qdiscs=qdiscs_available(release),
            tracepoints=tracepoints_available(),
            tools={name: first_line(cmd) for name, cmd in TOOLS.items()},
        )
    print(json.dumps(facts))


if __name__ == "__main__":
    args = sys.argv[1:]
    changing = "--changing" in args
    args = [a for a in args if a != "--changing"]
    main(args[0], args[1:], changing_only=changing)
