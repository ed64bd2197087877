"""`topology | virtual_rack_relocate(prefix, subnet)`: the same topology with bridges of its own
(<prefix><segment>, <prefix>mgmt) and management subnet 198.19.<subnet>.0/24, so a second rack
(another checkout's, a test's) can stand beside the default one. An empty subnet leaves the
topology as it is."""

from __future__ import annotations

import copy
import ipaddress

from ansible.errors import AnsibleFilterError


def virtual_rack_relocate(topology: dict, prefix: str, subnet: object = "") -> dict:
    if subnet in ("", None):
        return topology
    third = int(subnet) if str(subnet).isdigit() else -1
    if not 0 <= third <= 255:
        raise AnsibleFilterError(f"management subnet {subnet!r}: give the third octet (0-255)")
    out = copy.deepcopy(topology)
    mgmt = out["management"]
    net = ipaddress.ip_network(f"198.19.{third}.0/24")

    def moved(address: str) -> str:
        host = int(ipaddress.ip_address(address.split("/")[0])) & 0xFF
        return str(net.network_address + host)

    mgmt["bridge"] = f"{prefix}mgmt"
    length = mgmt["controller"].split("/")[1] if "/" in mgmt["controller"] else "24"
    mgmt["controller"] = f"{moved(mgmt['controller'])}/{length}"
    if "vm" in mgmt:
        mgmt["vm"] = f"{moved(mgmt['vm'])}/{mgmt['vm'].split('/')[1]}"
    for segment in (out.get("segments") or {}).values():
        segment["bridge"] = prefix + segment["bridge"].split("-", 1)[-1]
    for host in out["hosts"].values():
        host["mgmt"] = moved(host["mgmt"])
    return out


class FilterModule:
    def filters(self):
        return {"virtual_rack_relocate": virtual_rack_relocate}
