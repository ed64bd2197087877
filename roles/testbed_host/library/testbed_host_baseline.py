#!/usr/bin/python
"""Ansible module: the host's own settings before trialbed changed them, recorded on the host,
and given back on teardown.

configure.yml changes sysctls (the congestion control among them), congestion-control module
parameters, offloads, MTU, route metrics and the root qdisc of the experiment interfaces.
Before it does, this module records each of those values the first time it sees it (a value
already recorded is kept: the second trial's configure finds the first trial's settings, not
the host's own). teardown.yml gives every recorded value back and forgets the record, so that
a teardown needs none of the trial's variables, and a second one finds nothing to do.
"""

from __future__ import annotations

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testbed_host_kernel import Host, read, sysctl_path, write_value

DOCUMENTATION = r"""
module: testbed_host_baseline
short_description: Record a host's settings before a trial changes them; give them back
options:
  state:
    description:
      - C(recorded) adds the values not yet in O(path) (in check mode nothing is written);
        it changes the host only with O(restore_unlisted_sysctls).
      - C(restored) writes back every recorded value that differs now (changed when one did)
        and removes O(path). The route metrics are returned, for testbed_host_route_metrics.
    choices: [recorded, restored]
    required: true
    type: str
  path: {description: The record (JSON) on the host., type: path, required: true}
  sysctls: {description: Sysctl names to record., type: list, elements: str, default: []}
  restore_unlisted_sysctls:
    description:
      - With C(recorded), give back the recorded sysctls that O(sysctls) no longer lists (an
        earlier trial set them, this one does not); changed when one differed.
    type: bool
    default: false
  module_parameters:
    description: Kernel module parameters to record, as C(module/parameter), e.g.
      C(tcp_htcp/use_rtt_scaling).
    type: list
    elements: str
    default: []
  interfaces:
    description: Interfaces whose MTU, offloads, route metrics and root qdisc to record.
    type: list
    elements: str
    default: []
"""

RETURN = r"""
absent_sysctls:
  description: The listed sysctls this kernel does not have (e.g. IPv6's, without IPv6).
  returned: state=recorded
  type: list
restored:
  description: What was written back, one line per value (C(net.ipv4.tcp_congestion_control=cubic)).
  returned: state=restored
  type: list
route_metrics:
  description: Interface -> the managed route metrics it had (initcwnd, initrwnd, rto_min).
  returned: always
  type: dict
"""


def module_parameter_path(name: str) -> str:
    module, parameter = name.split("/", 1)
    return f"/sys/module/{module}/parameters/{parameter}"


def load(path: str) -> dict[str, dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise ValueError(f"{path} is not the JSON this module writes: {e}") from e


def record(module: AnsibleModule, host: Host) -> dict:
    path = module.params["path"]
    recorded = load(path)
    sysctls = recorded.setdefault("sysctls", {})
    added = []
    for name in module.params["sysctls"]:
        if name not in sysctls and (value := read(sysctl_path(name))) is not None:
            sysctls[name] = value
            added.append(name)
    parameters = recorded.setdefault("module_parameters", {})
    for name in module.params["module_parameters"]:
        value = read(module_parameter_path(name))
        if name not in parameters and value is not None:
            parameters[name] = value
            added.append(name)
    interfaces = recorded.setdefault("interfaces", {})
    for iface in module.params["interfaces"]:
        if iface not in interfaces:
            interfaces[iface] = host.interface(iface)
            added.append(iface)
    given_back = []
    if module.params["restore_unlisted_sysctls"]:
        for name, value in sysctls.items():
            if name not in module.params["sysctls"] and read(sysctl_path(name)) != value:
                given_back.append(f"{name}={value}")
                if not module.check_mode:
                    write_value(sysctl_path(name), value)
    if added and not module.check_mode:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".new", "w") as f:
            json.dump(recorded, f, indent=1, sort_keys=True)
        os.replace(path + ".new", path)
    return {
        "changed": bool(given_back),
        "recorded": added,
        "absent_sysctls": [
            n for n in module.params["sysctls"] if not os.path.exists(sysctl_path(n))
        ],
        "restored": given_back,
        "route_metrics": routes_of(recorded),
        "diff": {"prepared": "".join(f"restore {line}\n" for line in given_back)},
    }


def routes_of(recorded: dict) -> dict[str, dict]:
    return {i: s["route_metrics"] for i, s in recorded.get("interfaces", {}).items()}


def restore(module: AnsibleModule, host: Host) -> dict:
    path = module.params["path"]
    recorded = load(path)
    done = []

    def write(file: str, value: str, label: str) -> None:
        if read(file) not in (None, value):
            done.append(f"{label}={value}")
            if not module.check_mode:
                write_value(file, value)

    for name, value in recorded.get("sysctls", {}).items():
        write(sysctl_path(name), value, name)
    for name, value in recorded.get("module_parameters", {}).items():
        write(module_parameter_path(name), value, name)
    for iface, was in recorded.get("interfaces", {}).items():
        if not os.path.exists(f"/sys/class/net/{iface}"):
            module.warn(f"{iface} is gone: its settings are not restored")
            continue
        now = host.interface(iface)
        if now["mtu"] != was["mtu"]:
            done.append(f"{iface} mtu {was['mtu']}")
            if not module.check_mode:
                host.run("ip", "link", "set", "dev", iface, "mtu", str(was["mtu"]))
        changed = [f"{k} {v}" for k, v in was["offloads"].items() if now["offloads"].get(k) != v]
        if changed:
            done.append(f"{iface} {' '.join(changed)}")
            if not module.check_mode:
                host.run("ethtool", "-K", iface, *" ".join(changed).split())
        # fq is the only root qdisc this role sets (pacing); shaping is linux_router's.
        if now["root_qdisc"] == "fq" and was["root_qdisc"] != "fq":
            done.append(f"{iface} root qdisc {was['root_qdisc']}")
            if not module.check_mode:
                host.run("tc", "qdisc", "del", "dev", iface, "root")
    if recorded and not module.check_mode:
        os.remove(path)
    return {
        "changed": bool(done),
        "restored": done,
        "route_metrics": routes_of(recorded),
        "diff": {"prepared": "".join(f"restore {line}\n" for line in done)},
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["recorded", "restored"]},
            "path": {"type": "path", "required": True},
            "sysctls": {"type": "list", "elements": "str", "default": []},
            "restore_unlisted_sysctls": {"type": "bool", "default": False},
            "module_parameters": {"type": "list", "elements": "str", "default": []},
            "interfaces": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    host = Host(module)
    try:
        if module.params["state"] == "recorded":
            module.exit_json(**record(module, host))
        module.exit_json(**restore(module, host))
    except ValueError as e:
        module.fail_json(msg=str(e))


if __name__ == "__main__":
    main()
