"""RIO at the core (issue 8, item 3): thresholds in packets converted to bytes with the mean
packet size, w_q written as the burst tc turns into GRED's EWMA weight, the tc lines the
linux_router role renders (GRED in RIO mode, clsact filters from the DSCP), the messages for
settings that cannot be built, and GRED's per-VQ counters read from `tc -s -j qdisc show`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from core import rio, rio_bpf
from tests.unit.spec_files import error_of, write
from trials import preflight
from trials.plan import load_plan
from trials.preflight.facts import kernel_modules
from trials.spec import SpecError

PROJECT = Path(__file__).resolve().parents[2]
DATA = PROJECT / "tests/data/rio"
EXPERIMENT = """\
experiment: diffserv
network:
  links:
    - {name: core, from: R, to: C, rate: 1500kbit, buffer: 60kB, qdisc: rio}
traffic:
  - {type: cbr_udp, name: in_flow, from: A, to: C, packet_bytes: 1500, interval: 12ms, dscp: af11}
duration: 10s
"""


def _plugin(name: str):
    path = PROJECT / "playbooks/filter_plugins" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.FilterModule().filters()


def render(links: list[dict], backend: str = "netem") -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(PROJECT / "roles/linux_router/templates"),
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(_plugin("trialbed_units"))
    env.filters.update(_plugin("trialbed_rio"))
    env.filters.update(_plugin("trialbed_link_rules"))
    return env.get_template("shaping.tc.j2").render(
        linux_router_links=links,
        __linux_router_backend=backend,
        linux_router_htb_burst="1600b",
        ansible_managed="managed",
        inventory_hostname="R",
    )


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_seed004_defaults_converted_from_packets_to_bytes():
    (vq_in, vq_out) = rio.virtual_queues({}, "60kB")
    # EXPERIMENTS.md §4: IN min 9 (the sweep's first), max 3 min, Pmax 0.1; OUT 2/6, 0.2.
    assert (vq_in.min_packets, vq_in.max_packets, vq_in.pmax) == (9, 27, 0.1)
    assert (vq_out.min_packets, vq_out.max_packets, vq_out.pmax) == (2, 6, 0.2)
    assert (vq_in.min_bytes, vq_in.max_bytes) == (9 * 1500, 27 * 1500)
    assert (vq_out.min_bytes, vq_out.max_bytes) == (2 * 1500, 6 * 1500)
    assert vq_in.limit == vq_out.limit == 60000  # one physical queue: the link's buffer
    assert (vq_in.prio, vq_out.prio) == (1, 2)  # grio: OUT's average includes IN's
    # Another mean packet size converts the same packets to other bytes, and a packet buffer
    # is counted in it too.
    (small_in, _) = rio.virtual_queues({"mean_packet": "1000B", "in": {"min": 30}}, "100pkt")
    assert (small_in.min_bytes, small_in.max_bytes, small_in.limit) == (30000, 90000, 100000)
    assert small_in.record()["mean_packet"] == 1000


def test_w_q_becomes_the_burst_that_gives_the_nearest_power_of_two():
    assert rio.wlog_for(0.0012) == 10  # 2^-9.7: GRED uses 2^-10
    assert rio.wlog_for(0.002) == 9
    for vq in rio.virtual_queues({"in": {"min": 240}, "out": {"w_q": 0.002}}, "1200kB"):
        # iproute2's own derivation gives back the weight asked for, from the burst written
        assert rio.tc_red_eval_ewma(vq.min_bytes, vq.burst, vq.mean_packet) == vq.wlog
        assert vq.record()["w_q_effective"] == 2.0**-vq.wlog
    (vq_in, vq_out) = rio.virtual_queues({}, "60kB")
    # measured on the VM rack: tc -d showed "ewma 10" for both VQs with these bursts
    assert (vq_in.burst, vq_out.burst) == (94, 33)


def test_in_dscps_become_flower_tos_matches():
    assert rio.tos_filters({}) == [
        {"tos": "0x28", "mask": "0xfc", "vq": 0},  # AF11 = 10 << 2
        {"tos": "0x48", "mask": "0xfc", "vq": 0},  # AF21
        {"tos": "0x68", "mask": "0xfc", "vq": 0},  # AF31
        {"tos": "0x88", "mask": "0xfc", "vq": 0},  # AF41
    ]
    assert rio.tos_filters({"in_dscp": ["ef", 0]}) == [
        {"tos": "0xb8", "mask": "0xfc", "vq": 0},
        {"tos": "0x00", "mask": "0xfc", "vq": 0},
    ]
    # With the third level, its codes (AF*3 unless given) go to VQ 2.
    assert rio.tos_filters({"in_dscp": ["af11"], "high": {}}) == [
        {"tos": "0x28", "mask": "0xfc", "vq": 0},
        *({"tos": tos, "mask": "0xfc", "vq": 2} for tos in ("0x38", "0x58", "0x78", "0x98")),
    ]
    assert rio.tos_filters({"high": {}, "high_dscp": ["cs1"]})[-1] == {
        "tos": "0x20",
        "mask": "0xfc",
        "vq": 2,
    }


def test_role_renders_gred_in_rio_mode_and_the_clsact_filters():
    link = {"iface": "right", "rate": "1500kbit", "buffer": "60kB", "delay_ms": 25.0}
    text = render([{**link, "qdisc": "rio", "rio": {"in": {"min": 5}}}])
    assert lines(text) == [
        "qdisc add dev right root handle 1: netem delay 25.0ms limit 1000000",
        "qdisc add dev right parent 1:1 handle 2: htb default 10",
        "class add dev right parent 2: classid 2:10 htb rate 1500kbit ceil 1500kbit "
        "burst 1600b cburst 1600b",
        "qdisc add dev right parent 2:10 handle 10: gred setup vqs 2 default 1 grio limit 60000",
        "qdisc change dev right parent 2:10 handle 10: gred vq 0 prio 1 limit 60000 min 7500 "
        "max 22500 avpkt 1500 burst 66 probability 0.1 bandwidth 1500kbit",
        "qdisc change dev right parent 2:10 handle 10: gred vq 1 prio 2 limit 60000 min 3000 "
        "max 9000 avpkt 1500 burst 33 probability 0.2 bandwidth 1500kbit",
        "qdisc add dev right clsact",
        "filter add dev right egress protocol ip prio 1 flower ip_tos 0x28/0xfc classid :0",
        "filter add dev right egress protocol ip prio 1 flower ip_tos 0x48/0xfc classid :0",
        "filter add dev right egress protocol ip prio 1 flower ip_tos 0x68/0xfc classid :0",
        "filter add dev right egress protocol ip prio 1 flower ip_tos 0x88/0xfc classid :0",
        "filter add dev right egress protocol all prio 2 matchall classid :1",
    ]
    # The render says what the bytes came from (packets, mean packet, w_q asked and used).
    assert "# VQ 0 (IN): min 5 max 15 packets of 1500 B, Pmax 0.1, w_q 0.0012 (GRED: 2^-10)" in text
    # The same text on a second render (the role then reports no change).
    assert render([{**link, "qdisc": "rio", "rio": {"in": {"min": 5}}}]) == text
    # Other qdiscs get no clsact.
    assert "clsact" not in render([{**link, "qdisc": "droptail"}])


def test_role_renders_codel_as_the_leaf_under_htb():
    # Not RIO: the same template's plain CoDel leaf, for seed 000's link (1 Mbit/s, 60 000 B,
    # 25 ms one way). tc-codel(8): `tc qdisc ... codel [ limit PACKETS ] [ target TIME ]
    # [ interval TIME ] [ ecn | noecn ]`; limit in packets, the buffer in full frames as for
    # pie and fq_codel (60 000 B / 1500 = 40), target and interval at their defaults (5ms,
    # 100ms), ECN off as fq_codel's.
    link = {"iface": "right", "rate": "1mbit", "buffer": "60000B", "delay_ms": 25}
    assert lines(render([{**link, "qdisc": "codel"}])) == [
        "qdisc add dev right root handle 1: netem delay 25ms limit 1000000",
        "qdisc add dev right parent 1:1 handle 2: htb default 10",
        "class add dev right parent 2: classid 2:10 htb rate 1mbit ceil 1mbit "
        "burst 1600b cburst 1600b",
        "qdisc add dev right parent 2:10 handle 10: codel limit 40 noecn",
    ]
    # Without netem (the delay line): HTB is the root, CoDel its leaf; a buffer in packets
    # is CoDel's limit as given.
    nfqueue = lines(render([{**link, "buffer": "20pkt", "qdisc": "codel"}], backend="nfqueue"))
    assert nfqueue[-1] == "qdisc add dev right parent 1:10 handle 10: codel limit 20 noecn"
    assert "clsact" not in " ".join(nfqueue)


def test_role_checks_name_the_key():
    problems = _plugin("trialbed_units")["trialbed_link_problems"]
    link = {"iface": "right", "rate": "1500kbit", "buffer": "20000B", "qdisc": "rio"}
    found = problems(link, ["right"], True)
    assert found == [
        "rio.in.max: 27 packets (40500 B at mean_packet 1500B) do not fit the link's buffer "
        "(20000 B): GRED would drop at the tail before RED's max; raise the buffer or "
        "lower the thresholds"
    ]
    found = problems({**link, "buffer": "60kB", "rio": {"out": {"pmax": 0}}}, ["right"], True)
    assert found == ["rio.out.pmax: 0 is not a probability in (0, 1]"]
    found = problems({**link, "qdisc": "droptail", "rio": {"in": {"min": 3}}}, ["right"], True)
    assert found == ["rio: thresholds given, but qdisc is not rio"]
    found = problems({"iface": "right", "qdisc": "rio"}, ["right"], True)
    assert found == ["qdisc rio needs a rate and a buffer (its physical queue)"]


def test_third_level_renders_a_third_vq_fed_by_the_af3_codes():
    """MPM's three colours: GRED with three VQs in RIO mode (high's prio 3: its average adds
    IN's and OUT's), AF*3 to VQ 2, unmatched packets still to OUT (VQ 1, also the default)."""
    link = {"iface": "right", "rate": "6mbit", "buffer": "1000pkt", "delay_ms": 0}
    three = {"in_dscp": ["af11"], "in": {"min": 333, "max": 999}, "out": {"min": 9}, "high": {}}
    text = lines(render([{**link, "qdisc": "rio", "rio": three}]))
    setup = (
        "qdisc add dev right parent 1:10 handle 10: gred setup vqs 3 default 1 grio limit 1500000"
    )
    assert setup in text
    assert (
        "qdisc change dev right parent 1:10 handle 10: gred vq 2 prio 3 limit 1500000 min 3000 "
        "max 9000 avpkt 1500 burst 33 probability 0.2 bandwidth 6mbit"
    ) in text
    assert [t for t in text if t.startswith("filter")] == [
        "filter add dev right egress protocol ip prio 1 flower ip_tos 0x28/0xfc classid :0",
        *(
            f"filter add dev right egress protocol ip prio 1 flower ip_tos {tos}/0xfc classid :2"
            for tos in ("0x38", "0x58", "0x78", "0x98")
        ),
        "filter add dev right egress protocol all prio 2 matchall classid :1",
    ]
    vqs = rio.virtual_queues(three, "1000pkt")
    assert [(vq.dp, vq.precedence, vq.prio, vq.min_packets, vq.max_packets) for vq in vqs] == [
        (0, "in", 1, 333, 999),
        (1, "out", 2, 9, 27),
        (2, "high", 3, 2, 6),
    ]


def test_experiment_file_takes_rio_with_defaults_and_records_them(tmp_path):
    plan = load_plan(write(tmp_path, EXPERIMENT))
    shaping = plan.base.network.links[0].direction("forward")
    assert shaping.qdisc == "rio"
    assert shaping.rio.settings() == {
        "mean_packet": "1500B",
        "in": {},
        "out": {},
        "in_dscp": ["af11", "af21", "af31", "af41"],
    }
    assert [vq.max_packets for vq in shaping.virtual_queues()] == [27, 6]
    # A factor over the IN threshold (the seed-004 sweep) gives one trial per setting.
    swept = EXPERIMENT + "factors:\n  network.links[0].rio.in.min: [9, 13]\n"
    plan = load_plan(write(tmp_path, swept))
    maxes = sorted(
        t.experiment.network.links[0].direction("forward").virtual_queues()[0].max_bytes
        for t in plan.select(None)
    )
    assert maxes == [27 * 1500, 39 * 1500]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            "qdisc: rio, rio: {in: {min: 30}}",
            "key 'network.links[0]': rio.in.max: 90 packets (135000 B at mean_packet "
            "1500B) do not fit the link's buffer (60000 B)",
        ),
        (
            "qdisc: rio, rio: {in: {min: 0}}",
            "key 'network.links[0].rio.in.min': 0 is not a number of packets",
        ),
        (
            "qdisc: rio, rio: {out: {min: 4, max: 3}}",
            "rio.out.max (3 packets) must be above rio.out.min (4 packets)",
        ),
        (
            "qdisc: rio, rio: {inn: {min: 3}}",
            "unknown key 'network.links[0].rio.inn'; allowed here: mean_packet, in, out, in_dscp, "
            "high, high_dscp",
        ),
        (
            "qdisc: rio, rio: {high_dscp: [af13]}",
            "rio.high_dscp: given, but the queue has no rio.high level",
        ),
        (
            "qdisc: rio, rio: {high: {}, high_dscp: [af13, af21]}",
            "rio.high_dscp: DSCP [18] also in rio.in_dscp; a code has one level",
        ),
        (
            "qdisc: rio, rio: {high: {min: 30}}",
            "rio.high.max: 90 packets (135000 B at mean_packet 1500B) do not fit the link's buffer",
        ),
        (
            "qdisc: rio, rio: {in: {minimum: 3}}",
            "unknown key 'network.links[0].rio.in.minimum'; allowed here: min, max, pmax, w_q",
        ),
        (
            "qdisc: rio, rio: {mean_packet: 1500}",
            "key 'network.links[0].rio.mean_packet': 1500 is not a size in bytes; write a number "
            "and one of: B, kB, MB",
        ),
        ("qdisc: rio, rio: {in_dscp: [gold]}", "'gold' is not a DSCP; give 0..63 or one of"),
        (
            "qdisc: droptail, rio: {in: {min: 5}}",
            "rio: thresholds given for qdisc 'droptail'; set qdisc: rio",
        ),
        ("qdisc: redd", "key 'network.links[0].qdisc'"),
    ],
)
def test_bad_rio_settings_name_file_key_and_allowed(tmp_path, edit, expected):
    message = error_of(tmp_path, EXPERIMENT.replace("qdisc: rio", edit))
    assert expected in message
    if edit == "qdisc: redd":
        assert "'rio'" in message  # the allowed values include it


def test_gred_counters_per_virtual_queue():
    # Listings taken on the VM rack around a trial (an AF11 and an AF12 TCP flow into a
    # 1.5 Mbit/s RIO link: IN 2771 packets, 66 dropped; OUT and unmarked 354, 122 dropped).
    before = rio.gred_counters((DATA / "gred_before_vm.json").read_text())
    after = rio.gred_counters((DATA / "gred_after_vm.json").read_text())
    assert sorted(after) == [0, 1]
    assert after[0]["prio"] == 1 and after[1]["prio"] == 2
    delta = rio.counters_delta(before, after)
    for dp in (0, 1):
        row = delta[dp]
        assert row["drops"] == sum(
            row[k] for k in ("forced_drops", "early_drops", "pdrop", "other_drops")
        )
        assert row["packets"] == after[dp]["packets"] - before.get(dp, {}).get("packets", 0)
    raw = json.loads((DATA / "gred_after_vm.json").read_text())
    vqs = next(q for q in raw if q["kind"] == "gred")["options"]["vqs"]
    assert delta[1]["early_drops"] == vqs[1]["prob_drop"] - before[1]["early_drops"]
    assert (delta[0]["packets"], delta[0]["drops"]) == (2771, 66)
    assert (delta[1]["packets"], delta[1]["drops"]) == (354, 122)
    assert delta[1]["early_drops"] == 35 and delta[1]["forced_drops"] == 54
    assert rio.gred_counters('[{"kind": "htb", "options": {}}]') == {}


class FakeRack:
    """The dumbbell's hosts, a kernel without sch_gred (the namespace rack on this machine's
    kernel), or with it (the VM rack)."""

    def __init__(self, kind: str, have: set[str]):
        import ipaddress

        from core.rack import Host

        topology = yaml.safe_load(
            (PROJECT / "inventory/virtual/topologies/dumbbell.yml").read_text()
        )
        self.vars = {"trialbed_rack_kind": kind}
        self.hosts = {
            name: Host(
                name=name,
                address=h["mgmt"],
                user="root",
                groups=tuple(h["groups"]),
                workdir="/tmp/none",
                interfaces={k: ipaddress.IPv4Interface(v) for k, v in h["interfaces"].items()},
                vars={},
            )
            for name, h in topology["hosts"].items()
        }
        self.have = have
        self.probes: list[str] = []

    def host(self, name):
        return self.hosts[name]

    def run_parallel(self, commands, check=True):
        self.probes += list(commands.values())
        # the qdisc probe echoes each qdisc whose modules all exist (rio: GRED's; the BPF
        # RIO's, which preflight asks for beside it)
        said = [
            q
            for q in ("rio", rio_bpf.PROBE)
            if q in commands[next(iter(commands))] and self.have >= set(kernel_modules(q))
        ]
        return {h: " ".join(said) for h in commands}


def fake_facts(rack, names, **_):
    tools = {t: "x" for t in ("tc", "tcpdump", "tcpreplay", "python3", "iperf3")}
    return {
        n: {
            "kernel": "6.12-cloud",
            "cc_loaded": ["reno", "cubic"],
            "cc_modules": [],
            "cc_params": {},
            "tools": tools,
            "free_disk_bytes": 10**10,
            "qdiscs": [],
            "tracepoints": [],
            "mtu": {itf: 1500 for itf in rack.host(n).interfaces},
            "speed": {},
        }
        for n in names
    }


def test_preflight_refuses_rio_without_gred_or_the_bpf_rio_and_points_to_the_vm_rack(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(preflight.run, "host_facts", fake_facts)
    monkeypatch.setattr(preflight.run, "reachability", lambda rack, names: (list(names), []))
    trials = load_plan(write(tmp_path, EXPERIMENT)).select(None)
    rack = FakeRack("namespaces", set())
    with pytest.raises(SpecError) as exc:
        preflight.preflight(trials, rack, "exp.yml")  # type: ignore[arg-type]
    message = " ".join(str(exc.value).split())
    assert (
        "exp.yml: link core: qdisc 'rio' is not in the kernel of host R (6.12-cloud): it "
        "needs sch_gred, sch_ingress, cls_flower and cls_matchall; nor can it run as the BPF "
        "program hostside/bpf_tc/rio there, which needs sch_ingress and cls_bpf in the kernel, "
        "clang, libbpf-dev; use droptail here, or a rack whose kernel has them (RACK=vm: the VM "
        "rack, whose Debian kernel has them)"
    ) in message
    # every module is probed on the router, GRED's and the BPF RIO's, and the probe is a valid
    # shell command that says rio (rio_bpf) when every module of it can be loaded (modprobe
    # stubbed) or is built in (a function of its own in /proc/kallsyms: grep stubbed), nothing
    # when one cannot
    probe = rack.probes[-1]
    assert all(m in probe for m in [*preflight.QDISC_MODULES["rio"], *rio_bpf.KERNEL_MODULES])
    builtin = 'grep() { test "$2" = clsact_find || test "$2" = cls_bpf_classify; }'
    for stub, said in (
        ("modprobe() { true; }; grep() { false; }", ["rio", "rio_bpf"]),
        ('modprobe() { test "$2" != cls_flower; }; grep() { false; }', ["rio_bpf"]),
        ('modprobe() { test "$2" != cls_bpf; }; grep() { false; }', ["rio"]),
        (f"modprobe() {{ false; }}; {builtin}", ["rio_bpf"]),  # this machine's kernel
    ):
        shell = f"{stub}; {probe}"
        assert (
            subprocess.run(["sh", "-c", shell], capture_output=True, text=True).stdout.split()
            == said
        )
    # A qdisc of one module too (a "((" here would be read as arithmetic and say nothing).
    preflight.qdiscs_available(rack, ["R"], {"fq_codel"})  # type: ignore[arg-type]
    shell = f"modprobe() {{ true; }}; {rack.probes[-1]}"
    assert (
        subprocess.run(["sh", "-c", shell], capture_output=True, text=True).stdout == "fq_codel\n"
    )
    # A kernel with them (the VM rack's) passes.
    preflight.preflight(trials, FakeRack("vm", set(preflight.QDISC_MODULES["rio"])), "exp.yml")  # type: ignore[arg-type]

    # So does one without GRED where the BPF RIO can be built and loaded (this machine's
    # kernel, with clang and libbpf-dev): roles/linux_router then runs it.
    def with_bpf_tools(rack, names, **_):
        facts = fake_facts(rack, names)
        for f in facts.values():
            f["bpf_cc_kernel"] = {"tools": {"clang": "/usr/bin/clang"}, "libbpf_headers": True}
        return facts

    monkeypatch.setattr(preflight.run, "host_facts", with_bpf_tools)
    preflight.preflight(trials, FakeRack("namespaces", set(rio_bpf.KERNEL_MODULES)), "exp.yml")  # type: ignore[arg-type]
    # ... but not where the kernel lacks the BPF classifier
    with pytest.raises(SpecError, match="which needs sch_ingress and cls_bpf in the kernel;"):
        preflight.preflight(trials, FakeRack("namespaces", {"sch_ingress"}), "exp.yml")  # type: ignore[arg-type]


def test_preflight_refuses_host_pacing_without_fq(tmp_path, monkeypatch):
    """Linux host pacing needs sch_fq; a kernel without it (this machine's, a namespace rack)
    is refused by preflight with the key and what works instead, before any host is touched."""
    monkeypatch.setattr(preflight.run, "host_facts", fake_facts)
    monkeypatch.setattr(preflight.run, "reachability", lambda rack, names: (list(names), []))
    paced = (
        EXPERIMENT.replace("qdisc: rio", "qdisc: droptail") + "hosts:\n  senders: {pacing: true}\n"
    )
    trials = load_plan(write(tmp_path, paced)).select(None)
    rack = FakeRack("namespaces", set())
    with pytest.raises(SpecError) as exc:
        preflight.preflight(trials, rack, "exp.yml")  # type: ignore[arg-type]
    message = " ".join(str(exc.value).split())
    assert "exp.yml: key 'hosts.*.pacing (A)': pacing needs the fq qdisc" in message, message
    assert "kernel of host A (6.12-cloud)" in message
    assert "use traffic[].pacing (TCP's own pacing, per flow) instead" in message
    assert any("fq" in probe for probe in rack.probes)  # it asked the host's kernel


def test_preflight_keeps_free_twice_what_all_of_a_hosts_captures_write(tmp_path, monkeypatch):
    """Two capture points on R write at once: the disk check adds them up (it took the larger
    one alone, half of what a trial writes)."""
    monkeypatch.setattr(preflight.run, "reachability", lambda rack, names: (list(names), []))
    monkeypatch.setattr(preflight.checks, "capture_bytes", lambda net, site, duration: 300e6)

    def little_disk_on_r(rack, names, **kw):
        facts = fake_facts(rack, names, **kw)
        facts["R"]["free_disk_bytes"] = 1000 * 10**6  # above 2 x 300 MB, below 2 x 600 MB
        return facts

    monkeypatch.setattr(preflight.run, "host_facts", little_disk_on_r)
    two_points = (
        EXPERIMENT.replace("qdisc: rio}", "qdisc: droptail}\n    - {name: edge, from: R, to: A, "
                           "rate: 1500kbit, buffer: 60kB}")
        + "capture:\n  points:\n    - {name: p1, link: core, at: R}\n"
        "    - {name: p2, link: edge, at: R}\n"
    )  # fmt: skip
    trials = load_plan(write(tmp_path, two_points)).select(None)
    with pytest.raises(SpecError) as exc:
        preflight.preflight(trials, FakeRack("namespaces", set()), "exp.yml")  # type: ignore[arg-type]
    message = " ".join(str(exc.value).split())
    assert "host R: only 1000 MB free" in message
    assert "the captures at p1, p2 write up to 600 MB in one trial" in message
