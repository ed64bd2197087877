#!/usr/bin/python
"""Ansible module: congestion controls the kernel lacks, provided as BPF programs
(hostside/bpf_cc/<name>/), registered once per kernel for every host that needs them.

A registered congestion control belongs to the kernel, and several hosts may share one (the
virtual rack's namespaces, and several racks on one machine). So one record per congestion
control, <record_dir>/<name>.json (under /run: a reboot forgets it with the registration),
says what is registered (struct_ops id, the source's and the object's sha256, the parameters)
and who needs it (users: a host's working directory or a rack's state directory, each with
the parameters it asked for). Updated under an exclusive lock:

- state=present: for each congestion control the kernel offers itself (a module, built in,
  or registered by something else), nothing (provider C(kernel)). Otherwise its source folder
  (the name's own, or the one `folders` gives: bpf_htcp from htcp/, to run beside the kernel's
  own htcp) is built (once per source hash, under build_dir) and registered with the
  parameters, or the registered one is kept and its parameters set (a BPF parameter is
  kernel-wide and live, as a module parameter is); this user is added. Refused, naming both:
  parameters or a source that differ from what another user asked for.
- state=absent: this user (and every user below it) is removed, and users whose directory is
  gone; a congestion control nobody needs any more is unregistered (by id) and its record goes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: testbed_host_bpf_cc
short_description: Register BPF congestion controls once per kernel, for the hosts that need them
options:
  state: {description: present (provide them for this user) or absent (this user is done).,
          type: str, required: true, choices: [present, absent]}
  ccs:
    description: present - congestion control -> the parameters this user asks for (a name not
      given keeps its value); absent - ignored (every record is looked at).
    type: dict
    default: {}
  folders:
    description: present - congestion control -> the folder of hostside/bpf_cc it is built
      from, when that is not its own name (it is then built under this name, build.sh CC:NAME).
    type: dict
    default: {}
  user: {description: Who needs them (a directory; absent also removes the users below it).,
         type: path, required: true}
  sources: {description: The sources (present), path relative to hostside/bpf_cc -> text.,
            type: dict, default: {}}
  build_dir: {description: Where builds go, one directory per source hash., type: path,
              default: /var/lib/trialbed/bpf_cc}
  record_dir: {description: Where the records are (one per kernel: on a tmpfs)., type: path,
               default: /run/trialbed/bpf_cc}
"""

RETURN = r"""
providers:
  description: Congestion control -> C(bpf) (registered here from its source) or C(kernel).
  returned: always
  type: dict
registered:
  description: Congestion control -> its record (id, params_map_id, params, source (its
    folder), source_sha256, object_sha256, users), for those provided as BPF.
  returned: always
  type: dict
"""

AVAILABLE = "/proc/sys/net/ipv4/tcp_available_congestion_control"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
BTF = "/sys/kernel/btf/vmlinux"
SHARED = ("bpf_cc.h", "trialbed_bpf_cc.c", "build.sh")  # what every congestion control builds from
LOADER = "trialbed-bpf-cc"


class Failure(Exception):
    pass


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Failure(f"{what}: {(done.stderr or done.stdout).strip()[-1500:]}")
    return done.stdout


@contextmanager
def locked(directory: Path):
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def source_files(sources: dict[str, str], cc: str) -> dict[str, str]:
    """The files a congestion control is built from: the shared ones and its own folder's."""
    files = {
        p: t
        for p, t in sources.items()
        if p in SHARED or (p.startswith(f"{cc}/") and p.endswith((".c", ".h")))
    }
    if f"{cc}/{cc}.bpf.c" not in files:
        raise Failure(f"{cc}: no BPF source {cc}/{cc}.bpf.c among the sources given")
    return files


def source_sha256(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + files[path].encode() + b"\0")
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(build_dir: Path, cc: str, files: dict[str, str], sha: str, folder: str) -> Path:
    """The directory holding <cc>.bpf.o (from `folder`) and the loader built from `files`
    (built once)."""
    done = build_dir / f"{cc}-{sha[:16]}"
    if (done / f"{cc}.bpf.o").is_file() and (done / LOADER).is_file():
        return done
    missing = [t for t in ("clang", "cc") if shutil.which(t) is None]
    if not Path("/usr/include/bpf/libbpf.h").is_file():
        missing.append("libbpf's headers")
    if missing:
        raise Failure(
            f"{cc}: cannot build the BPF congestion control here: no {', '.join(missing)} "
            "(Debian: clang libbpf-dev gcc libc6-dev; testbed_host_bpf_cc_packages)"
        )
    work = build_dir / f".{cc}-{sha[:16]}.{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    for path, text in files.items():
        (work / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (work / "src" / path).write_text(text)
    build_sh = ["sh", str(work / "src/build.sh"), str(work), f"{folder}:{cc}"]
    run(build_sh, f"{cc}: building it failed")
    shutil.rmtree(done, ignore_errors=True)
    os.replace(work, done)
    return done


def kernel_problem(cc: str) -> str | None:
    """Why this kernel cannot take a BPF congestion control (None: it can, as far as seen)."""
    missing = []
    if not os.path.exists(BTF):
        missing.append(f"BTF ({BTF}: CONFIG_DEBUG_INFO_BTF)")
    if shutil.which("bpftool") is None:
        missing.append("bpftool (Debian: bpftool)")
    if missing:
        return (
            f"{cc} is neither in this kernel ({os.uname().release}) nor loadable as a module, "
            f"and it cannot take it as BPF: no {', '.join(missing)}"
        )
    return None


def registered(record: dict | None, cc: str) -> bool:
    """Whether the record's struct_ops is still registered in this boot of the kernel."""
    if not record or record.get("boot_id") != read(BOOT_ID) or cc not in read(AVAILABLE).split():
        return False
    done = subprocess.run(
        ["bpftool", "-j", "struct_ops", "show", "id", str(record["id"])],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        shown = json.loads(done.stdout) if done.returncode == 0 else {}
    except ValueError:
        return False
    return shown.get("name") == cc and shown.get("kernel_struct_ops") == "tcp_congestion_ops"


def unregister(record: dict) -> None:
    run(
        ["bpftool", "struct_ops", "unregister", "id", str(record["id"])],
        f"unregistering struct_ops id {record['id']}",
    )


def conflicts(users: dict, me: str, params: dict) -> list[str]:
    """Other users that asked for another value of one of `params`."""
    return [
        f"{user} ({', '.join(f'{k}={v}' for k, v in sorted(theirs.items()))})"
        for user, theirs in sorted(users.items())
        if user != me and any(k in params and str(params[k]) != str(v) for k, v in theirs.items())
    ]


def load_record(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def save_record(path: Path, record: dict) -> None:
    path.with_suffix(".tmp").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(path.with_suffix(".tmp"), path)


def live_users(users: dict) -> dict:
    return {u: p for u, p in users.items() if os.path.isdir(u)}


def provide(p: dict, check: bool) -> tuple[bool, dict, dict]:
    record_dir, build_dir, me = Path(p["record_dir"]), Path(p["build_dir"]), p["user"]
    changed, providers, records = False, {}, {}
    with locked(record_dir):
        for cc, params in sorted(p["ccs"].items()):
            params = {k: str(v) for k, v in (params or {}).items()}
            path = record_dir / f"{cc}.json"
            record = load_record(path)
            if not registered(record, cc):
                record = None
                if cc in read(AVAILABLE).split():
                    providers[cc] = "kernel"
                    continue
            if record is None and (problem := kernel_problem(cc)):
                raise Failure(problem)
            folder = (p["folders"] or {}).get(cc, cc)
            files = source_files(p["sources"], folder)
            sha = source_sha256(files)
            if record is not None:
                users = live_users(record["users"])
                if record["source_sha256"] != sha:
                    if others := [u for u in users if u != me]:
                        raise Failure(
                            f"{cc} is registered on this kernel from another source "
                            f"(sha256 {record['source_sha256'][:12]}) for {', '.join(others)}; "
                            f"this one's is {sha[:12]}. One kernel holds one {cc}: wait for "
                            "their teardown (or rack-down), or run the same checkout."
                        )
                    changed = True
                    if check:
                        providers[cc] = "bpf"
                        continue
                    unregister(record)
                    record = None
            if record is None:
                changed = True
                if check:
                    providers[cc] = "bpf"
                    continue
                out = build(build_dir, cc, files, sha, folder)
                given = [f"{k}={v}" for k, v in sorted(params.items())]
                loaded = json.loads(
                    run([str(out / LOADER), "register", str(out / f"{cc}.bpf.o"), *given],
                        f"{cc}: registering the BPF congestion control failed")
                )  # fmt: skip
                record = {
                    "cc": cc,
                    "source": folder,
                    "id": loaded["id"],
                    "params_map_id": loaded["params_map_id"],
                    "params": {k: str(v) for k, v in loaded["params"].items()},
                    "source_sha256": sha,
                    "object_sha256": file_sha256(out / f"{cc}.bpf.o"),
                    "loader": str(out / LOADER),
                    "boot_id": read(BOOT_ID),
                    "users": {},
                }
            record["users"] = live_users(record["users"])
            if clash := conflicts(record["users"], me, params):
                raise Failure(
                    f"{cc} (BPF) is kernel-wide: {me} asks for "
                    f"{', '.join(f'{k}={v}' for k, v in sorted(params.items()))} while "
                    f"{'; '.join(clash)} asked otherwise on this kernel"
                )
            unknown = sorted(set(params) - set(record["params"]))
            if unknown:
                raise Failure(
                    f"{cc} (BPF) has no parameter {', '.join(unknown)}; it has: "
                    f"{', '.join(sorted(record['params']))}"
                )
            differ = {k: v for k, v in params.items() if record["params"][k] != v}
            if differ:
                changed = True
                if not check:
                    given = [f"{k}={v}" for k, v in sorted(differ.items())]
                    out = json.loads(
                        run([record["loader"], "set", str(record["params_map_id"]), *given],
                            f"{cc}: setting its parameters failed")
                    )  # fmt: skip
                    record["params"] = {k: str(v) for k, v in out["params"].items()}
            if record["users"].get(me) != params:
                changed = True
                record["users"][me] = params
            if not check:
                save_record(path, record)
            providers[cc] = "bpf"
            records[cc] = record
    return changed, providers, records


def release(p: dict, check: bool) -> bool:
    record_dir, me = Path(p["record_dir"]), p["user"].rstrip("/")
    if not record_dir.is_dir():
        return False
    changed = False
    with locked(record_dir):
        for path in sorted(record_dir.glob("*.json")):
            record = load_record(path) or {}
            cc = path.stem
            users = {
                u: q
                for u, q in live_users(record.get("users", {})).items()
                if u != me and not u.startswith(me + "/")
            }
            if users == record.get("users") and registered(record, cc):
                continue
            changed = True
            if check:
                continue
            if users and registered(record, cc):
                record["users"] = users
                save_record(path, record)
                continue
            if registered(record, cc):
                unregister(record)
            path.unlink()
    return changed


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["present", "absent"]},
            "ccs": {"type": "dict", "default": {}},
            "folders": {"type": "dict", "default": {}},
            "user": {"type": "path", "required": True},
            "sources": {"type": "dict", "default": {}},
            "build_dir": {"type": "path", "default": "/var/lib/trialbed/bpf_cc"},
            "record_dir": {"type": "path", "default": "/run/trialbed/bpf_cc"},
        },
        supports_check_mode=True,
    )
    try:
        if module.params["state"] == "absent":
            module.exit_json(
                changed=release(module.params, module.check_mode), providers={}, registered={}
            )
        changed, providers, records = provide(module.params, module.check_mode)
    except Failure as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=changed, providers=providers, registered=records)


if __name__ == "__main__":
    main()
