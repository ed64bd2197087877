"""The experiment's `markers:`: validation, and where each marker runs on a rack (the chain2
topology's hosts, no SSH)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.hostside import remote_dir
from core.rack import Rack, RackError
from tests.unit.render_trial import topology_hosts
from trials.adaptive_marking import marker_sites, router_python
from trials.network import resolve_network
from trials.plan import load_plan
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
