#!/usr/bin/python
"""Ansible module: set a host's sysctls for a trial, live and in the role's sysctl file, in
one call.

ansible.posix.sysctl sets one name per call; with the congestion control, the trial's sysctls
and IPv6 off on each experiment interface, that was some twenty calls per host and the largest
part of a configure run (measured on the virtual rack's five hosts: 5.6 of 22.6 s). This module
does what those calls did: each value written to /proc/sys where it differs, and its
`name=value` line in the file (the format ansible.posix.sysctl and trialbed-select-cc write;
other lines stay).
"""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testbed_host_kernel import read, sysctl_path, write_value

DOCUMENTATION = r"""
module: testbed_host_sysctls
short_description: Set sysctls live and record them in a file, in one call
options:
  sysctls:
    description: Name -> value (as sysctl(8) names them; a "/" in a part stands for a dot).
    type: dict
    required: true
  path: {description: The file of C(name=value) lines to keep in step., type: path, required: true}
"""

RETURN = r"""
set:
  description: The values written, one C(name=value) per entry.
  returned: always
  type: list
"""


def normal(value: object) -> str:
    return " ".join(str(value).split())


def file_lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def with_lines(lines: list[str], wanted: dict[str, str]) -> list[str]:
    """The file's lines with each wanted name's line replaced (or added at the end)."""
    out, placed = [], set()
    for line in lines:
        name = line.split("=", 1)[0].strip()
        if "=" in line and name in wanted:
            if name not in placed:
                out.append(f"{name}={wanted[name]}")
                placed.add(name)
            continue
        out.append(line)
    out.extend(f"{n}={v}" for n, v in wanted.items() if n not in placed)
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "sysctls": {"type": "dict", "required": True},
            "path": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    wanted = {name: normal(value) for name, value in module.params["sysctls"].items()}
    path = module.params["path"]
    missing = [n for n in wanted if not os.path.exists(sysctl_path(n))]
    if missing:
        module.fail_json(msg=f"this kernel has no sysctl {', '.join(missing)}")
    changed_live = [f"{n}={v}" for n, v in wanted.items() if read(sysctl_path(n)) != v]
    before = file_lines(path)
    after = with_lines(before, wanted)
    if not module.check_mode:
        try:
            for line in changed_live:
                name, value = line.split("=", 1)
                write_value(sysctl_path(name), value)
        except ValueError as e:
            module.fail_json(msg=str(e))
        if after != before:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".new", "w") as f:
                f.write("".join(line + "\n" for line in after))
            os.replace(path + ".new", path)
    module.exit_json(
        changed=bool(changed_live) or after != before,
        set=changed_live,
        diff={
            "before": "".join(line + "\n" for line in before),
            "after": "".join(line + "\n" for line in after),
            "before_header": path,
            "after_header": path,
        },
    )


if __name__ == "__main__":
    main()
