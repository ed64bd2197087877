"""What the runner re-applies between trials, and how it accounts for its overhead."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_marking import dumbbell
from trials.ansible import configure_tags
from trials.host_vars import cc_switchable, host_vars, shaping_switchable
from trials.network import host_settings, resolve_network
from trials.plan import load_plan
from trials.record import overhead_phases, overhead_s
from trials.runner import TrialRunner

PROJECT = Path(__file__).resolve().parents[2]

BASE = {
    "testbed_host_cc": "cubic",
    "testbed_host_sysctls": {"net.ipv4.tcp_no_metrics_save": 1},
    "linux_router_links": [{"iface": "right", "rate": "1mbit", "delay_ms": 25.0}],
    "capture_points": [],
}


def test_nothing_known_applied_means_the_whole_playbook():
    assert configure_tags(None, BASE) is None


def test_only_the_tags_of_the_changed_variables():
    assert configure_tags(BASE, dict(BASE)) == set()
    other = {**BASE, "testbed_host_cc": "reno"}
    assert configure_tags(BASE, other) == {"cc"}
    other["linux_router_links"] = [{"iface": "right", "rate": "1mbit", "delay_ms": 50.0}]
    assert configure_tags(BASE, other) == {"cc", "shaping"}


def test_a_variable_appearing_or_vanishing_counts_as_a_change():
    assert configure_tags(BASE, {**BASE, "testbed_host_cc_params": {"beta": 1}}) == {"cc"}
    less = {k: v for k, v in BASE.items() if k != "testbed_host_cc"}
    assert configure_tags(BASE, less) == {"cc"}


def test_a_variable_without_a_tag_runs_everything():
    assert configure_tags(BASE, {**BASE, "testbed_host_offloads_off": False}) is None


def test_a_congestion_control_made_available_is_switched_to_without_configure():
    applied = {**BASE, "testbed_host_cc_choices": ["cubic", "reno"]}
    assert cc_switchable(applied, {**applied, "testbed_host_cc": "reno"})
    # Whatever else differs goes through configure.yml, but not the congestion control.
    moved = {**applied, "testbed_host_cc": "reno", "testbed_host_sysctls": {}}
    assert cc_switchable(applied, moved)
    # The same one, one not made available, other module parameters or another choice list.
    assert not cc_switchable(applied, dict(applied))
    assert not cc_switchable(applied, {**applied, "testbed_host_cc": "bbr"})
    other = {**applied, "testbed_host_cc": "reno", "testbed_host_cc_params": {"beta": 1}}
    assert not cc_switchable(applied, other)
    more = {**applied, "testbed_host_cc": "reno", "testbed_host_cc_choices": ["bbr", "reno"]}
    assert not cc_switchable(applied, more)
    assert not cc_switchable(BASE, {**BASE, "testbed_host_cc": "reno"})  # no choices made
    assert not cc_switchable(None, {**applied, "testbed_host_cc": "reno"})  # nothing known


def test_module_parameters_set_with_the_choices_do_not_stop_a_switch():
    # H-TCP's parameters were set by the configure that made the choices (module-wide).
    params = {"htcp": {"use_bandwidth_switch": 0}}
    applied = {
        **BASE,
        "testbed_host_cc_choices": ["cubic", "htcp", "reno"],
        "testbed_host_cc_choice_params": params,
    }
    htcp = {**applied, "testbed_host_cc": "htcp", "testbed_host_cc_params": params["htcp"]}
    assert cc_switchable(applied, htcp)
    assert cc_switchable(htcp, {**applied, "testbed_host_cc": "reno"})
    # Other parameters than the ones set, or a different set of them: configure.yml.
    assert not cc_switchable(applied, {**htcp, "testbed_host_cc_params": {"use_rtt_scaling": 0}})
    assert not cc_switchable(applied, {**htcp, "testbed_host_cc_choice_params": {}})


def test_a_router_switches_between_the_link_settings_rendered_for_the_batch():
    links = {d: [{"iface": "right", "rate": "1mbit", "delay_ms": d}] for d in (25.0, 50.0)}
    applied = {**BASE, "linux_router_links_choices": [links[25.0], links[50.0]]}
    assert shaping_switchable(applied, {**applied, "linux_router_links": links[50.0]})
    assert not shaping_switchable(applied, dict(applied))  # the same
    other = [{"iface": "right", "rate": "2mbit", "delay_ms": 25.0}]
    assert not shaping_switchable(applied, {**applied, "linux_router_links": other})
    assert not shaping_switchable(BASE, {**BASE, "linux_router_links": links[50.0]})
    assert not shaping_switchable(None, {**applied, "linux_router_links": links[50.0]})


def test_seed000_renders_both_delays_on_the_router_and_switches_with_the_cc(tmp_path):
    """The seed-000 matrix on the dumbbell: R gets both delays' links as choices (the order
    fixed, whichever trial comes first), the end hosts none; from any trial to one with the
    other delay and congestion control, both are switches."""
    source = PROJECT / "experiments/collateral_damage.yml"
    plan = load_plan(
        source,
        ['factors={"hosts.all.cc": ["reno", "cubic"], "network.links[*].delay": ["25ms", "50ms"]}'],
    )
    rack = dumbbell()
    runner = TrialRunner(plan, rack, tmp_path)
    choices = runner.config.choices.shaping
    assert set(choices) == {"R"}
    assert [{x["delay_ms"] for x in c} for c in choices["R"]] == [{25.0}, {50.0}]
    variables = {}
    for trial in plan.trials:
        net = resolve_network(trial.experiment, rack, str(source))
        settings = host_settings(trial.experiment, net, str(source))
        variables[trial.name] = host_vars(
            trial, net, settings, runner.config.choices.cc, runner.config.choices.shaping
        )
    first, second = variables["cc-reno_delay-25ms_r1"], variables["cc-cubic_delay-50ms_r1"]
    assert shaping_switchable(first["R"], second["R"])
    assert all(cc_switchable(first[h], second[h]) for h in "ABCDR")
    assert "linux_router_links_choices" not in first["A"]
    # Every variable that differs is one a switch sets.
    for h in "ABCDR":
        differs = {k for k in first[h] if first[h][k] != second[h].get(k)}
        assert differs <= {"testbed_host_cc", "linux_router_links"}, (h, differs)


TIMES = {
    "started": "2026-11-22T10:00:00.000+00:00",
    "configured": "2026-11-22T10:00:04.500+00:00",
    "armed": "2026-11-22T10:00:06.000+00:00",
    "t0": 1795341607.5,  # 10:00:07.5 UTC, as the runner records it (epoch seconds)
    "traffic_done": "2026-11-22T10:03:09.500+00:00",  # 180 s of traffic + 2 s drain
    "stopped": "2026-11-22T10:03:10.700+00:00",
    "collected": "2026-11-22T10:03:12.000+00:00",
}


def test_overhead_is_split_into_its_phases_and_they_add_up():
    phases = overhead_phases(TIMES)
    assert phases == {"configure": 4.5, "arm": 1.5, "lead": 1.5, "stop": 1.2, "collect": 1.3}
    assert overhead_s(TIMES) == round(sum(phases.values()), 2) == 10.0


def test_a_trial_that_never_started_has_no_overhead_figure_but_its_phases():
    times = {k: TIMES[k] for k in ("started", "configured")}
    assert overhead_s(times) is None
    assert overhead_phases(times) == {"configure": 4.5}


def test_the_facts_a_runner_caches_are_the_ones_the_host_script_leaves_out():
    from tests.hostside import load
    from trials import preflight

    host_facts = load("probes/host_facts.py")

    assert preflight.STATIC_FACTS == host_facts.STATIC


def test_a_late_launch_stops_the_trial_and_lengthens_the_next_lead():
    from trials.runner import late_launch

    assert late_launch(0.4, 1.0) == (None, 1.0)  # in time: the lead stays
    said, lead = late_launch(2.19, 1.0)
    assert lead == 4.4 and said == (
        "the senders were launched 1.19 s after T0 (lead 1 s): stopped at once, as every rate "
        "from T0 would read low; the next trial's lead is 4.4 s"
    )
    assert late_launch(0.6, 4.4) == (None, 4.4)  # a longer lead is kept
