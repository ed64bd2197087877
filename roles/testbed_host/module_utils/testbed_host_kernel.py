"""A host's kernel settings as the role's modules read and write them: sysctl and module
parameter files, and an interface's MTU, offloads, route metrics and root qdisc."""

from __future__ import annotations

import json
import re

from ansible.module_utils.basic import AnsibleModule

OFFLOADS = {
    "tso": "tcp-segmentation-offload",
    "gso": "generic-segmentation-offload",
    "gro": "generic-receive-offload",
}
ROUTE_METRICS = ("initcwnd", "initrwnd", "rto_min")


def sysctl_path(name: str) -> str:
    """As sysctl(8) reads a name: dots separate its parts, a "/" in a part stands for a dot
    (net.ipv6.conf.eth0/100.disable_ipv6 is /proc/sys/net/ipv6/conf/eth0.100/disable_ipv6)."""
    return "/proc/sys/" + "/".join(part.replace("/", ".") for part in name.split("."))


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return " ".join(f.read().split())  # tcp_rmem's tabs read back as spaces
    except OSError:
        return None


def write_value(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise ValueError(f"cannot write {value!r} to {path}: {e.strerror}") from e


class Host:
    def __init__(self, module: AnsibleModule):
        self.module = module

    def run(self, *argv: str) -> str:
        rc, out, err = self.module.run_command(list(argv))
        if rc != 0:
            self.module.fail_json(msg=f"{' '.join(argv)} failed: {err.strip()}", rc=rc)
        return out

    def offloads(self, iface: str) -> dict[str, str]:
        text = self.run("ethtool", "-k", iface)
        found = dict(re.findall(r"^([a-z-]+): (on|off)", text, re.MULTILINE))
        return {short: found[long] for short, long in OFFLOADS.items() if long in found}

    def route_metrics(self, iface: str) -> dict[str, object]:
        """The managed metrics of the interface's first unicast route that has any (the role
        sets the same ones on all of them)."""
        routes = json.loads(self.run("ip", "-4", "-j", "route", "show", "dev", iface) or "[]")
        for route in routes:
            metrics = {}
            for entry in route.get("metrics", []):
                metrics.update({k: v for k, v in entry.items() if k in ROUTE_METRICS})
            if metrics:
                if "rto_min" in metrics:
                    metrics["rto_min"] = f"{metrics['rto_min']}ms"
                return metrics
        return {}

    def root_qdisc(self, iface: str) -> str:
        shown = json.loads(self.run("tc", "-j", "qdisc", "show", "dev", iface, "root") or "[]")
        return shown[0]["kind"] if shown else "none"

    def interface(self, iface: str) -> dict[str, object]:
        return {
            "mtu": int(read(f"/sys/class/net/{iface}/mtu") or 0),
            "offloads": self.offloads(iface),
            "route_metrics": self.route_metrics(iface),
            "root_qdisc": self.root_qdisc(iface),
        }
