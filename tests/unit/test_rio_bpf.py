"""RIO as a tc BPF program (issue 50, item 2; hostside/bpf_tc/rio/): the program against its
Python reference (analysis/rio_model.py) on generated arrival sequences, packet by packet and
state by state; its virtual FIFO against an exact offline work-conserving FIFO; and what RIO
predicts of it (OUT dropped first, RED's spacing of early drops, the idle decay).

The program runs on crafted frames through BPF_PROG_TEST_RUN (tests/bpf_prog.py): root,
clang and libbpf, no interface. The tests set the program's clock and random value per packet
through its .bss test hooks, except where they measure its own random draws.
"""

from __future__ import annotations

import copy
import json
import random
import struct
from fractions import Fraction
from pathlib import Path

import pytest

from analysis.rio_model import RioModel, level_of_dscp
from core import rio_bpf
from core.dscp import DSCP_NAMES
from tests import bpf_prog
from tests.hostside import load

pytestmark = pytest.mark.skipif(bool(bpf_prog.missing()), reason=str(bpf_prog.missing()))

TC_ACT_OK, TC_ACT_SHOT = 0, 2
ARP = None  # a frame that is not IP: its DSCP is None
# Code points the sequences use: IN (AF11, AF21), OUT (AF12, BE, EF), high (AF13) and not IP.
CODES = [DSCP_NAMES[n] for n in ("af11", "af21", "af12", "be", "ef", "af13")] + [ARP]
SIZES = (60, 200, 576, 1514)
PAPER = {"rate": "6mbit", "buffer": "90kB", "rio": {}}  # seed 004: IN min 9, OUT 2/6, w_q 0.0012
BUSY = {  # small thresholds and a fast average: every branch within a few thousand packets
    "rate": "6mbit",
    "buffer": "30kB",
    "rio": {"in": {"min": 3, "max": 12, "w_q": 0.05}, "out": {"min": 2, "max": 5, "w_q": 0.05}},
}
THREE = {**BUSY, "rio": {**BUSY["rio"], "high": {"min": 2, "max": 4, "w_q": 0.05}}}
FAST = {**BUSY, "rate": "1gbit", "buffer": "18kB"}  # idle periods past the overflow guard
CASES = [  # link, mode, backlog, ns-2's guard, packets
    (PAPER, "gred", "queued", False, 6000),
    (BUSY, "gred", "queued", False, 3000),
    (BUSY, "gred", "fluid", False, 3000),
    (BUSY, "coupled", "queued", False, 3000),
    (BUSY, "coupled", "fluid", False, 3000),
    (THREE, "gred", "queued", False, 3000),
    (THREE, "coupled", "fluid", False, 3000),
    (FAST, "gred", "fluid", False, 2000),
    (BUSY, "gred", "queued", True, 3000),
    (THREE, "coupled", "fluid", True, 3000),
]


@pytest.fixture(scope="module")
def obj(tmp_path_factory) -> Path:
    return bpf_prog.build(tmp_path_factory.mktemp("rio") / "rio.bpf.o")


def frame(size: int, dscp: int | None, v6: bool = False) -> bytes:
    """An Ethernet frame of `size` bytes: IPv4 or IPv6 with that DSCP, or ARP (None)."""
    if dscp is None:
        head = bytes(12) + struct.pack("!H", 0x0806)
    elif v6:
        head = bytes(12) + struct.pack("!HI", 0x86DD, (6 << 28) | (dscp << 22))
    else:
        head = bytes(12) + struct.pack("!HBB", 0x0800, 0x45, dscp << 2)
    return head + bytes(size - len(head))


def sequence(rng: random.Random, n: int, rate_bps: int, backwards: bool = True) -> list[tuple]:
    """`n` arrivals (now_ns, size, dscp, v6, rnd) in phases: overload bursts, near the link's
    rate, idle gaps (up to the overflow guard's length, 2^63 / rate ns), packets at one
    instant, and (when `backwards`) a clock that steps back, as CPUs' stamps may."""
    out: list[tuple] = []
    now = 1_000_000
    tx = 1514 * 8 * 10**9 // rate_bps  # one full packet's time
    while len(out) < n:
        phase = rng.choice(["burst", "burst", "steady", "idle", "same", "back"])
        count = rng.randint(5, 80)
        for _ in range(count):
            if phase == "burst":
                now += int(rng.uniform(0.1, 0.9) * tx)
            elif phase == "steady":
                now += int(rng.uniform(0.9, 1.4) * tx)
            elif phase == "idle":
                gaps = (rng.randint(2, 400) * tx, (1 << 63) // rate_bps + rng.randint(0, tx))
                now += gaps[0] if rng.random() < 0.97 else gaps[1]
                count = 1
            elif phase == "back" and backwards:
                now = max(1, now - rng.randint(1, tx))
            dscp = rng.choice(CODES)
            size = rng.choice(SIZES) if rng.random() < 0.3 else 1514
            out.append((now, size, dscp, rng.random() < 0.2, rng.getrandbits(32)))
            if phase in ("idle", "back"):
                break
    return out[:n]


def model_state(m: RioModel) -> dict:
    """The model's state in the program's map layout (rio_state without lock and ring)."""
    return {
        "head": m.head,
        "tail": m.tail,
        "now_ns": m.now_ns,
        "work": m.work,
        "accepted": m.accepted,
        "level_accepted": list(m.level_accepted),
        "sub": [
            {
                "avg": q.avg,
                "count": q.count,
                "arrival_ns": q.arrival_ns,
                "accept_ns": q.accept_ns,
                "accept_work": q.accept_work,
            }
            for q in m.sub
        ],
    }


def program_state(st: dict) -> dict:
    return {k: v for k, v in st.items() if k not in ("lock", "last")}


def run_both(prog: bpf_prog.Program, model: RioModel, seq: list[tuple]) -> dict[str, int]:
    """Every packet through both; asserts equal verdicts, what each packet saw and the whole
    state after it. Returns how many packets ended each way."""
    seen: dict[str, int] = {}
    for k, (now, size, dscp, v6, rnd) in enumerate(seq):
        prog.set_bss(test_now_ns=now, test_rand=rnd, test_rand_on=1)
        verdict = prog.run(frame(size, dscp, v6))
        st = prog.read("rio_state")
        d = model.arrive(now, size, level_of_dscp(model.cfg, dscp), rnd)
        where = f"packet {k} (t {now} ns, {size} B, DSCP {dscp})"
        assert verdict == (TC_ACT_OK if d.reason == "pass" else TC_ACT_SHOT), where
        last = st["last"]
        assert rio_bpf.REASONS[last["reason"]] == d.reason, where
        assert (last["level"], tuple(last["queue"]), last["queued"], last["avg"], last["pb"]) == (
            d.level,
            d.queue,
            d.queued,
            d.avg,
            d.pb,
        ), where
        assert program_state(st) == model_state(model), where
        seen[d.reason] = seen.get(d.reason, 0) + 1
    return seen


@pytest.mark.parametrize(("link", "mode", "backlog", "guard", "n"), CASES)
def test_program_and_model_agree_packet_by_packet(obj, link, mode, backlog, guard, n):
    cfg = rio_bpf.from_link(link, mode=mode, backlog=backlog, ns2_guard=guard)
    prog = bpf_prog.Program(obj, rio_bpf.PROGRAM, cfg.program_params())
    try:
        model = RioModel(cfg)
        seed = f"{n}{mode}{backlog}{len(cfg.levels)}{'guard' if guard else ''}"
        seq = sequence(random.Random(seed), n, cfg.rate_bps)
        seen = run_both(prog, model, seq)
        stats = prog.read("stats")
    finally:
        prog.close()
    print(
        f"{mode}/{backlog}{', ns-2 guard' if guard else ''}, {len(cfg.levels)} levels, "
        f"{link['rate']}: {n} packets, 0 "
        f"mismatches; {seen}; idle decays {model.idle_decays}"
    )
    # the counters summed over CPUs are the model's
    for name in ("packets", "bytes", "early", "forced", "limit", "ring_full"):
        assert [sum(c[name][lv] for c in stats) for lv in range(3)] == getattr(
            model.counters, name
        ), name
    # the sequences reach RED's branches: early and forced drops, idle periods, the tail
    assert seen.get("early", 0) > 0 and seen["pass"] > n // 4
    assert model.idle_decays > 0
    if link is not PAPER:
        assert seen.get("forced", 0) > 0


def test_counters_across_2_32_and_the_ring_wrap(obj):
    """Byte counters and slot numbers kept mod 2^32 (the ring's index mod 2^16): start both
    just below the wrap and run across it."""
    cfg = rio_bpf.from_link(BUSY, backlog="fluid")
    prog = bpf_prog.Program(obj, rio_bpf.PROGRAM, cfg.program_params())
    try:
        model = RioModel(cfg)
        start = (1 << 32) - 50_000
        slots = (1 << 32) - 40
        model.accepted, model.level_accepted = start, [start - 7, (1 << 32) - 3, 11]
        model.head = model.tail = slots
        prog.write(
            "rio_state",
            {
                "accepted": start,
                "level_accepted": model.level_accepted,
                "head": slots,
                "tail": slots,
            },
        )
        seen = run_both(prog, model, sequence(random.Random(7), 1500, cfg.rate_bps))
        assert model.tail < 1000 and model.accepted < start  # both wrapped
        assert seen.get("early", 0) > 0
    finally:
        prog.close()


def exact_fifo(rate_bps: int, seq: list[tuple], accepted: list[bool], levels: list[int]):
    """For each arrival, before it joins: the FIFO's remaining bytes (fluid, exact), the
    bytes of each level still waiting (not yet being sent) and each level's remaining bytes,
    from the accepted packets' start and finish times (work-conserving, `rate_bps`)."""
    per_byte = Fraction(8 * 10**9, rate_bps)  # ns
    sent: list[tuple[Fraction, Fraction, int, int]] = []  # start, finish, size, level
    finish = Fraction(0)
    out = []
    for (now, size, *_), ok, level in zip(seq, accepted, levels, strict=True):
        fluid = sum(
            (min(size_i, (f - now) / per_byte) for s, f, size_i, _ in sent if f > now),
            Fraction(0),
        )
        waiting = [sum(sz for s, _, sz, lv in sent if lv == k and s > now) for k in range(3)]
        remaining = [
            sum(
                (min(sz, (f - now) / per_byte) for _, f, sz, lv in sent if lv == k and f > now),
                Fraction(0),
            )
            for k in range(3)
        ]
        out.append((fluid, waiting, remaining))
        if ok:
            start = max(Fraction(now), finish)
            finish = start + size * per_byte
            sent.append((start, finish, size, level))
            sent = [x for x in sent if x[1] > now]
    return out


@pytest.mark.parametrize("backlog", rio_bpf.BACKLOGS)
def test_virtual_fifo_is_an_exact_work_conserving_fifo(obj, backlog):
    """The program's backlog, as each packet sees it, against a FIFO computed offline in exact
    fractions from the packets the program let through: equal, to the unit of work (1/8 bit
    ns) for the fluid backlog and to the byte for what waits."""
    cfg = rio_bpf.from_link(BUSY, mode="gred", backlog=backlog)
    seq = sequence(random.Random(backlog), 2500, cfg.rate_bps, backwards=False)
    prog = bpf_prog.Program(obj, rio_bpf.PROGRAM, cfg.program_params())
    seen, ok, levels = [], [], []
    try:
        for now, size, dscp, v6, rnd in seq:
            prog.set_bss(test_now_ns=now, test_rand=rnd, test_rand_on=1)
            ok.append(prog.run(frame(size, dscp, v6)) == TC_ACT_OK)
            st = prog.read("rio_state")
            seen.append((st["work"] - (size * rio_bpf.BYTE_WORK if ok[-1] else 0), st["last"]))
            levels.append(st["last"]["level"])
    finally:
        prog.close()
    exact = exact_fifo(cfg.rate_bps, seq, ok, levels)
    busy = 0
    for k, ((work, last), (fluid, waiting, remaining)) in enumerate(zip(seen, exact, strict=True)):
        assert work == fluid * rio_bpf.BYTE_WORK, f"packet {k}"
        assert last["queued"] == sum(waiting), f"packet {k}"
        per_level = waiting if backlog == "queued" else [int(r) for r in remaining]
        # gred: each sub-queue is one level's packets
        assert last["queue"] == per_level, f"packet {k}"
        busy += fluid > 0
    assert busy > len(seq) // 3 and sum(not x for x in ok) > 0
    print(
        f"{backlog}: {len(seq)} arrivals, {busy} to a busy FIFO, {sum(ok)} let through: "
        "backlog equal to the exact FIFO at every arrival"
    )


def drop_rates(obj, link: dict, mode: str, in_share: float, load: float, n: int) -> dict:
    """IN and OUT drop fractions under Poisson arrivals of full packets at `load` times the
    link, with the program's own random draws (bpf_get_prandom_u32)."""
    cfg = rio_bpf.from_link(link, mode=mode)
    prog = bpf_prog.Program(obj, rio_bpf.PROGRAM, cfg.program_params())
    rng = random.Random(f"{mode}{load}")
    gap = 1514 * 8 * 10**9 / cfg.rate_bps / load
    now, offered, dropped = 1_000_000, [0, 0], [0, 0]
    try:
        for _ in range(n):
            now += int(rng.expovariate(1 / gap))
            level = 0 if rng.random() < in_share else 1
            prog.set_bss(test_now_ns=now)
            verdict = prog.run(frame(1514, DSCP_NAMES["af11" if level == 0 else "af12"]))
            offered[level] += 1
            dropped[level] += verdict == TC_ACT_SHOT
    finally:
        prog.close()
    return {"in": dropped[0] / offered[0], "out": dropped[1] / offered[1]}


@pytest.mark.parametrize("mode", rio_bpf.MODES)
def test_out_is_dropped_before_in(obj, mode):
    """RIO's point: under overload OUT takes the drops. With seed 004's thresholds (OUT 2..6
    packets of the total average, IN 9..27 of IN's), 1.2 times the link, half the packets
    IN: OUT's drop rate is far above IN's, and IN loses (almost) nothing."""
    rates = drop_rates(obj, PAPER, mode, in_share=0.5, load=1.2, n=8000)
    print(f"{mode}: drop rate IN {rates['in']:.4f}, OUT {rates['out']:.4f}")
    assert rates["out"] > 0.2  # OUT alone must shed what the link cannot carry
    assert rates["in"] < rates["out"] / 10


def test_early_drops_are_spaced_as_red_spaces_them(obj):
    """A queue held at a fixed length (a dropped packet is sent again at once, so the FIFO
    neither grows nor shrinks): the average settles, p_b is fixed, and RED's count-based
    spacing makes the gaps between early drops uniform on 1..1/p_b, so that a fraction
    2 p_b / (1 + p_b) of arrivals is dropped. Measured with the program's own random draws."""
    link = {"rate": "6mbit", "buffer": "60kB", "rio": {"in": {"min": 2, "max": 20, "w_q": 0.05}}}
    cfg = rio_bpf.from_link(link)
    prog = bpf_prog.Program(obj, rio_bpf.PROGRAM, cfg.program_params())
    tx = 1514 * 8 * 10**9 // cfg.rate_bps
    af11 = frame(1514, DSCP_NAMES["af11"])
    now, gaps, since, pbs = 1_000_000, [], 0, set()
    try:
        for _ in range(10):  # a standing queue of 10 packets
            prog.set_bss(test_now_ns=now)
            assert prog.run(af11) == TC_ACT_OK
        for slot in range(15_000):
            now += tx
            while True:  # until one joins: one leaves per packet time
                prog.set_bss(test_now_ns=now)
                verdict = prog.run(af11)
                since += 1
                if slot > 2000:  # the average has settled
                    pbs.add(prog.read("rio_state")["last"]["pb"])
                if verdict == TC_ACT_OK:
                    break
                if slot > 2000:
                    gaps.append(since)
                since = 0
    finally:
        prog.close()
    pb = sum(pbs) / len(pbs) / (1 << rio_bpf.P_SHIFT)
    assert max(pbs) - min(pbs) < 0.01 * max(pbs)  # p_b held (within 1 %)
    fraction = len(gaps) / sum(gaps)
    expected = 2 * pb / (1 + pb)
    sigma = (expected * (1 - expected) / sum(gaps)) ** 0.5
    print(
        f"p_b {pb:.4f}: {len(gaps)} early drops, fraction {fraction:.4f} "
        f"(RED: {expected:.4f}), longest gap {max(gaps)} (1/p_b = {1 / pb:.1f})"
    )
    assert abs(fraction - expected) < 4 * sigma
    assert max(gaps) <= int(1 / pb) + 2


def test_ns2_guard_keeps_an_empty_queue_from_locking_out(obj):
    """The lock-out analysis/gred_lockout.py measured on the VM rack: a burst lifts IN's
    average past max; then sparse packets (one per 20 ms, the link idle between them) find
    the queue empty. Without a guard (GRED's way) each is dropped: the idle period ended at
    the first, so the average only decays by w_q (0.0012) per packet and stays above max
    (seed 004's OUT thresholds given to IN here: 2 and 6 packets). With ns-2's
    guard (no RED drop while at most one packet waits) each goes through."""
    link = {"rate": "6mbit", "buffer": "400kB", "rio": {"in": {"min": 2, "max": 6}}}  # w_q 0.0012
    af11 = frame(1514, DSCP_NAMES["af11"])
    passed = {}
    for guard in (False, True):
        cfg = rio_bpf.from_link(link, ns2_guard=guard)
        prog = bpf_prog.Program(obj, rio_bpf.PROGRAM, cfg.program_params())
        try:
            now = 1_000_000
            for _ in range(250):  # at once: the average climbs far past max (6 packets)
                prog.set_bss(test_now_ns=now)
                prog.run(af11)
            lifted = prog.read("rio_state")["sub"][0]["avg"] >> rio_bpf.AVG_SHIFT
            now += prog.read("rio_state")["work"] // cfg.rate_bps + 1  # the queue emptied
            verdicts = []
            for _ in range(100):
                now += 20_000_000
                prog.set_bss(test_now_ns=now)
                verdicts.append(prog.run(af11) == TC_ACT_OK)
        finally:
            prog.close()
        assert lifted >= 6 * 1500
        passed[guard] = sum(verdicts)
    print(
        f"100 packets into an empty queue after the burst: {passed[False]} through without a "
        f"guard, {passed[True]} with ns-2's"
    )
    assert passed[False] == 0 and passed[True] == 100


def test_idle_decay_is_red_s(obj):
    """After the link stood idle for m packet times, the average is (1 - w_q)^m of what it
    was (RED's idle-time rule), within the fixed point's truncation."""
    link = {**BUSY, "rio": {"in": {"min": 20, "w_q": 0.002}}, "buffer": "120kB"}
    cfg = rio_bpf.from_link(link, backlog="fluid")  # idle from the last packet's end
    w = cfg.levels[0].wq / (1 << rio_bpf.W_SHIFT)
    per_packet = cfg.mean_packet * 8 * 10**9 // cfg.rate_bps  # ns
    af11 = frame(1514, DSCP_NAMES["af11"])
    for m in (1, 37, 500, 4000):
        prog = bpf_prog.Program(obj, rio_bpf.PROGRAM, cfg.program_params())
        try:
            now = 1_000_000
            for _ in range(60):  # a burst: the average climbs
                now += 10_000
                prog.set_bss(test_now_ns=now)
                prog.run(af11)
            before = prog.read("rio_state")["sub"][0]["avg"]
            empty_at = now + prog.read("rio_state")["work"] // cfg.rate_bps
            prog.set_bss(test_now_ns=empty_at + m * per_packet + per_packet // 2)
            prog.run(af11)
            after = prog.read("rio_state")["sub"][0]["avg"]
        finally:
            prog.close()
        assert after == pytest.approx(before * (1 - w) ** m, rel=1e-4, abs=2), m


def test_paper_settings_become_the_program_s_integers():
    cfg = rio_bpf.from_link(PAPER)
    params = cfg.program_params()
    # EXPERIMENTS.md §4: IN 9/27 packets, Pmax 0.1; OUT 2/6, 0.2; w_q 0.0012; 1500 B each
    assert (params["in_min"], params["in_max"]) == (9 * 1500, 27 * 1500)
    assert (params["out_min"], params["out_max"]) == (2 * 1500, 6 * 1500)
    assert params["in_maxp"] / 2**32 == pytest.approx(0.1, abs=1e-9)
    assert params["out_maxp"] / 2**32 == pytest.approx(0.2, abs=1e-9)
    assert params["in_wq"] / 2**rio_bpf.W_SHIFT == pytest.approx(0.0012, rel=1e-3)
    assert (params["rate_bps"], params["limit_bytes"], params["levels"]) == (6_000_000, 90_000, 2)
    assert params["in_dscp"] == sum(1 << DSCP_NAMES[f"af{c}1"] for c in range(1, 5))
    # GRED's weight instead, for comparing the two: 2^-10
    gred = rio_bpf.from_link(PAPER, weight="gred").program_params()
    assert gred["in_wq"] == 1 << (rio_bpf.W_SHIFT - 10)
    with pytest.raises(rio_bpf.RioBpfError, match="mode 'ns2'"):
        rio_bpf.from_link(PAPER, mode="ns2")
    with pytest.raises(rio_bpf.RioBpfError, match="buffer"):
        rio_bpf.from_link({**PAPER, "buffer": "100MB", "rio": {"in": {"min": 9}}})


def test_loader_names_what_it_cannot_do(obj, capsys):
    """hostside/bpf_tc/rio/trialbed_rio.py: the parameters it loaded are read back whole (the
    defaults of those not given), a parameter the object lacks is named with those it has, an
    interface that does not exist is named; nothing is attached (no interface here)."""
    loader = load(bpf_prog.LOADER)
    cfg = rio_bpf.from_link(PAPER)
    loaded = loader.BpfObject(str(obj), cfg.program_params())
    try:
        assert {k: loaded.params[k] for k in cfg.program_params()} == cfg.program_params()
        assert loaded.params["high_min"] == 0  # not given: the object's own value
    finally:
        loaded.close()
    assert loader.main(["attach", "lo", str(obj), "in_minimum=9"]) == 2
    err = capsys.readouterr().err
    assert "no parameter in_minimum" in err and "in_min" in err
    assert loader.main(["attach", "lo", str(obj), "rate_bps=fast"]) == 2
    assert "rate_bps: 'fast' is not an integer" in capsys.readouterr().err
    assert loader.main(["show", "no-such-if0"]) == 1
    assert "no interface 'no-such-if0'" in capsys.readouterr().err
    assert loader.main(["attach", "lo"]) == 2


def test_loader_reads_the_program_back_and_its_counters_read_as_gred_s(obj):
    """What trialbed_rio.py's `show` reads of an attached program (here `program`, by the id of
    the one under test): its parameters, its counters summed over the CPUs and its state, as
    the maps hold them; core/rio_bpf.counters_delta turns two such answers into GRED's per-VQ
    counters, equal to what the model counted between them."""
    loader = load(bpf_prog.LOADER)
    cfg = rio_bpf.from_link(BUSY)
    prog = bpf_prog.Program(obj, rio_bpf.PROGRAM, cfg.program_params())
    try:
        prog_id = loader.prog_id_of(prog.lib, prog.obj.prog_fd)
        model = RioModel(cfg)
        seq = sequence(random.Random(3), 1600, cfg.rate_bps)
        run_both(prog, model, seq[:800])
        before, counted = loader.program(prog_id), copy.deepcopy(model.counters)
        run_both(prog, model, seq[800:])
        after = loader.program(prog_id)
        assert after["prog_id"] == prog_id
        assert {k: after["params"][k] for k in cfg.program_params()} == cfg.program_params()
        assert after["state"] == {k: v for k, v in prog.read("rio_state").items() if k != "lock"}
        per_cpu = prog.read("stats")
        assert after["stats"] == {
            k: [sum(c[k][lv] for c in per_cpu) for lv in range(3)] for k in per_cpu[0]
        }
    finally:
        prog.close()
    delta = rio_bpf.counters_delta(before, after)
    assert sorted(delta) == [0, 1]  # two levels
    for level, row in delta.items():
        for ours, theirs in (
            ("packets", "packets"),
            ("early_drops", "early"),
            ("forced_drops", "forced"),
            ("pdrop", "limit"),
        ):
            assert (
                row[ours]
                == getattr(model.counters, theirs)[level] - getattr(counted, theirs)[level]
            )
        assert (
            row["drops"]
            == row["early_drops"] + row["forced_drops"] + row["pdrop"] + row["other_drops"]
        )
        assert row["qave_bytes"] == model.sub[level].avg >> rio_bpf.AVG_SHIFT
    assert delta[1]["early_drops"] > 0 and delta[1]["forced_drops"] > 0
    # from zero when the program was attached again in between (another id)
    again = rio_bpf.counters_delta({**before, "prog_id": prog_id + 1}, after)
    assert again[1]["packets"] == model.counters.packets[1]
    json.dumps(after)  # as trial.json takes it
