"""hostside/bpf_tc/double.h, the doubles the BPF markers compute A_IN with, against this
machine's own doubles (Python's float): every operation on seeded random operands, subnormals,
ties and cancellations included, must give the same bits, run in the kernel on crafted frames
(tests/data/bpf_tc/double_check.bpf.c)."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path

import pytest

from tests import bpf_tc

CHECK = Path(__file__).resolve().parents[1] / "data/bpf_tc/double_check.bpf.c"
ADD, SUB, MUL, FROM_U32 = range(4)
ETHER = bytes(12) + b"\x88\xb5"  # a local experimental EtherType: no IP for the kernel
MAX_FINITE = 0x7FEFFFFFFFFFFFFF

pytestmark = pytest.mark.skipif(bool(bpf_tc.missing()), reason=bpf_tc.missing() or "")


def bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def value(b: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", b))[0]


def operands(rng: random.Random) -> float:
    """A non-negative finite double of one of the kinds rounding treats differently."""
    kind = rng.randrange(8)
    if kind == 0:
        return value(rng.randrange(0, MAX_FINITE + 1))  # any bits
    if kind == 1:
        return value(rng.randrange(0, 1 << 52))  # subnormal or zero
    if kind == 2:
        return float(rng.randrange(0, 1 << rng.randrange(1, 54)))  # an integer
    if kind == 3:
        return math.ldexp(1.0, rng.randrange(-1074, 1000))  # a power of two
    if kind == 4:
        return rng.uniform(0, 1)  # alpha-like
    if kind == 5:
        return rng.randrange(1, 1 << 20) / (1 << rng.randrange(0, 60))  # A_IN-like
    if kind == 6:
        return value(rng.choice([0, 1, (1 << 52) - 1, 1 << 52, MAX_FINITE]))
    return math.ldexp(rng.uniform(1, 2), rng.randrange(-1100, 1020))


def python(op: int, x: float, y: float) -> float:
    if op == ADD:
        return x + y
    if op == SUB:
        return x - y
    if op == MUL:
        return x * y
    return float(int(x))


def cases(seed: int, n: int) -> list[tuple[int, float, float]]:
    rng = random.Random(seed)
    out: list[tuple[int, float, float]] = []
    for _ in range(n):
        op, x, y = rng.randrange(3), operands(rng), operands(rng)
        if rng.random() < 0.3:  # near each other: cancellation, ties on the last bit
            y = value(min(MAX_FINITE, max(0, bits(x) + rng.randrange(-4, 5))))
        if rng.random() < 0.2:  # exactly half a unit of x's last place, or just off it
            half_unit = math.ldexp(1.0, math.frexp(x)[1] - 54) if x else 0.0
            y = half_unit * rng.choice([1, 3, 1 + 2**-20, 1 - 2**-20])
        if op == SUB and y > x:
            x, y = y, x
        out.append((op, x, y))
    for v in (0, 1, 2, 3, 7, 1000, 2**31, 2**32 - 1, rng.randrange(2**32)):
        out.append((FROM_U32, float(v), 0.0))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return bpf_tc.build(tmp_path_factory.mktemp("bpf_tc"), str(CHECK))


def test_every_operation_gives_the_bits_python_gives(built: Path) -> None:
    todo = cases(seed=20261207, n=30000)
    frames = [
        (1, ETHER + struct.pack("<QQQQ", op, int(x) if op == FROM_U32 else bits(x), bits(y), 0))
        for op, x, y in todo
    ]
    got = bpf_tc.run(built, "double_check", frames)
    assert got.summary["packets"] == len(todo)
    wrong = []
    for (op, x, y), frame in zip(todo, got.frames, strict=True):
        result = struct.unpack_from("<Q", frame, len(ETHER) + 24)[0]
        if result != bits(python(op, x, y)):
            wrong.append((op, x.hex(), y.hex(), value(result).hex(), python(op, x, y).hex()))
    assert not wrong, f"{len(wrong)} of {len(todo)} differ, e.g. {wrong[:5]}"
    ops = {op for op, _, _ in todo}
    assert ops == {ADD, SUB, MUL, FROM_U32}
    # The operands reached every region: subnormal results, rounding, and overflow to inf.
    results = [python(op, x, y) for op, x, y in todo]
    assert any(0 < r < 2.2250738585072014e-308 for r in results)
    assert any(math.isinf(r) for r in results)
