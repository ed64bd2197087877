#!/usr/bin/python
"""Ansible module: which rack is up under a namespace prefix, and which checkout owns it.

Namespace names, bridges and management addresses belong to the whole machine, while a rack's
keys, sshd files and inventory live in one checkout. So rack-up records

- an owner file per prefix, <owner_dir>/<prefix>rack.json: the checkout (project_dir), its
  state directory, the topology's name, since when it is up, its inventory, and the
  namespaces, bridges and management addresses it holds;
- the same record plus the topology itself in <state_dir>/rack.json (the stored copy that
  rack-down and a rack-up of another topology take the rack down with).

state=check (before a rack-up, action=up, or a rack-down, action=down) fails, naming the owner,
when the prefix's rack belongs to another checkout whose namespaces still exist; takes over,
with a warning, an owner file whose namespaces are gone, and a live rack whose state
directory is gone (its checkout deleted or cleaned: nobody else could take it down); refuses
a rack-up whose bridges or management addresses a live rack under another prefix holds, or
whose state directory holds the rack of another prefix; and returns the rack that is up
(`previous`) and whether a rack-up must take it down first (`switch`, `message`).
state=present writes both records (keeping `since` while the same rack stays up);
state=absent removes the owner file.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.virtual_rack_qemu import qemu_pid

DOCUMENTATION = r"""
module: virtual_rack_owner
short_description: Owner file and stored copy of a virtual rack
options:
  state: {description: check, present or absent., type: str, required: true,
          choices: [check, present, absent]}
  action: {description: For state=check, up (rack-up) or down (rack-down)., type: str,
           default: up, choices: [up, down]}
  owner_dir: {description: Directory of the owner files., type: path, default: /run/trialbed}
  prefix: {description: Namespace prefix of the rack., type: str, required: true}
  project_dir: {description: This checkout., type: path}
  state_dir: {description: The rack's state directory., type: path}
  inventory: {description: The generated inventory., type: path}
  name: {description: The topology's name (its file's stem)., type: str}
  source: {description: The topology file., type: path}
  topology: {description: The topology., type: dict}
  namespaces: {description: The rack's namespaces., type: list, elements: str}
  bridges: {description: The rack's bridges., type: list, elements: str}
  management: {description: The rack's management addresses., type: list, elements: str}
  kind: {description: namespaces (on this machine) or vm (inside a qemu VM)., type: str,
         default: namespaces}
  vm_pidfile: {description: A VM rack's qemu pid file (the rack is live while it runs)., type: path}
"""


def read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write(path: Path, data: dict) -> bool:
    """Write JSON if it differs; True when it did."""
    text = json.dumps(data, indent=2) + "\n"
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


def describe(rec: dict) -> str:
    return (
        f"checkout {rec.get('project_dir', '?')} (topology {rec.get('topology', '?')}, "
        f"up since {rec.get('since', '?')}, state {rec.get('state_dir', '?')})"
    )


class Owner:
    def __init__(self, module: AnsibleModule):
        self.module = module
        self.p = module.params
        self.dir = Path(self.p["owner_dir"])
        out = module.run_command(["ip", "-j", "netns", "list"], check_rc=True)[1]
        self.netns = {n["name"] for n in json.loads(out or "[]")}

    def file(self, prefix: str) -> Path:
        return self.dir / f"{prefix}rack.json"

    def live(self, rec: dict, prefix: str) -> list[str]:
        """The record's namespaces that still exist (a VM rack's: its qemu, while it runs)."""
        if rec.get("vm_pidfile"):
            pid = qemu_pid(Path(rec["vm_pidfile"]))
            return [f"qemu pid {pid}"] if pid else []
        names = rec.get("namespaces")
        if not isinstance(names, list):
            return sorted(n for n in self.netns if n.startswith(prefix))
        return [n for n in names if n in self.netns]

    def foreign(self, prefix: str, action: str) -> dict | None:
        """The prefix's owner record if it is this checkout's; fails if another checkout's
        rack is up; warns and returns None for a stale one."""
        path = self.file(prefix)
        rec = read(path)
        if rec is None:
            if path.exists():
                self.module.warn(f"Taking over {path}: it is not a readable owner record.")
            return None
        if rec.get("project_dir") == self.p["project_dir"]:
            return rec
        live = self.live(rec, prefix)
        if live and not Path(rec.get("state_dir") or ".").is_dir():
            self.module.warn(
                f"Taking over the virtual rack with namespace prefix '{prefix}' of "
                f"{describe(rec)}: its state directory is gone (the checkout was deleted or "
                "cleaned with the rack up), so no checkout could take it down there; this one "
                "takes it down."
            )
            return rec
        if live:
            self.module.fail_json(
                msg=(
                    f"The virtual rack with namespace prefix '{prefix}' is owned by another "
                    f"{describe(rec)}; owner file {path}. Namespaces, bridges and management "
                    "addresses belong to the whole machine, so this checkout "
                    f"({self.p['project_dir']}) will not "
                    f"{'build over' if action == 'up' else 'remove'} it. To go on, either take "
                    f"it down there (cd "
                    f"{rec.get('project_dir')} && make rack-down), or use another prefix here: "
                    "-e virtual_rack_namespace_prefix=<prefix> with a topology file of its own "
                    "bridges and management subnet (-e virtual_rack_topology_file=<file>)."
                ),
                owner=rec,
            )
        self.module.warn(
            f"Taking over the stale owner file {path}: it names {describe(rec)}, whose "
            "namespaces are gone."
        )
        return None

    def check_shared(self) -> None:
        """Refuse bridges or management addresses that a live rack of another prefix holds."""
        mine_bridges = set(self.p["bridges"] or [])
        mine_mgmt = {a.split("/")[0] for a in self.p["management"] or []}
        for path in sorted(self.dir.glob("*rack.json")):
            prefix = path.name[: -len("rack.json")]
            if prefix == self.p["prefix"]:
                continue
            rec = read(path)
            if not rec or not self.live(rec, prefix):
                continue
            bridges = sorted(mine_bridges & set(rec.get("bridges") or []))
            mgmt = sorted(mine_mgmt & {a.split("/")[0] for a in rec.get("management") or []})
            if bridges or mgmt:
                what = " and ".join(
                    ([f"bridge{'s' * (len(bridges) > 1)} {', '.join(bridges)}"] if bridges else [])
                    + ([f"management address{'es' * (len(mgmt) > 1)} {', '.join(mgmt)}"]
                       if mgmt else [])
                )  # fmt: skip
                self.module.fail_json(
                    msg=(
                        f"{what} of topology {self.p['name']} ({self.p['source']}) "
                        f"{'is' if len(bridges) + len(mgmt) == 1 else 'are'} held by the "
                        f"virtual rack with namespace prefix '{prefix}' of {describe(rec)}; "
                        f"owner file {path}. Give this rack bridges and a management subnet "
                        "of its own in a copy of the topology (virtual_rack_topology_file), "
                        f"or take that rack down (cd {rec.get('project_dir')} && make rack-down)."
                    ),
                    owner=rec,
                )

    def stored(self, state_dir: str) -> dict | None:
        return read(Path(state_dir) / "rack.json")

    def check(self) -> dict:
        p = self.p
        action = p["action"]
        owner = self.foreign(p["prefix"], action)
        if action == "up":
            self.check_shared()
        previous = None
        if owner:
            # The rack the owner file names, from its stored copy when there is one.
            stored = self.stored(owner.get("state_dir") or "")
            previous = stored if stored and stored.get("prefix") == p["prefix"] else owner
        result: dict = {"previous": {}, "switch": False, "message": "", "state_dir_in_use": False}
        if not owner and p["state_dir"]:
            previous = self.stored(p["state_dir"])
            if previous and previous.get("prefix") != p["prefix"]:
                # The state directory holds the rack of another prefix: its keys and sshd files
                # are not this rack's to replace or remove.
                if action == "up":
                    self.module.fail_json(
                        msg=(
                            f"{p['state_dir']} holds the virtual rack with namespace prefix "
                            f"'{previous.get('prefix')}' (topology {previous.get('topology')}, "
                            f"up since {previous.get('since')}), not one with prefix "
                            f"'{p['prefix']}'. Give this rack a state directory of its own "
                            "(-e virtual_rack_state_dir=<dir>), or take that rack down first "
                            f"(-e virtual_rack_namespace_prefix={previous.get('prefix')} "
                            "-e virtual_rack_state=absent)."
                        )
                    )
                result["state_dir_in_use"] = True
                previous = None
        result["previous"] = previous or {}
        if action == "up" and previous:
            reasons = []
            if previous.get("topology") == p["name"]:
                if "spec" not in previous:
                    reasons.append("no stored copy of it")
                elif previous["spec"] != p["topology"]:
                    reasons.append("its topology changed")
            if previous.get("state_dir") != p["state_dir"]:
                reasons.append(f"its state is in {previous.get('state_dir')}")
            if previous.get("kind", "namespaces") != p["kind"]:
                reasons.append(f"it is a {previous.get('kind', 'namespaces')} rack")
            if previous.get("topology") != p["name"] or reasons:
                result["switch"] = True
                result["message"] = (
                    f"taking down the running {previous.get('topology')} rack to bring up "
                    f"{p['name']}" + (f" ({'; '.join(reasons)})" if reasons else "")
                )
        return result

    def present(self) -> bool:
        p = self.p
        path = self.file(p["prefix"])
        old = read(path) or {}
        record = {
            "project_dir": p["project_dir"],
            "state_dir": p["state_dir"],
            "topology": p["name"],
            "topology_file": p["source"],
            "prefix": p["prefix"],
            "inventory": p["inventory"],
            "since": "",
            "namespaces": p["namespaces"] or [],
            "bridges": p["bridges"] or [],
            "management": p["management"] or [],
            "kind": p["kind"],
        }
        if p["vm_pidfile"]:
            record["vm_pidfile"] = p["vm_pidfile"]
        same = all(old.get(k) == record[k] for k in ("project_dir", "state_dir", "topology"))
        record["since"] = (
            old["since"]
            if same and old.get("since")
            else datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        )
        stored = {**record, "spec": p["topology"]}
        if self.module.check_mode:
            return read(path) != record or self.stored(p["state_dir"]) != stored
        changed = write(path, record)
        return write(Path(p["state_dir"]) / "rack.json", stored) or changed

    def absent(self) -> bool:
        path = self.file(self.p["prefix"])
        rec = read(path)
        if rec is None and not path.exists():
            return False
        if (
            rec
            and rec.get("project_dir") != self.p["project_dir"]
            and self.live(rec, self.p["prefix"])
        ):
            return False  # another checkout's live rack: never ours to forget
        if not self.module.check_mode:
            path.unlink(missing_ok=True)
        return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["check", "present", "absent"]},
            "action": {"type": "str", "default": "up", "choices": ["up", "down"]},
            "owner_dir": {"type": "path", "default": "/run/trialbed"},
            "prefix": {"type": "str", "required": True},
            "project_dir": {"type": "path"},
            "state_dir": {"type": "path"},
            "inventory": {"type": "path"},
            "name": {"type": "str"},
            "source": {"type": "path"},
            "topology": {"type": "dict"},
            "namespaces": {"type": "list", "elements": "str"},
            "bridges": {"type": "list", "elements": "str"},
            "management": {"type": "list", "elements": "str"},
            "kind": {"type": "str", "default": "namespaces", "choices": ["namespaces", "vm"]},
            "vm_pidfile": {"type": "path"},
        },
        required_if=[
            ("state", "check", ["project_dir"]),
            ("state", "present", ["project_dir", "state_dir", "name", "topology"]),
        ],
        supports_check_mode=True,
    )
    owner = Owner(module)
    state = module.params["state"]
    if state == "check":
        module.exit_json(changed=False, **owner.check())
    elif state == "present":
        module.exit_json(
            changed=owner.present(), owner_file=str(owner.file(module.params["prefix"]))
        )
    else:
        module.exit_json(changed=owner.absent())


if __name__ == "__main__":
    main()
