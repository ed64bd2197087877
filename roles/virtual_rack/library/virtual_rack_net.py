#!/usr/bin/python
"""Ansible module: the whole network of a virtual rack in one call.

No module exists for network namespaces, so this one owns the rack's network: the bridges in
the controller's namespace (management and one per segment) with the controller's management
address, and per host a network namespace joined to the bridges by veths, with addresses,
routes and offloads. It changes only what differs, so a second run reports ok. One call for
the whole rack keeps an 18-host rack-up fast (a per-host loop in Ansible pays a module start
per host).

state=absent ends every process in the given namespaces (sshd, tcpdump, iperf3, the delay line:
they would keep a deleted namespace alive), then removes their veths, the namespaces and the
bridges. It needs only the names, so it works from the record a rack-up left behind.
"""

from __future__ import annotations

import json
import os
import signal
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: virtual_rack_net
short_description: Namespaces, veths, bridges, addresses and routes of a virtual rack
options:
  topology:
    description: The topology (management, segments, hosts), for state=present.
    type: dict
  prefix: {description: Prefix of the namespace names., type: str, default: ""}
  offloads_off: {description: Turn TSO/GSO/GRO off on every veth end., type: bool, default: true}
  namespaces: {description: Namespaces to remove (state=absent)., type: list, elements: str}
  bridges: {description: Bridges to remove (state=absent)., type: list, elements: str}
  state: {description: present or absent., type: str, default: present,
          choices: [present, absent]}
"""

OFFLOADS = {
    "tso": "tcp-segmentation-offload",
    "gso": "generic-segmentation-offload",
    "gro": "generic-receive-offload",
}
IFNAMSIZ = 15


class Net:
    def __init__(self, module: AnsibleModule):
        self.module = module
        self.changes: list[str] = []

    # -- helpers ---------------------------------------------------------------------------
    def run(self, *args: str, check: bool = True) -> str:
        rc, out, err = self.module.run_command(list(args))
        if check and rc != 0:
            self.module.fail_json(msg=f"{' '.join(args)} failed: {err.strip()}", rc=rc)
        return out

    def change(self, what: str, *args: str) -> None:
        self.changes.append(what)
        if not self.module.check_mode:
            self.run(*args)

    def ip(self, ns: str | None, *args: str) -> list[str]:
        return ["ip", *(("-n", ns) if ns else ()), *args]

    def ip_json(self, ns: str | None, *args: str) -> list[dict]:
        return json.loads(self.run(*self.ip(ns, "-j", *args)) or "[]")

    def namespaces(self) -> set[str]:
        return {n["name"] for n in json.loads(self.run("ip", "-j", "netns", "list") or "[]")}

    def offloads_on(self, ns: str | None, ifname: str) -> list[str]:
        enter = ["nsenter", f"--net=/run/netns/{ns}"] if ns else []
        out = self.run(*enter, "ethtool", "-k", ifname, check=False)
        features = dict(
            line.strip().split(":", 1) for line in out.splitlines() if ":" in line.strip()
        )
        return [
            short
            for short, name in OFFLOADS.items()
            if features.get(name, "").strip().startswith("on")
        ]

    # -- present ---------------------------------------------------------------------------
    def plan(self) -> dict[str, list[dict]]:
        """Interfaces per host; fails with a message naming what is wrong in the topology."""
        p = self.module.params
        topo = p["topology"] or {}
        errors = []
        mgmt = topo.get("management") or {}
        segments = topo.get("segments") or {}
        hosts = topo.get("hosts") or {}
        if not hosts:
            errors.append("'hosts' must name at least one host")
        for key in ("bridge", "controller", "prefix"):
            if key not in mgmt:
                errors.append(f"management.{key} is missing")
        peer_prefix = p["prefix"].replace("-", "")
        plan = {}
        for host, spec in hosts.items():
            spec = spec or {}
            if "mgmt" not in spec:
                errors.append(f"host {host}: 'mgmt' (management address) is missing")
            ifs = [
                {
                    "name": "mgmt",
                    "bridge": mgmt.get("bridge"),
                    "address": f"{spec.get('mgmt')}/{mgmt.get('prefix')}",
                }
            ]
            for seg, addr in (spec.get("interfaces") or {}).items():
                if seg not in segments:
                    errors.append(f"host {host}: segment {seg!r} is not in 'segments'")
                    continue
                ifs.append({"name": seg, "bridge": segments[seg]["bridge"], "address": addr})
            for itf in ifs:
                itf["peer"] = f"{peer_prefix}{host}-{itf['name']}"
                for what in ("name", "peer"):
                    if len(itf[what]) > IFNAMSIZ:
                        errors.append(
                            f"host {host}: interface name {itf[what]!r} is longer than "
                            f"{IFNAMSIZ} characters (shorten the host or segment name)"
                        )
            plan[host] = ifs
        if errors:
            self.module.fail_json(msg="topology: " + "; ".join(errors))
        return plan

    def ensure_present(self) -> None:
        p = self.module.params
        topo = p["topology"]
        plan = self.plan()
        mgmt = topo["management"]
        bridges = [mgmt["bridge"]] + [s["bridge"] for s in (topo.get("segments") or {}).values()]
        root = {link["ifname"]: link for link in self.ip_json(None, "-d", "link", "show")}
        mgmt_bridge_missing = mgmt["bridge"] not in root
        for bridge in bridges:
            if bridge not in root:
                self.change(
                    f"bridge {bridge}",
                    *self.ip(None, "link", "add", bridge, "type", "bridge"),
                    *("nf_call_iptables", "0", "nf_call_ip6tables", "0"),
                    *("nf_call_arptables", "0"),
                )
                root[bridge] = {"flags": []}
            self.ensure_up(None, bridge, root)
        have = set()
        if not (mgmt_bridge_missing and self.module.check_mode):
            have = {
                f"{a['local']}/{a['prefixlen']}"
                for link in self.ip_json(None, "addr", "show", "dev", mgmt["bridge"])
                for a in link.get("addr_info", [])
                if a.get("family") == "inet"
            }
        if mgmt["controller"] not in have:
            self.change(
                f"controller address {mgmt['controller']}",
                *self.ip(None, "addr", "add", mgmt["controller"], "dev", mgmt["bridge"]),
            )
        existing = self.namespaces()
        for host, ifs in plan.items():
            ns = p["prefix"] + host
            self.ensure_host(ns, ifs, topo["hosts"][host] or {}, root, ns in existing)
        self.ensure_neighbours(plan, p["prefix"])

    def ensure_neighbours(self, plan: dict[str, list[dict]], prefix: str) -> None:
        """Permanent ARP entries between the hosts of each experiment segment. A router's ARP
        probe otherwise waits in the bottleneck queue with the traffic: dropped there, it is a
        tc drop no capture sees, and unanswered probes make the kernel drop traffic itself."""
        present = self.namespaces()
        on_segment: dict[str, list[tuple[str, str, str, str]]] = {}
        for host, ifs in plan.items():
            ns = prefix + host
            if ns not in present:  # check mode on a rack not built yet
                continue
            links = self.ip_json(ns, "link", "show")
            macs = {link["ifname"]: link.get("address") for link in links}
            for itf in ifs:
                name = itf["name"]
                if name != "mgmt" and macs.get(name):
                    address = itf["address"].split("/")[0]
                    on_segment.setdefault(itf["bridge"], []).append((ns, name, address, macs[name]))
        for members in on_segment.values():
            for ns, dev, _, _ in members:
                have = {
                    (n.get("dst"), n.get("lladdr"))
                    for n in self.ip_json(ns, "neigh", "show", "dev", dev)
                    if "PERMANENT" in n.get("state", [])
                }
                for other_ns, _, address, mac in members:
                    if other_ns != ns and (address, mac) not in have:
                        self.change(
                            f"{ns}:{dev} neighbour {address} at {mac}",
                            *self.ip(ns, "neigh", "replace", address, "lladdr", mac),
                            *("dev", dev, "nud", "permanent"),
                        )

    def ensure_host(self, ns: str, ifs: list[dict], spec: dict, root: dict, exists: bool) -> None:
        if exists:
            inner = {link["ifname"]: link for link in self.ip_json(ns, "-d", "link", "show")}
            addrs = {
                link["ifname"]: {
                    f"{a['local']}/{a['prefixlen']}"
                    for a in link.get("addr_info", [])
                    if a.get("family") == "inet"
                }
                for link in self.ip_json(ns, "addr", "show")
            }
            routes = {(r.get("dst"), r.get("gateway")) for r in self.ip_json(ns, "route", "show")}
        else:
            self.change(f"namespace {ns}", "ip", "netns", "add", ns)
            inner, addrs, routes = {}, {}, set()
        self.ensure_ipv4_only(ns)
        self.ensure_up(ns, "lo", inner)
        for itf in ifs:
            name, peer, bridge = itf["name"], itf["peer"], itf["bridge"]
            fresh = peer not in root
            if fresh:
                if name in inner:  # half of a pair left behind: start the pair anew
                    self.change(f"{ns}:{name} removed", *self.ip(ns, "link", "del", name))
                self.change(
                    f"veth {peer}<->{ns}:{name}",
                    *self.ip(None, "link", "add", peer, "type", "veth"),
                    *("peer", "name", name, "netns", ns),
                )
                root[peer] = {"flags": []}
                inner[name] = {"flags": []}
            if root[peer].get("master") != bridge:
                self.change(
                    f"{peer} joins {bridge}", *self.ip(None, "link", "set", peer, "master", bridge)
                )
            self.ensure_up(None, peer, root)
            self.ensure_up(ns, name, inner)
            if itf["address"] not in addrs.get(name, set()):
                self.change(
                    f"{ns}:{name} address {itf['address']}",
                    *self.ip(ns, "addr", "add", itf["address"], "dev", name),
                )
            if self.module.params["offloads_off"]:
                for where, ifname in ((None, peer), (ns, name)):
                    on = (
                        list(OFFLOADS)
                        if fresh and self.module.check_mode
                        else self.offloads_on(where, ifname)
                    )
                    if on:
                        enter = ["nsenter", f"--net=/run/netns/{where}"] if where else []
                        self.change(
                            f"{where + ':' if where else ''}{ifname} offloads off: {' '.join(on)}",
                            *enter,
                            *("ethtool", "-K", ifname),
                            *[arg for o in on for arg in (o, "off")],
                        )
        for route in spec.get("routes") or []:
            if (route["to"], route["via"]) not in routes:
                self.change(
                    f"{ns}: route {route['to']} via {route['via']}",
                    *self.ip(ns, "route", "replace", route["to"], "via", route["via"]),
                )

    def ensure_ipv4_only(self, ns: str) -> None:
        """No IPv6 in a host's namespace, before its links come up: the rack is IPv4
        (198.18.0.0/15), and IPv6's own frames (router solicitations, sent forever with a
        backoff since Linux 4.19; MLD reports) would cross the shaped queues unseen by the
        `ip` captures: a router's solicitation dropped at a full bottleneck was a drop tc
        counted and no capture saw."""
        enter = ["nsenter", f"--net=/run/netns/{ns}"]  # /proc/sys/net is the namespace's
        files = [f"/proc/sys/net/ipv6/conf/{c}/disable_ipv6" for c in ("all", "default")]
        now = self.run(*enter, "cat", *files, check=False).split()
        if now != ["1", "1"] and (now or self.module.check_mode):
            write = " && ".join(f"echo 1 > {f}" for f in files)
            self.change(f"{ns}: IPv6 off", *enter, "sh", "-c", write)

    def ensure_up(self, ns: str | None, ifname: str, links: dict[str, dict]) -> None:
        if "UP" not in links.get(ifname, {}).get("flags", []):
            where = f"{ns}:" if ns else ""
            self.change(f"{where}{ifname} up", *self.ip(ns, "link", "set", ifname, "up"))

    # -- absent ----------------------------------------------------------------------------
    def ensure_absent(self) -> None:
        p = self.module.params
        existing = self.namespaces()
        mine = [ns for ns in p["namespaces"] or [] if ns in existing]
        pids = []
        for ns in mine:
            pids += [int(x) for x in self.run("ip", "netns", "pids", ns, check=False).split()]
        if pids:
            self.changes.append(f"end processes {' '.join(map(str, pids))}")
            if not self.module.check_mode:
                self.end(pids)
        for ns in mine:
            for link in self.ip_json(ns, "-d", "link", "show"):
                if link.get("linkinfo", {}).get("info_kind") == "veth":
                    self.change(
                        f"{ns}:{link['ifname']} removed",
                        *self.ip(ns, "link", "del", link["ifname"]),
                    )
            self.change(f"namespace {ns} removed", "ip", "netns", "del", ns)
        root = self.ip_json(None, "-d", "link", "show")
        names = {link["ifname"] for link in root}
        for bridge in p["bridges"] or []:
            if bridge not in names:
                continue
            # Ports whose namespace is already gone (a half-removed rack) go with the bridge.
            for link in root:
                if (
                    link.get("master") == bridge
                    and link.get("linkinfo", {}).get("info_kind") == "veth"
                ):
                    self.change(f"{link['ifname']} removed", "ip", "link", "del", link["ifname"])
            self.change(f"bridge {bridge} removed", "ip", "link", "del", bridge)

    @staticmethod
    def end(pids: list[int]) -> None:
        """SIGTERM, up to 5 s to exit, then SIGKILL."""
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
            alive = []
            for pid in pids:
                try:
                    os.kill(pid, sig)
                    alive.append(pid)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while alive and time.monotonic() < deadline:
                alive = [pid for pid in alive if os.path.exists(f"/proc/{pid}")]
                if alive:
                    time.sleep(0.05)
            if not alive:
                return
            pids = alive


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "topology": {"type": "dict"},
            "prefix": {"type": "str", "default": ""},
            "offloads_off": {"type": "bool", "default": True},
            "namespaces": {"type": "list", "elements": "str"},
            "bridges": {"type": "list", "elements": "str"},
            "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
        },
        required_if=[("state", "present", ["topology"])],
        supports_check_mode=True,
    )
    net = Net(module)
    if module.params["state"] == "present":
        net.ensure_present()
    else:
        net.ensure_absent()
    module.exit_json(
        changed=bool(net.changes),
        changes=net.changes,
        diff={"before": "", "after": "\n".join(net.changes) + "\n"} if net.changes else {},
    )


if __name__ == "__main__":
    main()
