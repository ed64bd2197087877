"""Every string of an experiment file that may reach a host's command line or a file name is
checked at the schema level, for every element whether a trial uses it or not: names of
nodes, links, traffic, capture points, markers and rules; inventory hosts (an address or a DNS
name); interface names (Linux and FreeBSD rules); congestion controls and their module
parameters; DSCPs; factor keys. A refusal names the key, the line, the value and the rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.spec_files import GOOD, check, error_of, write
from trials.fields import shown
from trials.plan import load_plan
from trials.spec import SpecError

HOSTILE = ["$(reboot)", ";rm -rf /", "a'b", 'a"b', "a b", "a\nb", "a\x00b", "-oProxyCommand=x"]
HOSTILE += ["::::", "abc:def", "1.2.3", "x" * 254, "a..b", "-a.example"]
NAME_RULE = "a letter, then up to 31 letters, digits or _"


def quoted(value: str) -> str:
    """A value as YAML writes it in a flow mapping (double quotes, escapes)."""
    return '"' + value.encode("unicode_escape").decode().replace('"', '\\"') + '"'


@pytest.mark.parametrize("value", HOSTILE)
def test_a_node_host_that_is_not_an_address_or_dns_name_is_refused_at_its_key(tmp_path, value):
    text = GOOD.replace("network:\n", f"network:\n  nodes: {{R1: R1, S1: {quoted(value)}}}\n")
    assert error_of(tmp_path, text) == (
        f"{tmp_path / 'exp.yml'}: key 'network.nodes.S1.host': {shown(value)} is not an IP "
        "address or a DNS name; give the inventory host as an IPv4/IPv6 address or a DNS name "
        "(labels of letters, digits, - and _, at most 253 characters) (line 4)"
    )


def test_node_hosts_in_either_form_and_every_node_is_checked(tmp_path):
    ok = GOOD.replace(
        "network:\n",
        "network:\n  nodes: {R1: lab-r1.example.org, R2: {host: 198.18.0.2}, S1: '2001:db8::1',"
        " S2: S2, D1: lab_d1, D2: D2}\n",
    )
    base = load_plan(write(tmp_path, ok)).base
    assert [base.network.host_of(n) for n in ("R1", "R2", "S1", "D1", "X")] == [
        "lab-r1.example.org", "198.18.0.2", "2001:db8::1", "lab_d1", "X",
    ]  # fmt: skip
    assert base.model_dump()["network"]["nodes"]["R2"] == "198.18.0.2"  # recorded as before
    # a node no link, flow or capture uses is still checked
    bad = ok.replace("D2: D2}", "D2: D2, Z9: '999.1.1.1'}")
    message = error_of(tmp_path, bad)
    assert f"{tmp_path / 'exp.yml'}: key 'network.nodes.Z9.host': '999.1.1.1' is not " in message
    message = error_of(tmp_path, ok.replace("{host: 198.18.0.2}", "{host: 198.18.0.2, user: x}"))
    assert "unknown key 'network.nodes.R2.user'; allowed here: host (line 4)" in message


def test_a_node_host_that_the_topology_lacks_is_blamed_on_network_nodes(tmp_path):
    nodes = "{R1: lab-r1, R2: R2, S1: S1, S2: S2, D1: D1, D2: D2}"
    text = GOOD.replace("network:\n", f"network:\n  nodes: {nodes}\n")
    done = check(tmp_path, text)
    assert done.returncode == 2
    said = " ".join(done.stderr.split())
    assert (
        f"{tmp_path / 'exp.yml'}: key 'network.nodes.R1.host': 'lab-r1' (node R1) is not a host "
        "of the chain2 topology; its hosts are:"
    ) in said
    assert "key 'network.links[0]'" not in said  # not blamed on the links that use R1


@pytest.mark.parametrize(
    ("value", "ok"),
    [("eth0", True), ("enp2s0", True), ("vtnet0.100", True), ("em1", True),
     ("br-lan_2", True), ("a23456789012345", True),
     ("a234567890123456", False), ("0eth", False), ("eth0:1", False), ("a/b", False),
     ("eth 0", False), ("*", False), ("-i", False), ("eth0;reboot", False), ("", False),
     ("em1*", False), ("$IFACE", False)],
)  # fmt: skip
def test_interface_names_follow_linux_and_freebsd_rules(tmp_path, value, ok):
    text = GOOD.replace("interface: core", f"interface: {quoted(value)}")
    if ok:
        assert load_plan(write(tmp_path, text)).base.capture.points[1].interface == value
        return
    message = error_of(tmp_path, text)
    assert message == (
        f"{tmp_path / 'exp.yml'}: key 'capture.points[1].interface': {value!r} is not an "
        "interface name; a letter, then up to 14 letters, digits, _, . or - (Linux and FreeBSD: "
        "15 characters) (line 14)"
    )


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("{name: bottleneck,", "{name: VALUE,", "network.links[0].name"),
        ("between: [R1, R2]", "between: [R1, VALUE]", "network.links[0].between[1]"),
        ("name: first,", "name: VALUE,", "traffic[0].name"),
        ("from: S1, to: D1", "from: VALUE, to: D1", "traffic[0].from"),
        ("{name: before,", "{name: VALUE,", "capture.points[0].name"),
        ("link: access1, at: R1", "link: VALUE, at: R1", "capture.points[0].link"),
        ("node: R2,", "node: VALUE,", "capture.points[1].node"),
        ("topology: chain2", "topology: VALUE", "topology"),
        ("experiment: startup", "experiment: VALUE", "experiment"),
    ],
)
def test_every_name_is_a_plain_identifier(tmp_path, old, new, key):
    for value in ["$(reboot)", "a b", "x" * 33, "1a", "a-b"]:
        text = GOOD.replace(old, new.replace("VALUE", quoted(value)))
        assert text != GOOD
        message = error_of(tmp_path, text)
        assert f"{tmp_path / 'exp.yml'}: key '{key}': {value!r} is not a name; {NAME_RULE}" in (
            message
        ), message


def test_host_keys_cc_and_module_parameters_are_checked(tmp_path):
    path = tmp_path / "exp.yml"
    hosts = "hosts:\n  senders:"
    cases = [
        (GOOD.replace(hosts, "hosts:\n  '$(x)': {cc: reno}\n  senders:"),
         f"{path}: key 'hosts.$(x)': '$(x)' is not a node or group name; a letter or _, then up "
         "to 63 letters, digits or _ (all, senders, receivers, an inventory group or a node) "
         "(line 16)"),
        (GOOD.replace("cc: reno}", "cc: 'reno;reboot'}", 1),
         f"{path}: key 'traffic[0].cc': unknown congestion control 'reno;reboot'; allowed: "
         "reno, cubic, htcp, bbr, bic, dctcp, highspeed, hybla, illinois, lp, nv, scalable, "
         "vegas, veno, westwood, yeah, cdg (line 8)"),
        (GOOD.replace(hosts, "hosts:\n  all: {cc_params: {htcp: {'a;reboot': 1}}}\n  senders:"),
         f"{path}: key 'hosts.all.cc_params.htcp.a;reboot': 'a;reboot' is not a module "
         "parameter name; a C identifier of up to 64 letters, digits or _, as in "
         "/sys/module/tcp_<cc>/parameters/ (line 16)"),
        (GOOD.replace(hosts, "hosts:\n  all: {cc_params: {htcp: {a: '$(reboot)'}}}\n  senders:"),
         f"{path}: key 'hosts.all.cc_params.htcp.a': '$(reboot)' is not a module parameter "
         "value; give a whole number (-2147483648 to 4294967295) or a word of up to 64 letters, "
         "digits or _ . , + - (not starting with -) (line 16)"),
        (GOOD.replace(hosts, "hosts:\n  all: {cc_params: {htcp: {alpha: true}}}\n  senders:"),
         f"{path}: key 'hosts.all.cc_params.htcp.alpha': true is a boolean; give a whole number "
         "(-2147483648 to 4294967295) or a word of up to 64 letters, digits or _ . , + - (not "
         "starting with -), e.g. 1 or 0 (line 16)"),
        (GOOD.replace(hosts, "hosts:\n  all: {cc_params: {tahoe: {x: 1}}}\n  senders:"),
         f"{path}: key 'hosts.all.cc_params.tahoe': unknown congestion control 'tahoe'; allowed:"),
    ]  # fmt: skip
    for text, said in cases:
        assert said in error_of(tmp_path, text)
    fine = GOOD.replace(
        hosts, "hosts:\n  all: {cc_params: {htcp: {a: 0, b: Y, c: -1}}}\n  senders:"
    )
    params = load_plan(write(tmp_path, fine)).base.hosts["all"].cc_params
    assert params == {"htcp": {"a": 0, "b": "Y", "c": -1}}


@pytest.mark.parametrize(
    ("dscp", "said"),
    [("64", "64 is not a DSCP; give 0..63 or one of: cs0"),
     ("true", "true is a boolean, not a DSCP; give 0..63 or one of: cs0"),
     ("'ef;reboot'", "'ef;reboot' is not a DSCP; give 0..63 or one of: cs0"),
     ("[ef]", "[...] is not a DSCP") ],
)  # fmt: skip
def test_dscp_is_a_code_point_or_its_name(tmp_path, dscp, said):
    message = error_of(tmp_path, GOOD.replace("dscp: af11", f"dscp: {dscp}"))
    said = said.replace("[...]", "['ef']")
    assert f"{tmp_path / 'exp.yml'}: key 'traffic[2].dscp': {said}" in message, message


def test_marking_addresses_are_addresses_or_node_names(tmp_path):
    marking = "  marking:\n    - {at: S1, proto: tcp, dst: VALUE, dscp: ef}\ntraffic:"
    for value, ok in (("198.18.0.0/16", True), ("D1", True), ("'$(reboot)'", False),
                      ("'198.18.0.1;x'", False), ("'a b'", False)):  # fmt: skip
        text = GOOD.replace("traffic:", marking.replace("VALUE", value), 1)
        if ok:
            assert load_plan(write(tmp_path, text)).trials
            continue
        message = error_of(tmp_path, text)
        assert f"key 'network.marking[0].dst': {value.strip(chr(39))!r} is neither an IPv4" in (
            message
        ), message


def test_description_and_name_are_printable_text(tmp_path):
    message = error_of(
        tmp_path, GOOD.replace("topology:", 'description: "ok\\e[2Jcleared"\ntopology:')
    )
    assert (
        f"{tmp_path / 'exp.yml'}: key 'description': 'ok\\x1b[2Jcleared' holds the control "
        "character '\\x1b'; allowed: printable text, newlines and tabs (line 2)"
    ) in message
    text = GOOD.replace("topology:", 'description: "two\\nlines"\nname: one line\ntopology:')
    assert load_plan(write(tmp_path, text)).base.description == "two\nlines"
    message = error_of(tmp_path, GOOD.replace("topology:", 'name: "a\\u202eb"\ntopology:'))
    assert "key 'name': 'a\\u202eb' holds the control character '\\u202e'" in message


def test_factor_keys_name_elements_by_index_name_or_star(tmp_path):
    for key in ("traffic[$(x)].cc", "traffic[a b].cc", "traffic[].cc", "traffic[late].c c"):
        text = GOOD.replace("traffic[late].start: [0s, 15s]", f"{quoted(key)}: [reno]")
        message = error_of(tmp_path, text)
        assert f"key 'factors.{key}': {key!r} is not a key; write dotted names" in message


def test_names_from_the_file_never_hold_what_a_shell_reads(tmp_path):
    """Every identifier the schema accepted in the shipped files is plain: the runner may
    put it on a command line or in a file name (quoting is still the runner's duty)."""
    project = Path(__file__).resolve().parents[2]
    for path in sorted((project / "experiments").glob("*.yml")):
        for trial in load_plan(path).trials:
            exp = trial.experiment
            names = [*exp.nodes(), *exp.generator_names(), exp.experiment, exp.topology]
            names += [p.name for p in exp.capture.points] + [lk.name for lk in exp.network.links]
            names += [p.interface for p in exp.capture.points if p.interface]
            for name in names:
                assert name.replace("_", "").replace(".", "").replace("-", "").isalnum(), name


def test_a_message_keeps_one_problem_per_line_whatever_the_file_holds(tmp_path):
    text = GOOD.replace(
        "hosts.senders.initcwnd: [1, 3, 10]", 'hosts.senders.initcwnd: [1, "a\\nb"]'
    )
    plan = load_plan(write(tmp_path, text))
    with pytest.raises(SpecError) as exc:
        plan.select(None)
    (line,) = str(exc.value).splitlines()
    assert line.startswith(
        f"{tmp_path / 'exp.yml'}: key 'hosts.senders.initcwnd': 'a\\nb' is not a whole number; "
    )
    assert "(in the trial with hosts.senders.initcwnd=a\\nb, traffic[late].start=" in line
    message = error_of(tmp_path, GOOD.replace("hosts:\n", 'hosts:\n  "x\\ny": {cc: reno}\n'))
    assert f"{tmp_path / 'exp.yml'}: key 'hosts.x\\ny': 'x\\ny' is not a node or group name" in (
        message
    )
