"""core/command.py: any words reach the program as themselves, and a tree of joined commands
runs as the tree says, whatever its operators' precedence in sh; nothing but a built command
is joined, and nothing makes a Command but the module's functions. Run by /bin/sh, as the
host's POSIX shell runs them (core.remote_shell carries them past the login shell)."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.command import (
    DEV_NULL,
    STDOUT,
    Command,
    and_then,
    command,
    group,
    or_else,
    pipeline,
    redirected,
    script,
    sequence,
)

WORDS = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
HOSTILE = ["$(touch pwned)", "`touch pwned`", "; touch pwned", "a'b", 'a"b', "\\", "-n", "*",
           "~", "a\nb", "${IFS}", "!", "&&", "|", ">x", "#", " ", ""]  # fmt: skip
SETTINGS = settings(deadline=timedelta(seconds=5), database=None)


def sh(cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, cwd=cwd, check=False)


@settings(SETTINGS, max_examples=60)
@given(st.lists(WORDS | st.sampled_from(HOSTILE), min_size=1, max_size=6))
def test_every_word_reaches_the_program_as_itself(words):
    done = sh(command("printf", "%s\\0", *words))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split("\0")[:-1] == words


def test_nothing_a_word_holds_runs(tmp_path):
    for word in HOSTILE:
        assert sh(command("echo", word), cwd=tmp_path).returncode == 0
        assert sh(script('echo "$1" "$2"', word, word), cwd=tmp_path).returncode == 0
    assert list(tmp_path.iterdir()) == []  # no `touch pwned` ran
    out = tmp_path / "$(touch pwned) x"
    assert sh(redirected(command("echo", "hi"), str(out)), cwd=tmp_path).returncode == 0
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


# A tree of joined commands: a leaf prints its word and ends with its status.
leaves = st.tuples(st.sampled_from("abcdef"), st.sampled_from([0, 0, 1]))
trees = st.recursive(
    leaves,
    lambda inner: st.tuples(
        st.sampled_from(["and", "or", "seq", "group", "quiet"]),
        st.lists(inner, min_size=1, max_size=3),
    ),
    max_leaves=8,
)
JOIN = {"and": and_then, "or": or_else, "seq": sequence}


def build(tree) -> Command:
    if isinstance(tree[0], str) and len(tree[0]) == 1:
        word, status = tree
        return and_then(command("printf", word), command("false" if status else "true"))
    op, parts = tree
    if op == "group":
        return group(sequence(*map(build, parts)))
    if op == "quiet":  # its output nowhere
        return redirected(sequence(*map(build, parts)), DEV_NULL, stderr=STDOUT)
    return JOIN[op](*map(build, parts))


def evaluate(tree) -> tuple[str, int]:
    """What sh prints and returns for the tree, as its operators say."""
    if isinstance(tree[0], str) and len(tree[0]) == 1:
        return tree
    op, parts = tree
    if op in ("group", "quiet", "seq"):
        out, status = "", 0
        for part in parts:
            printed, status = evaluate(part)
            out += printed
        return ("" if op == "quiet" else out), status
    out, status = evaluate(parts[0])
    for part in parts[1:]:
        if (status == 0) == (op == "and"):
            printed, status = evaluate(part)
            out += printed
    return out, status


@settings(SETTINGS, max_examples=80)
@given(trees)
def test_a_tree_of_commands_runs_as_the_tree_says(tree):
    done = sh(build(tree))
    assert (done.stdout.decode(), done.returncode) == evaluate(tree), build(tree)


def test_a_pipeline_and_a_list_keep_their_meaning_inside_each_other():
    count = pipeline(sequence(command("echo", "a"), command("echo", "b")), command("wc", "-l"))
    assert sh(count).stdout.split() == [b"2"]
    assert sh(and_then(command("false"), count)).stdout == b""  # && binds the whole pipeline
    both = redirected(sequence(command("echo", "a"), command("ls", "/nonexistent")), DEV_NULL)
    assert sh(both).stdout == b"" and sh(both).stderr  # > takes the group's output only


def test_only_built_commands_are_joined_and_only_the_module_makes_them():
    with pytest.raises(TypeError, match="not a built command"):
        and_then(command("true"), "rm -rf /")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a built command"):
        redirected(f"{command('true')}; reboot", "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"built by core\.command"):
        Command("reboot", 0)
    with pytest.raises(TypeError, match="not bool"):
        command("sleep", True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not float"):
        command("sleep", 0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NUL"):
        command("echo", "a\x00b")
    with pytest.raises(ValueError, match="at least one word"):
        command()
    assert not isinstance(command("a") + "; b", Command)  # a str operation gives a str


def test_exec_text_execs_a_plain_command_only():
    assert command("sleep", 1).exec_text() == "exec sleep 1"
    assert redirected(command("tcpdump"), "x.pcap").exec_text() == "exec tcpdump > x.pcap"
    listed = sequence(command("sleep", 1), command("nft", "delete", "table", "inet", "t"))
    assert listed.exec_text() == "sleep 1; nft delete table inet t"
    assert group(command("a")).exec_text() == "{ a; }"
