#!/usr/bin/python
"""Ansible module: the initial namespace's net.ipv4.tcp_allowed_congestion_control, shared by
every virtual rack on the machine.

A namespace may only select a congestion control that list names, and the list belongs to the
whole machine, while several racks (other prefixes, other checkouts, the test racks) come and
go on it. So one record, <owner_dir>/allowed_cc.json, holds the list as it was before the first
rack changed it and, per rack (its state directory), what that rack needs:

- state=present adds `allow` to the list and to the rack's entry (the first rack to change the
  list records the original);
- state=absent forgets the rack; the list keeps what the original and the racks still up need,
  and when no rack is left it is the original again and the record goes. A rack that is not in
  the record (brought up before the record existed) gives back its own `legacy_original` file
  when no other rack is recorded.

The record is updated under an exclusive lock (two racks can come up at once).
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: virtual_rack_allowed_cc
short_description: The machine's allowed congestion controls, shared between virtual racks
options:
  state: {description: present (allow for this rack) or absent (this rack is gone)., type: str,
          required: true, choices: [present, absent]}
  rack: {description: The rack's state directory (its key in the record)., type: str,
         required: true}
  allow: {description: Congestion controls this rack's hosts select., type: list,
          elements: str, default: []}
  owner_dir: {description: Directory of the record., type: path, default: /run/trialbed}
  legacy_original: {description: A rack's own copy of the list from before the shared record.,
                    type: path}
  sysctl_path: {description: The list's file., type: path,
                default: /proc/sys/net/ipv4/tcp_allowed_congestion_control}
"""

RETURN = r"""
allowed: {description: The list afterwards., type: list}
original: {description: The list before any rack changed it (empty when none did)., type: list}
racks: {description: The racks still recorded., type: list}
"""


@contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_record(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("racks"), dict):
        return None
    return data


def write_record(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def plan(
    current: list[str],
    record: dict | None,
    state: str,
    rack: str,
    allow: list[str],
    legacy: list[str] | None,
) -> tuple[list[str], dict | None]:
    """The list and the record after this call."""
    if state == "present":
        wanted = [c for c in allow if c not in current]
        known = set(record["racks"].get(rack, [])) if record else set()
        if not wanted and (record is None or known >= set(allow)):
            return current, record  # nothing to add: a rack that changes nothing is not recorded
        record = record or {"original": current, "racks": {}}
        record["racks"][rack] = sorted(known | set(allow))
        return current + wanted, record
    if record is None or rack not in record["racks"]:
        if legacy is not None and not (record and record["racks"]):
            return legacy, record
        return current, record
    del record["racks"][rack]
    if not record["racks"]:
        return list(record["original"]), None
    needed = set(record["original"]).union(*record["racks"].values())
    return [c for c in current if c in needed], record


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["present", "absent"]},
            "rack": {"type": "str", "required": True},
            "allow": {"type": "list", "elements": "str", "default": []},
            "owner_dir": {"type": "path", "default": "/run/trialbed"},
            "legacy_original": {"type": "path"},
            "sysctl_path": {
                "type": "path",
                "default": "/proc/sys/net/ipv4/tcp_allowed_congestion_control",
            },
        },
        supports_check_mode=True,
    )
    p = module.params
    record_path = Path(p["owner_dir"]) / "allowed_cc.json"
    sysctl = Path(p["sysctl_path"])
    legacy_path = Path(p["legacy_original"]) if p["legacy_original"] else None
    legacy = legacy_path.read_text().split() if legacy_path and legacy_path.is_file() else None
    with locked(record_path):
        current = sysctl.read_text().split()
        before = read_record(record_path)
        record = json.loads(json.dumps(before)) if before else None  # plan() edits its copy
        allowed, record = plan(current, record, p["state"], p["rack"], p["allow"], legacy)
        changed = allowed != current or record != before
        if changed and not module.check_mode:
            if allowed != current:
                try:
                    sysctl.write_text(" ".join(allowed))
                except OSError as exc:
                    module.fail_json(
                        msg=f"cannot write {sysctl} = {' '.join(allowed)!r}: {exc} (only the "
                        "congestion controls this kernel offers can be allowed: "
                        "net.ipv4.tcp_available_congestion_control)"
                    )
            if record is None:
                record_path.unlink(missing_ok=True)
            else:
                write_record(record_path, record)
    diff = {"before": " ".join(current) + "\n", "after": " ".join(allowed) + "\n"}
    module.exit_json(
        changed=changed,
        allowed=allowed,
        original=(record or before or {}).get("original", []),
        racks=sorted((record or {}).get("racks", {})),
        diff=diff,
    )


if __name__ == "__main__":
    main()
