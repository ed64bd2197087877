"""Experiment files: what is accepted, the plan they expand to, and the messages for what is
not (every message names the file and the key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.units import Buffer, parse_buffer, parse_bytes, parse_duration_ns, parse_rate
from tests.unit.spec_files import GOOD, check, error_of, write
from trials import preflight, rack_kind
from trials.plan import load_plan, parse_key, set_key
from trials.spec import SpecError

PROJECT = Path(__file__).resolve().parents[2]


def test_shipped_experiments_load():
    full = load_plan(PROJECT / "experiments" / "collateral_damage.yml")
    assert len(full.trials) == 3 * 2 * 3 * 5
    htcp = full.base.hosts["all"].cc_params["htcp"]
    assert htcp == {"use_bandwidth_switch": 0, "use_rtt_scaling": 1}
    smoke = load_plan(PROJECT / "experiments" / "smoke.yml")
    assert [t.name for t in smoke.trials] == ["r1"]
    for name in ("startup_lswan", "startup_satellite", "startup_hswan"):
        plan = load_plan(PROJECT / "experiments" / f"{name}.yml")
        assert plan.base.topology == "chain2" and plan.trials, name


def test_every_block_is_typed(tmp_path):
    exp = load_plan(write(tmp_path, GOOD)).base
    bottleneck, access = exp.network.links
    assert bottleneck.rate == 1_500_000 and bottleneck.buffer == Buffer(20, "pkt")
    assert bottleneck.direction("reverse").delay == 50_000_000
    assert access.direction("forward").delay == 0 and access.direction("reverse").rate == 10**7
    first, late, udp = exp.traffic
    assert (first.type, late.start, udp.type, udp.dscp) == (
        "bulk_tcp",
        15 * 10**9,
        "cbr_udp",
        "af11",
    )
    assert exp.generator_names() == ["first", "late", "cbr_udp2"]
    assert exp.capture.points[0].at == "R1" and exp.capture.points[1].interface == "core"
    assert exp.hosts["senders"].rto_min == 200_000_000 and exp.hosts["senders"].rcvbuf == 128_000


def test_factors_over_dotted_keys_make_named_trials_with_stable_ids(tmp_path):
    plan = load_plan(write(tmp_path, GOOD))
    assert len(plan.trials) == 3 * 2 * 2
    names = [t.name for t in plan.trials]
    assert len(set(names)) == len(names)
    assert "initcwnd-3_start-15s_r2" in names
    trial = next(t for t in plan.trials if t.name == "initcwnd-1_start-0s_r1")
    assert trial.experiment.hosts["senders"].initcwnd == 1
    assert trial.experiment.traffic[1].start == 0
    # Same file, same ids and order; another level, another id.
    again = load_plan(write(tmp_path, GOOD))
    assert [(t.name, t.id) for t in again.trials] == [(t.name, t.id) for t in plan.trials]
    assert names != sorted(names)  # seeded random order
    ids = {t.id for t in plan.trials}
    assert len(ids) == len(plan.trials)


def test_wildcard_and_named_elements(tmp_path):
    raw = {"network": {"links": [{"name": "a", "delay": "1ms"}, {"name": "b", "delay": "1ms"}]}}
    set_key(raw, "network.links[*].delay", "25ms")
    set_key(raw, "network.links[b].rate", "1mbit")
    assert [lk["delay"] for lk in raw["network"]["links"]] == ["25ms", "25ms"]
    assert raw["network"]["links"][1]["rate"] == "1mbit"
    assert parse_key("traffic[0].cc") == ["traffic", 0, "cc"]
    with pytest.raises(ValueError, match="no entry named 'c'; it has: a, b"):
        set_key(raw, "network.links[c].delay", "1ms")


def test_set_overrides_the_file_and_replaces_a_factor(tmp_path):
    plan = load_plan(write(tmp_path, GOOD), ["duration=20s", "hosts.senders.initcwnd=10"])
    assert plan.base.duration == 20 * 10**9
    assert len(plan.trials) == 2 * 2  # initcwnd is no longer a factor
    assert {t.experiment.hosts["senders"].initcwnd for t in plan.trials} == {10}
    # The factors themselves are a key: set, they replace the file's (no longer ignored).
    plan = load_plan(write(tmp_path, GOOD), ['factors={"hosts.senders.initcwnd": [1, 3]}'])
    assert len(plan.trials) == 2 * 2
    assert {t.experiment.hosts["senders"].initcwnd for t in plan.trials} == {1, 3}
    assert {t.experiment.traffic[1].start for t in plan.trials} == {15 * 10**9}  # the file's
    message = error_of(tmp_path, GOOD, ("duration=20 seconds",))
    assert "key 'duration'" in message and "us, ms, s, min" in message
    message = error_of(tmp_path, GOOD, ("duration",))
    assert "--set duration: write KEY=VALUE" in message


def test_only_takes_names_and_globs(tmp_path):
    plan = load_plan(write(tmp_path, GOOD))
    assert {t.name for t in plan.select(["initcwnd-10_*"])} == {
        f"initcwnd-10_start-{s}_r{r}" for s in ("0s", "15s") for r in (1, 2)
    }
    assert len(plan.select(["*_r1", plan.trials[0].id])) == 6 + (plan.trials[0].repetition == 2)
    with pytest.raises(SpecError, match="--only nope matches no trial"):
        plan.select(["nope"])


def test_codel_is_a_link_qdisc(tmp_path):
    plan = load_plan(write(tmp_path, GOOD.replace("delay: 50ms}", "delay: 50ms, qdisc: codel}")))
    bottleneck = plan.base.network.links[0]
    assert bottleneck.direction("forward").qdisc == "codel"
    assert bottleneck.direction("reverse").qdisc == "codel"
    # Checked against the kernel like pie: sch_codel, and the rack whose kernel has it.
    assert rack_kind.needs(plan.trials)["qdiscs"] == {"codel"}
    assert preflight.kernel_modules("codel") == ["sch_codel"]
    message = error_of(tmp_path, GOOD.replace("delay: 50ms}", "delay: 50ms, qdisc: codle}"))
    assert "key 'network.links[0].qdisc'" in message and "'codel'" in message


def test_wrong_references_are_named(tmp_path):
    message = error_of(tmp_path, GOOD.replace("link: access1", "link: access9"))
    assert "capture.points[0].link: no link named 'access9'" in message
    assert "the links are: bottleneck, access1" in message
    message = error_of(tmp_path, GOOD.replace("link: access1, at: R1", "link: access1, at: R2"))
    assert "capture.points[0].at: 'R2' is not an end of link access1 (S1 and R1)" in message
    nodes = "network:\n  nodes: {R1: R1, R2: R2, S1: S1, S2: S2, D2: D2}\n"
    message = error_of(tmp_path, GOOD.replace("network:\n", nodes))
    assert "traffic[0].to: node 'D1' is not in network.nodes" in message


def test_bad_values_name_key_and_allowed(tmp_path):
    message = error_of(tmp_path, GOOD.replace("rate: 1.5mbit", "rate: 1.5mbps"))
    assert "key 'network.links[0].rate'" in message and "bit, kbit, mbit, gbit" in message
    message = error_of(tmp_path, GOOD.replace("buffer: 20pkt", "buffer: 20 packets"))
    assert "key 'network.links[0].buffer'" in message and "B, kB, MB, pkt" in message
    message = error_of(tmp_path, GOOD.replace("type: cbr_udp", "type: voip"))
    assert "key 'traffic[2]'" in message and "'bulk_tcp', 'cbr_udp'" in message
    message = error_of(tmp_path, GOOD.replace("cc: reno, start", "cc: nosuch, start"))
    assert "key 'traffic[1].cc'" in message and "allowed: reno, cubic, htcp" in message
    message = error_of(tmp_path, GOOD.replace("dscp: af11", "dscp: gold"))
    assert "key 'traffic[2].dscp'" in message and "ef" in message
    message = error_of(
        tmp_path, GOOD.replace("qdisc", "x").replace("delay: 50ms}", "delay: 50ms, qdisc: sfq}")
    )
    assert "key 'network.links[0].qdisc'" in message and "'fq_codel'" in message
    message = error_of(
        tmp_path, GOOD.replace("    - {name: before", "    - {name: before, side: in")
    )
    assert (
        "unknown key 'capture.points[0].side'; allowed here: name, link, at, node, interface"
        in message
    )
    plan = load_plan(
        write(
            tmp_path,
            GOOD.replace("hosts.senders.initcwnd: [1, 3, 10]", "hosts.senders.initcwnd: [1, 0]"),
        )
    )
    with pytest.raises(SpecError) as exc:
        plan.select(None)  # a level no trial can run with is an error once it is selected
    message = " ".join(str(exc.value).split())
    assert (
        "key 'hosts.senders.initcwnd'" in message
        and "(in the trial with hosts.senders.initcwnd=0" in message
    )
    message = error_of(
        tmp_path, GOOD.replace("forward: {delay: 0s}", "forward: {delay: 0s, rte: 1mbit}")
    )
    assert "forward: unknown key rte; allowed: rate, buffer, delay, qdisc" in message


def test_unknown_and_repeated_keys_in_lists_are_named(tmp_path):
    message = error_of(tmp_path, GOOD.replace("name: first,", "name: first, flowz: 2,"))
    assert (
        "unknown key 'traffic[0].flowz'; allowed here: type, name, from, to, start, flows"
        in message
    )
    message = error_of(tmp_path, GOOD.replace("type: cbr_udp,", "type: cbr_udp, name: first,"))
    assert "traffic names must be unique; repeated: first" in message
    message = error_of(tmp_path, GOOD.replace("name: r2_core", "name: before"))
    assert "capture point names must be unique; repeated: before" in message


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    message = error_of(tmp_path, GOOD.replace("duration: 30s", "duration: [30s"))
    assert "line 18, column 8" in message and "not valid YAML" in message


def test_units_are_exact():
    assert parse_rate("1mbit") == 1_000_000
    assert parse_rate("1.5Mbit") == 1_500_000
    assert parse_bytes("60kB") == parse_bytes("60000B") == 60_000
    assert parse_duration_ns("20ms") == 20_000_000
    assert parse_duration_ns("3min") == 180 * 10**9
    assert parse_buffer("60kB") == Buffer(60_000, "B") and str(parse_buffer("20pkt")) == "20pkt"
    with pytest.raises(ValueError, match="bit, kbit, mbit, gbit"):
        parse_rate("2mbps")


def test_check_prints_the_plan(tmp_path):
    done = check(tmp_path, GOOD, "--only", "initcwnd-10_*")
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "4 of 12 trial(s)" in out
    assert "hosts.senders.initcwnd=10, traffic[late].start=15s" in out


def test_only_needs_just_the_selected_trials_to_validate(tmp_path):
    # A 10 s run cannot hold the late joiner at 15 s, but the simultaneous starts can run.
    plan = load_plan(write(tmp_path, GOOD), ["duration=10s"])
    assert len(plan.select(["*start-0s*"])) == 6
    with pytest.raises(SpecError, match=r"traffic\[1\].start \(15 s\) is not before the end"):
        plan.select(["*start-15s*"])


def test_files_that_are_not_yaml_text_are_refused_by_name(tmp_path):
    for make, said in (
        (lambda p: p.mkdir(), "a directory, not an experiment file"),
        (lambda p: p.write_bytes(b"\xffexperiment: startup\n"), "not a text file (byte 0"),
    ):
        path = tmp_path / f"case{len(list(tmp_path.iterdir()))}.yml"
        make(path)
        with pytest.raises(SpecError) as exc:
            load_plan(path)
        assert str(exc.value) == f"{path}: {said}" or str(exc.value).startswith(f"{path}: {said}")


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    lines = GOOD.splitlines()
    first, last = lines.index("duration: 30s") + 1, len(lines) + 1
    message = error_of(tmp_path, GOOD + "duration: 4s\n")
    assert (
        f"line {last}, column 1: not valid YAML: key 'duration' given twice (first on line {first})"
    ) in message
    message = error_of(tmp_path, GOOD.replace("cc: reno}", "cc: reno, cc: cubic}", 1))
    flow = next(i for i, line in enumerate(lines, 1) if "name: first" in line)
    assert (
        f"line {flow}, column " in message
        and f"key 'cc' given twice (first on line {flow})" in message
    )


def test_factors_that_cannot_make_a_matrix_are_refused(tmp_path):
    factors = "factors:\n  hosts.senders.initcwnd: [1, 3, 10]\n"
    for levels, said in (
        (
            "traffic[late.start: [0s]",
            "key 'factors.traffic[late.start': 'traffic[late.start' is not a key",
        ),
        ("traffic[late].start: []", "key 'factors.traffic[late].start': no levels"),
        ("traffic[late].start: [0s, 15s, 0s]", 'level "0s" given more than once'),
        ("repetitions: [1, 2]", "repetitions cannot be a factor (it describes the matrix"),
        ("topology: [chain2, dumbbell]", "topology cannot be a factor (one batch runs on one rack"),
    ):
        text = GOOD.replace(
            factors + "  traffic[late].start: [0s, 15s]\n", f"{factors}  {levels}\n"
        )
        assert text != GOOD
        assert said in error_of(tmp_path, text), levels


def test_repetitions_of_a_file_judged_trial_by_trial_are_checked(tmp_path):
    # duration 10 s: the base file (late joiner at 15 s) is judged trial by trial
    for bad in ("three", "[1, 2]", "0", "", "true"):
        text = GOOD.replace("repetitions: 2", f"repetitions: {bad}").replace("30s", "10s")
        message = error_of(tmp_path, text)
        assert "key 'repetitions'" in message and "whole number of at least 1" in message, bad


def test_set_errors_say_the_file_was_changed_by_set(tmp_path):
    without_factors = GOOD[: GOOD.index("factors:")]
    message = error_of(tmp_path, without_factors, ("durtion=20s",))
    assert "unknown key 'durtion'" in message
    assert "(the file as changed by --set durtion=20s)" in message


def test_traffic_to_itself_is_refused(tmp_path):
    message = error_of(tmp_path, GOOD.replace("from: S2, to: D2, dscp", "from: D2, to: D2, dscp"))
    assert "traffic[2]: from and to are the same node (D2)" in message


def test_nodes_and_host_groups_beyond_the_virtual_topology_are_refused_before_a_rack(tmp_path):
    """What `check` (and run/batch on the virtual rack, before it is brought up) finds from the
    topology file: an unknown topology, nodes it lacks, hosts.<key> naming nothing there."""

    path = tmp_path / "exp.yml"
    for text, said in (
        (GOOD.replace("topology: chain2", "topology: chian2"),
         f"{path}: key 'topology': 'chian2' is not a virtual rack topology; the topologies are: "
         "chain2, dumbbell"),
        (GOOD.replace("to: D1", "to: D9"),
         f"{path}: key 'traffic[0].to': node 'D9' is not a host of the chain2 topology"),
        (GOOD.replace("topology: chain2", "topology: dumbbell"),
         f"{path}: key 'network.links[0]': node 'R1' is not a host of the dumbbell topology; its "
         "hosts are: A, B, C, D, R"),
        (GOOD.replace("hosts:\n  senders:", "hosts:\n  sendres:"),
         f"{path}: key 'hosts.sendres': not a node, an inventory group or one of all, senders, "
         "receivers"),
    ):  # fmt: skip
        done = check(tmp_path, text)
        assert done.returncode == 2, done.stdout[-2000:]
        assert said in " ".join(done.stderr.split()), done.stderr
        assert "Traceback" not in done.stderr
    assert check(tmp_path, GOOD).returncode == 0


def test_more_mistakes_get_the_key_and_what_is_allowed(tmp_path):
    message = error_of(tmp_path, GOOD.replace("initcwnd: 10, rto_min", "initcwind: 10, rto_min"))
    allowed = "allowed here: cc, cc_params, cc_implementation, initcwnd"
    assert f"unknown key 'hosts.senders.initcwind'; {allowed}" in message
    message = error_of(tmp_path, GOOD.replace("{type: cbr_udp, from: S2", "{from: S2"))
    assert "key 'traffic[2]': needs a type; the types are: bulk_tcp, cbr_udp" in message
    long_late = write(tmp_path, GOOD.replace("start: 15s", "start: 15s, duration: 20s"))
    with pytest.raises(SpecError) as exc:  # the late joiner's trials only
        load_plan(long_late).select(None)
    assert (
        f"{long_late}: key 'traffic[1].duration': traffic[1].duration (20 s from its start at "
        "15 s) runs past the end of the trial (duration 30 s)"
    ) in str(exc.value)
    message = error_of(tmp_path, GOOD.replace("factors:", "warmup: 40s\nfactors:"))
    assert "key 'warmup': warmup (40 s) must be shorter than duration (30 s)" in message


def test_set_names_one_factor_by_its_dotted_key(tmp_path):
    plan = load_plan(write(tmp_path, GOOD), ["factors.hosts.all.cc=[reno, cubic]"])
    assert len(plan.trials) == 24
    assert {t.overrides["hosts.all.cc"] for t in plan.trials} == {"reno", "cubic"}


def test_a_byte_buffer_must_hold_one_full_size_frame(tmp_path):
    message = error_of(tmp_path, GOOD.replace("buffer: 20pkt", "buffer: 1000B"))
    assert (
        "key 'network.links[0]': buffer 1000B cannot hold one full-size frame (1514 B at mtu "
        "1500): every such packet would be dropped"
    ) in message
    small_mtu = GOOD.replace("buffer: 20pkt, delay: 50ms", "buffer: 1000B, delay: 50ms, mtu: 576")
    assert len(load_plan(write(tmp_path, small_mtu)).trials) == 12  # 590 B frames fit
    message = error_of(
        tmp_path,
        GOOD.replace("buffer: 20pkt", "buffer: 1000B, reverse: {buffer: 10B}").replace(
            "buffer: 1000B", "buffer: 2000B"
        ),
    )
    assert "key 'network.links[0]': reverse: buffer 10B cannot hold one full-size frame" in message
    one_way = GOOD.replace(
        "between: [R1, R2], rate: 1.5mbit, buffer: 20pkt", "from: R1, to: R2, rate: 1.5mbit"
    )
    message = error_of(tmp_path, one_way)
    assert "key 'network.links[0]': a shaped direction (rate) needs a buffer" in message


def test_a_misspelt_family_is_refused_with_the_likely_one(tmp_path):
    done = check(tmp_path, GOOD.replace("experiment: startup", "experiment: statrup"))
    assert done.returncode == 2
    assert "key 'experiment': 'statrup' has no report module; did you mean 'startup'?" in " ".join(
        done.stderr.split()
    )
    assert (
        check(tmp_path, GOOD.replace("experiment: startup", "experiment: my_new_family")).returncode
        == 0
    )
