#!/usr/bin/env python3
"""trialbed_rio.py: puts hostside/bpf_tc/rio's program on an interface's egress with its
parameters, takes it off, and reads its counters and state, through libbpf (ctypes: the Python
standard library and the libbpf1 package). Output is JSON on stdout; errors go to stderr with
exit status 1 (2: bad usage or an unknown parameter).

  trialbed_rio.py attach IFACE OBJECT [NAME=VALUE]...
      load OBJECT with those parameters (its .rodata constants, by name) and attach its
      program to IFACE's egress (clsact, direct action; the clsact qdisc is added where there
      is none), replacing what this command attached there before. It stays attached after
      this program exits. Prints {"iface", "prog_id", "object_sha256", "params"}.
  trialbed_rio.py detach IFACE
      take it off again (the clsact qdisc stays). Prints {"iface", "detached"}.
  trialbed_rio.py show IFACE
      the program on IFACE's egress, read from the kernel: its parameters, its counters
      summed over the CPUs (per level: IN, OUT, high) and its state (the virtual FIFO, RED's
      averages). Prints {"iface", "prog_id", "params", "stats", "state"}; prog_id null when
      none is attached.

The tests load the same object through this file's BpfObject (tests/bpf_prog.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import socket
import struct
import sys
from typing import Any

LIBBPF = "libbpf.so.1"
PROGRAM = "rio"
HANDLE = PRIORITY = 0x7B  # this tool's filter on an egress (hostside/bpf_tc's loader's too)
BPF_TC_EGRESS = 1 << 1
BPF_TC_F_REPLACE = 1 << 0
EEXIST = 17
# include/uapi/linux/btf.h: kinds
BTF_INT, BTF_ARRAY, BTF_STRUCT, BTF_UNION, BTF_ENUM = 1, 3, 4, 5, 6
BTF_TYPEDEF, BTF_VOLATILE, BTF_CONST, BTF_VAR, BTF_DATASEC, BTF_ENUM64 = 8, 9, 10, 14, 15, 19
QUALIFIERS = {BTF_TYPEDEF, BTF_VOLATILE, BTF_CONST, BTF_VAR}
INT_SIGNED = 1  # BTF_INT_ENCODING bit
PER_CPU = {5, 6}  # BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY
# include/uapi/linux/bpf.h: offsets in struct bpf_prog_info and struct bpf_map_info
PROG_NR_MAP_IDS, PROG_MAP_IDS = 52, 56
MAP_TYPE, MAP_VALUE_SIZE, MAP_NAME, MAP_BTF_ID, MAP_BTF_VALUE = 0, 12, 24, 64, 72
INFO_SIZE = 256


class BpfError(RuntimeError):
    """libbpf or the kernel refused: the message names the step and the error."""


def _fail(step: str) -> BpfError:
    err = ctypes.get_errno()
    return BpfError(f"{step}: {os.strerror(err) if err else 'failed'}")


def libbpf() -> ctypes.CDLL:
    """libbpf with the signatures used here."""
    lib = ctypes.CDLL(LIBBPF, use_errno=True)
    vp, cp, i, sz, u32 = (
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_size_t,
        ctypes.c_uint32,
    )
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
        "bpf_map__type": (i, [vp]),
        "bpf_map__value_size": (u32, [vp]),
        "bpf_map__btf_value_type_id": (u32, [vp]),
        "bpf_map__initial_value": (vp, [vp, ctypes.POINTER(sz)]),
        "bpf_map__set_initial_value": (i, [vp, vp, sz]),
        "btf__find_by_name_kind": (i, [vp, cp, u32]),
        "btf__type_by_id": (vp, [vp, u32]),
        "btf__name_by_offset": (cp, [vp, u32]),
        "btf__load_from_kernel_by_id": (vp, [u32]),
        "btf__free": (None, [vp]),
        "bpf_map_lookup_elem": (i, [i, vp, vp]),
        "bpf_map_update_elem": (i, [i, vp, vp, ctypes.c_uint64]),
        "bpf_prog_get_fd_by_id": (i, [u32]),
        "bpf_map_get_fd_by_id": (i, [u32]),
        "bpf_obj_get_info_by_fd": (i, [i, vp, ctypes.POINTER(u32)]),
        "bpf_tc_hook_create": (i, [vp]),
        "bpf_tc_attach": (i, [vp, vp]),
        "bpf_tc_detach": (i, [vp, vp]),
        "bpf_tc_query": (i, [vp, vp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


class TcHook(ctypes.Structure):
    """libbpf's struct bpf_tc_hook."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("ifindex", ctypes.c_int),
        ("attach_point", ctypes.c_int),
        ("parent", ctypes.c_uint32),
    ]


class TcOpts(ctypes.Structure):
    """libbpf's struct bpf_tc_opts."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("prog_fd", ctypes.c_int),
        ("flags", ctypes.c_uint32),
        ("prog_id", ctypes.c_uint32),
        ("handle", ctypes.c_uint32),
        ("priority", ctypes.c_uint32),
    ]


class Btf:
    """A BTF object, enough to decode and encode integers, enums, arrays, structs and data
    sections (values by member and variable name)."""

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

    def _name_at(self, offset: int) -> str:
        return self.lib.btf__name_by_offset(self.btf, offset).decode()

    def name(self, type_id: int) -> str:
        at = self.lib.btf__type_by_id(self.btf, type_id)
        return self._name_at(struct.unpack("<I", ctypes.string_at(at, 4))[0])

    def resolve(self, type_id: int) -> int:
        while self._record(type_id)[0] in QUALIFIERS:
            type_id = self._record(type_id)[2]
        return type_id

    def _trailer(self, at: int, count: int) -> list[tuple[int, int, int]]:
        return [struct.unpack("<III", ctypes.string_at(at + 12 * k, 12)) for k in range(count)]

    def datasec(self, name: str) -> dict[str, tuple[int, int, int]]:
        """A data section's variables: name -> (offset, size, type id)."""
        sec = self.lib.btf__find_by_name_kind(self.btf, name.encode(), BTF_DATASEC)
        if sec < 0:
            raise BpfError(f"the object's BTF has no section {name}")
        _kind, vlen, _size, at = self._record(sec)
        return {
            self.name(var): (offset, size, self._record(var)[2])
            for var, offset, size in self._trailer(at, vlen)
        }

    def size(self, type_id: int) -> int:
        kind, _vlen, size, at = self._record(self.resolve(type_id))
        if kind == BTF_ARRAY:
            elem, _index, count = self._trailer(at, 1)[0]
            return self.size(elem) * count
        return size

    def decode(self, type_id: int, data: bytes, base: int = 0) -> Any:
        """The value of type `type_id` at data[base:]: int, list or dict by name."""
        kind, vlen, size, at = self._record(self.resolve(type_id))
        if kind == BTF_INT:
            signed = bool((struct.unpack("<I", ctypes.string_at(at, 4))[0] >> 24) & INT_SIGNED)
            return int.from_bytes(data[base : base + size], "little", signed=signed)
        if kind in (BTF_ENUM, BTF_ENUM64):
            return int.from_bytes(data[base : base + size], "little")
        if kind == BTF_ARRAY:
            elem, _index, count = self._trailer(at, 1)[0]
            step = self.size(elem)
            return [self.decode(elem, data, base + n * step) for n in range(count)]
        if kind in (BTF_STRUCT, BTF_UNION):
            return {
                self._name_at(name_off): self.decode(member, data, base + (bits & 0xFFFFFF) // 8)
                for name_off, member, bits in self._trailer(at, vlen)
            }
        if kind == BTF_DATASEC:
            return {
                self.name(var): self.decode(self._record(var)[2], data, base + offset)
                for var, offset, _size in self._trailer(at, vlen)
            }
        raise BpfError(f"BTF kind {kind} not decoded")

    def encode(self, type_id: int, value: Any, buf: bytearray, base: int = 0) -> None:
        """Write `value` (as decode returns it; members left out stay) at buf[base:]."""
        kind, vlen, size, at = self._record(self.resolve(type_id))
        if kind in (BTF_INT, BTF_ENUM, BTF_ENUM64):
            buf[base : base + size] = (int(value) % (1 << (8 * size))).to_bytes(size, "little")
        elif kind == BTF_ARRAY:
            elem, _index, _count = self._trailer(at, 1)[0]
            for n, item in enumerate(value):
                self.encode(elem, item, buf, base + n * self.size(elem))
        elif kind in (BTF_STRUCT, BTF_UNION):
            for name_off, member, bits in self._trailer(at, vlen):
                if (name := self._name_at(name_off)) in value:
                    self.encode(member, value[name], buf, base + (bits & 0xFFFFFF) // 8)
        else:
            raise BpfError(f"BTF kind {kind} not encoded")


def possible_cpus() -> int:
    """How many values a per-CPU map's lookup returns."""
    with open("/sys/devices/system/cpu/possible") as f:
        text = f.read().strip()
    count = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


def lookup(lib: ctypes.CDLL, fd: int, value_size: int, per_cpu: bool, key: int = 0) -> bytes:
    """A map's value at `key` (a per-CPU map's: one per possible CPU, each 8-aligned)."""
    step = (value_size + 7) // 8 * 8
    buf = ctypes.create_string_buffer(step * (possible_cpus() if per_cpu else 1))
    k = ctypes.c_uint32(key)
    if lib.bpf_map_lookup_elem(fd, ctypes.byref(k), buf):
        raise _fail(f"reading map fd {fd}")
    return buf.raw


class BpfObject:
    """An object file opened, its parameters set by name, and loaded: its program and maps."""

    def __init__(self, path: str, params: dict[str, int], program: str = PROGRAM):
        self.lib = lib = libbpf()
        self.obj = lib.bpf_object__open_file(path.encode(), None)
        if not self.obj:
            raise _fail(f"opening {path}")
        self.btf = Btf(lib, lib.bpf_object__btf(self.obj))
        self.maps: dict[str, int] = {}  # by the object's name: .rodata and .bss by section
        m = lib.bpf_object__next_map(self.obj, None)
        while m:
            name = lib.bpf_map__name(m).decode()
            self.maps["." + name.rsplit(".", 1)[1] if "." in name else name] = m
            m = lib.bpf_object__next_map(self.obj, m)
        self.params = self._set_params(params)
        if lib.bpf_object__load(self.obj):
            raise _fail(f"loading {path} (the verifier's log is above)")
        found = lib.bpf_object__find_program_by_name(self.obj, program.encode())
        if not found:
            raise BpfError(f"{path} has no program {program}")
        self.prog_fd = lib.bpf_program__fd(found)

    def _set_params(self, params: dict[str, int]) -> dict[str, int]:
        """Write `params` into .rodata's initial image; return every parameter's value."""
        rodata = self.maps[".rodata"]
        variables = self.btf.datasec(".rodata")
        unknown = sorted(set(params) - set(variables))
        if unknown:
            raise ValueError(f"no parameter {', '.join(unknown)}; it has: {', '.join(variables)}")
        size = ctypes.c_size_t()
        at = self.lib.bpf_map__initial_value(rodata, ctypes.byref(size))
        image = bytearray(ctypes.string_at(at, size.value))
        for name, value in params.items():
            offset, width, _type = variables[name]
            if not 0 <= int(value) < 1 << (8 * width):
                raise ValueError(f"parameter {name}: {value} does not fit {width} bytes")
            image[offset : offset + width] = int(value).to_bytes(width, "little")
        buf = ctypes.create_string_buffer(bytes(image), len(image))
        if self.lib.bpf_map__set_initial_value(rodata, buf, len(image)):
            raise _fail("setting the parameters")
        return {
            name: int.from_bytes(image[off : off + width], "little")
            for name, (off, width, _type) in variables.items()
        }

    def fd(self, name: str) -> int:
        return self.lib.bpf_map__fd(self.maps[name])

    def read(self, name: str, key: int = 0) -> Any:
        """Map `name`'s value at `key`, decoded (a per-CPU map: a list, one per CPU)."""
        m = self.maps[name]
        size = self.lib.bpf_map__value_size(m)
        per_cpu = self.lib.bpf_map__type(m) in PER_CPU
        raw = lookup(self.lib, self.fd(name), size, per_cpu, key)
        type_id = self.lib.bpf_map__btf_value_type_id(m)
        if per_cpu:
            step = (size + 7) // 8 * 8
            return [self.btf.decode(type_id, raw, n * step) for n in range(len(raw) // step)]
        return self.btf.decode(type_id, raw)

    def write(self, name: str, value: dict[str, Any], key: int = 0) -> None:
        """Map `name`'s value at `key`: as it is, with the members `value` gives."""
        m = self.maps[name]
        size = self.lib.bpf_map__value_size(m)
        image = bytearray(lookup(self.lib, self.fd(name), size, False, key)[:size])
        self.btf.encode(self.lib.bpf_map__btf_value_type_id(m), value, image)
        k, buf = ctypes.c_uint32(key), ctypes.create_string_buffer(bytes(image), size)
        if self.lib.bpf_map_update_elem(self.fd(name), ctypes.byref(k), buf, 0):
            raise _fail(f"writing map {name}")

    def close(self) -> None:
        if self.obj:
            self.lib.bpf_object__close(self.obj)
            self.obj = None


def _hook(iface: str) -> TcHook:
    try:
        index = socket.if_nametoindex(iface)
    except OSError:
        raise BpfError(f"no interface {iface!r}") from None
    return TcHook(sz=ctypes.sizeof(TcHook), ifindex=index, attach_point=BPF_TC_EGRESS)


def _opts(**fields: int) -> TcOpts:
    return TcOpts(sz=ctypes.sizeof(TcOpts), handle=HANDLE, priority=PRIORITY, **fields)


def attach(iface: str, path: str, params: dict[str, int]) -> dict[str, Any]:
    """Load `path` with `params` and attach it to `iface`'s egress (see the module's doc)."""
    hook = _hook(iface)
    obj = BpfObject(path, params)
    try:
        if obj.lib.bpf_tc_hook_create(ctypes.byref(hook)) not in (0, -EEXIST):
            raise _fail(f"adding clsact to {iface}")
        opts = _opts(prog_fd=obj.prog_fd, flags=BPF_TC_F_REPLACE)
        if obj.lib.bpf_tc_attach(ctypes.byref(hook), ctypes.byref(opts)):
            raise _fail(f"attaching to {iface}'s egress")
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return {
            "iface": iface,
            "prog_id": opts.prog_id,
            "object_sha256": digest,
            "params": obj.params,
        }
    finally:
        obj.close()


def detach(iface: str) -> dict[str, Any]:
    lib, hook = libbpf(), _hook(iface)
    return {
        "iface": iface,
        "detached": lib.bpf_tc_detach(ctypes.byref(hook), ctypes.byref(_opts())) == 0,
    }


def _info(lib: ctypes.CDLL, fd: int, buf: ctypes.Array) -> bytes:
    size = ctypes.c_uint32(len(buf))
    if lib.bpf_obj_get_info_by_fd(fd, buf, ctypes.byref(size)):
        raise _fail(f"reading the info of fd {fd}")
    return buf.raw


def show(iface: str) -> dict[str, Any]:
    """What the program on `iface`'s egress holds (see the module's doc)."""
    lib, hook = libbpf(), _hook(iface)
    opts = _opts()
    if lib.bpf_tc_query(ctypes.byref(hook), ctypes.byref(opts)):
        return {"iface": iface, "prog_id": None}
    return {"iface": iface, **program(opts.prog_id)}


def prog_id_of(lib: ctypes.CDLL, fd: int) -> int:
    """The id of the program open as `fd`."""
    return struct.unpack_from("<I", _info(lib, fd, ctypes.create_string_buffer(INFO_SIZE)), 4)[0]


def program(prog_id: int) -> dict[str, Any]:
    """The program `prog_id` as the kernel holds it: its parameters (.rodata), its counters
    per level summed over the CPUs (stats) and its state (rio_state, without the lock), each
    decoded with the BTF the kernel keeps for its map."""
    lib = libbpf()
    prog = lib.bpf_prog_get_fd_by_id(prog_id)
    if prog < 0:
        raise _fail(f"opening program {prog_id}")
    try:
        raw = _info(lib, prog, ctypes.create_string_buffer(INFO_SIZE))
        count = struct.unpack_from("<I", raw, PROG_NR_MAP_IDS)[0]
        ids = (ctypes.c_uint32 * count)()
        info = ctypes.create_string_buffer(INFO_SIZE)
        struct.pack_into("<IIQ", info, PROG_NR_MAP_IDS - 4, 0, count, ctypes.addressof(ids))
        _info(lib, prog, info)
    finally:
        os.close(prog)
    out: dict[str, Any] = {"prog_id": prog_id}
    for map_id in ids:
        fd = lib.bpf_map_get_fd_by_id(map_id)
        if fd < 0:
            raise _fail(f"opening map {map_id}")
        try:
            key, value = _map_value(lib, fd)
        finally:
            os.close(fd)
        if key:
            out[key] = value
    if "state" in out:
        out["state"].pop("lock", None)
    return out


def _map_value(lib: ctypes.CDLL, fd: int) -> tuple[str | None, Any]:
    """(what it is: params, stats, state or None for the others, its decoded value)."""
    raw = _info(lib, fd, ctypes.create_string_buffer(INFO_SIZE))
    (kind,) = struct.unpack_from("<I", raw, MAP_TYPE)
    (size,) = struct.unpack_from("<I", raw, MAP_VALUE_SIZE)
    name = raw[MAP_NAME : MAP_NAME + 16].split(b"\0")[0].decode()
    (btf_id,) = struct.unpack_from("<I", raw, MAP_BTF_ID)
    (value_type,) = struct.unpack_from("<I", raw, MAP_BTF_VALUE)
    key = {"rio_state": "state", "stats": "stats"}.get(name)
    if name.endswith(".rodata"):
        key = "params"
    if key is None or not btf_id:
        return None, None
    btf = lib.btf__load_from_kernel_by_id(btf_id)
    if not btf:
        raise _fail(f"reading the BTF of map {name}")
    try:
        decoder = Btf(lib, btf)
        data = lookup(lib, fd, size, kind in PER_CPU)
        if kind not in PER_CPU:
            return key, decoder.decode(value_type, data)
        step = (size + 7) // 8 * 8
        cpus = [decoder.decode(value_type, data, n * step) for n in range(len(data) // step)]
        return key, {
            k: [sum(c[k][i] for c in cpus) for i in range(len(v))] for k, v in cpus[0].items()
        }
    finally:
        lib.btf__free(btf)


def _params(args: list[str]) -> dict[str, int]:
    out = {}
    for arg in args:
        name, eq, value = arg.partition("=")
        if not eq or not name:
            raise ValueError(f"'{arg}': a parameter is NAME=VALUE")
        try:
            out[name] = int(value, 0)
        except ValueError:
            raise ValueError(f"parameter {name}: '{value}' is not an integer") from None
    return out


USAGE = """usage: trialbed_rio.py attach IFACE OBJECT [NAME=VALUE]...
       trialbed_rio.py detach IFACE
       trialbed_rio.py show IFACE"""


def main(argv: list[str]) -> int:
    try:
        if len(argv) >= 3 and argv[0] == "attach":
            result = attach(argv[1], argv[2], _params(argv[3:]))
        elif len(argv) == 2 and argv[0] == "detach":
            result = detach(argv[1])
        elif len(argv) == 2 and argv[0] == "show":
            result = show(argv[1])
        else:
            print(USAGE, file=sys.stderr)
            return 2
    except ValueError as e:
        print(f"trialbed_rio.py: {e}", file=sys.stderr)
        return 2
    except (BpfError, OSError) as e:
        print(f"trialbed_rio.py: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
