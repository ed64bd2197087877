#!/usr/bin/python
"""Ansible module: one virtual-rack host as a network namespace with veth links.

No module exists for network namespaces, so this one owns the whole host: namespace,
management and experiment veths (each attached to a bridge in the controller's namespace),
addresses, routes and offloads. It changes only what differs, so a second run reports ok.
"""

from __future__ import annotations

import json

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: virtual_rack_host
short_description: A virtual-rack host as a network namespace joined to bridges by veths
options:
  name: {description: Host name (inventory_hostname)., required: true, type: str}
  namespace: {description: Network namespace name., required: true, type: str}
  interfaces:
    description: Interfaces inside the namespace.
    type: list
    elements: dict
    default: []
    suboptions:
      name: {description: Interface name inside the namespace., type: str, required: true}
      peer: {description: Name of the veth end in the controller namespace., type: str,
             required: true}
      bridge: {description: Bridge the peer joins., type: str, required: true}
      address: {description: Address with prefix length, or empty for none., type: str,
                default: ""}
  routes:
    description: Routes inside the namespace, each {to, via}.
    type: list
    elements: dict
    default: []
  offloads_off: {description: Turn TSO/GSO/GRO off on every veth end., type: bool, default: true}
  state: {description: present or absent., type: str, default: present,
          choices: [present, absent]}
"""

OFFLOADS = ("tso", "gso", "gro")
ETHTOOL_NAMES = {
    "tso": "tcp-segmentation-offload",
    "gso": "generic-segmentation-offload",
    "gro": "generic-receive-offload",
}


class Host:
    def __init__(self, module: AnsibleModule):
        self.module = module
        self.ns = module.params["namespace"]
        self.changes: list[str] = []

    def run(self, *args: str, ns: bool = False, check: bool = True) -> str:
        cmd = (["ip", "netns", "exec", self.ns] if ns else []) + list(args)
        rc, out, err = self.module.run_command(cmd)
        if check and rc != 0:
            self.module.fail_json(msg=f"{' '.join(cmd)} failed: {err.strip()}", rc=rc)
        return out

    def change(self, what: str, *args: str, ns: bool = False) -> None:
        self.changes.append(what)
        if not self.module.check_mode:
            self.run(*args, ns=ns)

    def links(self, ns: bool) -> dict[str, dict]:
        if ns and not self.ns_exists():
            return {}
        return {
            link["ifname"]: link
            for link in json.loads(self.run("ip", "-j", "-d", "link", "show", ns=ns))
        }

    def ns_exists(self) -> bool:
        out = self.run("ip", "-j", "netns", "list")
        return any(entry["name"] == self.ns for entry in json.loads(out or "[]"))

    def addresses(self, ifname: str) -> set[str]:
        if not self.ns_exists():
            return set()
        out = json.loads(
            self.run("ip", "-j", "addr", "show", "dev", ifname, ns=True, check=False) or "[]"
        )
        return {
            f"{a['local']}/{a['prefixlen']}"
            for link in out
            for a in link.get("addr_info", [])
            if a.get("family") == "inet"
        }

    def offloads_on(self, ifname: str, ns: bool) -> list[str]:
        if self.module.check_mode and ns and not self.ns_exists():
            return list(OFFLOADS)
        out = self.run("ethtool", "-k", ifname, ns=ns, check=False)
        on = []
        for short, long_name in ETHTOOL_NAMES.items():
            for line in out.splitlines():
                if line.strip().startswith(long_name + ":") and ": on" in line:
                    on.append(short)
        return on

    def ensure_present(self) -> None:
        p = self.module.params
        if not self.ns_exists():
            self.change(f"namespace {self.ns}", "ip", "netns", "add", self.ns)
        root_links = self.links(ns=False)
        inner_links = self.links(ns=True)
        self.ensure_up("lo", inner_links, ns=True)
        for itf in p["interfaces"]:
            name, peer, bridge = itf["name"], itf["peer"], itf["bridge"]
            if peer not in root_links:
                self.change(
                    f"veth {peer}<->{self.ns}:{name}",
                    "ip",
                    "link",
                    "add",
                    peer,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    name,
                    "netns",
                    self.ns,
                )
                root_links[peer] = {"operstate": "DOWN", "flags": []}
                inner_links[name] = {"operstate": "DOWN", "flags": []}
            if root_links[peer].get("master") != bridge:
                self.change(f"{peer} joins {bridge}", "ip", "link", "set", peer, "master", bridge)
            self.ensure_up(peer, root_links, ns=False)
            self.ensure_up(name, inner_links, ns=True)
            if itf["address"] and itf["address"] not in self.addresses(name):
                self.change(
                    f"{name} address {itf['address']}",
                    "ip",
                    "addr",
                    "add",
                    itf["address"],
                    "dev",
                    name,
                    ns=True,
                )
            if p["offloads_off"]:
                for ifname, ns in ((peer, False), (name, True)):
                    on = self.offloads_on(ifname, ns)
                    if on:
                        args = [arg for o in on for arg in (o, "off")]
                        self.change(
                            f"{ifname} offloads off: {' '.join(on)}",
                            "ethtool",
                            "-K",
                            ifname,
                            *args,
                            ns=ns,
                        )
        self.ensure_routes()

    def ensure_up(self, ifname: str, links: dict[str, dict], ns: bool) -> None:
        if "UP" not in links.get(ifname, {}).get("flags", []):
            self.change(f"{ifname} up", "ip", "link", "set", ifname, "up", ns=ns)

    def ensure_routes(self) -> None:
        have = set()
        if self.ns_exists():
            for r in json.loads(self.run("ip", "-j", "route", "show", ns=True) or "[]"):
                have.add((r.get("dst"), r.get("gateway")))
        for route in self.module.params["routes"]:
            if (route["to"], route["via"]) not in have:
                self.change(
                    f"route {route['to']} via {route['via']}",
                    "ip",
                    "route",
                    "replace",
                    route["to"],
                    "via",
                    route["via"],
                    ns=True,
                )

    def ensure_absent(self) -> None:
        root_links = self.links(ns=False)
        for itf in self.module.params["interfaces"]:
            if itf["peer"] in root_links:
                self.change(f"veth {itf['peer']} removed", "ip", "link", "del", itf["peer"])
        if self.ns_exists():
            self.change(f"namespace {self.ns} removed", "ip", "netns", "del", self.ns)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "namespace": {"type": "str", "required": True},
            "interfaces": {"type": "list", "elements": "dict", "default": []},
            "routes": {"type": "list", "elements": "dict", "default": []},
            "offloads_off": {"type": "bool", "default": True},
            "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
        },
        supports_check_mode=True,
    )
    host = Host(module)
    if module.params["state"] == "present":
        host.ensure_present()
    else:
        host.ensure_absent()
    module.exit_json(
        changed=bool(host.changes),
        changes=host.changes,
        diff={"before": "", "after": "\n".join(host.changes) + "\n"} if host.changes else {},
    )


if __name__ == "__main__":
    main()
