"""hostside/probes/host_facts.py's FreeBSD branch run on this machine against stand-in commands (no
FreeBSD host can run here): small shell scripts named sysctl, ifconfig, kldstat, uname, ipfw,
iperf3, ... first (and alone) on PATH, platform.system() saying FreeBSD. Their outputs are
written from the manuals of FreeBSD 13/14, each sample naming its source. Then such facts for
the FreeBSD router R of inventory/lab.example (and a FreeBSD sender) go through preflight's
checks for the seed-000 experiment (nothing is contacted: host_facts and reachability are
replaced, as in tests/unit/test_rio.py)."""

from __future__ import annotations

import json
import platform
import shutil
import textwrap
from pathlib import Path

import pytest

from core import link_rules
from core.rack import Rack
from tests.hostside import load
from trials import preflight
from trials.plan import load_plan
from trials.spec import SpecError

host_facts = load("probes/host_facts.py")

PROJECT = Path(__file__).resolve().parents[2]
LAB = PROJECT / "inventory/lab.example/hosts.yml"
EXPERIMENT = PROJECT / "experiments/collateral_damage.yml"

# mod_cc(4): net.inet.tcp.cc.available is the "list of currently available congestion control
# algorithms by name"; FreeBSD 13 and later print it as a table, a header line "CCmod D PCB
# count" then one line per module, name first, `*` in D on the default (the layout of
# sys/netinet/cc/cc.c, not spelled out by the manual; `sysctl -n` prints the value alone,
# which starts on a new line). newreno is cc_newreno(4), Linux's reno.
CC_AVAILABLE = "\n" + "".join(
    f"{name:<16}{default} {count}\n"
    for name, default, count in (
        ("CCmod", "D", "PCB count"),
        ("newreno", "*", 3),
        ("cubic", " ", 0),
        ("htcp", " ", 0),
    )
)
# sysctl(8): `sysctl -n NAME` prints the value only; an unknown name is an error
# ("unknown oid") with a non-zero exit status.
SYSCTLS = {
    "net.inet.tcp.cc.available": CC_AVAILABLE,
    "net.inet.tcp.cc.algorithm": "newreno",  # mod_cc(4): the default algorithm's name
    "net.inet.tcp.cc.htcp.adaptive_backoff": "0",  # cc_htcp(4)
    "net.inet.tcp.cc.htcp.rtt_scaling": "0",
    "kern.hz": "2000",
    "net.inet.ip.forwarding": "1",
}
# ifconfig(8): `-l` lists every interface on one line; `ifconfig IFACE` prints a first line
# `IFACE: flags=...<...> metric 0 mtu N`, then `options=...<...>` naming the capabilities
# that are on (TSO4, TSO6, LRO among them), ether, inet, media and status lines (the format
# of ifconfig(8)'s EXAMPLES and of roles/freebsd_router's offload check). The media line
# (ifconfig(8) "media type", ifmedia(4) subtypes): the selected media, then in parentheses
# the active one when autoselect chose it; the status line: active, or no carrier.
IFCONFIG = """\
{name}: flags=8863<UP,BROADCAST,RUNNING,SIMPLEX,MULTICAST> metric 0 mtu {mtu}
\toptions={options}
\tether 00:0c:29:3a:1b:{byte}
\tinet {address} netmask 0xffffff00 broadcast {broadcast}
\tmedia: {media}
\tstatus: {status}
\tnd6 options=29<PERFORMNUD,IFDISABLED,AUTO_LINKLOCAL>
"""
AUTO_1G = "Ethernet autoselect (1000baseT <full-duplex>)"
INTERFACES = {  # addresses: the lab inventory's (R's em1 and em2, A's enp2s0)
    "em1": {"mtu": 1500, "options": "481249b<RXCSUM,VLAN_MTU,VLAN_HWTAGGING,LRO,WOL_MAGIC>",
            "media": AUTO_1G, "status": "active", "address": "198.18.1.1"},
    "em2": {"mtu": 9000, "options": "4812098<VLAN_MTU,VLAN_HWTAGGING,VLAN_HWCSUM,TSO4,TSO6>",
            "media": "Ethernet 10Gbase-T <full-duplex>", "status": "active",
            "address": "198.18.2.1"},  # fixed media
    "em3": {"mtu": 1500, "options": "0", "media": "Ethernet autoselect (none)",
            "status": "no carrier", "address": "198.18.3.1"},  # cable out
    # the lab inventory's name for A's port
    "enp2s0": {"mtu": 1500, "options": "0", "media": AUTO_1G, "status": "active",
               "address": "198.18.1.11"},
}  # fmt: skip
# route(8): `route -n get ADDRESS` prints the route the kernel picks, one `name: value` line
# each (route to, destination, mask, gateway, fib, interface, flags), then a table of its
# metrics; `gateway` is a router's address when flags has GATEWAY. The stand-in answers as
# A of the lab rack: the right segment through R, the left one directly, on enp2s0.
ROUTE_GET = """\
   route to: {address}
destination: {network}
       mask: 255.255.255.0
    gateway: {gateway}
        fib: 0
  interface: {interface}
      flags: <{flags}>
 recvpipe  sendpipe  ssthresh  rtt,msec    mtu        weight    expire
       0         0         0         0      1500         1         0
"""
# netstat(1) -r -n (FreeBSD 14): "Routing tables", a family line "Internet:", a header naming
# the columns (Destination Gateway Flags Netif Expire), one line per route; a directly
# connected network's gateway is link#N, the host routes to the host's own addresses (flags
# UHS, UH for 127.0.0.1) go through lo0; flags U up, G gateway, S static, H host, B blackhole
# (the FLAGS of netstat(1) / route(8)). -4 and -f inet show IPv4 alone.
NETSTAT_ROUTES = [
    ("default", "198.19.10.1", "UGS", "em0"),
    ("127.0.0.1", "link#4", "UH", "lo0"),
    ("198.18.0.0/16", "198.18.1.11", "UGS", "em1"),
    ("198.18.1.0/24", "link#2", "U", "em1"),
    ("198.18.1.1", "link#4", "UHS", "lo0"),
    ("198.18.2.0/24", "link#3", "U", "em2"),
    ("198.18.2.1", "link#4", "UHS", "lo0"),
    ("198.19.10.0/24", "link#1", "U", "em0"),
    ("198.19.10.10", "link#4", "UHS", "lo0"),
    ("203.0.113.0/24", "127.0.0.1", "UGSB", "lo0"),
]
NETSTAT_TEXT = "Routing tables\n\nInternet:\n" + "".join(
    f"{d:<19}{g:<19}{f:<10}{n:>8}\n"
    for d, g, f, n in [("Destination", "Gateway", "Flags", "Netif Expire"), *NETSTAT_ROUTES]
)
# netstat(1) with libxo (xo_parse_args(3), `--libxo json`; FreeBSD 11 on): the same routes in
# statistics.route-information.route-table.rt-family[].rt-entry[], the interface as
# interface-name, flags also spelled out in flags_pretty (sbin's route.c field names).
PRETTY = {"U": "up", "G": "gateway", "S": "static", "H": "host", "B": "blackhole"}
NETSTAT_JSON = json.dumps(
    {"statistics": {"route-information": {"route-table": {"rt-family": [{
        "address-family": "Internet",
        "rt-entry": [
            {"destination": d, "gateway": g, "flags": f,
             "flags_pretty": [PRETTY[c] for c in f], "weight": 1, "interface-name": n}
            for d, g, f, n in NETSTAT_ROUTES
        ],
    }]}}}}
)  # fmt: skip
# What the Linux branch (ipv4_routes: `ip -4 -d -j route show table all` without table
# local) would give for these routes: the host's own addresses are left out.
ROUTES = [
    {"type": "unicast", "dst": "default", "gateway": "198.19.10.1", "dev": "em0"},
    {"type": "unicast", "dst": "198.18.0.0/16", "gateway": "198.18.1.11", "dev": "em1"},
    {"type": "unicast", "dst": "198.18.1.0/24", "dev": "em1"},
    {"type": "unicast", "dst": "198.18.2.0/24", "dev": "em2"},
    {"type": "unicast", "dst": "198.19.10.0/24", "dev": "em0"},
    {"type": "blackhole", "dst": "203.0.113.0/24", "gateway": "127.0.0.1", "dev": "lo0"},
]
ROUTES = [{**r, "table": "main", "metrics": {}} for r in ROUTES]
# First lines of the tools' version output (iperf3(1) --version, tcpdump(1) --version,
# tcpreplay(1) -V, python3 --version). ipfw(8) has no version option: its path is the fact.
TOOLS = {
    "iperf3": "iperf 3.16 (cJSON 1.7.15)",
    "tcpdump": "tcpdump version 4.9.3",
    "tcpreplay": "tcpreplay version: 4.4.4 (build git:v4.4.4)",
    "python3": "Python 3.11.9",
}


def script(path: Path, body: str) -> None:
    # PATH holds the stand-ins alone: their own cat and test come from the system's.
    path.write_text("#!/bin/sh\nPATH=/usr/bin:/bin\n" + textwrap.dedent(body))
    path.chmod(0o755)


def standins(
    tmp_path: Path,
    monkeypatch,
    *,
    ipfw: bool = True,
    siftr: str = "file",
    dummynet: bool = True,
    libxo: bool = True,
    hz: str = "2000",
    route_iface: str = "enp2s0",
) -> Path:
    """A FreeBSD host's commands in tmp_path/bin, alone on PATH, and its module directory.
    siftr: "loaded" (kldstat -q -m siftr succeeds), "file" (siftr.ko to load), "none".
    libxo: netstat knows --libxo (else it refuses it, as one before FreeBSD 11 would).
    hz: its kern.hz; route_iface: the interface its routes to 198.18.0.0/16 leave by."""
    bin_dir = tmp_path / "bin"
    modules = tmp_path / "boot/kernel"
    bin_dir.mkdir(parents=True, exist_ok=True)
    modules.mkdir(parents=True, exist_ok=True)
    # uname(1): -r prints the release.
    script(bin_dir / "uname", 'test "$1" = -r && echo 14.1-RELEASE\n')
    cases = "".join(
        f"  {name}) printf '%s\\n' '{value}' ;;\n" if "\n" not in value else ""
        for name, value in {**SYSCTLS, "kern.hz": hz}.items()
    )
    (tmp_path / "cc_available").write_text(CC_AVAILABLE)
    script(
        bin_dir / "sysctl",
        f"""\
        test "$1" = -n || exit 64
        case "$2" in
          net.inet.tcp.cc.available) cat {tmp_path / "cc_available"} ;;
        {cases}  *) echo "sysctl: unknown oid '$2'" >&2; exit 1 ;;
        esac
        """,
    )
    blocks = []
    for i, (name, itf) in enumerate(INTERFACES.items()):
        text = IFCONFIG.format(name=name, byte=f"{i:02x}", broadcast="198.18.255.255", **itf)
        blocks.append(f"  {name}) cat <<'EOF'\n{text}EOF\n  ;;\n")
    script(
        bin_dir / "ifconfig",
        'case "$1" in\n  -l) echo em0 em1 em2 lo0 ;;\n'
        + "".join(blocks)
        + '  *) echo "ifconfig: interface $1 does not exist" >&2; exit 1 ;;\nesac\n',
    )
    # kldstat(8): -q -m NAME exits 0 when module NAME is loaded or compiled in, else not.
    loaded = ["dummynet"] if dummynet else []
    loaded += ["siftr"] if siftr == "loaded" else []
    script(
        bin_dir / "kldstat",
        f'for m in {" ".join(loaded) or "-"}; do test "$3" = "$m" && exit 0; done; exit 1\n',
    )
    if siftr == "file":
        (modules / "siftr.ko").write_bytes(b"")
    for cc in ("cubic", "htcp", "dctcp"):  # kldload(8) cc_NAME: the file cc_NAME.ko
        (modules / f"cc_{cc}.ko").write_bytes(b"")
    if ipfw:
        script(bin_dir / "ipfw", "exit 0\n")
    route_standin(bin_dir, {"2": ("198.18.1.1", route_iface), "1": (None, route_iface)})
    (tmp_path / "netstat.json").write_text(NETSTAT_JSON)
    (tmp_path / "netstat.txt").write_text(NETSTAT_TEXT)
    json_case = f"  *--libxo*) cat {tmp_path / 'netstat.json'} ;;\n" if libxo else ""
    script(
        bin_dir / "netstat",
        f"""\
        case "$*" in
        {json_case}  *--libxo*) echo "netstat: illegal option -- -" >&2; exit 1 ;;
          "-rn -f inet") cat {tmp_path / "netstat.txt"} ;;
          *) exit 64 ;;
        esac
        """,
    )
    for name, line in TOOLS.items():
        script(bin_dir / name, f"echo '{line}'\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(host_facts, "FREEBSD_COMMAND_DIRS", [])
    monkeypatch.setattr(host_facts, "FREEBSD_MODULE_DIRS", [str(modules)])
    monkeypatch.setattr(platform, "system", lambda: "FreeBSD")
    return bin_dir


def route_standin(bin_dir: Path, routes: dict[str, tuple[str | None, str]]) -> None:
    """route(8) -n get: per subnet 198.18.N.0/24 (N given), its gateway (None: attached) and
    the interface it leaves by; any other address has no route."""
    answers = []
    for subnet, (gateway, iface) in routes.items():
        text = ROUTE_GET.format(
            address="$3", network=f"198.18.{subnet}.0", gateway=gateway or iface,
            interface=iface, flags="UP,GATEWAY,DONE,STATIC" if gateway else "UP,DONE",
        )  # fmt: skip
        answers.append(f"  198.18.{subnet}.*) cat <<EOF\n{text}EOF\n  ;;\n")
    script(
        bin_dir / "route",
        'test "$1 $2" = "-n get" || exit 64\ncase "$3" in\n'
        + "".join(answers)
        + '  *) echo "route: route has not been found" >&2; exit 1 ;;\nesac\n',
    )


def run_facts(tmp_path: Path, capsys, interfaces: list[str], *args, **kwargs) -> dict:
    host_facts.main(str(tmp_path / "work"), interfaces, *args, **kwargs)
    return json.loads(capsys.readouterr().out)


def test_freebsd_router_facts_from_its_commands(tmp_path, monkeypatch, capsys):
    standins(tmp_path, monkeypatch)
    asked = ["198.18.2.13", "198.18.1.12", "203.0.113.9"]
    facts = run_facts(tmp_path, capsys, ["em1", "em2", "em3", "em9"], destinations=asked)
    assert facts["kernel"] == "14.1-RELEASE"
    assert facts["addresses"] == {
        "em1": ["198.18.1.1/24"], "em2": ["198.18.2.1/24"], "em3": ["198.18.3.1/24"], "em9": [],
    }  # fmt: skip
    assert facts["route_to"] == {  # through a router; directly attached; no route
        "198.18.2.13": {"dev": "enp2s0", "gateway": "198.18.1.1"},
        "198.18.1.12": {"dev": "enp2s0", "gateway": None},
        "203.0.113.9": None,
    }
    assert facts["cc_loaded"] == ["reno", "cubic", "htcp"]  # header gone, newreno is reno
    assert facts["cc_modules"] == ["cubic", "dctcp", "htcp"]
    assert facts["cc_params"] == {}
    assert facts["sysctls"]["net.inet.tcp.cc.algorithm"] == "newreno"
    assert facts["sysctls"]["kern.hz"] == "2000"
    assert facts["sysctls"]["net.inet.tcp.rfc1323"] is None  # unknown to the stand-in
    assert "net.ipv4.tcp_congestion_control" not in facts["sysctls"]
    assert facts["interfaces"] == ["em0", "em1", "em2", "lo0"]
    assert facts["mtu"] == {"em1": 1500, "em2": 9000, "em3": 1500, "em9": None}
    # Mbit/s as an int, as the Linux branch's speed() (/sys/class/net/IFACE/speed) gives it.
    assert facts["speed"] == {"em1": 1000, "em2": 10000, "em3": None, "em9": None}
    assert facts["offloads"] == {
        "em1": {"TSO4": False, "TSO6": False, "LRO": True},
        "em2": {"TSO4": True, "TSO6": True, "LRO": False},
        "em3": {"TSO4": False, "TSO6": False, "LRO": False},
    }
    assert facts["routes"] == ROUTES
    assert facts["qdiscs"] == list(link_rules.DUMMYNET_AQMS)  # the link model's order
    assert facts["tracepoints"] == [] and facts["siftr"] is True  # siftr.ko to load
    assert facts["tools"] == {**TOOLS, "ipfw": str(tmp_path / "bin/ipfw")}
    assert facts["free_disk_bytes"] > 0
    assert set(host_facts.STATIC) <= set(facts)
    changing = run_facts(tmp_path, capsys, ["em1"], True)
    assert not set(host_facts.STATIC) & set(changing)


def test_kldstat_says_what_is_loaded_and_nothing_means_nothing(tmp_path, monkeypatch, capsys):
    standins(tmp_path, monkeypatch, siftr="loaded", dummynet=False)
    facts = run_facts(tmp_path, capsys, ["em1"])
    assert facts["siftr"] is True and facts["qdiscs"] == []
    standins(tmp_path / "none", monkeypatch, siftr="none")
    assert run_facts(tmp_path, capsys, ["em1"])["siftr"] is False


def test_missing_commands_give_none_not_an_exception(tmp_path, monkeypatch, capsys):
    standins(tmp_path, monkeypatch)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    facts = run_facts(tmp_path, capsys, ["em1"])
    assert facts["cc_loaded"] == [] and facts["interfaces"] == []
    assert facts["mtu"] == {"em1": None} and facts["offloads"] == {}
    assert facts["speed"] == {"em1": None} and facts["routes"] is None
    assert facts["addresses"] == {"em1": []} and facts["route_to"] is None  # cannot say
    assert set(facts["sysctls"].values()) == {None}
    assert set(facts["tools"].values()) == {None}
    assert facts["kernel"] == platform.release()


@pytest.mark.parametrize(
    ("media", "status", "speed"),
    [
        ("Ethernet autoselect (1000baseT <full-duplex>)", "active", 1000),
        ("Ethernet autoselect (10Gbase-T <full-duplex>)", "active", 10000),  # vtnet(4), ix(4)
        ("Ethernet autoselect (10Gbase-SR <full-duplex,rxpause,txpause>)", "active", 10000),
        ("Ethernet 10GBase-SR <full-duplex>", "active", 10000),  # fixed media, no autoselect
        ("Ethernet autoselect (100baseTX <full-duplex>)", "active", 100),
        ("Ethernet autoselect (10baseT/UTP <half-duplex>)", "active", 10),
        ("Ethernet autoselect (2500Base-T <full-duplex>)", "active", 2500),
        ("Ethernet autoselect (25GBase-SR <full-duplex>)", "active", 25000),
        ("Ethernet autoselect (100GBase-LR4 <full-duplex>)", "active", 100000),
        # media set by hand (ifconfig em1 media 1000baseT): selected, then active
        ("Ethernet 1000baseT <full-duplex> (1000baseT <full-duplex>)", "active", 1000),
        ("Ethernet autoselect (none)", "no carrier", None),
        ("Ethernet autoselect (1000baseT <full-duplex>)", "no carrier", None),  # stale media
        ("Ethernet autoselect", "active", None),  # no active media reported
        ("Ethernet autoselect (autoselect)", "active", None),
        ("IEEE 802.11 Wireless Ethernet autoselect mode 11g (autoselect)", "active", None),
    ],
)
def test_link_speed_from_the_media_line(media, status, speed):
    text = IFCONFIG.format(
        name="em1", address="198.18.1.1", broadcast="198.18.1.255", byte="00", mtu=1500,
        options="0", media=media, status=status,
    )  # fmt: skip
    assert host_facts.freebsd_speed(text) == speed
    # lo0 (ifconfig(8)): no media line, no status line.
    assert (
        host_facts.freebsd_speed("lo0: flags=8049<UP,LOOPBACK,RUNNING> metric 0 mtu 16384\n")
        is None
    )
    assert host_facts.freebsd_speed(None) is None


def test_routes_from_netstat_text_without_libxo(tmp_path, monkeypatch, capsys):
    standins(tmp_path, monkeypatch, libxo=False)
    assert run_facts(tmp_path, capsys, ["em1"])["routes"] == ROUTES


def test_routes_from_the_older_netstat_layout(monkeypatch):
    # netstat(1) of FreeBSD 10 and before: Refs and Use columns before Netif; no libxo.
    text = (
        "Routing tables\n\nInternet:\n"
        "Destination        Gateway            Flags    Refs      Use  Netif Expire\n"
        "default            198.19.10.1        UGS         0     1432    em0\n"
        "127.0.0.1          link#4             UH          0        8    lo0\n"
        "198.18.1.0/24      link#2             U           0      310    em1\n"
    )
    outputs = {("netstat", "-rn", "-f", "inet"): text}
    monkeypatch.setattr(
        host_facts, "run_soft", lambda cmd, any_status=False: outputs.get(tuple(cmd))
    )
    assert host_facts.freebsd_routes() == [ROUTES[0], ROUTES[2]]
    outputs = {}  # netstat missing or failing
    assert host_facts.freebsd_routes() is None
    outputs = {("netstat", "-rn", "-4", "--libxo", "json"): "{}"}  # JSON without routes
    assert host_facts.freebsd_routes() is None


def test_cc_available_in_both_layouts():
    assert host_facts.freebsd_cc_names(CC_AVAILABLE) == ["reno", "cubic", "htcp"]
    assert host_facts.freebsd_cc_names("newreno, cubic") == ["reno", "cubic"]  # before 13
    assert host_facts.freebsd_cc_names(None) == []


def lab_preflight(
    tmp_path, monkeypatch, capsys, overlays=(), sets=(), routers_routes=None, **freebsd
):
    """Preflight of seed 000's trials on the lab rack: R (and the hosts of freebsd_hosts) with
    facts from the FreeBSD branch and the stand-ins, the Debian hosts with Linux ones.
    routers_routes: a router's route(8) answers (route_standin), attached to both by default."""
    rack = Rack.load([LAB, *overlays])
    bin_dir = standins(tmp_path, monkeypatch, **freebsd)
    via_r = freebsd.get("route_iface", "enp2s0")
    end_host = {"2": ("198.18.1.1", via_r), "1": (None, via_r)}  # A's segment, via R to C's
    attached = {"1": (None, "em1"), "2": (None, "em2")}  # R: on both segments
    bsd = {}
    for name, host in rack.hosts.items():
        if preflight.runs_freebsd(rack, name):
            router = "freebsd_routers" in host.groups
            route_standin(
                bin_dir, (routers_routes or {}).get(name, attached) if router else end_host
            )
            asked = ["198.18.1.11", "198.18.1.12", "198.18.2.13", "198.18.2.14"]
            bsd[name] = run_facts(tmp_path, capsys, list(host.interfaces), destinations=asked)
            # its free disk was this machine's (host_facts ran here): a 2 Gbit/s link's
            # captures passed or failed the disk check as other files came and went
            bsd[name]["free_disk_bytes"] = 10**12
    linux_tools = {t: "x" for t in ("tc", "tcpdump", "tcpreplay", "python3", "iperf3")}

    def fake_facts(rack, names, **_):
        return {
            n: bsd.get(n)
            or {
                "kernel": "6.1.0-28-amd64",
                "cc_loaded": ["reno", "cubic"],
                "cc_modules": ["htcp"],
                "cc_params": {},
                "tools": linux_tools,
                "free_disk_bytes": 10**10,
                "qdiscs": [],
                "tracepoints": ["tcp:tcp_probe"],
                "mtu": {itf: 1500 for itf in rack.host(n).interfaces},
                "speed": {},
            }
            for n in names
        }

    def no_ssh(*_, **__):
        raise AssertionError("nothing is probed over SSH")

    monkeypatch.setattr(preflight.run, "host_facts", fake_facts)
    monkeypatch.setattr(preflight.run, "reachability", lambda rack, names: (list(names), []))
    monkeypatch.setattr(rack, "run_parallel", no_ssh)
    trials = load_plan(EXPERIMENT, list(sets)).select(None)
    return preflight.preflight(trials, rack, str(EXPERIMENT))


def test_seed000_passes_preflight_on_the_lab_rack_with_its_freebsd_router(
    tmp_path, monkeypatch, capsys
):
    facts = lab_preflight(tmp_path, monkeypatch, capsys)
    assert facts["R"]["tools"]["ipfw"] and "tc" not in facts["R"]["tools"]
    # preflight compares the speed (Mbit/s) with each shaped link's rate: 1 Mbit/s fits.
    assert facts["R"]["speed"] == {"em1": 1000, "em2": 10000}
    assert preflight.available({"R": facts["R"]}) == [
        "R (kernel 14.1-RELEASE): cc cubic dctcp htcp reno; qdiscs red gred rio fq_codel pie "
        "codel; tracepoints none; siftr yes"
    ]


def test_a_link_faster_than_the_freebsd_routers_nic_is_named_with_ifconfig(
    tmp_path, monkeypatch, capsys
):
    # R's em1 at 1 Gbit/s (its media line), the upstream link out of it asked for 2 Gbit/s
    with pytest.raises(SpecError) as exc:
        lab_preflight(
            tmp_path, monkeypatch, capsys, sets=["network.links[1].rate=2gbit", "factors={}"]
        )
    said = str(exc.value).split("\nWhat the hosts have:")[0].splitlines()
    assert said == [
        f"{EXPERIMENT}: link upstream: 2gbit out of R:em1, whose NIC runs at 1000 Mbit/s "
        "(ifconfig em1); the shaper cannot send faster than the wire: lower the rate or use a "
        "faster port"
    ]


def test_seed000_preflight_names_r_and_ipfw_when_ipfw_is_missing(tmp_path, monkeypatch, capsys):
    with pytest.raises(SpecError) as exc:
        lab_preflight(tmp_path, monkeypatch, capsys, ipfw=False)
    said = str(exc.value).split("\nWhat the hosts have:")[0].splitlines()
    assert said == [
        "host R lacks ipfw (needed by link upstream): it is in FreeBSD's base system "
        "(/sbin/ipfw), which roles/freebsd_router needs with dummynet: restore it there, or "
        "make the host a Linux router (group linux_routers)"
    ]


def test_a_freebsd_sender_needs_siftr_and_has_reno_as_newreno(tmp_path, monkeypatch, capsys):
    overlay = tmp_path / "freebsd_a.yml"
    overlay.write_text("all:\n  children:\n    freebsd_hosts:\n      hosts:\n        A: {}\n")
    facts = lab_preflight(tmp_path, monkeypatch, capsys, [overlay])
    assert {"reno", "htcp", "cubic"} <= set(facts["A"]["cc_loaded"])  # seed 000's three
    with pytest.raises(SpecError) as exc:
        lab_preflight(tmp_path / "none", monkeypatch, capsys, [overlay], siftr="none")
    said = str(exc.value).split("\nWhat the hosts have:")[0].splitlines()
    assert said == [
        "host A runs FreeBSD and has no SIFTR (siftr(4): not loaded, no siftr.ko), which "
        "records the cwnd of traffic[0] (bulk_tcp) there: load it (kldload siftr) or use a "
        "kernel that has it"
    ]


def test_a_freebsd_router_is_told_which_dummynet_aqms_it_has():
    problems = preflight.freebsd_qdisc_problems(
        "exp.yml",
        {"R": {"cake": "core", "fq_codel": "edge"}},
        {"R": {"kernel": "14.1-RELEASE", "qdiscs": ["red", "gred", "fq_codel", "pie"]}},
    )
    assert problems == [
        "exp.yml: link core: qdisc 'cake' is not available on the FreeBSD host R "
        "(14.1-RELEASE): its dummynet offers red, gred, fq_codel, pie; use droptail or one of "
        "those here, or a Linux router"
    ]


def test_a_linux_host_without_ethtool_gives_its_facts(tmp_path, monkeypatch, capsys):
    """A fresh lab host before configure has no ethtool: its facts still come back (preflight
    then names the tool and what installs it); they crashed with FileNotFoundError before."""
    if platform.system() != "Linux":
        pytest.skip("the Linux branch")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ip", "sysctl", "tc"):  # what else the Linux branch asks, where it has them
        if (found := shutil.which(tool)) is not None:
            (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    facts = run_facts(tmp_path, capsys, ["lo"])
    assert facts["offloads"] == {"lo": None}
    assert "ethtool" not in facts["tools"]


def test_a_freebsd_router_still_at_its_default_tick_is_told_to_configure_and_reboot(
    tmp_path, monkeypatch, capsys
):
    """Before configure (and its reboot), R runs kern.hz=1000: whole-millisecond dummynet
    delays. Preflight says so before any host is touched (configure's own check came later)."""
    with pytest.raises(SpecError) as exc:
        lab_preflight(tmp_path, monkeypatch, capsys, hz="1000")
    said = str(exc.value).split("\nWhat the hosts have:")[0].splitlines()
    assert said == [
        "host R runs kern.hz=1000; dummynet delays are whole ticks, and roles/freebsd_router "
        "needs 2000 (freebsd_router_kern_hz): run make configure INVENTORY=... (it writes "
        "kern.hz to /boot/loader.conf), then reboot R"
    ]


def test_a_freebsd_sender_whose_route_leaves_by_its_management_port_is_refused(
    tmp_path, monkeypatch, capsys
):
    """A FreeBSD A whose routes to the experiment's subnets go out of em0 (its management
    port): the traffic would never cross R. Its route to C, its one peer (the UDP stream runs
    from B to D), is named with the route it needs; the Linux hosts' facts say no route."""
    overlay = tmp_path / "freebsd_a.yml"
    overlay.write_text("all:\n  children:\n    freebsd_hosts:\n      hosts:\n        A: {}\n")
    with pytest.raises(SpecError) as exc:
        lab_preflight(tmp_path, monkeypatch, capsys, [overlay], route_iface="em0")
    said = str(exc.value).split("\nWhat the hosts have:")[0].splitlines()
    assert said == [
        "host A's route to 198.18.2.13 (C, traffic[0]) leaves through em0, not its experiment "
        "interface enp2s0: the traffic would bypass the rack's links; the host's own network "
        "configuration needs a route to 198.18.2.13 via R (198.18.1.1) on enp2s0"
    ]


def test_a_freebsd_router_whose_route_to_a_segment_leaves_by_the_other_is_refused(
    tmp_path, monkeypatch, capsys
):
    """R's route to C's segment goes back out of em1 via A (a static route left from another
    setup): the data would never reach the em2 pipe. Preflight names R's route to each of C
    and D, with the interface the route must leave by."""
    misrouted = {"1": (None, "em1"), "2": ("198.18.1.11", "em1")}
    with pytest.raises(SpecError) as exc:
        lab_preflight(tmp_path, monkeypatch, capsys, routers_routes={"R": misrouted})
    said = str(exc.value).split("\nWhat the hosts have:")[0].splitlines()
    assert said == [
        f"host R's route to 198.18.2.{n} ({node}, traffic[{i}]) leaves through em1, not its "
        "experiment interface em2: the traffic would bypass the rack's links; the host's own "
        f"network configuration needs a route to 198.18.2.{n} on em2"
        for i, (node, n) in enumerate((("C", 13), ("D", 14)))
    ]
