"""The experiment's `markers:`: validation, and where each marker runs on a rack (the chain2
topology's hosts, no SSH)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from core.hostside import remote_dir
from core.rack import Rack, RackError
from tests.hostside import load
from tests.unit.render_trial import topology_hosts
from trials.adaptive_marking import marker_sites, router_python
from trials.network import resolve_network
from trials.plan import load_plan
from trials.preflight import checks
from trials.preflight.context import Context, TrialView
from trials.spec import SpecError

PROJECT = Path(__file__).resolve().parents[2]
EXPERIMENT = PROJECT / "experiments" / "web_poisson.yml"


def experiment_file(tmp_path: Path, **marker) -> Path:
    """experiments/web_poisson.yml without its factors, its marker changed by `marker`."""
    raw = yaml.safe_load(EXPERIMENT.read_text())
    raw.pop("factors")
    raw["markers"][0].update(marker)
    path = tmp_path / "exp.yml"
    path.write_text(yaml.safe_dump(raw))
    return path


def chain2_rack() -> Rack:
    hosts = topology_hosts(
        "chain2",
        workdir=lambda name: f"/srv/{name}",
        host_vars={
            "trialbed_project_dir": "/opt/tb",
            "linux_router_delayline_python": "{{ trialbed_project_dir }}/.venv/bin/python",
        },
    )
    return Rack([], hosts, {})


def test_shipped_experiment_sweeps_the_four_markers() -> None:
    plan = load_plan(EXPERIMENT)
    assert sorted({t.experiment.markers[0].marker for t in plan.trials}) == [
        "APM",
        "MPM",
        "NM",
        "WPM",
    ]


def test_marker_sites_on_the_chain(tmp_path: Path) -> None:
    exp = load_plan(experiment_file(tmp_path, af_class=2)).trials[0].experiment
    rack = chain2_rack()
    (site,) = marker_sites(exp, resolve_network(exp, rack, "x"), "x")
    assert (site.host, site.ifaces, site.queue) == ("R1", ("a1", "a2", "a3", "a4"), 100)
    shipped = remote_dir(rack.host("R1").workdir)
    command = site.marker_command(router_python(rack, "R1"), shipped)
    assert command.startswith(
        f"/opt/tb/.venv/bin/python {shipped}/markers/edge_marker.py --queue 100 --marker APM"
    )
    assert "--af-class 2 --code-points 18,20,22" in command  # AF21, AF22, AF23
    assert command.endswith("--iface a1 --iface a2 --iface a3 --iface a4")
    assert site.record()["interfaces"] == ["a1", "a2", "a3", "a4"]


def test_a_marker_runs_on_a_router(tmp_path: Path) -> None:
    exp = load_plan(experiment_file(tmp_path, at="S1", links=["access1"])).trials[0].experiment
    rack = chain2_rack()
    with pytest.raises(RackError, match=r"key 'markers\[0\].at': S1 is not a router"):
        marker_sites(exp, resolve_network(exp, rack, "x"), "x")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"links": ["nope"]}, "markers[0].links[0]: no link named 'nope'"),
        ({"at": "R2", "links": ["access1"]}, "link access1 joins S1 and R1, not R2"),
        ({"marker": "RIO"}, "'NM', 'APM', 'WPM' or 'MPM'"),
        ({"alpha": 1}, "key 'markers[0].alpha'"),
        ({"links": []}, "key 'markers[0].links'"),
        ({"speed": 1}, "unknown key 'markers[0].speed'"),
    ],
)
def test_bad_markers_are_refused_naming_the_key(tmp_path: Path, change: dict, said: str) -> None:
    path = experiment_file(tmp_path, **change)
    with pytest.raises(SpecError) as exc:
        load_plan(path)
    message = " ".join(str(exc.value).split())
    assert str(path) in message and said in message, message


def test_a_bpf_marker_runs_its_own_daemon_with_the_same_options(tmp_path: Path) -> None:
    exp = load_plan(experiment_file(tmp_path, implementation="bpf")).trials[0].experiment
    rack = chain2_rack()
    (site,) = marker_sites(exp, resolve_network(exp, rack, "x"), "x")
    shipped = remote_dir(rack.host("R1").workdir)
    command = site.marker_command(router_python(rack, "R1"), shipped)
    assert command.startswith(
        f"/opt/tb/.venv/bin/python {shipped}/markers/bpf_edge_marker.py --marker APM"
    )
    assert "--queue" not in command and "--code-points 10,12,14" in command
    assert command.endswith("--iface a4 --build-dir /srv/R1/bpf_tc")
    assert (site.record()["queue"], site.record()["implementation"]) == (None, "bpf")
    # the daemon takes every option the runner gives it
    args = load("markers/bpf_edge_marker.py").parse_args(shlex.split(command)[2:])
    assert (args.marker, args.code_points, args.a0) == ("APM", (10, 12, 14), exp.markers[0].a0)
    assert args.iface == ["a1", "a2", "a3", "a4"] and args.build_dir == "/srv/R1/bpf_tc"
    python = load_plan(experiment_file(tmp_path)).trials[0].experiment.markers[0]
    assert python.implementation == "python"  # the default


def test_preflight_names_what_a_router_lacks_to_build_a_bpf_marker(tmp_path: Path) -> None:
    exp_file = experiment_file(tmp_path, implementation="bpf")
    trial = load_plan(exp_file).trials[0]
    rack = chain2_rack()
    net = resolve_network(trial.experiment, rack, "x")
    view = TrialView(trial, net, {})
    ctx = Context(rack, "exp.yml", [trial], [trial], None)
    wants: dict = {}
    assert checks.need_bpf_tc(ctx, view, wants) == []
    assert wants == {"R1": {"markers[0].implementation": "APM"}}
    tools = {"clang": "/usr/bin/clang", "cc": "/usr/bin/cc", "bpftool": None}
    ctx.facts["R1"] = {"bpf_cc_kernel": {"tools": tools, "libbpf_headers": True}}
    assert checks.missing_bpf_tc(ctx, wants) == []  # bpftool is not needed
    ctx.facts["R1"]["bpf_cc_kernel"] = {"tools": {**tools, "clang": None}, "libbpf_headers": False}
    (problem,) = checks.missing_bpf_tc(ctx, wants)
    assert problem.startswith("exp.yml: key 'markers[0].implementation': bpf runs marker APM")
    assert "host R1, which lacks clang, libbpf-dev" in problem and "set it to python" in problem
    python = load_plan(experiment_file(tmp_path)).trials[0]
    wants = {}
    checks.need_bpf_tc(ctx, TrialView(python, net, {}), wants)
    assert wants == {}
