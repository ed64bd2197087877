"""Every quantity of an experiment file has a range a rack can carry (trials/fields.py): both
bounds are accepted, one step beyond either is refused with the key, the value and the range;
a boolean is never a number; the generated schema page carries the same ranges."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.spec_files import write
from trials import fields
from trials.plan import load_plan
from trials.spec import SpecError

PROJECT = Path(__file__).resolve().parents[2]
# One file with every kind of element: a rio link, each generator type, a marker, captures.
BASE = """\
experiment: ranges
topology: chain2
network:
  links:
    - {name: core, between: [R1, R2], rate: 10mbit, buffer: 1000pkt, delay: 10ms,
       qdisc: rio, rio: {in: {min: 9}, out: {min: 2}}}
    - {name: access, between: [S1, R1], rate: 100mbit, buffer: 100pkt}
traffic:
  - {type: bulk_tcp, name: bulk, from: S1, to: D1}
  - {type: cbr_udp, name: voip, from: S2, to: D2}
  - {type: transaction, name: eft, from: S3, to: D3, workload: eft_long, protocol: udp}
  - {type: web_poisson, name: web, from: S4, to: D4, load: 0.5}
markers:
  - {name: edge, at: R1, links: [access], marker: APM}
capture:
  points:
    - {name: core_in, link: core, at: R1}
hosts:
  all: {cc: reno}
duration: 60s
"""

# (key, lowest allowed, highest allowed, below, above, the range as messages write it)
RANGES = [
    ("network.links[1].rate", "10kbit", "100gbit", "9kbit", "100001mbit", "10kbit to 100gbit"),
    ("network.links[1].delay", "0s", "10s", None, "10001ms", "0s to 10s"),
    ("network.links[1].buffer", "1pkt", "100000pkt", None, "100001pkt",
     "1B to 150MB or 1pkt to 100000pkt"),
    ("network.links[1].mtu", 68, 9000, 67, 9001, "68 to 9000"),
    ("network.links[0].rio.mean_packet", "64B", "9000B", "63B", "9001B", "64B to 9kB"),
    ("network.links[0].rio.in.pmax", 0.001, 1, 0, 1.5, "above 0, up to 1"),
    ("network.links[0].rio.in.w_q", 0.001, 0.999, 0, 1, "above 0 and below 1"),
    ("duration", "1s", "86400s", "999ms", "86401s", "1s to 86400s"),
    ("warmup", "0s", "59s", None, "86401s", "0s to 86400s"),
    ("drain", "0s", "600s", None, "601s", "0s to 600s"),
    ("repetitions", 1, 100, 0, 101, "1 to 100"),
    ("seed", 0, 2**63 - 1, -1, 2**63, "0 to 9223372036854775807"),
    ("hosts.all.initcwnd", 1, 1000, 0, 1001, "1 to 1000"),
    ("hosts.all.rto_min", "1ms", "120s", "999us", "121s", "1ms to 120s"),
    ("hosts.all.rcvbuf", "1024B", "268435456B", "1023B", "268435457B", "1024B to 268435456B"),
    ("hosts.all.tcp_timestamps", 0, 1, -1, 2, "0 or 1"),
    ("traffic[0].flows", 1, 128, 0, 129, "1 to 128"),
    ("traffic[0].bytes", "1B", "1000000MB", None, "1000001MB", "1B to 1000000MB"),
    ("traffic[0].port", 1024, 65535, 1023, 65536, "1024 to 65535"),
    ("traffic[0].duration", "1ms", "60s", "999us", "86401s", "1ms to 86400s"),
    ("traffic[0].start", "0s", "59s", None, "86401s", "0s to 86400s"),
    ("traffic[1].packet_bytes", 36, 1500, 35, 1501, "36 to 1500"),
    ("traffic[1].interval", "10us", "10s", "9us", "11s", "10us to 10s"),
    ("traffic[2].pairs", 1, 64, 0, 65, "1 to 64"),
    ("traffic[2].count", 1, 10**9, 0, 10**9 + 1, "1 to 1000000000"),
    ("traffic[2].rto", "1ms", "120s", "999us", "121s", "1ms to 120s"),
    ("traffic[2].window", "8863B", "2147483647B", None, "2147483648B", "1B to 2147483647B"),
    ("traffic[3].link_rate", "10kbit", "100gbit", "9kbit", "101gbit", "10kbit to 100gbit"),
    ("capture.snaplen", 96, 65535, 95, 65536, "96 to 65535"),
    ("markers[0].af_class", 1, 4, 0, 5, "1 to 4"),
    ("markers[0].alpha", 0, 0.999, -0.5, 1, "0 up to (not including) 1"),
    ("markers[0].a0", 0.5, 100000, 0, 100001, "above 0, up to 100000"),
    ("markers[0].n_s", 0, 1000, -1, 1001, "0 to 1000"),
]  # fmt: skip


def set_(key: str, value: object) -> str:
    return f"{key}={value}"


def refused(tmp_path: Path, *sets: str) -> str:
    path = write(tmp_path, BASE)
    with pytest.raises(SpecError) as exc:
        load_plan(path, sets)
    return str(exc.value)


@pytest.mark.parametrize("row", RANGES, ids=[r[0] for r in RANGES])
def test_both_bounds_are_allowed_and_one_step_beyond_is_refused(tmp_path, row):
    key, low, high, below, above, allowed = row
    for ok in (low, high):
        assert load_plan(write(tmp_path, BASE), [set_(key, ok)]).trials, (key, ok)
    for bad in (below, above):
        if bad is None:
            continue
        message = refused(tmp_path, set_(key, bad))
        shown = repr(bad) if isinstance(bad, str) else str(bad)
        first = message.splitlines()[0]
        assert first.startswith(f"{tmp_path / 'exp.yml'}: key '{key}': "), first
        assert shown in first and allowed in first, first


@pytest.mark.parametrize("row", RANGES, ids=[r[0] for r in RANGES])
def test_a_boolean_is_not_a_number(tmp_path, row):
    key = row[0]
    message = refused(tmp_path, set_(key, "true")).splitlines()[0]
    assert message.startswith(f"{tmp_path / 'exp.yml'}: key '{key}': true "), message


def test_messages_for_ranges_read_exactly(tmp_path):
    path = tmp_path / "exp.yml"
    cases = [
        ("network.links[1].rate=500gbit",
         f"{path}: key 'network.links[1].rate': '500gbit' is out of range; allowed: 10kbit to "
         "100gbit"),
        ("network.links[1].rate=true",
         f"{path}: key 'network.links[1].rate': true is a boolean, not a rate; allowed: 10kbit "
         "to 100gbit"),
        ("traffic[0].flows=2.0",
         f"{path}: key 'traffic[0].flows': 2.0 is not a whole number; allowed: 1 to 128"),
        ("traffic[0].flows='2'",
         f"{path}: key 'traffic[0].flows': '2' is not a whole number; allowed: 1 to 128"),
        ("network.links[0].rio.in.pmax=.nan",
         f"{path}: key 'network.links[0].rio.in.pmax': nan is not a finite number; allowed: "
         "above 0, up to 1"),
        ("network.links[1].buffer=200MB",
         f"{path}: key 'network.links[1].buffer': '200MB' is out of range; allowed: 1B to "
         "150MB or 1pkt to 100000pkt"),
        ("traffic[0].pacing=1",
         f"{path}: key 'traffic[0].pacing': Input should be a valid boolean, not 1"),
        ("hosts.all.tcp_no_metrics_save=true",
         f"{path}: key 'hosts.all.tcp_no_metrics_save': true is not a whole number; allowed: 0 "
         "or 1"),
        (f"name={'x' * 201}", f"{path}: key 'name': 201 characters; allowed: at most 200"),
        ("name=a\tb",
         f"{path}: key 'name': 'a\\tb' holds the control character '\\t'; allowed: "
         "printable text on one line"),
        ("network.links[1].rate=" + "1" * 70 + "mbit",
         f"{path}: key 'network.links[1].rate': {fields.shown('1' * 70 + 'mbit')} is not a rate; "
         "allowed: 10kbit to 100gbit"),
    ]  # fmt: skip
    for setting, expected in cases:
        assert refused(tmp_path, setting).splitlines()[0] == expected


def test_an_out_of_range_value_in_the_file_names_its_line(tmp_path):
    text = BASE.replace("rate: 100mbit", "rate: 200gbit")
    with pytest.raises(SpecError) as exc:
        load_plan(write(tmp_path, text))
    assert str(exc.value) == (
        f"{tmp_path / 'exp.yml'}: key 'network.links[1].rate': '200gbit' is out of range; "
        "allowed: 10kbit to 100gbit (line 7)"
    )


def test_every_range_is_written_once_and_documented():
    page = (PROJECT / "docs" / "experiment-schema.md").read_text()
    ranges = [v for v in vars(fields).values() if isinstance(v, fields.Range)]
    assert len(ranges) >= 15
    for limit in ranges:
        if limit is not fields.CC_PARAM_INT:
            assert limit.text() in page, limit
    done = subprocess.run(
        [sys.executable, "scripts/schema_docs.py", "--check"],
        cwd=PROJECT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # the page is what the schema generates now
