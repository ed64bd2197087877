"""RACK=auto: the namespace rack when this machine's kernel has what the experiment needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trials import rack_kind
from trials.plan import load_plan

PROJECT = Path(__file__).resolve().parents[1]


def trials_of(name: str, *sets: str):
    return load_plan(PROJECT / "experiments" / name, list(sets)).select(None)


def test_needs_collects_congestion_controls_and_qdiscs():
    need = rack_kind.needs(trials_of("collateral_damage.yml"))
    assert need["cc"] == {"reno", "htcp", "cubic"}
    need = rack_kind.needs(trials_of("smoke.yml", "network.links[*].qdisc=fq_codel"))
    assert need == {"cc": {"cubic"}, "qdiscs": {"fq_codel"}}
    # H-TCP's module parameters stay in the file; a batch without H-TCP does not ask for it.
    need = rack_kind.needs(trials_of("collateral_damage.yml", "factors.hosts.all.cc=[reno,cubic]"))
    assert need == {"cc": {"reno", "cubic"}, "qdiscs": set()}


def test_auto_picks_the_vm_only_for_what_this_kernel_lacks(monkeypatch):
    monkeypatch.setattr(
        rack_kind, "local_offers", lambda: {"cc": {"reno", "cubic"}, "qdiscs": {"htb", "red"}}
    )
    kind, why = rack_kind.choose(trials_of("smoke.yml"), "auto")
    assert kind == "namespaces" and "has everything" in why
    kind, why = rack_kind.choose(trials_of("collateral_damage.yml"), "auto")
    assert kind == "vm" and "lacks htcp" in why
    kind, why = rack_kind.choose(
        trials_of("collateral_damage.yml", "factors.hosts.all.cc=[reno,cubic]"), "auto"
    )
    assert kind == "namespaces", why
    kind, why = rack_kind.choose(trials_of("smoke.yml", "network.links[*].qdisc=fq_codel"), "auto")
    assert kind == "vm" and "sch_fq_codel" in why
    assert rack_kind.choose(trials_of("collateral_damage.yml"), "namespaces")[0] == "namespaces"


def test_local_offers_reads_this_kernel():
    offers = rack_kind.local_offers()
    assert "reno" in offers["cc"]
    assert "htb" in offers["qdiscs"]


def test_a_congestion_control_this_kernel_can_take_as_bpf_keeps_the_namespace_rack():
    """htcp has no module here; hostside/bpf_cc/htcp/ is built and registered instead, where
    the kernel can take it (trials/bpf_cc.py says what it needs)."""
    offers = rack_kind.local_offers()
    if "htcp" not in offers["bpf_cc"]:
        pytest.skip(f"this kernel has htcp itself or cannot take BPF: {offers}")
    kind, why = rack_kind.choose(trials_of("htcp_smoke.yml"), "auto")
    assert kind == "namespaces" and "htcp: registered as BPF" in why, why
