"""Preflight's marker capacity check (trials/preflight/marker_load.py) on the shipped seed-004
files, resolved on the chain2 topology's hosts (no SSH): what each trial offers its edge marker,
against the packets/s the virtual inventory gives each rack kind's markers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.link_rules import FULL_FRAME_BYTES
from core.rack import Rack
from core.units import parse_rate
from tests.unit.render_trial import topology_hosts
from trials.network import resolve_network
from trials.plan import load_plan
from trials.preflight.checks import CHECKS
from trials.preflight.context import Context, TrialView
from trials.preflight.marker_load import capacity, marker_loads, markers_keep_up

PROJECT = Path(__file__).resolve().parents[2]
EXPERIMENTS = PROJECT / "experiments"
SEED_004 = ["diffserv.yml", "diffserv_wpm.yml", "diffserv_mpm.yml", "web_poisson.yml"]
INVENTORY_VARS = yaml.safe_load((PROJECT / "inventory/virtual/group_vars/all.yml").read_text())
KINDS = {"namespaces": "virtual", "vm": "vm"}  # the rack kind -> its trialbed_rack_kind


def rack(kind: str = "namespaces", **rack_vars) -> Rack:
    """The virtual rack of chain2 with the virtual inventory's variables (or `rack_vars`)."""
    given = rack_vars or INVENTORY_VARS
    return Rack([], topology_hosts("chain2"), {**given, "trialbed_rack_kind": KINDS[kind]})


def context(path: Path, on: Rack, sets: tuple[str, ...] = ()) -> Context:
    """Preflight's context for every trial of `path`, resolved on the rack as preflight does."""
    trials = load_plan(path, list(sets)).trials
    ctx = Context(on, str(path), trials, trials, None)
    for trial in trials:
        ctx.views.append(TrialView(trial, resolve_network(trial.experiment, on, str(path)), {}))
    return ctx


def offered(ctx: Context) -> list[float]:
    """Each trial's load on its first marker, packets/s."""
    return [marker_loads(v.exp, v.net, None)[0].pps for v in ctx.views]


def copy(tmp_path: Path, name: str = "diffserv.yml", scale: int = 1, **marker) -> Path:
    """A copy of a shipped file with its bottleneck `scale` times as fast and its marker
    changed by `marker` (the loads are fractions of the bottleneck, so they scale too). Its
    marker is the python one unless `marker` says otherwise: the one held to the lowest figure."""
    raw = yaml.safe_load((EXPERIMENTS / name).read_text())
    link = next(lk for lk in raw["network"]["links"] if lk["name"] == "bottleneck")
    link["rate"] = f"{int(link['rate'].removesuffix('mbit')) * scale}mbit"
    raw["markers"][0].update({"implementation": "python", **marker})
    path = tmp_path / f"x{scale}_{name}"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_the_check_is_a_row_of_the_table() -> None:
    assert [c.name for c in CHECKS if c.judge is markers_keep_up] == ["packets/s the markers carry"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", SEED_004)
def test_the_shipped_seed_004_files_pass_at_their_rates(name: str, kind: str) -> None:
    ctx = context(EXPERIMENTS / name, rack(kind))
    loads = offered(ctx)
    shipped = ctx.views[0].exp.markers[0].implementation
    carries, where, bad = capacity(ctx, shipped)
    assert bad is None
    assert where.startswith(f"{ctx.marker_capacities[0]}.{shipped} in the inventory")
    assert carries and min(loads) > 0 and max(loads) <= carries
    assert markers_keep_up(ctx, {}) == []


def test_a_scaled_up_copy_is_refused_on_the_vm_rack_naming_file_key_load_capacity_and_fixes(
    tmp_path: Path,
) -> None:
    path = copy(tmp_path, scale=4)
    ctx = context(path, rack("vm"))
    loads = offered(ctx)
    carries, where, _ = capacity(ctx, "python")
    shipped = offered(context(EXPERIMENTS / "diffserv.yml", rack("vm")))
    assert max(shipped) <= carries < min(loads)  # the premise: only the copy is beyond it
    (problem,) = markers_keep_up(ctx, {})
    worst = ctx.views[loads.index(max(loads))].trial.name
    assert problem.startswith(
        f"{path}: key 'markers[0]' (edge, the python marker at R1): trial {worst} offers it "
        f"about {max(loads):,.0f} packets/s ({len(loads)} of {len(loads)} selected trials offer "
        f"more than it carries), beyond the {carries:,.0f} packets/s this rack's python marker "
        f"carries ({where})."
    )
    assert "trialbed_vm_marker_max_pps.python in the inventory: provisional" in problem
    # what the count is made of: the bottleneck once for the four senders, their flows' own
    assert "traffic[0] (web1), traffic[1] (web2), traffic[2] (web3), traffic[3] (web4): data" in (
        problem
    )
    assert "link bottleneck (R1 -> R2, 24mbit)" in problem
    assert "markers[0].implementation: bpf" in problem and "make bench-marker" in problem
    assert "set trialbed_vm_marker_max_pps.python" in problem
    # The namespace rack's markers carry it.
    assert markers_keep_up(context(path, rack("namespaces")), {}) == []


def test_each_implementation_is_held_to_its_own_figure(tmp_path: Path) -> None:
    figures = {"trialbed_marker_max_pps": {"python": 1000, "bpf": 5000}}
    python = context(copy(tmp_path, scale=4), rack(**figures))
    (problem,) = markers_keep_up(python, {})
    assert (
        "beyond the 1,000 packets/s" in problem
        and "bpf; this rack's figure for it: 5,000)" in problem
    )
    bpf = context(copy(tmp_path, scale=4, implementation="bpf"), rack(**figures))
    assert max(offered(bpf)) < 5000 and markers_keep_up(bpf, {}) == []
    # A rack that gives no figure for an implementation does not limit it.
    unknown = context(copy(tmp_path, scale=4), rack(trialbed_marker_max_pps={"bpf": 1}))
    assert markers_keep_up(unknown, {}) == []


def test_the_load_follows_the_rate_and_counts_a_shared_bottleneck_once(tmp_path: Path) -> None:
    one = offered(context(EXPERIMENTS / "diffserv.yml", rack()))
    double = offered(context(copy(tmp_path, scale=2), rack()))
    assert double == pytest.approx([2 * x for x in one])  # load and rate both scale
    view = context(EXPERIMENTS / "diffserv.yml", rack()).views[0]
    (load,) = marker_loads(view.exp, view.net, None)
    data = [s for s in load.shares if s.what.startswith("data")]
    assert len(data) == 1 and len(data[0].keys) == len(view.exp.traffic)


def test_only_the_packets_entering_over_the_markers_links_count(tmp_path: Path) -> None:
    all_four = context(EXPERIMENTS / "diffserv.yml", rack()).views[0]
    (every,) = marker_loads(all_four.exp, all_four.net, None)
    one_link = context(copy(tmp_path, links=["access1"]), rack()).views[0]
    (first,) = marker_loads(one_link.exp, one_link.net, None)
    assert {k for s in first.shares for k in s.keys} == {"traffic[0] (web1)"}
    assert 0 < first.pps < every.pps
    # On the core link at R1 the marker sees what comes back from the receivers: ACKs.
    core = context(copy(tmp_path, links=["bottleneck"]), rack()).views[0]
    (acks,) = marker_loads(core.exp, core.net, None)
    kinds = {s.what.split(" in full-size")[0] for s in acks.shares if "full-size" in s.what}
    assert kinds == {"ACKs (one per data segment)"}
    assert all("server" in s.what for s in acks.shares if "full-size" not in s.what)


def test_the_nfqueue_marker_takes_tcp_only_and_the_bpf_one_every_packet(tmp_path: Path) -> None:
    stream = {"type": "cbr_udp", "name": "voip", "from": "S1", "to": "D1", "interval": "20ms"}
    added = {}
    for impl in ("python", "bpf"):
        path = copy(tmp_path, implementation=impl)
        (before,) = offered(context(path, rack(), ("factors={}",)))
        raw = yaml.safe_load(path.read_text())
        raw["traffic"].append(stream)
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        ctx = context(path, rack(), ("factors={}",))
        added[impl] = offered(ctx)[0] - before
    udp = ctx.views[0].exp.traffic[-1]
    assert added == {"python": 0, "bpf": pytest.approx(1e9 / udp.interval)}


def test_a_path_with_no_shaped_link_is_bounded_by_the_rate_ceiling_or_refused(
    tmp_path: Path,
) -> None:
    raw = yaml.safe_load((EXPERIMENTS / "web_poisson.yml").read_text())
    raw.pop("factors")
    for link in raw["network"]["links"]:
        link.pop("rate"), link.pop("buffer")
    for gen in raw["traffic"]:
        gen["link_rate"] = "6mbit"  # the rate the load is a fraction of, now that none is shaped
    path = tmp_path / "unshaped.yml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    # a marker figure below four senders at the ceiling (51 200 data packets/s), whatever the
    # inventory's calibration says
    below = {"python": 20000, "bpf": 20000, "source": "this test"}
    ctx = context(path, rack(**{**INVENTORY_VARS, "trialbed_marker_max_pps": below}))
    max_rate, _ = ctx.rate_limit
    assert max_rate == INVENTORY_VARS["trialbed_max_rate"]
    view = ctx.views[0]
    (load,) = marker_loads(view.exp, view.net, parse_rate(max_rate))
    ceiling = [s for s in load.shares if "rate ceiling" in s.what]
    assert len(ceiling) == len(raw["traffic"])  # one per flow: no shaped link says they share
    assert {s.pps for s in ceiling} == {parse_rate(max_rate) / 8 / FULL_FRAME_BYTES}
    (problem,) = markers_keep_up(ctx, {})  # four senders at the rack's ceiling each
    assert "data in full-size frames at the rack's rate ceiling (no shaped link)" in problem
    # A rack without a ceiling: nothing bounds them.
    bare = {k: v for k, v in INVENTORY_VARS.items() if k != "trialbed_max_rate"}
    (problem,) = markers_keep_up(context(path, rack(**bare)), {})
    assert problem == (
        f"{path}: key 'markers[0]' (python marker at R1): traffic[0] (web1), traffic[1] (web2), "
        "traffic[2] (web3), traffic[3] (web4) reaches it on a path with no shaped link, and the "
        "rack gives no rate ceiling (trialbed_max_rate): its packet rate has no bound; shape a "
        "link on its path"
    )


@pytest.mark.parametrize(
    ("figures", "key"),
    [
        ({"python": "fast"}, "trialbed_marker_max_pps.python"),
        ({"python": 0}, "trialbed_marker_max_pps.python"),
        (5000, "trialbed_marker_max_pps"),
    ],
)
def test_a_bad_figure_in_the_inventory_is_named(tmp_path: Path, figures: object, key: str) -> None:
    ctx = context(copy(tmp_path), rack(trialbed_marker_max_pps=figures))
    (problem,) = markers_keep_up(ctx, {})
    assert problem.startswith(f"the inventory: key '{key}': ")
    assert "allowed a mapping of implementation (python, bpf) to the packets/s" in problem
