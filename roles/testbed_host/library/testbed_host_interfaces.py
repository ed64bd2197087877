#!/usr/bin/python
"""Ansible module: the experiment interfaces' offloads, MTU and pacing qdisc, in one call.

Each was two or three tasks per interface (read, then change what differs), and a task costs
the controller about 45 ms per host whatever it does (measured: 40 `command: true` tasks on
the virtual rack's five hosts took 8.7 s). This module reads and sets all three for every
interface at once; the baseline module recorded the host's own values before, and gives them
back on teardown.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testbed_host_kernel import Host, read

DOCUMENTATION = r"""
module: testbed_host_interfaces
short_description: Offloads off, the MTU and fq pacing on experiment interfaces
options:
  interfaces: {description: The experiment interfaces., type: list, elements: str, required: true}
  offloads_off: {description: Turn TSO, GSO and GRO off where on., type: bool, default: false}
  mtu: {description: Interface -> MTU (interfaces not listed keep theirs)., type: dict, default: {}}
  pacing:
    description:
      - Interfaces that get fq at their root. Another experiment interface with fq at its root
        (an earlier configure paced it) gets the kernel's default root back.
    type: list
    elements: str
    default: []
"""

RETURN = r"""
changes:
  description: What was changed, one entry per interface and setting.
  returned: always
  type: list
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "interfaces": {"type": "list", "elements": "str", "required": True},
            "offloads_off": {"type": "bool", "default": False},
            "mtu": {"type": "dict", "default": {}},
            "pacing": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    host = Host(module)
    p = module.params
    changes: list[tuple[str, list[str]]] = []
    for iface in p["interfaces"]:
        if p["offloads_off"]:
            on = [k for k, v in host.offloads(iface).items() if v == "on"]
            if on:
                changes.append((f"{iface} {' '.join(on)} off", ["ethtool", "-K", iface]
                                + [w for k in on for w in (k, "off")]))  # fmt: skip
        if iface in p["mtu"]:
            want = int(p["mtu"][iface])
            if int(read(f"/sys/class/net/{iface}/mtu") or 0) != want:
                changes.append((f"{iface} mtu {want}",
                                ["ip", "link", "set", "dev", iface, "mtu", str(want)]))  # fmt: skip
        root = host.root_qdisc(iface)
        tc = ["tc", "qdisc"]
        if iface in p["pacing"] and root != "fq":
            changes.append((f"{iface} root fq", [*tc, "replace", "dev", iface, "root", "fq"]))
        elif iface not in p["pacing"] and root == "fq":
            changes.append((f"{iface} root fq removed", [*tc, "del", "dev", iface, "root"]))
    if not module.check_mode:
        for _, argv in changes:
            host.run(*argv)
    done = [label for label, _ in changes]
    module.exit_json(
        changed=bool(done),
        changes=done,
        diff={"prepared": "".join(line + "\n" for line in done)},
    )


if __name__ == "__main__":
    main()
