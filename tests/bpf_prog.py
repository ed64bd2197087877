"""A tc BPF object for the tests, through libbpf with ctypes: compile it, set its `.rodata`
parameters by name, load it, run one crafted frame at a time with BPF_PROG_TEST_RUN (no
interface: root and the build tools only), and read or write its maps, their values decoded by
the object's own BTF (struct members by name, so the tests know no layout)."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

LIBBPF = "libbpf.so.1"
# hostside/bpf_cc/build.sh's flags: debug info (the BTF read here), warnings as errors, and no
# directory of the build's in the object.
CLANG_FLAGS = ("-g", "-O2", "-target", "bpf", "-Wall", "-Werror", "-fdebug-compilation-dir=.")
LIBBPF_HEADER = Path("/usr/include/bpf/bpf_helpers.h")

# include/uapi/linux/btf.h: kinds, and the sizes of a type's record and of its trailers.
BTF_INT, BTF_ARRAY, BTF_STRUCT, BTF_UNION, BTF_ENUM = 1, 3, 4, 5, 6
BTF_TYPEDEF, BTF_VOLATILE, BTF_CONST, BTF_VAR, BTF_DATASEC, BTF_ENUM64 = 8, 9, 10, 14, 15, 19
QUALIFIERS = {BTF_TYPEDEF, BTF_VOLATILE, BTF_CONST, BTF_VAR}
INT_SIGNED = 1  # BTF_INT_ENCODING bit
PER_CPU = {5, 6}  # BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY


class BpfError(RuntimeError):
    """libbpf or the kernel refused: the message names the step and errno."""


def missing() -> str | None:
    """Why a BPF program cannot be built and run here, or None."""
    if os.geteuid() != 0:
        return "needs root: loading a BPF program"
    if not shutil.which("clang"):
        return "needs clang (Debian package clang)"
    if not LIBBPF_HEADER.exists():
        return "needs libbpf-dev (Debian package)"
    try:
        ctypes.CDLL(LIBBPF)
    except OSError:
        return f"needs {LIBBPF} (Debian package libbpf1)"
    return None


def compile_object(source: Path, out: Path) -> Path:
    """clang -target bpf, as the hosts build their programs."""
    done = subprocess.run(
        ["clang", *CLANG_FLAGS, "-c", source.name, "-o", str(out)],
        cwd=source.parent,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise BpfError(f"clang {source}:\n{done.stderr}")
    return out


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(LIBBPF, use_errno=True)
    vp, cp, i, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "bpf_object__open_file": (vp, [cp, vp]),
        "bpf_object__load": (i, [vp]),
        "bpf_object__close": (None, [vp]),
        "bpf_object__btf": (vp, [vp]),
        "bpf_object__next_map": (vp, [vp, vp]),
        "bpf_object__find_program_by_name": (vp, [vp, cp]),
        "bpf_program__fd": (i, [vp]),
        "bpf_map__name": (cp, [vp]),
        "bpf_map__fd": (i, [vp]),
        "bpf_map__value_size": (ctypes.c_uint32, [vp]),
        "bpf_map__type": (i, [vp]),
        "bpf_map__btf_value_type_id": (ctypes.c_uint32, [vp]),
        "bpf_map__initial_value": (vp, [vp, ctypes.POINTER(sz)]),
        "bpf_map__set_initial_value": (i, [vp, vp, sz]),
        "btf__find_by_name_kind": (i, [vp, cp, ctypes.c_uint32]),
        "btf__type_by_id": (vp, [vp, ctypes.c_uint32]),
        "btf__name_by_offset": (cp, [vp, ctypes.c_uint32]),
        "bpf_map_lookup_elem": (i, [i, vp, vp]),
        "bpf_map_update_elem": (i, [i, vp, vp, ctypes.c_uint64]),
        "bpf_prog_test_run_opts": (i, [i, vp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


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


class Btf:
    """The object's BTF, enough to decode integers, enums, arrays and structs."""

    def __init__(self, lib: ctypes.CDLL, btf: int):
        self.lib, self.btf = lib, btf
        self._records: dict[int, tuple[int, int, int, int]] = {}

    def _record(self, type_id: int) -> tuple[int, int, int, int]:
        """(kind, vlen, size or type, address of the trailer)."""
        if type_id not in self._records:
            at = self.lib.btf__type_by_id(self.btf, type_id)
            _name, info, size = struct.unpack("<III", ctypes.string_at(at, 12))
            self._records[type_id] = ((info >> 24) & 0x1F, info & 0xFFFF, size, at + 12)
        return self._records[type_id]

    def name(self, type_id: int) -> str:
        at = self.lib.btf__type_by_id(self.btf, type_id)
        (name_off,) = struct.unpack("<I", ctypes.string_at(at, 4))
        return self.lib.btf__name_by_offset(self.btf, name_off).decode()

    def resolve(self, type_id: int) -> int:
        while self._record(type_id)[0] in QUALIFIERS:
            type_id = self._record(type_id)[2]
        return type_id

    def datasec(self, name: str) -> dict[str, tuple[int, int, int]]:
        """A data section's variables: name -> (offset, size, type id)."""
        sec = self.lib.btf__find_by_name_kind(self.btf, name.encode(), BTF_DATASEC)
        if sec < 0:
            raise BpfError(f"the object's BTF has no section {name}")
        _kind, vlen, _size, at = self._record(sec)
        out = {}
        for k in range(vlen):
            var, offset, size = struct.unpack("<III", ctypes.string_at(at + 12 * k, 12))
            out[self.name(var)] = (offset, size, self._record(var)[2])
        return out

    def decode(self, type_id: int, data: bytes, base: int = 0) -> Any:
        """The value of type `type_id` at data[base:]: int, list or dict by member name."""
        type_id = self.resolve(type_id)
        kind, vlen, size, at = self._record(type_id)
        if kind == BTF_INT:
            (info,) = struct.unpack("<I", ctypes.string_at(at, 4))
            signed = bool((info >> 24) & INT_SIGNED)
            return int.from_bytes(data[base : base + size], "little", signed=signed)
        if kind in (BTF_ENUM, BTF_ENUM64):
            return int.from_bytes(data[base : base + size], "little")
        if kind == BTF_ARRAY:
            elem, _index, count = struct.unpack("<III", ctypes.string_at(at, 12))
            step = self.size(elem)
            return [self.decode(elem, data, base + n * step) for n in range(count)]
        if kind in (BTF_STRUCT, BTF_UNION):
            out = {}
            for k in range(vlen):
                name_off, member, bits = struct.unpack("<III", ctypes.string_at(at + 12 * k, 12))
                name = self.lib.btf__name_by_offset(self.btf, name_off).decode()
                out[name] = self.decode(member, data, base + (bits & 0xFFFFFF) // 8)
            return out
        raise BpfError(f"BTF kind {kind} not decoded")

    def encode(self, type_id: int, value: Any, buf: bytearray, base: int = 0) -> None:
        """Write `value` (as decode returns it; members left out stay) at buf[base:]."""
        type_id = self.resolve(type_id)
        kind, vlen, size, at = self._record(type_id)
        if kind in (BTF_INT, BTF_ENUM, BTF_ENUM64):
            buf[base : base + size] = (int(value) & ((1 << (8 * size)) - 1)).to_bytes(
                size, "little"
            )
        elif kind == BTF_ARRAY:
            elem, _index, _count = struct.unpack("<III", ctypes.string_at(at, 12))
            for n, item in enumerate(value):
                self.encode(elem, item, buf, base + n * self.size(elem))
        elif kind in (BTF_STRUCT, BTF_UNION):
            for k in range(vlen):
                name_off, member, bits = struct.unpack("<III", ctypes.string_at(at + 12 * k, 12))
                name = self.lib.btf__name_by_offset(self.btf, name_off).decode()
                if name in value:
                    self.encode(member, value[name], buf, base + (bits & 0xFFFFFF) // 8)
        else:
            raise BpfError(f"BTF kind {kind} not encoded")

    def size(self, type_id: int) -> int:
        kind, _vlen, size, at = self._record(self.resolve(type_id))
        if kind == BTF_ARRAY:
            elem, _index, count = struct.unpack("<III", ctypes.string_at(at, 12))
            return self.size(elem) * count
        return size


class Program:
    """One loaded object: its program (by name), its maps (by name, `.bss` and `.rodata` by
    their section's name) and BPF_PROG_TEST_RUN."""

    def __init__(self, obj_path: Path, prog: str, params: dict[str, int]):
        self.lib = lib = _lib()
        self.obj = lib.bpf_object__open_file(str(obj_path).encode(), None)
        if not self.obj:
            raise BpfError(f"open {obj_path}: errno {ctypes.get_errno()}")
        self.btf = Btf(lib, lib.bpf_object__btf(self.obj))
        self.maps: dict[str, int] = {}
        m = lib.bpf_object__next_map(self.obj, None)
        while m:
            name = lib.bpf_map__name(m).decode()
            self.maps["." + name.rsplit(".", 1)[1] if "." in name else name] = m
            m = lib.bpf_object__next_map(self.obj, m)
        self._set_rodata(params)
        if lib.bpf_object__load(self.obj):
            raise BpfError(
                f"load {obj_path} (the verifier's log is above): errno {ctypes.get_errno()}"
            )
        found = lib.bpf_object__find_program_by_name(self.obj, prog.encode())
        if not found:
            raise BpfError(f"{obj_path} has no program {prog}")
        self.prog_fd = lib.bpf_program__fd(found)
        self.bss = self.btf.datasec(".bss") if ".bss" in self.maps else {}

    def _set_rodata(self, params: dict[str, int]) -> None:
        if not params:
            return
        rodata = self.maps[".rodata"]
        variables = self.btf.datasec(".rodata")
        unknown = sorted(set(params) - set(variables))
        if unknown:
            raise BpfError(f"no parameter {unknown}; the object has {sorted(variables)}")
        size = ctypes.c_size_t()
        at = self.lib.bpf_map__initial_value(rodata, ctypes.byref(size))
        image = bytearray(ctypes.string_at(at, size.value))
        for name, value in params.items():
            offset, width, _type = variables[name]
            image[offset : offset + width] = int(value).to_bytes(width, "little")
        buf = ctypes.create_string_buffer(bytes(image), len(image))
        if self.lib.bpf_map__set_initial_value(rodata, buf, len(image)):
            raise BpfError(f"set .rodata: errno {ctypes.get_errno()}")

    def _fd(self, name: str) -> int:
        return self.lib.bpf_map__fd(self.maps[name])

    def read(self, name: str, key: int = 0) -> Any:
        """Map `name`'s value at `key`, decoded (a per-CPU map: one value per possible CPU)."""
        m = self.maps[name]
        size = self.lib.bpf_map__value_size(m)
        per_cpu = self.lib.bpf_map__type(m) in PER_CPU
        step = (size + 7) // 8 * 8  # the kernel copies one value per possible CPU, 8-aligned
        ncpu = len(_possible_cpus()) if per_cpu else 1
        buf = ctypes.create_string_buffer(step * ncpu)
        k = ctypes.c_uint32(key)
        if self.lib.bpf_map_lookup_elem(self._fd(name), ctypes.byref(k), buf):
            raise BpfError(f"lookup {name}: errno {ctypes.get_errno()}")
        type_id = self.lib.bpf_map__btf_value_type_id(m)
        if per_cpu:
            return [self.btf.decode(type_id, buf.raw, n * step) for n in range(ncpu)]
        return self.btf.decode(type_id, buf.raw)

    def write(self, name: str, value: dict[str, Any], key: int = 0) -> None:
        """Map `name`'s value at `key`: its present value with the members `value` gives."""
        m = self.maps[name]
        size = self.lib.bpf_map__value_size(m)
        k = ctypes.c_uint32(key)
        buf = ctypes.create_string_buffer(size)
        if self.lib.bpf_map_lookup_elem(self._fd(name), ctypes.byref(k), buf):
            raise BpfError(f"lookup {name}: errno {ctypes.get_errno()}")
        image = bytearray(buf.raw)
        self.btf.encode(self.lib.bpf_map__btf_value_type_id(m), value, image)
        new = ctypes.create_string_buffer(bytes(image), size)
        if self.lib.bpf_map_update_elem(self._fd(name), ctypes.byref(k), new, 0):
            raise BpfError(f"update {name}: errno {ctypes.get_errno()}")

    def set_bss(self, **values: int) -> None:
        """Write `.bss` variables by name (the others are set to 0)."""
        size = self.lib.bpf_map__value_size(self.maps[".bss"])
        image = bytearray(size)
        for name, value in values.items():
            offset, width, _type = self.bss[name]
            image[offset : offset + width] = int(value).to_bytes(width, "little")
        k = ctypes.c_uint32(0)
        buf = ctypes.create_string_buffer(bytes(image), size)
        if self.lib.bpf_map_update_elem(self._fd(".bss"), ctypes.byref(k), buf, 0):
            raise BpfError(f"update .bss: errno {ctypes.get_errno()}")

    def run(self, frame: bytes) -> int:
        """The program's verdict on one frame (BPF_PROG_TEST_RUN, once)."""
        data = ctypes.create_string_buffer(frame, len(frame))
        out = ctypes.create_string_buffer(len(frame) + 256)
        opts = TestRunOpts(sz=ctypes.sizeof(TestRunOpts), repeat=1)
        opts.data_in, opts.data_size_in = ctypes.addressof(data), len(frame)
        opts.data_out, opts.data_size_out = ctypes.addressof(out), len(out)
        if self.lib.bpf_prog_test_run_opts(self.prog_fd, ctypes.byref(opts)):
            raise BpfError(f"BPF_PROG_TEST_RUN: errno {ctypes.get_errno()}")
        return opts.retval

    def close(self) -> None:
        if self.obj:
            self.lib.bpf_object__close(self.obj)
            self.obj = None


def _possible_cpus() -> list[int]:
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    cpus: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus
