"""roles/freebsd_router rendered by Ansible itself on the controller (no FreeBSD host can run
here): the ruleset, loader.conf, rc.conf settings, sysctls and the removal script for the
seed-000 parameters and the AQM variants, checked against expectations written from the
manuals of FreeBSD 13/14. Each expectation names its source:

- ipfw(8) "PIPE, QUEUE AND SCHEDULER CONFIGURATION": `bw` is a number followed by
  K|M|G and bit/s; `delay` in milliseconds; `queue` in slots or Kbytes; `red | gred
  w_q/min_th/max_th/max_p` (thresholds in bytes when the queue is in bytes, else slots);
  `sched N config ... type fq_codel` with `limit` in packets (at most 20480).
- ipfw(8) "TRAFFIC SHAPER (DUMMYNET) CONFIGURATION", its subsection "PIPE, QUEUE AND SCHEDULER
  CONFIGURATION": `queue N config pipe P` attaches a queue (flowset) to pipe P, `weight`
  1..100; `queue` and `red` are set per queue, RED's thresholds in the queue's unit. "RULE
  OPTIONS": `dscp spec[,spec]`, setdscp's keywords (af11, ef, ...) or 0..63, any option may
  be prefixed by `not`; "RULE ACTIONS": `queue N`. sys/netpfil/ipfw/ip_dummynet.c
  config_sched: `pipe N config` makes sched N a WF2Q+ (qdisc rio's two queues on one pipe).
- ipfw(8) "CONFIGURING CODEL, PIE, FQ-CODEL and FQ-PIE AQM": pie and codel on a pipe (`pipe N
  config bw ... pie`, `... codel`); fq_codel as a scheduler: `pipe 1 config bw`, `sched 1
  config pipe 1 type fq_codel`, `queue 1 config sched 1`, `add ... queue 1 ...`.
- ipfw(8) "LIST OF RULES AND PREPROCESSING": a file of ipfw commands, one per line, `#`
  comments; "RULE FORMAT" / "RULE OPTIONS": `out`, `xmit iface` (only on outgoing packets),
  `via iface`; rules are tried in number order.
- ipfw(8) "LOADER TUNABLES": net.inet.ip.fw.default_to_accept, read before ipfw loads.
- dummynet(4) / loader.conf(5): dummynet_load="YES"; kern.hz sets the tick dummynet's delay
  is counted in (0.5 ms at 2000, the paper's router).
- sbin/ipfw/dummynet.c (what ipfw(8) leaves open): `K` in a queue size is 1024, so
  60 000 bytes must be written `60000bytes` (a B/bytes suffix), not 60KBytes (61 440 B);
  bw's K and M are 1000 and 10^6; delay is parsed as an integer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
PLAYBOOK = """
- name: Render the FreeBSD router's files on the controller
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Check the inputs
      ansible.builtin.include_role: {name: freebsd_router, tasks_from: validate}
      when: step == 'render'
    - name: Render the ruleset, the removal script and the record
      ansible.builtin.include_role: {name: freebsd_router, tasks_from: render, public: true}
      when: step == 'render'
    - name: Write loader.conf
      ansible.builtin.include_role: {name: freebsd_router, tasks_from: loader}
      when: step == 'render'
    - name: Keep the rc.conf settings and sysctls the role applies
      ansible.builtin.copy:
        dest: "{{ freebsd_router_dir }}/settings.json"
        content: >-
          {{ {'rc': __freebsd_router_rc, 'sysctls': __freebsd_router_sysctls,
              'show': __freebsd_router_show} | to_json }}
        mode: "0644"
      when: step == 'render'
    - name: Render the removal script from the record (teardown)
      ansible.builtin.include_role: {name: freebsd_router, tasks_from: removal}
      when: step == 'removal'
"""


def link(iface: str, delay_ms: float = 25, **kw) -> dict:
    return {"iface": iface, "rate": "1mbit", "buffer": "60000B", "delay_ms": delay_ms, **kw}


def run_role(
    out: Path, links: list[dict], step: str = "render", **extra
) -> subprocess.CompletedProcess:
    """ansible-playbook against localhost, with the links as the runner passes them
    (linux_router_links: the role reads the Linux router's variable)."""
    out.mkdir(parents=True, exist_ok=True)
    play = out.parent / "play.yml"
    play.write_text(PLAYBOOK)
    variables = {
        "step": step,
        "linux_router_links": links,
        "linux_router_forwarding": True,
        "trialbed_interfaces": {f"em{i}": {} for i in range(1, 6)},
        "freebsd_router_management_iface": "em0",  # the lab's (a test without: "")
        "freebsd_router_dir": str(out),
        "ansible_python_interpreter": sys.executable,
        # There is no ipfw here to run `ipfw -n` (what a FreeBSD host checks the file with),
        # and /boot/loader.conf is not ours to write.
        "__freebsd_router_check_ruleset": "",
        "__freebsd_router_loader_conf": str(out / "loader.conf"),
        **extra,
    }
    (out.parent / "vars.json").write_text(json.dumps(variables))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",  # messages on one line
    }
    return subprocess.run(
        [
            str(PROJECT / ".venv/bin/ansible-playbook"),
            "-i", "localhost,",
            str(play),
            "-e", f"@{out.parent / 'vars.json'}",
        ],
        cwd=PROJECT, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip


def commands(ruleset: str) -> list[str]:
    """The ipfw commands of a ruleset file: lines that are neither blank nor comments."""
    lines = [line.strip() for line in ruleset.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def pipe_words(command: str) -> dict[str, str]:
    """`pipe N config bw X delay Y queue Z ...` -> {'bw': X, 'delay': Y, 'queue': Z, ...}."""
    words = command.split()[3:]
    return dict(zip(words[::2], words[1::2], strict=False))


@pytest.fixture(scope="module", params=[50, 100], ids=["rtt50", "rtt100"])
def seed000(request, tmp_path_factory):
    """The seed-000 router: 1 Mbit/s, 60 000 B drop-tail, RTT/2 in each direction."""
    out = tmp_path_factory.mktemp(f"seed000-{request.param}") / "router"
    delay = request.param / 2
    result = run_role(out, [link("em1", delay), link("em2", delay)],
                      freebsd_router_management_iface="em0")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return request.param, out


def test_seed000_ruleset_has_one_pipe_per_direction(seed000):
    rtt, out = seed000
    rules = commands((out / "ipfw.rules").read_text())
    one_way = rtt // 2
    assert rules == [
        # Management first (rules are tried in number order): it never meets a pipe.
        "add 10000 allow ip from any to any via em0",
        f"pipe 10001 config bw 1Mbit/s delay {one_way} queue 60000bytes",
        "add 10001 pipe 10001 ip from any to any out xmit em1",
        f"pipe 10002 config bw 1Mbit/s delay {one_way} queue 60000bytes",
        "add 10002 pipe 10002 ip from any to any out xmit em2",
    ]
    for command in rules:
        if command.startswith("pipe "):
            words = pipe_words(command)
            # bw: integer + K|M|G + bit/s; K, M are 10^3, 10^6 (dummynet.c read_bandwidth).
            number, unit = re.fullmatch(r"(\d+)([KMG]?)bit/s", words["bw"]).groups()
            assert int(number) * {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}[unit] == 1_000_000
            # delay: whole milliseconds below 10 000.
            assert words["delay"].isdigit() and int(words["delay"]) == rtt / 2 < 10_000
            # queue: exactly 60 000 bytes (a 'bytes' suffix; K would mean 1024).
            assert re.fullmatch(r"(\d+)bytes", words["queue"])[1] == "60000"
    assert not re.search(r"\bflush\b", "\n".join(rules))


def test_seed000_boot_and_kernel_settings(seed000):
    _, out = seed000
    loader = (out / "loader.conf").read_text().splitlines()
    # loader.conf(5) lines name="value"; kern.hz 2000 as on the paper's router; ipfw loads
    # with its default rule accepting (ipfw(8), LOADER TUNABLES), dummynet with it.
    assert sorted(loader) == sorted([
        'kern.hz="2000"', 'ipfw_load="YES"', 'dummynet_load="YES"',
        'net.inet.ip.fw.default_to_accept="1"',
    ])  # fmt: skip
    settings = json.loads((out / "settings.json").read_text())
    # rc.conf(5): firewall_type open (rc.firewall allows everything at 65000) with dummynet.
    assert settings["rc"] == {
        "firewall_enable": "YES", "firewall_type": "open", "dummynet_enable": "YES",
        "gateway_enable": "YES",
    }  # fmt: skip
    # io_fast 0: every packet waits its serialization time, as on a real link (ipfw(8)).
    assert int(settings["sysctls"]["net.inet.ip.dummynet.io_fast"]) == 0
    assert int(settings["sysctls"]["net.inet.ip.forwarding"]) == 1
    assert int(settings["sysctls"]["net.inet.ip.dummynet.pipe_byte_limit"]) >= 60_000


def test_seed000_record_names_what_teardown_removes(seed000):
    _, out = seed000
    record = json.loads((out / "delay_backend.json").read_text())
    assert record["owned"] == {
        "rules": [10000, 10001, 10002], "pipes": [10001, 10002], "scheds": [], "queues": [],
    }  # fmt: skip
    assert [entry["iface"] for entry in record["links"]] == ["em1", "em2"]
    # Drift is read back for exactly these numbers: `ipfw list N...` and `ipfw pipe show N...`
    # (ipfw(8) SYNOPSIS; `pipe N show` would take a single number).
    show = json.loads((out / "settings.json").read_text())["show"]
    assert "/sbin/ipfw list 10000 10001 10002 2>/dev/null;" in show
    assert "/sbin/ipfw pipe show 10001 10002 2>/dev/null" in show
    assert record["backend"] == "dummynet"


@pytest.fixture(scope="module")
def aqm(tmp_path_factory):
    out = tmp_path_factory.mktemp("aqm") / "router"
    links = [
        link("em1", qdisc="red"),
        {**link("em2", qdisc="gred"), "buffer": "30pkt"},
        link("em3", qdisc="pie"),
        link("em4", qdisc="fq_codel"),
        {"iface": "em5", "delay_ms": 40},  # delay alone, no rate limit
    ]
    result = run_role(out, links, ansible_host="198.19.10.2", freebsd_router_management_iface="")
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_aqm_rendered_where_the_experiment_asks(aqm):
    rules = commands((aqm / "ipfw.rules").read_text())
    # No management interface given: management traffic passes by the address Ansible uses.
    assert rules[:2] == [
        "add 10000 allow ip from any to 198.19.10.2",
        "add 10000 allow ip from 198.19.10.2 to any",
    ]
    assert rules[2:] == [
        # red: thresholds in bytes for a queue in bytes (max_th a third of it).
        "pipe 10001 config bw 1Mbit/s delay 25 queue 60000bytes red 0.002/6666/20000/0.1",
        "add 10001 pipe 10001 ip from any to any out xmit em1",
        # gred on a queue in slots: thresholds in slots.
        "pipe 10002 config bw 1Mbit/s delay 25 queue 30 gred 0.002/3/10/0.1",
        "add 10002 pipe 10002 ip from any to any out xmit em2",
        # pie last: every word after it is PIE's.
        "pipe 10003 config bw 1Mbit/s delay 25 queue 60000bytes pie noecn",
        "add 10003 pipe 10003 ip from any to any out xmit em3",
        # fq_codel is a scheduler on the pipe, fed by a queue; the rule sends to the queue.
        "pipe 10004 config bw 1Mbit/s delay 25",
        "sched 10004 config pipe 10004 type fq_codel limit 40 noecn",
        "queue 10004 config sched 10004",
        "add 10004 queue 10004 ip from any to any out xmit em4",
        "pipe 10005 config delay 40",
        "add 10005 pipe 10005 ip from any to any out xmit em5",
    ]
    for command in rules:
        if " red " in command or " gred " in command:
            w_q, min_th, max_th, max_p = command.split()[-1].split("/")
            assert 0 < float(w_q) <= 1 and 0 <= float(max_p) <= 1
            assert int(min_th) < int(max_th)  # dummynet.c refuses min_th >= max_th


def test_seed000_with_codel_on_the_pipe(tmp_path):
    """Seed 000's links (1 Mbit/s, 60 000 B, 25 ms one way) with dummynet's plain CoDel."""
    out = tmp_path / "router"
    result = run_role(out, [link("em1", qdisc="codel"), link("em2", qdisc="codel")],
                      freebsd_router_management_iface="em0")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rules = commands((out / "ipfw.rules").read_text())
    # ipfw(8) "CONFIGURING CODEL, PIE, FQ-CODEL and FQ-PIE AQM": `ipfw pipe 1 config bw
    # 1mbits/s codel` (codel on the pipe itself, no sched or queue object); "TRAFFIC SHAPER
    # (DUMMYNET) CONFIGURATION": `codel [target time] [interval time] [ecn | noecn]`, and
    # "any token after codel is considered a parameter for CoDel": so it comes last, after
    # bw, delay and queue. target and interval stay at their defaults (5 ms, 100 ms).
    assert rules == [
        "add 10000 allow ip from any to any via em0",
        "pipe 10001 config bw 1Mbit/s delay 25 queue 60000bytes codel noecn",
        "add 10001 pipe 10001 ip from any to any out xmit em1",
        "pipe 10002 config bw 1Mbit/s delay 25 queue 60000bytes codel noecn",
        "add 10002 pipe 10002 ip from any to any out xmit em2",
    ]
    for command in rules:
        if command.startswith("pipe "):
            words = command.split()
            after = words[words.index("codel") + 1 :]
            assert after == ["noecn"]  # CoDel's own words only, ECN off (its default too)
            assert pipe_words(command.split(" codel")[0])["queue"] == "60000bytes"
    # A queue management on the pipe, not a scheduler: teardown removes rules and pipes only.
    record = json.loads((out / "delay_backend.json").read_text())
    assert record["owned"] == {
        "rules": [10000, 10001, 10002], "pipes": [10001, 10002], "scheds": [], "queues": [],
    }  # fmt: skip


def test_teardown_removes_exactly_its_own_rules_and_pipes(aqm):
    # Teardown gets no links: it reads the record the render left.
    result = run_role(aqm, [], step="removal")
    assert result.returncode == 0, result.stdout + result.stderr
    script = (aqm / "ipfw-remove.sh").read_text()
    lines = [line.strip() for line in script.splitlines() if line.strip().startswith("for n in")]
    assert lines == [
        "for n in 10000 10001 10002 10003 10004 10005; do",  # rules first: none sends to a pipe
        "for n in 10004; do",  # the fq_codel queue
        "for n in 10001 10002 10003 10004 10005; do",  # pipes
        "for n in 10004; do",  # the fq_codel scheduler
    ]
    body = [line.strip() for line in script.splitlines() if line.strip().startswith('"$ipfw"')]
    assert body == [
        '"$ipfw" delete "$n" 2>/dev/null && echo "removed rule $n"',
        '"$ipfw" queue delete "$n" 2>/dev/null && echo "removed queue $n"',
        '"$ipfw" pipe delete "$n" 2>/dev/null && echo "removed pipe $n"',
        '"$ipfw" sched delete "$n" 2>/dev/null && echo "removed sched $n"',
    ]
    assert "flush" not in script.replace("`ipfw flush`", "")
    sh = subprocess.run(["sh", "-n", str(aqm / "ipfw-remove.sh")], capture_output=True, check=False)
    assert sh.returncode == 0, sh.stderr


def test_bad_links_refused_naming_the_key(tmp_path):
    result = run_role(
        tmp_path / "router",
        [
            link("em1", qdisc="cake"),
            link("em2", delay_ms=25.5),
            {**link("em3"), "rate": "1mbps"},
            link("em9"),
            # rio's checks, as on a Linux router (core/rio.py), and dummynet's w_q in 16 bits
            link("em4", qdisc="rio", rio={"in": {"min": 30}}),  # max 90 packets > 40 slots
            link("em5", qdisc="rio", rio={"out": {"w_q": 0.00001}}),
        ],
    )
    assert result.returncode != 0
    out = result.stdout
    assert "qdisc 'cake': dummynet has droptail, red, gred, rio, fq_codel, pie, codel" in out
    assert "delay_ms 25.5: dummynet delays by whole milliseconds" in out
    assert "rate: '1mbps' is not a rate" in out
    assert "iface 'em9' is not an experiment interface of this host" in out
    assert "rio.in.max: 90 packets (135000 B at mean_packet 1500B) do not fit" in out
    assert "rio.out.w_q 1e-05: dummynet keeps w_q in 16 bits" in out
    assert not (tmp_path / "router" / "ipfw.rules").exists()  # nothing rendered


# Seed 004 (experiments/diffserv.yml): 6 Mbit/s, 62 ms, a queue of 1000 packets, RIO with the
# paper's thresholds in packets (IN min 9, max 3 x min, Pmax 0.1; OUT 2/6, 0.2; w_q 0.0012)
# and IN = AF11, AF21, AF31, AF41 (core/rio.py). Both directions of the bottleneck.
SEED004_RIO = {"mean_packet": "1500B", "in": {"min": 9}, "out": {"min": 2}}


def seed004(iface: str) -> dict:
    return {"iface": iface, "rate": "6mbit", "buffer": "1000pkt", "delay_ms": 62,
            "qdisc": "rio", "rio": SEED004_RIO}  # fmt: skip


@pytest.fixture(scope="module")
def rio_router(tmp_path_factory):
    out = tmp_path_factory.mktemp("seed004") / "router"
    result = run_role(out, [seed004("em1"), seed004("em2")], freebsd_router_management_iface="em0")
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_seed004_rio_as_two_red_queues_on_one_pipe(rio_router):
    rules = commands((rio_router / "ipfw.rules").read_text())
    # ipfw(8), PIPE, QUEUE AND SCHEDULER CONFIGURATION: the pipe is the link (bw, delay); each
    # queue is attached to it (`queue N config pipe P`), with its weight (1..100), its size
    # and `red w_q/min_th/max_th/max_p`, thresholds "in slots" since the queue is in slots:
    # the paper's packets as they are. IN queue base+i, OUT queue base+N+i (N = 2 links);
    # RULE OPTIONS `dscp af11,...` feeds IN, the rule after it (same number, "processed in
    # order of insertion") with `not dscp` the rest of the direction to OUT.
    assert rules == [
        "add 10000 allow ip from any to any via em0",  # management first, as for any link
        "pipe 10001 config bw 6Mbit/s delay 62",
        "queue 10001 config pipe 10001 weight 1 queue 1000 red 0.0012/9/27/0.1",
        "queue 10003 config pipe 10001 weight 1 queue 1000 red 0.0012/2/6/0.2",
        "add 10001 queue 10001 ip from any to any dscp af11,af21,af31,af41 out xmit em1",
        "add 10001 queue 10003 ip from any to any not dscp af11,af21,af31,af41 out xmit em1",
        "pipe 10002 config bw 6Mbit/s delay 62",
        "queue 10002 config pipe 10002 weight 1 queue 1000 red 0.0012/9/27/0.1",
        "queue 10004 config pipe 10002 weight 1 queue 1000 red 0.0012/2/6/0.2",
        "add 10002 queue 10002 ip from any to any dscp af11,af21,af31,af41 out xmit em2",
        "add 10002 queue 10004 ip from any to any not dscp af11,af21,af31,af41 out xmit em2",
    ]
    for command in rules:
        if " red " in command:
            w_q, min_th, max_th, max_p = command.split()[-1].split("/")
            # dummynet.c: 0 < w_q <= 1, 0 <= max_p <= 1, min_th < max_th; w_q in 16 bits
            assert 0 < float(w_q) <= 1 and 0 <= float(max_p) <= 1
            assert int(min_th) < int(max_th) <= 1000  # within the queue's slots
            assert int(float(w_q) * 2**16) > 0
    # The queue of 1000 slots passes ipfw's check (pipe_slot_limit, default 100).
    settings = json.loads((rio_router / "settings.json").read_text())
    assert int(settings["sysctls"]["net.inet.ip.dummynet.pipe_slot_limit"]) >= 1000
    # The approximation is said where the ruleset is read.
    text = (rio_router / "ipfw.rules").read_text()
    assert "# RIO approximated: queue 10001 IN (af11,af21,af31,af41, RED 0.0012/9/27/0.1)" in text


def test_seed004_rio_recorded_as_an_approximation_and_removed(rio_router):
    record = json.loads((rio_router / "delay_backend.json").read_text())
    assert record["owned"] == {
        "rules": [10000, 10001, 10002], "pipes": [10001, 10002], "scheds": [],
        "queues": [10001, 10002, 10003, 10004],
    }  # fmt: skip
    # trial.json carries this record (TrialRunner.delay_backends); the report shows `position`.
    label = "approximated by two dummynet RED queues (IN, OUT) on one pipe"
    assert set(record["rio"]) == {"em1", "em2"}
    em1 = record["rio"]["em1"]
    assert em1["rio"] == label
    assert (em1["pipe"], em1["queues"], em1["queue_slots"]) == (
        10001,
        {"in": 10001, "out": 10003},
        1000,
    )
    assert em1["in_dscp"] == [10, 18, 26, 34]
    assert (em1["in"]["min_slots"], em1["in"]["max_slots"], em1["in"]["pmax"]) == (9, 27, 0.1)
    assert (em1["out"]["min_slots"], em1["out"]["max_slots"], em1["out"]["pmax"]) == (2, 6, 0.2)
    assert em1["in"]["w_q_effective"] == 78 / 2**16  # (int)(0.0012 * 2^16), dummynet.c
    assert any("own average" in d for d in em1["differences"])
    assert any("WF2Q+" in d for d in em1["differences"])
    assert f"qdisc rio on em1, em2 {label}, not RIO itself" in record["position"]
    # Teardown (no links given, from the record): the queues go after the rules, before the
    # pipes, and nothing else.
    result = run_role(rio_router, [], step="removal")
    assert result.returncode == 0, result.stdout + result.stderr
    script = (rio_router / "ipfw-remove.sh").read_text()
    lines = [line.strip() for line in script.splitlines() if line.strip().startswith("for n in")]
    assert lines == [
        "for n in 10000 10001 10002; do",  # rules (both of each link's share its number)
        "for n in 10001 10002 10003 10004; do",  # queues: IN and OUT of each direction
        "for n in 10001 10002; do",  # pipes
    ]
    assert '"$ipfw" queue delete "$n"' in script


def test_rio_beside_other_links_and_a_buffer_in_bytes(tmp_path):
    out = tmp_path / "router"
    links = [
        link("em1"),
        # A buffer in bytes: dummynet would read RED's thresholds in bytes in a queue of bytes
        # (ipfw(8), `red`), so the queues are in slots, the buffer in whole mean packets.
        {**link("em2", qdisc="rio"), "rio": {"mean_packet": "1000B", "in_dscp": ["ef", 12]}},
        link("em3", qdisc="fq_codel"),
    ]
    result = run_role(out, links, freebsd_router_management_iface="em0")
    assert result.returncode == 0, result.stdout + result.stderr
    rules = commands((out / "ipfw.rules").read_text())
    assert rules[3:8] == [
        "pipe 10002 config bw 1Mbit/s delay 25",
        # 60 000 B / 1000 B = 60 slots; OUT's queue is base + N + i = 10000 + 3 + 2
        "queue 10002 config pipe 10002 weight 1 queue 60 red 0.0012/9/27/0.1",
        "queue 10005 config pipe 10002 weight 1 queue 60 red 0.0012/2/6/0.2",
        "add 10002 queue 10002 ip from any to any dscp ef,af12 out xmit em2",
        "add 10002 queue 10005 ip from any to any not dscp ef,af12 out xmit em2",
    ]
    record = json.loads((out / "delay_backend.json").read_text())
    assert record["owned"]["queues"] == [10002, 10003, 10005]  # rio IN, fq_codel, rio OUT
    assert record["owned"]["scheds"] == [10003]
    assert list(record["rio"]) == ["em2"]


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"freebsd_router_management_iface": ""}, "the management address 'localhost' "
         "(freebsd_router_management_address, else ansible_host) is not an IP address"),
        ({"ansible_host": "router.lab", "freebsd_router_management_iface": ""},
         "the management address 'router.lab'"),
        ({"freebsd_router_management_iface": "em1"}, "freebsd_router_management_iface is em1, "
         "an experiment interface (trialbed_interfaces)"),
        ({"freebsd_router_management_iface": "em0 any"}, "freebsd_router_management_iface is "
         "'em0 any'; allowed: a letter, then up to 14 letters"),
    ],
)  # fmt: skip
def test_a_management_rule_ipfw_would_refuse_is_refused_before_rendering(tmp_path, settings, said):
    """Without a management interface the rule names the address Ansible uses (ansible_host,
    else the inventory name): ipfw resolves a name on the router when the ruleset loads and
    refuses the ruleset when it cannot, cutting no session but applying nothing. Refused
    before any file is written, naming the variables."""
    out = tmp_path / "router"
    result = run_role(out, [link("em1"), link("em2")], **settings)
    assert result.returncode != 0
    message = " ".join(result.stdout.split())
    assert f"freebsd_router on localhost: {said}" in message, message[-2000:]
    assert not (out / "ipfw.rules").exists()


def test_playbooks_using_the_role_pass_the_syntax_check(tmp_path):
    inventory = tmp_path / "hosts.yml"
    routers = {"freebsd_routers": {"hosts": {"R": {}}}}
    inventory.write_text(yaml.safe_dump({"all": {"children": routers}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg")}
    for playbook in ("configure.yml", "teardown.yml"):
        result = subprocess.run(
            [str(PROJECT / ".venv/bin/ansible-playbook"), "--syntax-check", "-i", str(inventory),
             str(PROJECT / "playbooks" / playbook)],
            cwd=PROJECT, env=env, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr


def test_second_render_changes_nothing_and_dropped_links_are_removed(tmp_path):
    out = tmp_path / "router"
    two = [link("em1"), link("em2", qdisc="fq_codel")]
    first = run_role(out, two)
    assert first.returncode == 0, first.stdout + first.stderr
    again = run_role(out, two)
    assert again.returncode == 0 and re.search(r"localhost\s+: ok=\d+\s+changed=0 ", again.stdout)
    # The next trial has one link: the removal script the handler runs before applying the new
    # ruleset still removes the dropped link's rule, pipe, queue and scheduler.
    one = run_role(out, [link("em1")])
    assert one.returncode == 0, one.stdout + one.stderr
    script = (out / "ipfw-remove.sh").read_text()
    assert "for n in 10000 10001 10002; do" in script  # rules
    assert "for n in 10001 10002; do" in script  # pipes
    assert script.count("for n in 10002; do") == 2  # the fq_codel queue and scheduler
    assert commands((out / "ipfw.rules").read_text())[-2:] == [
        "pipe 10001 config bw 1Mbit/s delay 25 queue 60000bytes",
        "add 10001 pipe 10001 ip from any to any out xmit em1",
    ]
