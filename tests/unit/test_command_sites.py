"""Every place where core, collect, analysis or trials hand a command to a rack host is found
(tests/unit/command_sites.py reads their source), and each command there is built by
core/command.py; the finder itself is shown code that builds commands otherwise and must
name each such place."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from tests.unit.command_sites import Checker, Module, constructions, load, script_sources

MODULES = load()
CHECKER = Checker(MODULES)
# Modules that send commands to hosts today: the finder must find sites in each (a finder
# that stopped seeing calls would otherwise pass).
SENDING = {
    "core/daemons.py", "core/rack.py", "collect/fetch.py", "trials/adaptive_marking.py",
    "trials/batch_worker.py", "trials/configure.py", "trials/generators/bulk_tcp.py",
    "trials/generators/cbr_udp.py", "trials/generators/transaction.py",
    "trials/generators/web_poisson.py", "trials/preflight/clocks.py",
    "trials/preflight/facts.py", "trials/preflight/reach.py", "trials/runner.py",
    "trials/status.py", "trials/udp_stream.py",
}  # fmt: skip


def test_every_command_handed_to_a_host_is_built_by_core_command():
    sites = [s for m in MODULES.values() for s in CHECKER.sites(m)]
    bad = [str(s) for s in sites if not s.ok]
    assert not bad, "\n".join(bad)
    assert {s.path for s in sites} == SENDING, "sites found: " + ", ".join(
        sorted({s.path for s in sites})
    )
    sinks = {s.sink.rsplit(".", 1)[-1] for s in sites}
    assert sinks == {"run", "run_parallel", "spawn", "login_command", "exec_command"}


def test_functions_typed_as_returning_commands_return_built_ones():
    """The finder trusts a return type of Command: each such function's returns are checked
    the same way (the recorders, snapshot commands, program commands, ...)."""
    checked = [s for m in MODULES.values() for s in CHECKER.returns(m)]
    bad = [str(s) for s in checked if not s.ok]
    assert not bad, "\n".join(bad)
    assert len({s.sink for s in checked}) >= 10  # every helper that makes a command


def test_script_sources_are_constants_and_only_core_command_makes_a_command():
    scripts = [s for m in MODULES.values() for s in script_sources(m)]
    assert scripts and all(s.ok for s in scripts), "\n".join(map(str, scripts))
    made = [str(s) for m in MODULES.values() for s in constructions(m)]
    assert not made, "\n".join(made)


BAD = {
    "f-string": "rack.run(host, f'tc qdisc show dev {iface}')",
    "concatenation": "rack.run(host, 'cat ' + path)",
    "constant": "rack.run(host, 'true')",
    "str.join": "rack.run(host, ' && '.join(parts))",
    "shlex.join": "rack.run(host, shlex.join(['rm', '-rf', path]))",
    "untyped helper": "rack.run(host, untyped(path))",
    "helper lying about its type": "rack.run(host, lying(path))\n---\n"
    "def lying(path) -> Command:\n    return f'cat {path}'\n",
    "name bound twice": "c = command('true')\nc = f'{c}; reboot'\nrack.run(host, c)",
    "name extended": "c = command('true')\nc += '; reboot'\nrack.run(host, c)",
    "mapping value": "cmds = {}\ncmds[host] = f'ls {path}'\nrack.run_parallel(cmds)",
    "mapping update": "cmds = {}\ncmds.update({host: 'ls'})\nrack.run_parallel(cmds)",
    "mapping comprehension": "rack.run_parallel({h: f'ls {h}' for h in hosts})",
    "lambda default": "steps = [lambda c=c: rack.run(host, c) for c in ['a', 'b']]",
    "loop variable": "for c in [command('a'), 'b']:\n    rack.run(host, c)",
    "spawned text": "daemons.spawn(host, 'x', f'iperf3 -c {dst}')",
    "unknown receiver": "other.run(host, command('true'))",
    "login text": "conn.client.exec_command('true')",
    "script from values": "rack.run(host, script(f'ls {path}'))",
    "made by hand": "rack.run(host, Command('reboot', 0, key=None))",
}
GOOD = {
    "words": "rack.run(host, command('tc', 'qdisc', 'show', 'dev', iface))",
    "joined": "rack.run(host, and_then(command('a'), command('b')))",
    "typed helper": "rack.run(host, typed(path))",
    "mapping": "cmds = {}\ncmds[host] = command('ls', path)\nrack.run_parallel(cmds)",
    "items": "cmds = {h: command('ls') for h in hosts}\n"
    "steps = [lambda c=c: rack.run(h, c) for h, c in cmds.items()]",
    "script": "rack.run(host, script(LOOP, path))",
}
HEADER = """
import shlex
from core.command import Command, and_then, command, script

LOOP = 'for p in "$1"/*; do echo "$p"; done'


def untyped(path):
    return command('cat', path)


def typed(path) -> Command:
    return command('cat', path)


def site(rack, daemons, other, conn, host, iface, path, parts, hosts, dst):
"""


def findings(case: str) -> list[str]:
    """What the finder says of a module of HEADER, `case`'s body in site() and what follows
    its `---` at the module's top level."""
    body, _, top = case.partition("\n---\n")
    source = HEADER + textwrap.indent(body, "    ") + "\n\n\n" + top
    module = Module(Path("trials/site.py"), ast.parse(source))
    checker = CHECKER.extended("trials.site", module)
    found = [*checker.sites(module), *checker.returns(module), *script_sources(module)]
    return [str(s) for s in [*found, *constructions(module)] if not s.ok]


@pytest.mark.parametrize("case", BAD)
def test_a_command_built_otherwise_is_named_with_its_line(case):
    bad = findings(BAD[case])
    assert bad and all(b.startswith("trials/site.py:") for b in bad), bad
    if case == "helper lying about its type":
        assert any("lying -> Command: returns f'cat {path}'" in b for b in bad), bad


@pytest.mark.parametrize("case", GOOD)
def test_commands_built_by_core_command_pass(case):
    assert findings(GOOD[case]) == []
