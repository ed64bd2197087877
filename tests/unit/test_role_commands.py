"""The roles hand values (a trial's interfaces, congestion controls and their parameters, the
inventory's directories, names) to a host's shell only as quoted words: in every free-form
`ansible.builtin.shell`, `command` or `raw` of the roles and playbooks, and in every shell
script a role renders, each value a Jinja expression prints goes through `quote` (or
`map('quote')`), is a role variable (vars/) whose own text passes this same rule, is the
test of a condition, or is a template loop's constant. A task that needs no shell takes
`argv:` (not checked: each item is one word). The check reads the files (Jinja's own parser);
a test below shows it what it must refuse."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest
import yaml
from jinja2 import nodes

PROJECT = Path(__file__).resolve().parents[2]
MODULES = {"ansible.builtin.shell", "ansible.builtin.command", "ansible.builtin.raw",
           "shell", "command", "raw"}  # fmt: skip
# Shell scripts a role renders (the other templates are ipfw, tc, nftables or config files,
# read by their own programs, not by a shell).
SHELL_TEMPLATES = sorted(
    p for p in PROJECT.glob("roles/*/templates/*.j2") if p.read_text().startswith("#!/bin/sh")
)
# Printed into a comment only: Ansible's own banner.
HARMLESS = {"ansible_managed"}
NUMBERS = {"length", "count", "int", "float"}
ENV = jinja2.Environment()


def role_vars(role: Path) -> dict[str, object]:
    """A role's vars/ files: its own values (a user does not set them)."""
    out: dict[str, object] = {}
    for path in sorted((role / "vars").glob("*.yml")):
        out.update(yaml.safe_load(path.read_text()) or {})
    return out


def unquoted(text: str, known: dict[str, object], seen: frozenset[str] = frozenset()) -> list[str]:
    """The values `text` (a Jinja template of shell text) prints without quoting them."""
    tree = ENV.parse(text)
    constant_loops = {
        name.name
        for loop in tree.find_all(nodes.For)
        if isinstance(loop.iter, nodes.List | nodes.Tuple)
        and all(isinstance(n, nodes.Const) for n in loop.iter.find_all(nodes.Const))
        and not list(loop.iter.find_all(nodes.Name))
        for name in loop.target.find_all(nodes.Name)
    }
    bad = []
    for output in tree.find_all(nodes.Output):
        for expr in output.nodes:
            if isinstance(expr, nodes.TemplateData):
                continue
            bad += [f"{{{{ {_show(expr)} }}}}: {why}" for why in _names(expr, known, seen,
                                                                       constant_loops)]  # fmt: skip
    return bad


def _show(expr: nodes.Node) -> str:
    return type(expr).__name__ if not hasattr(expr, "name") else str(expr.name)


def _names(expr, known, seen, loops, quoted: bool = False) -> Iterator[str]:
    if isinstance(expr, nodes.Filter):
        is_quote = expr.name == "quote" or (
            expr.name == "map"
            and expr.args
            and isinstance(expr.args[0], nodes.Const)
            and expr.args[0].value == "quote"
        )
        number = expr.name in NUMBERS  # a count or a number: nothing for a shell to read
        yield from _names(expr.node, known, seen, loops, quoted or is_quote or number)
        for arg in expr.args:
            yield from _names(arg, known, seen, loops, True)  # a filter's own arguments
        return
    if isinstance(expr, nodes.CondExpr):  # its test only chooses
        yield from _names(expr.expr1, known, seen, loops, quoted)
        if expr.expr2 is not None:
            yield from _names(expr.expr2, known, seen, loops, quoted)
        return
    if isinstance(expr, nodes.Name):
        if quoted or expr.name in HARMLESS or expr.name in loops:
            return
        value = known.get(expr.name)
        if isinstance(value, str) and expr.name not in seen:  # shell text of the role
            for why in unquoted(value, known, seen | {expr.name}):
                yield f"{expr.name} (vars): {why}"
            return
        yield f"{expr.name} is printed unquoted"
        return
    if isinstance(expr, nodes.Getattr | nodes.Getitem) and not quoted:
        yield f"{_dotted(expr)} is printed unquoted"
        return
    for child in expr.iter_child_nodes():
        yield from _names(child, known, seen, loops, quoted)


def _dotted(expr: nodes.Node) -> str:
    if isinstance(expr, nodes.Getattr):
        return f"{_dotted(expr.node)}.{expr.attr}"
    if isinstance(expr, nodes.Getitem):
        return f"{_dotted(expr.node)}[...]"
    return getattr(expr, "name", type(expr).__name__)


def shell_tasks() -> Iterator[tuple[str, str, str, Path]]:
    """(file, task name, command text, role) of every free-form shell/command/raw task."""
    files = [*PROJECT.glob("roles/*/tasks/*.yml"), *PROJECT.glob("roles/*/handlers/*.yml")]
    files += PROJECT.glob("playbooks/*.yml")
    for path in sorted(files):
        role = path.parents[1] if path.parts[-3] == "roles" or "roles" in path.parts else PROJECT
        data = yaml.safe_load(path.read_text()) or []
        for task, vars_ in _tasks(data, {}):
            for module in MODULES & set(task):
                given = task[module]
                text = given.get("cmd") if isinstance(given, dict) else given
                if isinstance(text, str):
                    yield f"{path.relative_to(PROJECT)}: {task.get('name')}", text, role, vars_


def _tasks(items: list, vars_: dict) -> Iterator[tuple[dict, dict]]:
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        own = {**vars_, **(item.get("vars") or {})}
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            yield from _tasks(item.get(key), own)
        yield item, own


SHELL_TASKS = list(shell_tasks())


@pytest.mark.parametrize(
    ("where", "text", "role", "vars_"), SHELL_TASKS, ids=[t[0] for t in SHELL_TASKS]
)
def test_a_tasks_shell_text_quotes_every_value(where, text, role, vars_):
    bad = unquoted(text, {**role_vars(role), **vars_})
    assert not bad, f"{where}: " + "; ".join(bad)


@pytest.mark.parametrize("path", SHELL_TEMPLATES, ids=[p.name for p in SHELL_TEMPLATES])
def test_a_rendered_shell_script_quotes_every_value(path):
    bad = unquoted(path.read_text(), role_vars(path.parents[1]))
    assert not bad, f"{path.relative_to(PROJECT)}: " + "; ".join(bad)


def test_the_check_sees_the_roles_shell_tasks():
    roles = {Path(w.split(":")[0]).parts[1] for w, *_ in SHELL_TASKS if w.startswith("roles/")}
    assert {"linux_router", "freebsd_router", "testbed_host", "dscp_marker"} <= roles
    assert {p.name for p in SHELL_TEMPLATES} >= {"trialbed-select-cc.j2", "delay-rules.j2"}


@pytest.mark.parametrize(
    ("text", "known"),
    [
        ("tc qdisc show dev {{ link.iface }}", {}),
        ("echo {{ item.value | quote }} > /sys/module/{{ item.key }}", {}),
        ("for m in {{ ccs | join(' ') }}; do :; done", {}),
        ("{{ show }}", {"show": "tc qdisc show dev {{ iface }}"}),  # a role's shell text
        ("{{ 'x' if on else 'rm ' ~ path }}", {}),
        ("{{ dir }}/delay-rules check", {}),
        ("{{ ('rm ' ~ path) | upper }}", {}),
    ],
)
def test_the_check_refuses_a_value_printed_unquoted(text, known):
    assert unquoted(text, known)


@pytest.mark.parametrize(
    "text",
    [
        "tc qdisc show dev {{ link.iface | quote }}",
        "for m in {{ ccs | map('quote') | join(' ') }}; do :; done",
        "{{ 'true' if ansible_check_mode else 'rm -f \"$f\"' }}",
        "{% for k, c in [('a', ''), ('b', 'x ')] %}ipfw {{ c }}delete{% endfor %}",
        "{{ (dir ~ '/delay-rules') | quote }} check",
    ],
)
def test_the_check_lets_quoted_values_through(text):
    assert unquoted(text, {}) == []


RENDER = """
- name: Render the roles' shell texts with hostile values
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Load the roles' own values
      ansible.builtin.include_vars: "{{ item }}"
      loop: "{{ role_vars }}"
    - name: Write the shell texts
      ansible.builtin.copy:
        dest: "{{ out }}/texts.json"
        content: >-
          {{ {'apply': __linux_router_apply_shaping, 'show': __linux_router_tc_show,
              'delayline': __linux_router_delayline_args, 'nft': __dscp_marker_show} | to_json }}
        mode: "0644"
    - name: Render the switch scripts
      ansible.builtin.template:
        src: "{{ roles }}/{{ item.src }}"
        dest: "{{ out }}/{{ item.dest }}"
        mode: "0755"
      loop:
        - {src: linux_router/templates/trialbed-select-shaping.j2, dest: select-shaping}
        - {src: testbed_host/templates/trialbed-select-cc.j2, dest: select-cc}
"""


def test_rendered_shell_texts_hand_hostile_values_over_as_one_word(tmp_path):
    """Rendered by Ansible itself with an interface, a directory, a table and a congestion
    control holding shell syntax: every program (stubbed: each prints its arguments one per
    line) gets each value as one argument, and nothing of the values runs."""
    import json
    import os
    import subprocess
    import sys

    pwned = tmp_path / "pwned"
    iface, table, cc = f"a b;$(touch {pwned})", f"t`touch {pwned}`", f"x';touch {pwned};'"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("tc", "nft", "sysctl"):
        (bin_dir / program).write_text('#!/bin/sh\nprintf "%s\\n" "$0" "$@"\n')
        (bin_dir / program).chmod(0o755)
    variables = {
        "out": str(tmp_path), "roles": str(PROJECT / "roles"),
        "role_vars": [str(PROJECT / f"roles/{r}/vars/main.yml") for r in
                      ("linux_router", "dscp_marker", "testbed_host")
                      if (PROJECT / f"roles/{r}/vars/main.yml").exists()],
        "linux_router_links": [{"iface": iface, "rate": "1mbit", "buffer": "60000B",
                                "delay_ms": 25, "qdisc": "droptail"}],
        "linux_router_links_choices": [[], []], "linux_router_dir": str(tmp_path / "r d"),
        "remote_daemons_bin_dir": str(bin_dir), "remote_daemons_hostside_dir": str(tmp_path),
        "linux_router_delayline_python": "python3", "__linux_router_backend": "nfqueue",
        "__testbed_host_cc_selectable": ["reno", cc], "testbed_host_dir": str(tmp_path),
        "dscp_marker_table": table, "dscp_marker_dir": str(tmp_path),
        "ansible_python_interpreter": sys.executable,
    }  # fmt: skip
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    (tmp_path / "play.yml").write_text(RENDER)
    env = {**os.environ, "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(
        [str(PROJECT / ".venv/bin/ansible-playbook"), "-i", "localhost,",
         str(tmp_path / "play.yml"), "-e", f"@{tmp_path / 'vars.json'}"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    texts = json.loads((tmp_path / "texts.json").read_text())
    path = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run(*argv: str) -> list[str]:
        ran = subprocess.run(argv, capture_output=True, text=True, env=path, check=False)
        return ran.stdout.splitlines()

    assert iface in run("sh", "-c", texts["show"])
    assert table in run("sh", "-c", texts["nft"])
    assert str(tmp_path / "r d") in run("sh", "-c", f"printf '%s\\n' {texts['delayline']}")
    assert (
        subprocess.run(["sh", "-n", str(tmp_path / "select-shaping")], check=False).returncode == 0
    )
    assert run("sh", str(tmp_path / "select-cc"), cc)[-1] == f"net.ipv4.tcp_congestion_control={cc}"
    assert run("sh", str(tmp_path / "select-cc"), "nope") == []  # refused
    assert not pwned.exists()
