"""A tc BPF program of hostside/bpf_tc/ for the tests: compiled as the hosts compile it, loaded
with its parameters through the hosts' own loader (hostside/bpf_tc/rio/trialbed_rio.py, libbpf
by ctypes), and run on one crafted frame at a time with BPF_PROG_TEST_RUN: root and the build
tools, but no interface. Maps are read and written by member name (the object's BTF)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

from core.hostside import SOURCE
from tests.hostside import load

LOADER = "bpf_tc/rio/trialbed_rio.py"
BUILD = "bpf_tc/rio/build.sh"
LIBBPF_HEADER = Path("/usr/include/bpf/bpf_helpers.h")


def missing() -> str | None:
    """Why a BPF program cannot be built and run here, or None."""
    if os.geteuid() != 0:
        return "needs root: loading a BPF program"
    if not shutil.which("clang"):
        return "needs clang (Debian package clang)"
    if not LIBBPF_HEADER.exists():
        return "needs libbpf-dev (Debian package)"
    try:
        ctypes.CDLL(load(LOADER).LIBBPF)
    except OSError:
        return "needs libbpf (Debian package libbpf1)"
    return None


def build(out: Path) -> Path:
    """The object as the hosts build it (hostside/bpf_tc/rio/build.sh, run with sh as the role
    runs it)."""
    done = subprocess.run(["sh", str(SOURCE / BUILD), str(out)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{BUILD} {out}:\n{done.stderr}")
    return out


class TestRunOpts(ctypes.Structure):
    """libbpf's struct bpf_test_run_opts (bpf.h, libbpf 1.1)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


class Program:
    """One object loaded with `params`: BPF_PROG_TEST_RUN, its maps, its .bss test hooks."""

    def __init__(self, obj_path: Path, prog: str, params: dict[str, int]):
        self.obj = load(LOADER).BpfObject(str(obj_path), params, prog)
        self.lib = self.obj.lib
        self.lib.bpf_prog_test_run_opts.restype = ctypes.c_int
        self.lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.c_void_p]
        self.bss = self.obj.btf.datasec(".bss") if ".bss" in self.obj.maps else {}

    def read(self, name: str, key: int = 0):
        return self.obj.read(name, key)

    def write(self, name: str, value: dict, key: int = 0) -> None:
        self.obj.write(name, value, key)

    def set_bss(self, **values: int) -> None:
        """Write `.bss` variables by name (the others are set to 0)."""
        size = self.lib.bpf_map__value_size(self.obj.maps[".bss"])
        image = bytearray(size)
        for name, value in values.items():
            offset, width, _type = self.bss[name]
            image[offset : offset + width] = int(value).to_bytes(width, "little")
        k, buf = ctypes.c_uint32(0), ctypes.create_string_buffer(bytes(image), size)
        if self.lib.bpf_map_update_elem(self.obj.fd(".bss"), ctypes.byref(k), buf, 0):
            raise RuntimeError(f"update .bss: errno {ctypes.get_errno()}")

    def run(self, frame: bytes) -> int:
        """The program's verdict on one frame (BPF_PROG_TEST_RUN, once)."""
        data = ctypes.create_string_buffer(frame, len(frame))
        out = ctypes.create_string_buffer(len(frame) + 256)
        opts = TestRunOpts(sz=ctypes.sizeof(TestRunOpts), repeat=1)
        opts.data_in, opts.data_size_in = ctypes.addressof(data), len(frame)
        opts.data_out, opts.data_size_out = ctypes.addressof(out), len(out)
        if self.lib.bpf_prog_test_run_opts(self.obj.prog_fd, ctypes.byref(opts)):
            raise RuntimeError(f"BPF_PROG_TEST_RUN: errno {ctypes.get_errno()}")
        return opts.retval

    def close(self) -> None:
        self.obj.close()
