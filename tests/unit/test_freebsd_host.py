"""roles/freebsd_host evaluated by Ansible itself on the controller (no FreeBSD host can run
here): only the task files that decide run (connection local, no host is read or changed),
and what they decide is checked against expectations written from the manuals of FreeBSD
13/14. Each expectation names its source:

- mod_cc(4): net.inet.tcp.cc.algorithm selects the default congestion control among those
  compiled in or loaded as kernel modules (kld(4)); cc_newreno(4) is Linux's reno.
- cc_htcp(4): net.inet.tcp.cc.htcp.adaptive_backoff and rtt_scaling (0 or 1).
- cc_cubic(4): "There are currently no tunable MIB variables."
- kldstat(8) -q -m NAME: is module NAME compiled in or loaded (exit status);
  kldload(8) cc_NAME: load the file cc_NAME.ko, which declares the module NAME.
- tcp(4): rfc1323 (2: window scaling only, FreeBSD 14), hostcache.enable, recvspace,
  recvbuf_auto, recvbuf_max, sendspace, sendbuf_auto, sendbuf_max; RACK and BBR are TCP
  stacks (TCP_FUNCTION_BLK), not mod_cc algorithms.
- sysctl(8): -i skips unknown names, -e prints name=value.
- siftr(4): a FreeBSD sender's cwnd is recorded by SIFTR (the runner, not this role).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.rack import Rack
from trials.network import host_settings, resolve_network
from trials.plan import load_plan
from trials.runner import host_vars

PROJECT = Path(__file__).resolve().parents[2]
LAB = PROJECT / "inventory/lab.example/hosts.yml"
EXPERIMENT = PROJECT / "experiments/collateral_damage.yml"
PLAYBOOK = """
- name: Decide a FreeBSD end host's settings on the controller
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Check the inputs and refuse what FreeBSD cannot do
      ansible.builtin.include_role: {name: freebsd_host, tasks_from: validate, public: true}
      when: step == 'decide'
    - name: Keep what the role would apply
      ansible.builtin.copy:
        dest: "{{ freebsd_host_dir }}/decided.json"
        content: >-
          {{ {'modules': __freebsd_host_cc_modules, 'cc': __freebsd_host_cc_sysctls,
              'tcp': __freebsd_host_tcp_sysctls, 'read': __freebsd_host_managed_sysctls,
              'mtu': __freebsd_host_mtu_want} | to_json }}
        mode: "0644"
      when: step == 'decide'
    - name: Record the host's own settings from the reads given
      ansible.builtin.include_role: {name: freebsd_host, tasks_from: record}
      when: step == 'record'
    - name: Give back what the record names (teardown)
      ansible.builtin.include_role: {name: freebsd_host, tasks_from: absent}
      when: step == 'absent'
"""
# What the runner sets for an end host by default (trials/runner.py TCP_RMEM, TCP_WMEM).
RUNNER_SYSCTLS = {
    "net.ipv4.tcp_no_metrics_save": 1,
    "net.ipv4.tcp_rmem": "4096 131072 6291456",
    "net.ipv4.tcp_wmem": "4096 16384 4194304",
}


def env() -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",  # messages on one line
    }


def run_role(out: Path, step: str = "decide", **variables) -> subprocess.CompletedProcess:
    """ansible-playbook against localhost with the variables as the runner names them
    (testbed_host_*: the role reads the Linux end host's contract)."""
    out.mkdir(parents=True, exist_ok=True)
    play = out.parent / "play.yml"
    play.write_text(PLAYBOOK)
    given = {
        "step": step,
        "freebsd_host_dir": str(out),
        "trialbed_interfaces": {"em1": {"address": "198.18.1.11/24"}},
        "ansible_python_interpreter": sys.executable,
        **variables,
    }
    (out.parent / "vars.json").write_text(json.dumps(given))
    return subprocess.run(
        [str(PROJECT / ".venv/bin/ansible-playbook"), "-i", "localhost,", str(play),
         "-e", f"@{out.parent / 'vars.json'}"],
        cwd=PROJECT, env=env(), capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip


def decide(tmp_path: Path, **variables) -> dict:
    result = run_role(tmp_path / "host", **variables)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((tmp_path / "host" / "decided.json").read_text())


def refused(tmp_path: Path, **variables) -> str:
    """The refusal's output; nothing may have been decided."""
    result = run_role(tmp_path / "host", **variables)
    assert result.returncode != 0, result.stdout
    assert not (tmp_path / "host" / "decided.json").exists()
    return result.stdout


@pytest.mark.parametrize(
    ("linux", "freebsd"), [("reno", "newreno"), ("cubic", "cubic"), ("htcp", "htcp")]
)
def test_congestion_control_by_its_freebsd_name(tmp_path, linux, freebsd):
    decided = decide(tmp_path, testbed_host_cc=linux)
    # mod_cc(4): the default is selected by name; the module of that name is looked for with
    # `kldstat -q -m NAME` and loaded from cc_NAME.ko (kldstat(8), kldload(8)).
    assert decided["cc"] == {"net.inet.tcp.cc.algorithm": freebsd}
    assert decided["modules"] == [freebsd]
    assert "net.inet.tcp.cc.algorithm" in decided["read"]  # recorded before it changes


def test_flows_congestion_controls_are_loaded_too(tmp_path):
    decided = decide(tmp_path, testbed_host_cc="reno", trialbed_flow_cc=["htcp", "cubic"])
    assert decided["modules"] == ["newreno", "htcp", "cubic"]
    assert decided["cc"] == {"net.inet.tcp.cc.algorithm": "newreno"}


def test_htcp_parameters_as_cc_htcp_variables(tmp_path):
    # The collateral-damage paper's H-TCP (experiments/collateral_damage.yml cc_params).
    decided = decide(
        tmp_path,
        testbed_host_cc="htcp",
        testbed_host_cc_params={"use_bandwidth_switch": 0, "use_rtt_scaling": 1},
    )
    # cc_htcp(4), MIB Variables: adaptive_backoff, rtt_scaling under net.inet.tcp.cc.htcp.
    assert decided["cc"] == {
        "net.inet.tcp.cc.algorithm": "htcp",
        "net.inet.tcp.cc.htcp.adaptive_backoff": 0,
        "net.inet.tcp.cc.htcp.rtt_scaling": 1,
    }
    # Read after the module is loaded (they exist only then) and before they are set.
    assert {"net.inet.tcp.cc.htcp.adaptive_backoff", "net.inet.tcp.cc.htcp.rtt_scaling"} <= set(
        decided["read"]
    )


def test_runner_sysctls_as_tcp4_variables(tmp_path):
    decided = decide(
        tmp_path, testbed_host_sysctls={**RUNNER_SYSCTLS, "net.ipv4.tcp_timestamps": 0},
        __freebsd_host_release="14",
    )  # fmt: skip
    largest = 6291456
    assert decided["tcp"] == {
        # tcp(4) hostcache.enable 0: no connection's metrics are kept for the next one.
        "net.inet.tcp.hostcache.enable": 0,
        # tcp(4) rfc1323 2: window scaling without timestamps (Linux keeps window scaling).
        "net.inet.tcp.rfc1323": 2,
        # tcp(4): recvspace/sendspace the initial buffer (Linux's default), *buf_max the
        # largest automatic size (Linux's max), *buf_auto automatic sizing on.
        "net.inet.tcp.recvspace": 131072,
        "net.inet.tcp.recvbuf_auto": 1,
        "net.inet.tcp.recvbuf_max": largest,
        "net.inet.tcp.sendspace": 16384,
        "net.inet.tcp.sendbuf_auto": 1,
        "net.inet.tcp.sendbuf_max": 4194304,
        # Above the default cap (2 MiB): sbreserve allows maxsockbuf * 2048 / (256 + 2048).
        "kern.ipc.maxsockbuf": math.ceil(largest * (256 + 2048) / 2048),
    }
    assert decided["tcp"]["kern.ipc.maxsockbuf"] * 2048 // (256 + 2048) >= largest
    # Applied in this order: the cap is raised before any buffer size needs it.
    order = list(decided["tcp"])
    assert order.index("kern.ipc.maxsockbuf") < order.index("net.inet.tcp.recvspace")
    assert set(decided["tcp"]) <= set(decided["read"])
    assert decided["mtu"] == {"em1": 1500}


def test_timestamps_on_and_metrics_kept(tmp_path):
    decided = decide(
        tmp_path,
        testbed_host_sysctls={"net.ipv4.tcp_no_metrics_save": 0, "net.ipv4.tcp_timestamps": 1},
    )
    assert decided["tcp"] == {"net.inet.tcp.hostcache.enable": 1, "net.inet.tcp.rfc1323": 1}


def test_socket_buffer_cap_is_never_lowered(tmp_path):
    # Small buffers (rcvbuf 60000B): the host's own cap (2 MiB by default) already admits them.
    decided = decide(
        tmp_path,
        testbed_host_sysctls={
            "net.ipv4.tcp_rmem": "4096 60000 60000",
            "net.ipv4.tcp_wmem": "4096 16384 60000",
        },
    )
    assert "kern.ipc.maxsockbuf" not in decided["tcp"]
    assert decided["tcp"]["net.inet.tcp.recvbuf_max"] == 60000
    assert "kern.ipc.maxsockbuf" in decided["read"]  # recorded whatever is decided


def test_bbr_refused_as_freebsd_has_no_bbr_module(tmp_path):
    out = refused(tmp_path, testbed_host_cc="bbr")
    assert (
        "localhost (a FreeBSD end host): testbed_host_cc 'bbr': FreeBSD has no BBR congestion "
        "control module (its RACK and BBR are TCP stacks" in out
    )
    assert "allowed: reno, cubic, htcp" in out


def test_unknown_congestion_controls_refused(tmp_path):
    out = refused(tmp_path, testbed_host_cc="vegas", trialbed_flow_cc=["reno", "bbr"])
    assert "testbed_host_cc 'vegas' has no FreeBSD congestion control module here" in out
    # iperf3 -C hands the name to TCP_CONGESTION as it is: 'reno' would fail on FreeBSD.
    assert "trialbed_flow_cc: a flow from or to this host asks for cc reno" in out
    assert "trialbed_flow_cc 'bbr': FreeBSD has no BBR congestion control module" in out


def test_module_parameters_refused_naming_the_key(tmp_path):
    out = refused(
        tmp_path, testbed_host_cc="htcp",
        testbed_host_cc_params={"use_rtt_scaling": 2, "alpha": 1},
    )  # fmt: skip
    assert "testbed_host_cc_params key 'alpha' has no FreeBSD counterpart (cc_htcp(4)); " in out
    assert "allowed: use_bandwidth_switch (net.inet.tcp.cc.htcp.adaptive_backoff), " in out
    assert "testbed_host_cc_params.use_rtt_scaling = 2: 0 or 1" in out
    # cc_cubic(4): no tunable MIB variables.
    out = refused(tmp_path, testbed_host_cc="cubic", testbed_host_cc_params={"beta": 717})
    assert "testbed_host_cc_params ['beta'] for cubic: only htcp's parameters map" in out


def test_sysctls_without_counterpart_refused_naming_the_key(tmp_path):
    out = refused(
        tmp_path,
        testbed_host_sysctls={
            **RUNNER_SYSCTLS,
            "net.ipv4.tcp_sack": 0,
            "net.ipv4.tcp_wmem": "4096 16384",
        },
    )
    assert "testbed_host_sysctls key 'net.ipv4.tcp_sack' has no FreeBSD counterpart here; " in out
    assert "mapped are: net.ipv4.tcp_no_metrics_save, net.ipv4.tcp_rmem, net.ipv4.tcp_wmem, " in out
    assert "testbed_host_sysctls net.ipv4.tcp_wmem = '4096 16384': three byte counts" in out


def test_timestamps_off_refused_where_rfc1323_is_on_or_off(tmp_path):
    # tcp(4) of FreeBSD 13: rfc1323 turns window scaling and timestamps on or off together.
    out = refused(
        tmp_path, testbed_host_sysctls={"net.ipv4.tcp_timestamps": 0}, __freebsd_host_release="13"
    )
    assert "net.ipv4.tcp_timestamps = 0 on FreeBSD 13: its net.inet.tcp.rfc1323 turns" in out


def test_what_is_not_built_for_freebsd_is_refused(tmp_path):
    out = refused(
        tmp_path,
        testbed_host_pacing_interfaces=["em1"],
        testbed_host_route_metrics={"initcwnd": 3},
        testbed_host_mtu={"em9": 9000},
        linux_router_links=[{"iface": "em1", "rate": "1mbit", "buffer": "60000B"}],
        dscp_marker_rules=[{"name": "x", "dscp": "ef"}],
    )
    assert "testbed_host_pacing_interfaces ['em1']: fq pacing is not built for FreeBSD" in out
    assert "testbed_host_route_metrics {'initcwnd': 3}: per-route TCP metrics" in out
    assert "testbed_host_mtu.em9 = 9000: an MTU is an integer from 68 to 65535 on one of" in out
    assert "linux_router_links [{" in out and "a shaped access link is not built" in out
    assert "dscp_marker_rules [{" in out and "FreeBSD has not" in out


SYSCTL_READ = [  # `sysctl -i -e ...` on the host before the first change (sysctl(8) -e)
    "net.inet.tcp.cc.algorithm=cubic",
    "net.inet.tcp.hostcache.enable=1",
    "kern.ipc.maxsockbuf=2097152",
]
IFCONFIG = (  # `ifconfig em1` (ifconfig(8)): mtu on the first line, options= what is on
    "em1: flags=8843<UP,BROADCAST,RUNNING,SIMPLEX,MULTICAST> metric 0 mtu 1500\n"
    "\toptions=481249b<RXCSUM,TXCSUM,VLAN_MTU,VLAN_HWTAGGING,VLAN_HWCSUM,LRO,WOL_MAGIC,"
    "VLAN_HWFILTER,TSO4>\n\tinet 198.18.1.11 netmask 0xffffff00 broadcast 198.18.1.255\n"
)


def record(out: Path, sysctls: list[str], ifconfig: str) -> dict:
    result = run_role(
        out, step="record",
        __freebsd_host_sysctls_read={"stdout_lines": sysctls},
        __freebsd_host_ifconfig={"results": [{"item": "em1", "stdout": ifconfig}]},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "baseline.json").read_text())


def test_record_keeps_the_hosts_own_values(tmp_path):
    out = tmp_path / "host"
    first = record(out, SYSCTL_READ, IFCONFIG)
    assert first == {
        "sysctls": {
            "net.inet.tcp.cc.algorithm": "cubic",
            "net.inet.tcp.hostcache.enable": "1",
            "kern.ipc.maxsockbuf": "2097152",
        },
        "interfaces": {"em1": {"mtu": 1500, "offloads": ["TSO4", "LRO"]}},
    }
    # The next trial finds the first one's settings and one the host has not had changed yet:
    # what was recorded stays the host's own, the new one is added.
    changed = ["net.inet.tcp.cc.algorithm=htcp", "net.inet.tcp.hostcache.enable=0",
               "kern.ipc.maxsockbuf=7077888", "net.inet.tcp.rfc1323=1"]  # fmt: skip
    second = record(out, changed, IFCONFIG.replace("mtu 1500", "mtu 9000").replace(",TSO4", ""))
    assert second["sysctls"] == {**first["sysctls"], "net.inet.tcp.rfc1323": "1"}
    assert second["interfaces"] == first["interfaces"]


def test_teardown_without_a_record_changes_nothing(tmp_path):
    out = tmp_path / "host"
    out.mkdir()
    (out / "baseline.json").write_text(json.dumps({"sysctls": {}, "interfaces": {}}))
    first = run_role(out, step="absent")
    assert first.returncode == 0, first.stdout + first.stderr
    assert not (out / "baseline.json").exists()  # forgotten once given back
    # The second teardown finds no record: nothing to give back, nothing changed.
    second = run_role(out, step="absent")
    assert second.returncode == 0, second.stdout + second.stderr
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0 ", second.stdout), second.stdout


def lab_with_freebsd_a(tmp_path: Path) -> Path:
    """An overlay that makes the lab rack's sender A a FreeBSD end host."""
    overlay = tmp_path / "freebsd_a.yml"
    freebsd_hosts = {"freebsd_hosts": {"hosts": {"A": {}}}}
    overlay.write_text(yaml.safe_dump({"all": {"children": freebsd_hosts}}))
    return overlay


def plays(listing: str) -> dict[str, list[str]]:
    """`ansible-playbook --list-hosts` output -> play name: hosts."""
    found: dict[str, list[str]] = {}
    for line in listing.splitlines():
        play = re.match(r"\s*play #\d+ \(.*?\): (.*?)\tTAGS", line)
        if play:
            current = found.setdefault(play[1], [])
        elif line.startswith("      ") and line.strip():
            current.append(line.strip())
    return found


def list_hosts(playbook: str, *overlays: Path) -> dict[str, list[str]]:
    """The playbook's plays and their hosts on the lab rack (with the overlays)."""
    inventories = [arg for path in (LAB, *overlays) for arg in ("-i", str(path))]
    listed = subprocess.run(
        [str(PROJECT / ".venv/bin/ansible-playbook"), "--list-hosts", *inventories,
         str(PROJECT / "playbooks" / playbook)],
        cwd=PROJECT, env=env(), capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    return plays(listed)


def test_configure_gives_a_freebsd_end_host_freebsd_host_only(tmp_path):
    configure = list_hosts("configure.yml", lab_with_freebsd_a(tmp_path))
    assert configure["FreeBSD end hosts"] == ["A"]
    for linux_only in ("End hosts and routers", "Find the hosts whose links are shaped",
                       "DSCP marking"):  # fmt: skip
        assert "A" not in configure[linux_only] and "B" in configure[linux_only], linux_only
    assert "A" in configure["Capture points"]
    listed = subprocess.run(
        [str(PROJECT / ".venv/bin/ansible-playbook"), "--list-tasks", "-i", str(LAB),
         "-i", str(lab_with_freebsd_a(tmp_path)), str(PROJECT / "playbooks/configure.yml")],
        cwd=PROJECT, env=env(), capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    tasks = listed.split("play #")
    freebsd = next(p for p in tasks if "): FreeBSD end hosts" in p)
    linux = next(p for p in tasks if "): End hosts and routers" in p)
    assert "freebsd_host : Load the congestion control modules" in freebsd
    assert "testbed_host :" not in freebsd and "freebsd_host :" not in linux
    assert "testbed_host : Record the host's own settings" in linux


def test_teardown_gives_a_freebsd_end_host_back_with_freebsd_host(tmp_path):
    teardown = list_hosts("teardown.yml", lab_with_freebsd_a(tmp_path))
    assert teardown["Host settings of FreeBSD end hosts"] == ["A"]
    for linux_only in ("Host settings", "Find the hosts whose links were shaped", "DSCP marking"):
        assert "A" not in teardown[linux_only] and "B" in teardown[linux_only], linux_only
    assert "A" in teardown["Trial processes left running"]


def test_the_documented_freebsd_end_host_declaration(tmp_path):
    """inventory/lab.example/hosts.yml shows, commented out, how a FreeBSD end host is
    declared (the group freebsd_hosts under testbed_hosts): uncommented, host E is a FreeBSD
    end host for the runner (trials/network.py FREEBSD_GROUPS) and for the playbooks."""
    lines = LAB.read_text().splitlines()
    start = lines.index("      # children:")
    block = ["      children:"]
    for line in lines[start + 1 :]:
        if not line.startswith("      #   "):
            break
        block.append("      " + line.removeprefix("      # "))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("\n".join(lines[:start] + block + lines[start + len(block) :]) + "\n")
    rack = Rack.load([inventory])
    assert rack.host("E").groups == ("testbed_hosts", "freebsd_hosts")  # a member of both
    assert str(rack.host("E").interfaces["em1"]) == "198.18.1.15/24"
    listed = subprocess.run(
        [str(PROJECT / ".venv/bin/ansible-playbook"), "--list-hosts", "-i", str(inventory),
         str(PROJECT / "playbooks/configure.yml")],
        cwd=PROJECT, env=env(), capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    configure = plays(listed)
    assert configure["FreeBSD end hosts"] == ["E"]
    assert "E" not in configure["End hosts and routers"]
    assert "E" in configure["Capture points"]


def input_checks(tmp_path: Path, *overlays: Path) -> subprocess.CompletedProcess:
    """configure.yml's input-check play for A, run on this machine (connection local: the
    checks are controller-side; nothing is sent to the lab address)."""
    args = [str(PROJECT / ".venv/bin/ansible-playbook"), str(PROJECT / "playbooks/configure.yml"),
            "-i", str(LAB), "-i", str(lab_with_freebsd_a(tmp_path))]  # fmt: skip
    for overlay in overlays:
        args += ["-i", str(overlay)]
    args += ["--limit", "A", "--tags", "input_checks", "-e", "ansible_connection=local",
             "-e", f"ansible_python_interpreter={sys.executable}"]  # fmt: skip
    return subprocess.run(
        args, cwd=PROJECT, env=env(), capture_output=True, text=True, check=False, timeout=180
    )


def test_configure_checks_the_runners_variables_on_a_freebsd_sender(tmp_path):
    """Seed 000's first trial on the lab rack with A on FreeBSD: the variables the runner
    hands A pass the input checks (and the unknown-variable check), through freebsd_host."""
    rack = Rack.load([LAB, lab_with_freebsd_a(tmp_path)])
    plan = load_plan(EXPERIMENT)
    trial = plan.trials[0]
    net = resolve_network(trial.experiment, rack, str(EXPERIMENT))
    variables = host_vars(trial, net, host_settings(trial.experiment, net, str(EXPERIMENT)))
    overlay = tmp_path / "trial.yml"
    overlay.write_text(yaml.safe_dump({"all": {"hosts": {"A": variables["A"]}}}))
    good = input_checks(tmp_path, overlay)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "freebsd_host : Refuse what a FreeBSD end host cannot do" in good.stdout
    assert "testbed_host :" not in good.stdout
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump({"all": {"hosts": {"A": {
        **variables["A"], "testbed_host_cc": "bbr",
        "testbed_host_route_metrics": {"initcwnd": 10},
    }}}}))  # fmt: skip
    refused = input_checks(tmp_path, bad)
    assert refused.returncode != 0
    assert "A (a FreeBSD end host): testbed_host_cc 'bbr': FreeBSD has no BBR" in refused.stdout
    assert "testbed_host_route_metrics {'initcwnd': 10}: per-route TCP metrics" in refused.stdout
