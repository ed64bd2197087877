"""Role linux_router with RIO as the BPF program (linux_router_rio_implementation bpf, what
auto chooses on a kernel without GRED): the shaping it renders (HTB + bfifo, the clsact the
program attaches to), the attach script (the loader with the link's parameters, each one word),
its record, and the shaping switch re-applying when only the program's thresholds change.
Rendered here with the role's own templates and filters; nothing is attached (no rack)."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
from pathlib import Path

import jinja2
import yaml

from core import rio_bpf

PROJECT = Path(__file__).resolve().parents[2]
ROLE = PROJECT / "roles/linux_router"
LINK = {
    "iface": "core x",  # a space: each value must reach the loader as one word
    "rate": "6mbit",
    "buffer": "90kB",
    "delay_ms": 0,
    "qdisc": "rio",
    "rio": {"in": {"min": 13}},
}
HOSTSIDE = "/opt/t/hostside"
OBJECT = "/var/lib/t/router/rio-bpf/abc.bpf.o"


def _plugin(name: str) -> dict:
    path = PROJECT / "playbooks/filter_plugins" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.FilterModule().filters()


def env() -> jinja2.Environment:
    e = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined
    )
    for plugin in ("trialbed_units", "trialbed_rio", "trialbed_link_rules"):
        e.filters.update(_plugin(plugin))
    e.filters["quote"] = lambda v: shlex.quote(str(v))  # Ansible's
    e.filters["bool"] = bool
    return e


def render(template: str, links: list[dict], impl: str = "bpf", **extra: object) -> str:
    given = {
        "linux_router_links": links,
        "linux_router_links_choices": [],
        "__linux_router_backend": "nfqueue",
        "__linux_router_rio_impl": impl,
        "__linux_router_rio_bpf_dir": f"{HOSTSIDE}/bpf_tc/rio",
        "__linux_router_rio_bpf_object": OBJECT,
        "linux_router_htb_burst": "1600b",
        "linux_router_dir": "/var/lib/t/router",
        "ansible_managed": "managed",
        "inventory_hostname": "R",
    }
    return env().get_template(template).render(**(given | extra))


def commands(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_shaping_is_htb_and_bfifo_with_the_clsact_the_program_attaches_to():
    text = render("shaping.tc.j2", [LINK])
    assert commands(text) == [
        "qdisc add dev core x root handle 1: htb default 10",
        "class add dev core x parent 1: classid 1:10 htb rate 6mbit ceil 6mbit "
        "burst 1600b cburst 1600b",
        "qdisc add dev core x parent 1:10 handle 10: bfifo limit 90000",
        "qdisc add dev core x clsact",
    ]
    # the parameters are written in it: new thresholds change the file (the switch applies it)
    assert f"in_min={13 * 1500}" in text
    assert render("shaping.tc.j2", [{**LINK, "rio": {"in": {"min": 9}}}]) != text
    # GRED's construction where the kernel has it: no bfifo, its VQs and DSCP filters
    gred = commands(render("shaping.tc.j2", [LINK], impl="gred"))
    assert "gred setup" in gred[2] and any("flower" in c for c in gred)


def test_attach_script_hands_the_loader_each_parameter_as_one_word(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    script = tmp_path / "rio-attach"
    links = [LINK, {**LINK, "iface": "b", "qdisc": "droptail"}]
    script.write_text(render("rio-attach.j2", links, linux_router_dir=str(out)))
    assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    path = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["sh", str(script)], env=path, check=True)
    args = (out / "rio_bpf.core x.json").read_text().splitlines()  # one attach: the rio link
    params = rio_bpf.from_link(LINK).program_params()
    assert args == [
        f"{HOSTSIDE}/bpf_tc/rio/trialbed_rio.py",
        "attach",
        "core x",
        OBJECT,
        *(f"{k}={v}" for k, v in params.items()),
    ]
    assert not (out / "rio_bpf.b.json").exists()
    # with GRED, nothing to attach
    assert commands(render("rio-attach.j2", [LINK], impl="gred")) == ["set -eu"]


def test_record_says_which_implementation_ran_and_with_what():
    record = _plugin("trialbed_rio")["trialbed_rio_bpf_record"]([LINK], "f00d")
    entry = record["core x"]
    assert (entry["implementation"], entry["source"], entry["source_sha256"]) == (
        "bpf",
        "hostside/bpf_tc/rio/rio.bpf.c",
        "f00d",
    )
    assert entry["params"]["in_min"] == 13 * 1500
    assert entry["levels"]["in"]["w_q"] == rio_bpf.fixed_wq(0.0012) / 2**rio_bpf.W_SHIFT


def test_switch_reapplies_when_only_the_thresholds_change(tmp_path):
    """trialbed-select-shaping takes a choice's rio-attach as it takes its shaping.tc: the
    live one is replaced and the shaping applied (the program attached again) when it
    differs; a second switch to the same choice changes nothing."""
    role_vars = yaml.safe_load((ROLE / "vars/main.yml").read_text())
    live = tmp_path / "router"
    choice = live / "choices/0"
    choice.mkdir(parents=True)
    e = env()
    given = {"linux_router_links": [LINK], "linux_router_dir": str(live)}
    show = e.from_string(role_vars["__linux_router_tc_show"]).render(**given)
    apply = e.from_string(role_vars["__linux_router_apply_shaping"]).render(
        __linux_router_tc_show=show, **given
    )
    switch = live / "trialbed-select-shaping"
    switch.write_text(
        render(
            "trialbed-select-shaping.j2",
            [LINK],
            linux_router_dir=str(live),
            linux_router_links_choices=[[LINK]],
            __linux_router_apply_shaping=apply,
            __linux_router_uses_nfqueue=False,
        )
    )
    for name, text in (("shaping.tc", "same\n"), ("delay_backend.json", "{}\n")):
        (live / name).write_text(text)
        (choice / name).write_text(text)
    (live / "rio-attach").write_text("echo old >> attached\n")
    (choice / "rio-attach").write_text(f"echo new >> {live}/attached\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tc").write_text(f'#!/bin/sh\necho "$*" >> {live}/tc.log\n')
    (bin_dir / "tc").chmod(0o755)
    path = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["sh", str(switch), "0"], env=path, check=True, cwd=tmp_path)
    assert (live / "attached").read_text() == "new\n"
    assert f"-batch {live}/shaping.tc" in (live / "tc.log").read_text()
    subprocess.run(["sh", str(switch), "0"], env=path, check=True, cwd=tmp_path)
    assert (live / "attached").read_text() == "new\n"  # unchanged: not applied again


def test_trial_record_takes_the_bpf_rio_s_counters_and_says_it_ran(tmp_path):
    """A Linux router that ran the BPF RIO: the runner's snapshots call its loader's `show`
    per rio egress; trial.json's rio record says implementation bpf, with the router's record
    of it (source, sha256) and its counters per level in GRED's names; the seed-004 summary
    labels them, and the provenance column names the implementation."""
    from types import SimpleNamespace

    from analysis.dataset import provenance
    from analysis.families import diffserv
    from tests.unit.spec_files import write
    from tests.unit.test_rio import EXPERIMENT, FakeRack
    from trials import host_commands
    from trials import record as trial_record
    from trials.network import resolve_network
    from trials.plan import load_plan

    trial = load_plan(write(tmp_path, EXPERIMENT)).trials[0]
    net = resolve_network(trial.experiment, FakeRack("namespaces", set()), "exp.yml")  # type: ignore[arg-type]
    (e,) = [e for e in net.egress if e.shaping.qdisc == "rio"]
    daemons = SimpleNamespace(remote={h: f"/w/{h}" for h in net.hosts})
    snapshot = host_commands.snapshot_commands(net, daemons, "after")[e.host]  # type: ignore[arg-type]
    workdir = net.hosts[e.host].workdir  # the shipped programs are under it (remote_dir)
    assert (
        f"; python3 {workdir}/hostside/{rio_bpf.LOADER} show {e.iface} "
        f"> /w/{e.host}/rio_bpf_{e.iface}_after.json 2> /dev/null; "
    ) in snapshot
    link = {"iface": e.iface, "rate": "1500kbit", "buffer": "60kB", "qdisc": "rio", "rio": {}}
    delay = {
        e.host: {
            "backend": "nfqueue",
            "rio_implementation": "bpf",
            "rio_bpf": _plugin("trialbed_rio")["trialbed_rio_bpf_record"]([link], "f00d"),
        }
    }
    host = tmp_path / e.host
    host.mkdir()
    params = rio_bpf.from_link(link).program_params()

    def shown(packets: list[int], early: list[int]) -> dict:
        zero = [0, 0, 0]
        stats = {"packets": packets, "bytes": [p * 1500 for p in packets], "early": early}
        stats |= {"forced": [0, 3, 0], "limit": zero, "ring_full": zero}
        sub = [{"avg": 3000 << rio_bpf.AVG_SHIFT}, {"avg": 4500 << rio_bpf.AVG_SHIFT}, {"avg": 0}]
        state = {"sub": sub, "last": {"queue": [3000, 4500, 0]}}
        return {"iface": e.iface, "prog_id": 42, "params": params, "stats": stats, "state": state}

    for tag, text in (
        ("before", shown([10, 20, 0], [0, 1, 0])),
        ("after", shown([2781, 374, 0], [0, 36, 0])),
    ):
        (host / f"rio_bpf_{e.iface}_{tag}.json").write_text(json.dumps(text))
    entry = trial_record.rio_record(tmp_path, net, delay)[f"{e.host}:{e.iface}"]
    assert entry["implementation"] == "bpf" and "error" not in entry
    assert entry["bpf"]["source_sha256"] == "f00d" and entry["bpf"]["prog_id"] == 42
    assert entry["counters"]["0"]["packets"] == 2771 and entry["counters"]["0"]["drops"] == 0
    assert entry["counters"]["1"]["early_drops"] == 35 and entry["counters"]["1"]["drops"] == 35
    # the seed-004 summary reads them as GRED's and labels them
    summary = diffserv.trial_summary(
        {
            "parameters": {"duration": "10s", "warmup": "0s"},
            "rio": {f"{e.host}:{e.iface}": entry},
            "traffic": {},
        },
        {"generators": {}},
    )
    assert summary["rio_bpf"] is True and summary["drop_out"] == 35 / 354
    columns = provenance(
        {"delay": delay, "network": {"egress": [{"host": e.host, "link": e.link, "qdisc": "rio"}]}}
    )
    assert columns["qdisc_impl"] == f"{e.link}=rio:bpf (hostside/bpf_tc/rio)"
    # The bottleneck's drop count: the program's (before the qdisc) and the bfifo's own.
    from analysis.bottleneck import queue_drops_counted

    for tag, dropped in (("before", 1), ("after", 3)):
        (host / f"tc_{tag}.txt").write_text(
            f"## {e.iface}\nqdisc bfifo 10: parent 1:10 limit 60000b\n"
            f" Sent 1000 bytes 10 pkt (dropped {dropped}, overlimits 0 requeues 0)\n"
        )
    assert queue_drops_counted(host, e.iface) == 35 + (3 - 1)  # early OUT drops, bfifo tail
    # a router that ran GRED: no loader answer, GRED's listing
    gred = trial_record.rio_record(tmp_path / "none", net, {e.host: {"rio_implementation": "gred"}})
    assert gred[f"{e.host}:{e.iface}"]["implementation"] == "gred"
