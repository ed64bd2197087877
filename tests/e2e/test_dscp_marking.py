"""Static DSCP marking (role dscp_marker, network.marking) on the test rack, judged from a real
trial's captures and the hosts' nftables: a sender marks its TCP flow, the edge router remarks
the cbr_udp stream (whose own DSCP, set in its pcap, shows before the router), the counters
count, a second configure changes nothing, and teardown removes the role's table and no other.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from analysis.pcap import ip_to_int, read_pcap
from core.dscp import DSCP_NAMES
from core.link_rules import DSCP_TABLE_FAMILY, DSCP_TABLE_NAME
from core.rack import Rack
from tests.e2e.conftest import PROJECT, only_batch, recap

pytestmark = pytest.mark.rack

EXPERIMENT = """\
experiment: collateral_damage
description: DSCP marking end to end
network:
  links:
    - {name: downstream, from: R, to: C, rate: 10mbit, buffer: 60000B}
    - {name: upstream, from: R, to: A, rate: 10mbit, buffer: 60000B}
  marking:
    - {name: tcp_af11, at: A, flow: tcp, dscp: af11}
    - {name: voip_cs5, at: R, flow: voip, dscp: cs5}
traffic:
  - {type: bulk_tcp, name: tcp, from: A, to: C, flows: 1}
  - {type: cbr_udp, name: voip, from: B, to: D, packet_bytes: 186, interval: 20ms, dscp: ef}
capture:
  points:
    - {name: bottleneck_in, link: upstream, at: R}
    - {name: bottleneck_out, link: downstream, at: R}
duration: 8s
"""
TABLE = f"{DSCP_TABLE_FAMILY} {DSCP_TABLE_NAME}"
# Tables someone else keeps on the hosts: teardown must leave them as they are.
BYSTANDERS = {"R": "inet bystander", "A": "ip bystander"}


def nft(rack: Rack, host: str, args: str, check: bool = True) -> str:
    return rack.run(host, f"nft {args}", check=check)


def tables(rack: Rack, host: str) -> list[str]:
    return [t.removeprefix("table ") for t in nft(rack, host, "list tables").splitlines()]


@pytest.fixture(scope="module")
def trial(test_rack, tmp_path_factory):
    rack = Rack.load([test_rack.inventory])
    for host, table in BYSTANDERS.items():
        nft(rack, host, f"add table {table}")
        nft(rack, host, f"add chain {table} keep '{{ type filter hook output priority 0; }}'")
        nft(rack, host, f"add rule {table} keep counter")
    base = tmp_path_factory.mktemp("dscp")
    exp_file = base / "dscp.yml"
    exp_file.write_text(EXPERIMENT)
    done = subprocess.run(
        [sys.executable, "-m", "trials", "run", str(exp_file),
         "-i", str(test_rack.inventory), "--results", str(base / "results")],
        cwd=PROJECT, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    batch = only_batch(base / "results")
    (trial_dir,) = (batch / "trials").iterdir()
    yield {
        "rack": rack,
        "dir": trial_dir,
        "stdout": done.stdout,
        "record": json.loads((trial_dir / "trial.json").read_text()),
        "summary": json.loads((trial_dir / "analysis" / "summary.json").read_text()),
    }
    for host, table in BYSTANDERS.items():
        nft(rack, host, f"delete table {table}", check=False)


def own(frame: pd.DataFrame, record: dict, name: str) -> pd.DataFrame:
    gen = record["traffic"][name]
    return frame[
        (frame.proto == gen["proto"])
        & (frame.src == ip_to_int(gen["src"]))
        & (frame.dst == ip_to_int(gen["dst"]))
        & (frame.dport == gen["port"])
    ]


def test_marked_packets_carry_their_dscp_in_the_captures(trial):
    record, trial_dir = trial["record"], trial["dir"]
    assert record["status"] == "complete", record["errors"]
    before = read_pcap(trial_dir / "R" / "bottleneck_in.pcap")
    after = read_pcap(trial_dir / "R" / "bottleneck_out.pcap")
    for name, frame, dscp in (
        ("tcp", before, "af11"),  # marked by A as it left A
        ("tcp", after, "af11"),  # R leaves it alone
        ("voip", before, "ef"),  # as cbr_udp generated it in its pcap
        ("voip", after, "cs5"),  # remarked by R on its way out
    ):
        packets = own(frame, record, name)
        seen = sorted(set((packets.tos.to_numpy() >> 2).tolist()))
        print(f"{name}: {len(packets)} packets with DSCP {seen}")
        assert len(packets) > 0 and seen == [DSCP_NAMES[dscp]], (name, seen)
    # The analysis says the same, per capture point on each flow's path.
    gens = trial["summary"]["generators"]
    assert set(gens["tcp"]["dscp"]["bottleneck_in"]) == {"af11"}
    assert set(gens["voip"]["dscp"]["bottleneck_in"]) == {"ef"}
    assert set(gens["voip"]["dscp"]["bottleneck_out"]) == {"cs5"}
    assert gens["voip"]["dscp_seen"] == [DSCP_NAMES["ef"]]
    per_flow = pd.read_parquet(trial_dir / "analysis" / "dscp.parquet")
    assert set(per_flow.dscp_name) == {"af11", "ef", "cs5"}
    assert "DSCP voip" in trial["stdout"] and "marking on R" in trial["stdout"]


def test_rule_counters_count_what_they_marked(trial):
    record, trial_dir = trial["record"], trial["dir"]
    marking = record["marking"]
    print(json.dumps(marking))
    tcp, voip = marking["A"]["tcp_af11"], marking["R"]["voip_cs5"]
    assert (tcp["dscp"], voip["dscp"]) == (DSCP_NAMES["af11"], DSCP_NAMES["cs5"])
    assert tcp["packets"] > 0 and voip["packets"] > 0
    # R forwards the stream packet by packet: its rule counted every packet R received (the
    # rule runs before R's egress queue, which may drop some of them).
    before = read_pcap(trial_dir / "R" / "bottleneck_in.pcap")
    assert voip["packets"] == len(own(before, record, "voip"))
    # A's TCP leaves in GSO segments the counter sees once each: never more than on the wire.
    tcp_wire = own(before, record, "tcp")
    assert tcp["packets"] <= len(tcp_wire) and tcp["bytes"] <= int(tcp_wire.ip_len.sum())
    for host in ("A", "R"):  # the listings came back with the trial's files
        assert (trial_dir / host / "dscp_counters_after.json").exists()


def test_the_runners_teardown_left_other_tables_alone(trial):
    rack = trial["rack"]
    for host, table in BYSTANDERS.items():
        assert table in tables(rack, host), host
        assert TABLE not in tables(rack, host), host


def test_configure_validates_applies_once_and_teardown_removes_only_its_table(trial, test_rack):
    rack = trial["rack"]
    overlay = trial["dir"] / "ansible" / "trial_vars.yml"
    # The two hosts that mark (and the controller's play): B, C and D take no part, and each
    # playbook run on five hosts costs tens of seconds.
    inventory = ("-i", str(test_rack.inventory), "--limit", "localhost,A,R")
    first = test_rack.playbook("configure.yml", *inventory, "-i", str(overlay))
    assert first.returncode == 0, first.stdout[-3000:]
    assert recap(first.stdout)["R"]["changed"] > 0
    # The rendered file is what nft -c accepts and what the kernel now holds.
    work = rack.host("R").workdir
    nft(rack, "R", f"-c -f {work}/dscp/dscp.nft")
    live = nft(rack, "R", f"-s list table {TABLE}")
    assert live.strip() == rack.run("R", f"cat {work}/dscp/dscp.applied").strip()
    assert 'ip dscp set cs5 accept comment "voip_cs5"' in live

    second = test_rack.playbook("configure.yml", *inventory, "-i", str(overlay))
    assert second.returncode == 0, second.stdout[-3000:]
    changed = {host: counts["changed"] for host, counts in recap(second.stdout).items()}
    print(f"second configure: changed {changed}")
    assert changed and all(v == 0 for v in changed.values()), changed

    # A table removed behind the role's back is put back by the next configure.
    nft(rack, "R", f"delete table {TABLE}")
    again = test_rack.playbook("configure.yml", *inventory, "-i", str(overlay), "--tags", "marking")
    assert again.returncode == 0, again.stdout[-3000:]
    assert recap(again.stdout)["R"]["changed"] > 0
    assert nft(rack, "R", f"-s list table {TABLE}").strip() == live.strip()

    down = test_rack.playbook("teardown.yml", *inventory)  # no trial variables
    assert down.returncode == 0, down.stdout[-3000:]
    assert recap(down.stdout)["R"]["changed"] > 0 and recap(down.stdout)["A"]["changed"] > 0
    for host, table in BYSTANDERS.items():
        assert TABLE not in tables(rack, host), host
        assert table in tables(rack, host), host
        assert "counter" in nft(rack, host, f"list table {table}")  # its rule is still there
    twice = test_rack.playbook("teardown.yml", *inventory)
    assert twice.returncode == 0, twice.stdout[-3000:]
    changed = {host: counts["changed"] for host, counts in recap(twice.stdout).items()}
    print(f"second teardown: changed {changed}")
    assert changed and all(v == 0 for v in changed.values()), changed


def test_a_ruleset_nft_refuses_is_not_applied(trial, test_rack, tmp_path):
    """The address passes the role's input check (four numbers) but not nft -c: the
    configure fails naming it, and the table in force stays."""
    rack = trial["rack"]
    overlay = trial["dir"] / "ansible" / "trial_vars.yml"
    inventory = ("-i", str(test_rack.inventory))
    marking = ("--tags", "marking", "--limit", "R")  # this role alone, on the router
    applied = test_rack.playbook("configure.yml", *inventory, "-i", str(overlay), *marking)
    assert applied.returncode == 0, applied.stdout[-3000:]
    live = nft(rack, "R", f"-s list table {TABLE}")
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "all:\n  hosts:\n    R:\n      dscp_marker_rules:\n"
        "        - {name: wrong, src: 198.18.1.300, dscp: ef}\n"
    )
    done = test_rack.playbook("configure.yml", *inventory, "-i", str(bad), *marking)
    assert done.returncode != 0
    said = " ".join(done.stdout.split())
    assert "Render the marking table" in said and "198.18.1.300" in said, said[-2000:]
    assert nft(rack, "R", f"-s list table {TABLE}") == live
    down = test_rack.playbook("teardown.yml", *inventory, "--limit", "localhost,R")
    assert down.returncode == 0, down.stdout[-3000:]
