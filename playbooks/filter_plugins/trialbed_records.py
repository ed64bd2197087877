"""Filters over the records the roles keep on the hosts (read on the controller, where the
virtual rack's hosts keep their files)."""

from __future__ import annotations

import json


def trialbed_recorded_cc(path: str) -> str:
    """The congestion control a host had before configure (testbed_host's baseline.json at
    `path`), '' when there is no record."""
    try:
        with open(path) as f:
            return json.load(f).get("sysctls", {}).get("net.ipv4.tcp_congestion_control", "")
    except (OSError, ValueError):
        return ""


class FilterModule:
    def filters(self):
        return {"trialbed_recorded_cc": trialbed_recorded_cc}
