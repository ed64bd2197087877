"""Runs ON a rack host (sent over SSH as source, standard library only but for the core modules
it imports, carried inside: core/program_source.py): prints as JSON what a
trial depends on (kernel, congestion controls, tools, sysctls, offloads, MTUs, link speeds,
addresses, routes with their metrics and the one picked to given addresses, free disk, the
sha256 of the host programs shipped there), for preflight and for each trial's record."""

import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys

# Sent with these core modules inside (core/program_source.py): the host has no checkout.
# Role remote_daemons ships hostside/ with its SHA256SUMS where REMOTE_NAME and SUMS say.
from core.hostside import REMOTE_NAME, SUMS
from core.link_rules import DUMMYNET_AQMS, LINUX_KERNEL_QDISCS

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
    """The IPv4 routes of every table but `local` (`ip -4 -d -j route show table all`), with
    metrics as one dict ({"initcwnd": 10, "rto_min": 200} in ms; {}: defaults); None: no ip."""
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


def ipv4_addresses(interfaces):
    """Each interface's IPv4 addresses as "address/prefix" (`ip -4 -j addr show`); None
    where ip is missing, [] for an interface without any (or not there)."""
    if not shutil.which("ip"):
        return None
    out = subprocess.run(["ip", "-4", "-j", "addr", "show"], capture_output=True, text=True)
    found = {
        link.get("ifname"): [
            f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if "local" in a
        ]
        for link in json.loads(out.stdout or "[]")
    }
    return {itf: found.get(itf, []) for itf in interfaces}


def route_to(address, source=None):
    """The kernel's own choice of route to an address (`ip -4 -j route get`, from `source`
    if given, so that rules choosing by source count): its interface and gateway (None
    where directly attached); None where it finds no route."""
    done = subprocess.run(
        ["ip", "-4", "-j", "route", "get", address, *(["from", source] if source else [])],
        capture_output=True,
        text=True,
    )
    routes = json.loads(done.stdout or "[]") if done.returncode == 0 else []
    if not routes:
        return None
    return {"dev": routes[0].get("dev"), "gateway": routes[0].get("gateway")}


TRACEPOINTS = ["tcp/tcp_probe"]


def module_names(release):
    """The basenames (without .ko*) of every module file of this kernel: from modules.dep,
    else from one walk of the module tree (a recursive glob per name walked it a dozen times:
    seconds per host under the VM rack's emulation)."""
    root = f"/lib/modules/{release}"
    dep = read(f"{root}/modules.dep")
    if dep:
        paths = [line.split(":", 1)[0] for line in dep.splitlines()]
    else:
        paths = [name for _, _, files in os.walk(root) for name in files]
    return {os.path.basename(p).split(".ko")[0] for p in paths if ".ko" in p}


def cc_modules(modules):
    """The congestion controls among the module names (tcp_<name>)."""
    return sorted(m[4:] for m in modules if m.startswith("tcp_"))


def qdiscs_available(release, modules):
    """The qdiscs of LINUX_KERNEL_QDISCS this kernel has: loaded, built in, or a module to load."""
    builtin = read(f"/lib/modules/{release}/modules.builtin") or ""
    have = []
    for q in LINUX_KERNEL_QDISCS:
        if (
            os.path.isdir(f"/sys/module/sch_{q}")
            or f"/sch_{q}.ko" in builtin
            or f"sch_{q}" in modules
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


# Where testbed_host records the BPF congestion controls it registered (its
# testbed_host_bpf_cc_record_dir), and the kernel's BTF a BPF one needs.
BPF_CC_RECORDS, BTF = "/run/trialbed/bpf_cc", "/sys/kernel/btf/vmlinux"
BPF_CC_KEPT = ("id", "params", "source_sha256", "object_sha256")  # of a record, in the facts


def bpf_cc_kernel():
    """Whether this kernel can take a BPF congestion control (BTF, bpf_tcp_ca, the JIT: its
    sysctl exists in the initial namespace only, elsewhere the JIT's symbol is what shows) and
    whether the host can build one (clang, a C compiler, bpftool, libbpf's headers)."""
    try:
        with open("/proc/kallsyms") as f:
            symbols = f.read()
    except OSError:
        symbols = None
    enabled = read("/proc/sys/net/core/bpf_jit_enable")
    jit = None if symbols is None else " bpf_int_jit_compile" in symbols
    if enabled is not None:
        jit = enabled != "0"
    return {
        "btf": os.path.exists(BTF),
        "bpf_tcp_ca": None if symbols is None else " bpf_tcp_ca_" in symbols,
        "jit": jit,
        "tools": {t: shutil.which(t) for t in ("clang", "cc", "bpftool")},
        "libbpf_headers": os.path.exists("/usr/include/bpf/libbpf.h"),
    }


def bpf_cc_registered(loaded):
    """The BPF congestion controls testbed_host registered in this boot of the kernel, name ->
    its record (struct_ops id, parameters, the source's and the object's sha256)."""
    boot = read("/proc/sys/kernel/random/boot_id")
    out = {}
    for path in sorted(glob.glob(f"{BPF_CC_RECORDS}/*.json")):
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if record.get("boot_id") == boot and record.get("cc") in loaded:
            out[record["cc"]] = {k: record.get(k) for k in BPF_CC_KEPT}
    return out


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
STATIC = tuple(
    ["hostname", "kernel", "cc_modules", "qdiscs", "tracepoints", "tools", "siftr", "bpf_cc_kernel"]
)


# -- FreeBSD (a dummynet router of the group freebsd_routers, an end host of freebsd_hosts) --
# The same keys where they make sense, from FreeBSD's own commands; each call fails soft (a
# missing or failing command gives None). Not run on FreeBSD here: the unit tests
# (tests/unit/test_host_facts_freebsd.py) run it against stand-ins written from the manuals.
#   cc_loaded, cc_modules: Linux names (FreeBSD's newreno is reno, as roles/freebsd_host maps).
#   sysctls: FreeBSD's own names (FREEBSD_SYSCTLS), net.inet.tcp.cc.algorithm as the kernel
#     says it (newreno); cc_params {} (htcp's two MIB variables are among the sysctls).
#   tools: ipfw (its path) instead of tc; qdiscs: the dummynet AQMs roles/freebsd_router
#     renders, when dummynet is loaded or loadable; offloads: per interface, the ifconfig
#     options TSO4, TSO6 and LRO on or off; tracepoints: [].
#   speed: per interface in Mbit/s as on Linux, from the active media of `ifconfig IFACE`
#     (None without carrier or a media word that names no speed).
#   routes: the IPv4 routes of the default FIB in ipv4_routes()'s shape, from netstat(1)
#     (its libxo JSON, else its text); the host routes to the host's own addresses (on lo0,
#     Linux's table local) left out; metrics {} (FreeBSD has no per-route initcwnd/rto_min).
#   siftr: True when SIFTR (siftr(4), the cwnd recorder of a FreeBSD sender) is loaded or
#     compiled in (`kldstat -q -m siftr`) or its module file exists; False otherwise.
FREEBSD_SYSCTLS = [
    "net.inet.tcp.cc.algorithm",
    "net.inet.tcp.cc.htcp.adaptive_backoff",
    "net.inet.tcp.cc.htcp.rtt_scaling",
    "net.inet.tcp.hostcache.enable",
    "net.inet.tcp.rfc1323",
    "net.inet.tcp.sack.enable",
    "net.inet.tcp.ecn.enable",
    "net.inet.tcp.recvspace",
    "net.inet.tcp.recvbuf_max",
    "net.inet.tcp.recvbuf_auto",
    "net.inet.tcp.sendspace",
    "net.inet.tcp.sendbuf_max",
    "net.inet.tcp.sendbuf_auto",
    "kern.ipc.maxsockbuf",
    "net.inet.ip.forwarding",
    "kern.hz",
    "net.inet.ip.dummynet.io_fast",
]
FREEBSD_TOOLS = {
    "iperf3": ["iperf3", "--version"],
    "tcpreplay": ["tcpreplay", "-V"],
    "tcpdump": ["tcpdump", "--version"],
    "python3": ["python3", "--version"],
}
# mod_cc(4) names -> Linux's (roles/freebsd_host: reno is FreeBSD's newreno).
FREEBSD_CC_NAMES = {"newreno": "reno"}
# Where kld(4) modules are (kldload's default module path), and where FreeBSD keeps its
# system commands, searched after PATH (an SSH session's PATH may lack /sbin).
FREEBSD_MODULE_DIRS = ["/boot/kernel", "/boot/modules"]
FREEBSD_COMMAND_DIRS = [
    "/sbin",
    "/usr/sbin",
    "/bin",
    "/usr/bin",
    "/usr/local/sbin",
    "/usr/local/bin",
]
FREEBSD_OFFLOADS = ("TSO4", "TSO6", "LRO")


def which(name):
    path = os.pathsep.join([os.environ.get("PATH", ""), *FREEBSD_COMMAND_DIRS])
    return shutil.which(name, path=path)


def run_soft(cmd, any_status=False):
    """cmd's stdout (with any_status, stdout or else stderr, whatever its exit status); None
    where the command is missing, fails or hangs."""
    path = which(cmd[0])
    if not path:
        return None
    try:
        done = subprocess.run([path, *cmd[1:]], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if any_status:
        return done.stdout or done.stderr
    return done.stdout if done.returncode == 0 else None


def freebsd_cc_names(text):
    """`sysctl -n net.inet.tcp.cc.available` -> Linux names. FreeBSD 13 on print a table, a
    header line "CCmod D PCB count" then one line per module, name first; older ones a list
    separated by commas."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if lines and lines[0].split()[0] == "CCmod":
        names = [line.split()[0] for line in lines[1:]]
    else:
        names = (text or "").replace(",", " ").split()
    return [FREEBSD_CC_NAMES.get(n, n) for n in names]


def kld_available(name):
    """A kld(4) module loaded or compiled in (kldstat -q -m: exit status), or a file to load."""
    if run_soft(["kldstat", "-q", "-m", name]) is not None:
        return True
    return any(os.path.isfile(f"{d}/{name}.ko") for d in FREEBSD_MODULE_DIRS)


def ifconfig_of(interface):
    """`ifconfig IFACE` (ifconfig(8)): the MTU at the end of its first line (`mtu N`), which
    of TSO4, TSO6 and LRO its `options=...<...>` line names, and the link speed its media
    line says (freebsd_speed). None for no such interface (ifconfig fails)."""
    out = run_soft(["ifconfig", interface])
    if out is None:
        return None
    found = re.search(r"\bmtu (\d+)", out)
    options = re.search(r"^\s*options=\w*<([^>]*)>", out, re.MULTILINE)
    on = options[1].split(",") if options else []
    # `inet A netmask 0xffffff00 ...`: the address and its mask in hex (ifconfig(8))
    inet = re.findall(r"^\s*inet (\d+\.\d+\.\d+\.\d+) netmask 0x([0-9a-fA-F]{8})", out, re.M)
    return {
        "mtu": int(found[1]) if found else None,
        "offloads": {o: o in on for o in FREEBSD_OFFLOADS},
        "speed": freebsd_speed(out),
        "addresses": [f"{a}/{bin(int(mask, 16)).count('1')}" for a, mask in inet],
    }


def freebsd_route_to(address):
    """`route -n get ADDRESS` (route(8)): the route the kernel picks, as route_to() gives
    it. Its lines `interface: em1` and, for a route through a router (flags GATEWAY),
    `gateway: 198.18.1.1`. None where it finds none."""
    out = run_soft(["route", "-n", "get", address])
    fields = dict(re.findall(r"^\s*([a-z]+): (.*?)\s*$", out or "", re.MULTILINE))
    if "interface" not in fields:
        return None
    gatewayed = "GATEWAY" in fields.get("flags", "")
    return {"dev": fields["interface"], "gateway": fields.get("gateway") if gatewayed else None}


# A media subtype's speed (ifmedia(4) names: 10baseT/UTP, 100baseTX, 1000baseT, 2500Base-T,
# 10Gbase-T, 10GBase-SR, 25GBase-CR, 100GBase-LR4, ...): a number, G for gigabit, then base.
_MEDIA_SPEED = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(G?)base", re.IGNORECASE)


def freebsd_speed(ifconfig):
    """The link speed in Mbit/s (an int, as speed() gives on Linux) from `ifconfig IFACE`
    (ifconfig(8)): the active media, in parentheses after the selected one on its `media:`
    line (`media: Ethernet autoselect (1000baseT <full-duplex>)`), else the selected one
    (`media: Ethernet 10Gbase-T <full-duplex>`). None without carrier (`status: no carrier`,
    active media `(none)`), without a media line, or for a media word naming no speed."""
    media = re.search(r"^\s*media:\s*(.*)$", ifconfig or "", re.MULTILINE)
    status = re.search(r"^\s*status:\s*(.*?)\s*$", ifconfig or "", re.MULTILINE)
    if not media or (status and status[1] != "active"):
        return None
    active = re.search(r"\(([^)]*)\)", media[1])
    found = _MEDIA_SPEED.search(active[1] if active else media[1])
    if not found:
        return None
    mbits = float(found[1]) * (1000 if found[2] else 1)
    return int(mbits) if mbits > 0 else None


def _freebsd_route(destination, gateway, flags, netif):
    """One netstat(1) route as ipv4_routes() gives a Linux one; None for a host route to one
    of the host's own addresses (H on a loopback interface: what Linux keeps in table local)."""
    flags = flags or ""
    if "H" in flags and re.fullmatch(r"lo\d+", netif or ""):
        return None
    route = {
        # netstat's B (blackhole) and R (reject) routes; every other one forwards (unicast).
        "type": "blackhole" if "B" in flags else ("unreachable" if "R" in flags else "unicast"),
        "dst": destination,
    }
    # A directly connected network has link#N (or a MAC address) as its gateway: no gateway.
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", gateway or ""):
        route["gateway"] = gateway
    if netif:
        route["dev"] = netif
    route.update(table="main", metrics={})  # netstat -rn shows the default FIB (0)
    return route


def freebsd_routes():
    """The IPv4 routes (netstat(1) -rn): from `netstat -rn -4 --libxo json` (FreeBSD 11 on:
    statistics.route-information.route-table.rt-family[] of address-family "Internet", each
    rt-entry with destination, gateway, flags and interface-name), else from the text of
    `netstat -rn -f inet` (a header line naming the columns Destination, Gateway, Flags, ...,
    Netif, then one line per route). None where netstat is missing or says nothing usable."""
    routes = None
    out = run_soft(["netstat", "-rn", "-4", "--libxo", "json"])
    try:
        table = json.loads(out)["statistics"]["route-information"]["route-table"]
        families = table["rt-family"]
        families = families if isinstance(families, list) else [families]
        routes = [
            _freebsd_route(
                e.get("destination"),
                e.get("gateway"),
                e.get("flags"),
                e.get("interface-name") or e.get("netif"),
            )
            for family in families
            if family.get("address-family", "Internet") == "Internet"
            for e in family.get("rt-entry") or []
        ]
    except (TypeError, ValueError, KeyError, AttributeError):
        routes = None
    if routes is None:
        text = run_soft(["netstat", "-rn", "-f", "inet"])
        if text is None:
            return None
        header = None
        routes = []
        for line in text.splitlines():
            words = line.split()
            if words[:2] == ["Destination", "Gateway"]:
                header = words
            elif header and len(words) >= 3 and not line.endswith(":"):
                netif = header.index("Netif") if "Netif" in header else None
                routes.append(
                    _freebsd_route(
                        words[0],
                        words[1],
                        words[2],
                        words[netif] if netif is not None and netif < len(words) else None,
                    )
                )
        if header is None:
            return None
    return [r for r in routes if r is not None]


def trials_disk(workdir):
    """The disk where the trials' files land (<workdir>/trials: a lab may mount one there)."""
    where = os.path.join(workdir, "trials")
    os.makedirs(where, exist_ok=True)
    return shutil.disk_usage(where)


def hostside_files(workdir):
    """The sha256 of every file the shipped folder's SHA256SUMS lists, as the file is on this
    host now (None for one that is missing); None when nothing was shipped."""
    folder = os.path.join(workdir, REMOTE_NAME)
    listed = read(os.path.join(folder, SUMS))
    if listed is None:
        return None
    files = {}
    for line in listed.splitlines():
        path = line.partition("  ")[2]
        try:
            with open(os.path.join(folder, path), "rb") as f:
                files[path] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            files[path] = None
    return files


def freebsd_facts(workdir, interfaces, changing_only=False, destinations=()):
    def sysctl(name):
        out = run_soft(["sysctl", "-n", name])
        return out.strip() if out is not None else None

    ifconfig = {itf: ifconfig_of(itf) for itf in interfaces}
    usage = trials_disk(workdir)
    facts = {
        "cc_loaded": freebsd_cc_names(sysctl("net.inet.tcp.cc.available")),
        "cc_params": {},
        "sysctls": {k: sysctl(k) for k in FREEBSD_SYSCTLS},
        "offloads": {itf: i["offloads"] for itf, i in ifconfig.items() if i},
        "mtu": {itf: i["mtu"] if i else None for itf, i in ifconfig.items()},
        "speed": {itf: i["speed"] if i else None for itf, i in ifconfig.items()},
        "addresses": {itf: i["addresses"] if i else [] for itf, i in ifconfig.items()},
        "interfaces": sorted((run_soft(["ifconfig", "-l"]) or "").split()),
        "routes": freebsd_routes(),
        "route_to": {a: freebsd_route_to(a) for a in destinations} if which("route") else None,
        "free_disk_bytes": usage.free,
        "hostside": hostside_files(workdir),
    }
    if not changing_only:
        kernel = run_soft(["uname", "-r"])
        modules = sorted(
            {
                os.path.basename(p)[3:-3]
                for d in FREEBSD_MODULE_DIRS
                for p in glob.glob(f"{d}/cc_*.ko")
            }
        )
        tools = {
            name: (run_soft(cmd, any_status=True) or "").strip()
            for name, cmd in FREEBSD_TOOLS.items()
        }
        tools = {name: (out.splitlines() or [None])[0] for name, out in tools.items()}
        tools["ipfw"] = which("ipfw")  # no version option: its path
        facts.update(
            hostname=platform.node(),
            kernel=kernel.strip() if kernel else platform.release(),
            cc_modules=[FREEBSD_CC_NAMES.get(m, m) for m in modules],
            qdiscs=list(DUMMYNET_AQMS) if kld_available("dummynet") else [],
            tracepoints=[],
            siftr=kld_available("siftr"),
            bpf_cc_kernel=None,  # BPF congestion controls are Linux's (bpf_tcp_ca)
            tools=tools,
        )
    return facts


def main(workdir, interfaces, changing_only=False, destinations=(), source=None):
    """``destinations``: addresses whose route the facts say (route_to), from ``source``
    (the host's experiment address) where the host has that address."""
    if platform.system() == "FreeBSD":
        print(json.dumps(freebsd_facts(workdir, interfaces, changing_only, destinations)))
        return
    release = platform.release()
    offloads = {}
    ethtool = shutil.which("ethtool")  # a host without it: preflight names the missing tool
    for itf in interfaces:
        if ethtool is None:
            offloads[itf] = None
            continue
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
    usage = trials_disk(workdir)
    addresses = ipv4_addresses(interfaces)
    own = {a.split("/")[0] for found in (addresses or {}).values() for a in found}
    source = source if source in own else None  # a missing one: preflight names it
    loaded = (read("/proc/sys/net/ipv4/tcp_available_congestion_control") or "").split()
    facts = {
        "cc_loaded": loaded,
        "cc_params": cc_params,
        "bpf_cc": bpf_cc_registered(loaded),
        "sysctls": {k: read("/proc/sys/" + k.replace(".", "/")) for k in SYSCTLS},
        "offloads": offloads,
        "mtu": {itf: mtu(itf) for itf in interfaces},
        "speed": {itf: speed(itf) for itf in interfaces},
        "addresses": addresses,
        "interfaces": sorted(os.listdir("/sys/class/net")),
        "routes": ipv4_routes(),
        "route_to": {a: route_to(a, source) for a in destinations} if shutil.which("ip") else None,
        "free_disk_bytes": usage.free,
        "hostside": hostside_files(workdir),
    }
    if not changing_only:
        modules = module_names(release)
        facts.update(
            hostname=platform.node(),
            kernel=release,
            cc_modules=cc_modules(modules),
            qdiscs=qdiscs_available(release, modules),
            tracepoints=tracepoints_available(),
            tools={name: first_line(cmd) for name, cmd in TOOLS.items()},
            # Not in STATIC yet (preflight's STATIC_FACTS must list it too): read with them.
            bpf_cc_kernel=bpf_cc_kernel(),
        )
    print(json.dumps(facts))


if __name__ == "__main__":
    args = sys.argv[1:]
    changing = "--changing" in args
    to = [a.split("=", 1)[1] for a in args if a.startswith("--route-to=")]
    source = next((a.split("=", 1)[1] for a in args if a.startswith("--route-from=")), None)
    args = [a for a in args if a != "--changing" and not a.startswith("--route-")]
    main(args[0], args[1:], changing_only=changing, destinations=to, source=source)
