"""Action plugin: refuse variables that no role of this project reads.

Ansible ignores a variable nobody reads, so a by-hand `-e rate=2mbit` (or a typo such as
`linux_router_link` in a vars file) would configure nothing and still exit 0. The variables
the roles read are the options of their `meta/argument_specs.yml` and the keys of their
`defaults/main.yml`; the rack's inventory adds `trialbed_*` and Ansible's own `ansible_*`.
Anything else given to a host is refused, naming it and the nearest known names. Runs on
the controller; touches no host.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml
from ansible.plugins.action import ActionBase
from ansible.vars.reserved import get_reserved_names

PREFIXES = ("ansible_", "trialbed_")
# Ansible's magic variables (besides ansible_*) and what every play has.
MAGIC = {
    "environment", "group_names", "groups", "hostvars", "inventory_dir", "inventory_file",
    "inventory_hostname", "inventory_hostname_short", "omit", "play_hosts", "playbook_dir",
    "role_names", "vars",
}  # fmt: skip


def role_variables(roles_dir: Path) -> tuple[set[str], dict[str, list[str]]]:
    """The variables the roles read, and which of them hold a given key in their entries
    (`rate` -> [`linux_router_links`])."""
    names: set[str] = set()
    keys_of: dict[str, list[str]] = {}
    for role in sorted(p for p in roles_dir.iterdir() if p.is_dir()):
        specs = role / "meta" / "argument_specs.yml"
        if specs.exists():
            entries = (yaml.safe_load(specs.read_text()) or {}).get("argument_specs", {})
            for entry in entries.values():
                for name, option in (entry or {}).get("options", {}).items():
                    names.add(name)
                    for key in (option or {}).get("options", {}):
                        keys_of.setdefault(key, []).append(name)
        defaults = role / "defaults" / "main.yml"
        if defaults.exists():
            names.update(yaml.safe_load(defaults.read_text()) or {})
    return names, keys_of


def hint(name: str, ours: list[str], keys_of: dict[str, list[str]]) -> str:
    if name in keys_of:
        return f"a key of each entry of {' or '.join(sorted(set(keys_of[name])))}"
    near = [k for k in ours if name in k][:3]
    near = near or difflib.get_close_matches(name, ours, n=3, cutoff=0.6)
    if not near and (keys := difflib.get_close_matches(name, sorted(keys_of), n=1, cutoff=0.6)):
        return f"nearest known: {keys[0]}, {hint(keys[0], ours, keys_of)}"
    return f"nearest known: {', '.join(near) if near else 'none'}"


class ActionModule(ActionBase):
    _requires_connection = False
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        roles_dir = Path(task_vars["playbook_dir"]).parent / "roles"
        names, keys_of = role_variables(roles_dir)
        ours = sorted(names)
        known = set(ours) | MAGIC | set(get_reserved_names())
        unknown = sorted(
            name for name in task_vars if name not in known and not name.startswith(PREFIXES)
        )
        if not unknown:
            return {**result, "changed": False, "msg": f"none unknown ({len(ours)} known)"}
        hints = [f"{name} ({hint(name, ours, keys_of)})" for name in unknown]
        return {
            **result,
            "failed": True,
            "changed": False,
            "msg": f"variables no role of this project reads, given to "
            f"{task_vars.get('inventory_hostname')}: {'; '.join(hints)}. Every role's variables "
            f"are in {roles_dir}/<role>/meta/argument_specs.yml.",
        }
