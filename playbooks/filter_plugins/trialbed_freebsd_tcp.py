"""Filters that write testbed_host's contract (the experiment's Linux names for the congestion
control, its module parameters and the TCP sysctls the runner sets: trials/runner.py
host_vars) as the kernel settings of a FreeBSD 13/14 end host (roles/freebsd_host), and say
what has no FreeBSD counterpart, naming the variable and what is allowed.

Facts, from the FreeBSD manual pages (and the source where they leave a number open):
  - mod_cc(4): an algorithm is compiled into the kernel or loaded as a kernel module (kld(4));
    net.inet.tcp.cc.available lists those that can be selected, net.inet.tcp.cc.algorithm is
    the default for new connections. Module cc_<name>.ko declares the module <name>
    (DECLARE_CC_MODULE, sys/netinet/cc/cc.h): `kldstat -q -m <name>` finds it compiled in or
    loaded (kldstat(8)), `kldload cc_<name>` loads the file (kldload(8)).
  - cc_newreno(4): NewReno, Linux's reno. cc_cubic(4): "no tunable MIB variables".
  - cc_htcp(4): net.inet.tcp.cc.htcp.adaptive_backoff and rtt_scaling, both 0 (off) by default.
  - tcp(4), TCP_FUNCTION_BLK and functions_default: FreeBSD's RACK and BBR are alternate TCP
    stacks, not mod_cc(4) algorithms; no congestion control module is called bbr.
  - tcp(4), MIB variables: rfc1323 is 0 (neither option), 1 (window scaling and timestamps),
    2 (window scaling only), 3 (timestamps only) in current FreeBSD's tcp(4) and tcp_subr.c
    (taken here to hold from 14 on); 13's tcp(4) has it on or off. hostcache.enable: the
    host cache keeps a closed connection's metrics (RTT, ssthresh, cwnd) for the next
    connection to that host; 0 disables it.
    recvspace / sendspace: initial buffer; recvbuf_auto / sendbuf_auto: automatic sizing;
    recvbuf_max / sendbuf_max: its maximum.
  - kern.ipc.maxsockbuf caps every socket buffer: sbreserve refuses more than
    maxsockbuf * MCLBYTES / (MSIZE + MCLBYTES) (sb_max_adj, sys/kern/uipc_sockbuf.c), and
    automatic sizing stops there, whatever recvbuf_max says.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

# The core of the checkout this plugin belongs to, ahead of any other on the path (an
# installed one may be another checkout's).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from core.link_rules import LARGEST_MTU, MTU, SMALLEST_MTU

# The experiment's names (Linux's) -> mod_cc(4) algorithm and module names.
CC_NAMES = {"reno": "newreno", "cubic": "cubic", "htcp": "htcp"}
NO_BBR = (
    "FreeBSD has no BBR congestion control module (its RACK and BBR are TCP stacks, "
    "tcp(4) TCP_FUNCTION_BLK, not mod_cc(4) algorithms)"
)
# Linux tcp_htcp module parameters -> cc_htcp(4) MIB variables. Linux's H-TCP always adapts
# its backoff to minRTT/maxRTT and use_bandwidth_switch adds a reset on a bandwidth change;
# FreeBSD's only switch for an adaptive backoff is adaptive_backoff.
HTCP_PARAMETERS = {
    "use_bandwidth_switch": "net.inet.tcp.cc.htcp.adaptive_backoff",
    "use_rtt_scaling": "net.inet.tcp.cc.htcp.rtt_scaling",
}
NO_METRICS_SAVE = "net.ipv4.tcp_no_metrics_save"
RMEM, WMEM = "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"
TIMESTAMPS = "net.ipv4.tcp_timestamps"
MAPPED_SYSCTLS = (NO_METRICS_SAVE, RMEM, WMEM, TIMESTAMPS)
# rfc1323 (tcp(4)): window scaling alone is 2 from FreeBSD 14 on.
RFC1323_SPLIT_FROM_RELEASE = 14
# sys/sys/param.h (every FreeBSD platform) and sys/sys/sockbuf.h: SB_MAX, maxsockbuf's default.
MSIZE, MCLBYTES, SB_MAX = 256, 2048, 2 * 1024 * 1024
# ifconfig(8) capabilities turned off on experiment interfaces (-tso turns off both TSO4 and
# TSO6, -lro LRO) and given back on teardown by these names in lower case.
OFFLOADS = ("TSO4", "TSO6", "LRO")


def freebsd_cc(name: str) -> str:
    """'reno' -> 'newreno': the mod_cc(4) name, also the module's (cc_<name>.ko)."""
    if name not in CC_NAMES:
        raise AnsibleFilterError(f"congestion control {name!r} has no FreeBSD name here")
    return CC_NAMES[name]


def _cc_name_problem(variable: str, name: object) -> str | None:
    if name == "bbr":
        return f"{variable} 'bbr': {NO_BBR}; allowed: {', '.join(CC_NAMES)}"
    if name not in CC_NAMES:
        return (
            f"{variable} {name!r} has no FreeBSD congestion control module here; "
            f"allowed: {', '.join(CC_NAMES)} (reno is FreeBSD's newreno)"
        )
    return None


def _buffer_triple(value: object) -> tuple[int, int, int] | None:
    """'4096 131072 6291456' (Linux's min default max) -> (4096, 131072, 6291456)."""
    words = str(value).split()
    if len(words) != 3 or not all(w.isdigit() for w in words):
        return None
    low, default, high = (int(w) for w in words)
    return (low, default, high) if low <= default <= high and default > 0 else None


def _release(value: object) -> int | None:
    text = str(value or "").split(".")[0]
    return int(text) if text.isdigit() else None


def host_problems(s: dict) -> list[str]:
    """What a FreeBSD end host cannot do of its variables (testbed_host's contract), each
    naming the variable and what is allowed; empty when every value maps."""
    problems = []
    cc, params = s.get("cc"), s.get("cc_params") or {}
    if problem := _cc_name_problem("testbed_host_cc", cc):
        problems.append(problem)
    if params and cc != "htcp":
        problems.append(
            f"testbed_host_cc_params {sorted(params)} for {cc}: only htcp's parameters map "
            f"to FreeBSD ({', '.join(HTCP_PARAMETERS)}; cc_cubic(4) and cc_newreno(4) take "
            "none of Linux's)"
        )
    elif params:
        allowed = ", ".join(f"{k} ({v})" for k, v in HTCP_PARAMETERS.items())
        for key, value in params.items():
            if key not in HTCP_PARAMETERS:
                problems.append(
                    f"testbed_host_cc_params key {key!r} has no FreeBSD counterpart "
                    f"(cc_htcp(4)); allowed: {allowed}"
                )
            elif str(value) not in ("0", "1"):
                problems.append(f"testbed_host_cc_params.{key} = {value!r}: 0 or 1")
    for name in s.get("flow_cc") or []:
        if name == "reno":
            problems.append(
                "trialbed_flow_cc: a flow from or to this host asks for cc reno; iperf3 -C "
                "hands the name to the kernel as it is, and FreeBSD calls it newreno: give "
                "the host testbed_host_cc reno instead of the flow's cc"
            )
        elif problem := _cc_name_problem("trialbed_flow_cc", name):
            problems.append(problem)
    problems += _sysctl_problems(s.get("sysctls") or {}, _release(s.get("release")))
    problems += _interface_problems(s)
    return problems


def _sysctl_problems(sysctls: dict, release: int | None) -> list[str]:
    problems = []
    for key, value in sysctls.items():
        if key not in MAPPED_SYSCTLS:
            problems.append(
                f"testbed_host_sysctls key {key!r} has no FreeBSD counterpart here; "
                f"mapped are: {', '.join(MAPPED_SYSCTLS)}"
            )
        elif key in (RMEM, WMEM) and _buffer_triple(value) is None:
            problems.append(
                f"testbed_host_sysctls {key} = {value!r}: three byte counts 'min default max', "
                "min <= default <= max, default above 0"
            )
        elif key in (NO_METRICS_SAVE, TIMESTAMPS) and str(value) not in ("0", "1"):
            problems.append(f"testbed_host_sysctls {key} = {value!r}: 0 or 1")
        elif (
            key == TIMESTAMPS and str(value) == "0" and (release or 99) < RFC1323_SPLIT_FROM_RELEASE
        ):
            problems.append(
                f"testbed_host_sysctls {key} = 0 on FreeBSD {release}: its net.inet.tcp.rfc1323 "
                "turns timestamps and window scaling off together; timestamps alone go off "
                f"from FreeBSD {RFC1323_SPLIT_FROM_RELEASE} (rfc1323=2, tcp(4))"
            )
    return problems


def _interface_problems(s: dict) -> list[str]:
    problems = []
    interfaces = list(s.get("interfaces") or [])
    for iface, mtu in (s.get("mtu") or {}).items():
        if (
            iface not in interfaces
            or not str(mtu).isdigit()
            or not (SMALLEST_MTU <= int(mtu) <= LARGEST_MTU)
        ):
            problems.append(
                f"testbed_host_mtu.{iface} = {mtu}: an MTU is an integer from {SMALLEST_MTU} to "
                f"{LARGEST_MTU} on one of this host's experiment interfaces "
                f"({', '.join(interfaces) or 'none'})"
            )
    default = s.get("mtu_default", MTU)
    if not str(default).isdigit() or not SMALLEST_MTU <= int(default) <= LARGEST_MTU:
        problems.append(
            f"testbed_host_mtu_default = {default}: an integer from {SMALLEST_MTU} to {LARGEST_MTU}"
        )
    not_built = [
        ("testbed_host_pacing_interfaces", s.get("pacing_interfaces"),
         "fq pacing is not built for FreeBSD end hosts; leave it empty"),
        ("testbed_host_route_metrics", s.get("route_metrics"),
         "per-route TCP metrics (initcwnd, initrwnd, rto_min) are not built for FreeBSD end "
         "hosts (its net.inet.tcp.initcwnd_segments and rexmit_min, tcp(4), are host-wide); "
         "leave it empty"),
        ("linux_router_links", s.get("links"),
         "a shaped access link is not built for FreeBSD end hosts; shape that direction on "
         "a router"),
        ("dscp_marker_rules", s.get("dscp_rules"),
         "DSCP marking is built with nftables, which FreeBSD has not; mark on a Linux host "
         "or router"),
    ]  # fmt: skip
    for variable, value, why in not_built:
        if value:
            problems.append(f"{variable} {value}: {why}")
    return problems


def cc_sysctls(s: dict) -> dict[str, object]:
    """The default congestion control and its parameters as FreeBSD sysctls."""
    wanted: dict[str, object] = {"net.inet.tcp.cc.algorithm": freebsd_cc(s["cc"])}
    for key, value in (s.get("cc_params") or {}).items():
        wanted[HTCP_PARAMETERS[key]] = int(value)
    return wanted


def tcp_sysctls(s: dict, own_maxsockbuf: object = None) -> dict[str, object]:
    """The runner's Linux TCP sysctls as FreeBSD sysctls. `own_maxsockbuf`: the host's own
    kern.ipc.maxsockbuf (its record), raised only when the largest buffer needs more."""
    sysctls = s.get("sysctls") or {}
    wanted: dict[str, object] = {}
    if NO_METRICS_SAVE in sysctls:
        # Linux: do not keep a closed connection's metrics for the next one. FreeBSD: no
        # host cache, so nothing is kept or looked up (purgenow would empty it once, and the
        # next trial's first connection would fill it again).
        wanted["net.inet.tcp.hostcache.enable"] = 1 - int(sysctls[NO_METRICS_SAVE])
    if TIMESTAMPS in sysctls:
        # Linux keeps window scaling (tcp_window_scaling) when timestamps go off.
        wanted["net.inet.tcp.rfc1323"] = 1 if int(sysctls[TIMESTAMPS]) else 2
    buffers: dict[str, int] = {}
    for key, side in ((RMEM, "recv"), (WMEM, "send")):
        if key in sysctls:
            # Linux's min (the size kept under memory pressure) has no tcp(4) counterpart.
            _, default, high = _buffer_triple(sysctls[key]) or (0, 0, 0)
            buffers[f"net.inet.tcp.{side}space"] = default
            buffers[f"net.inet.tcp.{side}buf_auto"] = 1
            buffers[f"net.inet.tcp.{side}buf_max"] = high
    largest = max([v for k, v in buffers.items() if k.endswith("buf_max")], default=0)
    needed = math.ceil(largest * (MSIZE + MCLBYTES) / MCLBYTES)
    own = int(own_maxsockbuf) if str(own_maxsockbuf or "").isdigit() else SB_MAX
    if needed > own:  # first, so that no buffer size is ever above the cap
        wanted["kern.ipc.maxsockbuf"] = needed
    return {**wanted, **buffers}


def ifconfig_state(text: str) -> dict[str, object]:
    """What `ifconfig IFACE` prints (ifconfig(8)) -> {'mtu': 1500, 'offloads': ['TSO4', 'LRO']}:
    the first line ends in `mtu N`; `options=...<...>` names the capabilities that are on, of
    which TSO4, TSO6 and LRO hand the stack multi-segment packets."""
    mtu = re.search(r"\bmtu (\d+)", text)
    options = re.search(r"^\s*options=\w*<([^>]*)>", text, re.MULTILINE)
    on = options[1].split(",") if options else []
    return {"mtu": int(mtu[1]) if mtu else 0, "offloads": [o for o in OFFLOADS if o in on]}


class FilterModule:
    def filters(self):
        return {
            "trialbed_freebsd_cc": freebsd_cc,
            "trialbed_freebsd_host_problems": host_problems,
            "trialbed_freebsd_cc_sysctls": cc_sysctls,
            "trialbed_freebsd_tcp_sysctls": tcp_sysctls,
            "trialbed_freebsd_ifconfig": ifconfig_state,
        }
