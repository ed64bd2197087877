#!/usr/bin/python
"""Ansible module: the qemu VM of a VM rack (virtual_rack_kind: vm), started or stopped.

state=present boots the image that files/vm/build-image.sh made (Debian's stock kernel, booted
with -kernel/-initrd) with a copy-on-write overlay in the rack's state directory (the cached
image is never written), a seed disk (a tar: the VM's init, its management address, the
controller's public key, the VM's host key) and one NIC: a tap on the management bridge. No
other network (no user-mode NAT). KVM is used when it works, TCG otherwise, and the result
says which and why. It waits until the VM's sshd answers and returns the boot time.

state=absent stops the qemu whose pid file is in the state directory (by that pid, after
checking its command line names this rack's pid file), removes the tap and the VM's files.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.virtual_rack_cpus import unpin_process
from ansible.module_utils.virtual_rack_qemu import QEMU, qemu_pid

DOCUMENTATION = r"""
module: virtual_rack_vm
short_description: The qemu VM that holds a VM rack's namespaces
options:
  state: {description: present or absent., type: str, default: present,
          choices: [present, absent]}
  state_dir: {description: The rack's state directory (the VM's files go to vm/)., type: path,
              required: true}
  image_dir: {description: The built image (vmlinuz, initrd.img, root.raw)., type: path}
  init: {description: The VM's init script (files/vm/vm-init.sh)., type: path}
  bridge: {description: Management bridge (on the controller and inside the VM)., type: str}
  address: {description: The VM's management address with prefix length., type: str}
  tap: {description: Name of the tap on the controller., type: str}
  authorized_key: {description: Public key file the VM's root accepts., type: path}
  modules: {description: Kernel modules the VM loads at boot., type: list, elements: str}
  accel: {description: auto, kvm or tcg., type: str, default: auto}
  memory_mb: {description: Memory of the VM., type: int, default: 2048}
  cpus: {description: Virtual CPUs., type: int, default: 2}
  timeout: {description: Seconds to wait for the VM's sshd., type: float, default: 150}
  nice: {description: "Host scheduling priority of qemu: the nice value of its autogroup (its
          own session's) and of each of its threads.", type: int, default: -10}
"""

KVM_CREATE_VM = 0xAE01


def kvm_works() -> tuple[bool, str]:
    """Whether KVM can run this VM: /dev/kvm opens, a VM can be made, and the CPU has
    hardware virtualization (vmx/svm) to expose."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError as exc:
        return False, f"/dev/kvm: {exc.strerror}"
    try:
        vm = fcntl.ioctl(fd, KVM_CREATE_VM, 0)
        os.close(vm)
    except OSError as exc:
        return False, f"KVM_CREATE_VM failed: {exc.strerror}"
    finally:
        os.close(fd)
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    if not flags & {"vmx", "svm"}:
        return False, "/dev/kvm opens but the CPU shows no vmx/svm (nested virtualization off)"
    return True, "/dev/kvm works and the CPU has hardware virtualization"


def probe_kvm(module: AnsibleModule, image: Path, vmdir: Path) -> tuple[bool, str]:
    """Boot the kernel under KVM for a few seconds: it must print to the serial console
    (a KVM that cannot run a guest fails or stays silent)."""
    ok, why = kvm_works()
    if not ok:
        return ok, why
    log = vmdir / "kvm-probe.log"
    log.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [QEMU, "-accel", "kvm", "-nodefaults", "-display", "none", "-m", "256", "-no-reboot",
         "-serial", f"file:{log}", "-kernel", str(image / "vmlinuz"),
         "-append", "console=ttyS0 panic=-1 root=/dev/null"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and b"Linux version" in log.read_bytes():
            break
        time.sleep(0.2)
    booted = log.exists() and b"Linux version" in log.read_bytes()
    if proc.poll() is None:
        proc.kill()
    err = proc.communicate()[1].decode(errors="replace").strip()
    if booted:
        return True, why
    return False, f"a KVM guest did not start ({err[-200:] or 'no console output in 8 s'})"


def prioritize(pid: int, nice: int) -> dict:
    """Give qemu's threads (the emulated CPUs) priority on, and the use of, every CPU. Under TCG a
    vCPU thread that waits for a host CPU stalls the whole guest, and with it the shaper's
    timers: a 1 Mbit/s link then sends nothing for tens of ms (measured: with nice 0 the vCPU
    threads waited runnable 30 % of the time on a busy 2-core host; with -10, 8 %). qemu
    -daemonize runs in a session of its own, so with the kernel's autogroup scheduling (the
    default) only the autogroup's nice counts against other sessions; the threads' nice counts
    where autogroup is off."""
    done: dict = {"nice": nice}
    autogroup = Path(f"/proc/{pid}/autogroup")
    with contextlib.suppress(OSError):
        autogroup.write_text(str(nice))
        done["autogroup"] = autogroup.read_text().strip()
    threads = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
            threads += 1
    done["threads"] = threads
    # Both vCPUs on every host CPU, not on the one Mitogen left this module's process.
    done["cpus"] = unpin_process(pid)
    return done


def links() -> dict[str, dict]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
    return {link["ifname"]: link for link in json.loads(out or "[]")}


def ssh_ready(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=1) as s:
            s.settimeout(3)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def mac_of(tap: str) -> str:
    """A stable locally administered MAC address for the VM's NIC."""
    digest = sum(ord(c) * (i + 1) for i, c in enumerate(tap)) & 0xFFFFFF
    return "52:54:00:{:02x}:{:02x}:{:02x}".format(*digest.to_bytes(3, "big"))


def present(module: AnsibleModule) -> dict:
    p = module.params
    vmdir = Path(p["state_dir"]) / "vm"
    vmdir.mkdir(parents=True, exist_ok=True)
    pidfile = vmdir / "qemu.pid"
    image = Path(p["image_dir"])
    ip = p["address"].split("/")[0]
    info_file = vmdir / "vm.json"
    pid = qemu_pid(pidfile)
    if pid:  # (a qemu found by its command line, its files gone, has no vm.json)
        info = json.loads(info_file.read_text()) if info_file.exists() else {}
        same = info.get("image") == str(image) and info.get("address") == p["address"]
        if same and ssh_ready(ip):
            info["priority"] = prioritize(pid, p["nice"])
            return {"changed": False, **info, "pid": pid}
        stop(pidfile)
    changes = []
    # The tap: on the controller's management bridge, owned by nobody but this rack.
    have = links()
    tap = p["tap"]
    if tap in have:
        subprocess.run(["ip", "link", "del", tap], check=False)
    run(module, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
    run(module, "ip", "link", "set", tap, "master", p["bridge"])
    run(module, "ip", "link", "set", tap, "up")
    changes.append(f"tap {tap} on {p['bridge']}")

    # The VM's host key (known to the controller before the VM answers: never accepted blindly).
    key = vmdir / "ssh_host_ed25519_key"
    if not key.exists():
        run(module, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trialbed-vm",
            "-f", str(key))  # fmt: skip
    mac = mac_of(tap)
    seed = vmdir / "seed"
    seed.mkdir(exist_ok=True)
    (seed / "config.sh").write_text(
        f"VM_ADDRESS={p['address']}\nVM_BRIDGE={p['bridge']}\nVM_MAC={mac}\n"
        f"VM_MODULES='{' '.join(p['modules'] or [])}'\n"
    )
    seed_tar = vmdir / "seed.tar"
    with tarfile.open(seed_tar, "w", format=tarfile.USTAR_FORMAT) as tar:
        tar.add(p["init"], arcname="init")
        tar.add(seed / "config.sh", arcname="config.sh")
        tar.add(p["authorized_key"], arcname="authorized_keys")
        tar.add(key, arcname="ssh_host_ed25519_key")
    # A fresh overlay at every boot: the VM starts from the image as built.
    overlay = vmdir / "root.qcow2"
    overlay.unlink(missing_ok=True)
    run(module, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw",
        "-b", str(image / "root.raw"), str(overlay))  # fmt: skip

    if p["accel"] == "auto":
        use_kvm, why = probe_kvm(module, image, vmdir)
        accel = "kvm" if use_kvm else "tcg"
    else:
        accel, why = p["accel"], "asked for"
    console = vmdir / "console.log"
    console.unlink(missing_ok=True)
    argv = [
        QEMU, "-name", f"trialbed-{tap}",
        "-accel", accel if accel == "kvm" else "tcg,thread=multi",
        *(["-cpu", "host"] if accel == "kvm" else ["-cpu", "max"]),
        "-smp", str(p["cpus"]), "-m", str(p["memory_mb"]),
        "-nodefaults", "-display", "none", "-no-reboot",
        "-serial", f"file:{console}",
        "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"),
        "-append", "console=ttyS0 root=/dev/vda rw init=/sbin/trialbed-init net.ifnames=0 "
                   "quiet panic=-1 tsc=reliable",
        "-drive", f"file={overlay},if=virtio,format=qcow2,cache=unsafe",
        "-drive", f"file={seed_tar},if=virtio,format=raw,readonly=on",
        "-netdev", f"tap,id=mgmt,ifname={tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=mgmt,mac={mac}",
        "-daemonize", "-pidfile", str(pidfile),
    ]  # fmt: skip
    start = time.monotonic()
    run(module, *argv)
    pid = qemu_pid(pidfile)
    changes.append(f"qemu ({accel}) pid {pid}")
    priority = prioritize(pid, p["nice"]) if pid else {}
    deadline = start + p["timeout"]
    while not ssh_ready(ip):
        if not qemu_pid(pidfile):
            module.fail_json(
                msg=f"qemu exited while booting; console: {tail(console)}", changes=changes
            )
        if time.monotonic() > deadline:
            stop(pidfile)
            module.fail_json(
                msg=f"the VM's sshd did not answer on {ip}:22 within {p['timeout']:.0f} s; "
                f"console: {tail(console)}",
                changes=changes,
            )
        time.sleep(0.25)
    boot = time.monotonic() - start
    info = {
        "pid": pid,
        "accel": accel,
        "accel_reason": why,
        "boot_seconds": round(boot, 1),
        "address": p["address"],
        "tap": tap,
        "bridge": p["bridge"],
        "image": str(image),
        "kernel": (image / "kernel-release").read_text().strip(),
        "host_key": " ".join(key.with_name(key.name + ".pub").read_text().split()[:2]),
        "console": str(console),
        "pidfile": str(pidfile),
        "priority": priority,
    }
    info_file.write_text(json.dumps(info, indent=2) + "\n")
    return {"changed": True, "changes": changes, **info}


def tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(none)"


def run(module: AnsibleModule, *args: str) -> str:
    rc, out, err = module.run_command(list(args))
    if rc != 0:
        module.fail_json(msg=f"{' '.join(args)} failed: {(err or out).strip()}", rc=rc)
    return out


def stop(pidfile: Path) -> int | None:
    """SIGTERM the rack's qemu (by its pid), up to 10 s, then SIGKILL."""
    pid = qemu_pid(pidfile)
    if not pid:
        return None
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        if not os.path.exists(f"/proc/{pid}"):
            break
    return pid


def absent(module: AnsibleModule) -> dict:
    p = module.params
    vmdir = Path(p["state_dir"]) / "vm"
    changes = []
    info = {}
    with contextlib.suppress(OSError, ValueError):
        info = json.loads((vmdir / "vm.json").read_text())
    pid = stop(vmdir / "qemu.pid")
    if pid:
        changes.append(f"qemu pid {pid} stopped")
    tap = p["tap"] or info.get("tap")
    if tap and tap in links():
        subprocess.run(["ip", "link", "del", tap], check=False)
        changes.append(f"tap {tap} removed")
    if vmdir.exists():
        for f in sorted(vmdir.rglob("*"), reverse=True):
            f.rmdir() if f.is_dir() else f.unlink()
        vmdir.rmdir()
        changes.append(f"{vmdir} removed")
    return {"changed": bool(changes), "changes": changes}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
            "state_dir": {"type": "path", "required": True},
            "image_dir": {"type": "path"},
            "init": {"type": "path"},
            "bridge": {"type": "str"},
            "address": {"type": "str"},
            "tap": {"type": "str"},
            "authorized_key": {"type": "path"},
            "modules": {"type": "list", "elements": "str"},
            "accel": {"type": "str", "default": "auto", "choices": ["auto", "kvm", "tcg"]},
            "memory_mb": {"type": "int", "default": 2048},
            "cpus": {"type": "int", "default": 2},
            "timeout": {"type": "float", "default": 150.0},
            "nice": {"type": "int", "default": -10},
        },
        required_if=[
            (
                "state",
                "present",
                ["image_dir", "init", "bridge", "address", "tap", "authorized_key"],
            ),
        ],
    )
    result = present(module) if module.params["state"] == "present" else absent(module)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
