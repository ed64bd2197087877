"""Every command the runner hands to a rack host is built here, from words.

`command(*words)` is the one function that turns values into shell text: each word is quoted
for sh (shlex.quote), so a name from an experiment file, a path from the inventory or a trial's
name reaches the host as that one word and nothing else. Commands are joined (&&, ||, ;, |),
grouped and redirected only by the functions below, which take only built commands and quote
every file name they are given; fixed shell text (a loop, a test) is `script`'s constant
source, whose values arrive as positional parameters ("$1"), never pasted into it.
tests/unit/test_command_sites.py finds every place where a command is handed to a host and
checks that it comes from here; core.remote_shell then carries it past the login shell.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

_BUILT = object()  # only this module makes a Command
# How tightly a command binds, as sh parses it: a simple command (or a { } group), a
# pipeline, an and-or list, a list separated by ;.
_SIMPLE, _PIPELINE, _AND_OR, _LIST = range(4)
STDOUT = "&1"  # redirected(..., stderr=STDOUT): 2>&1
DEV_NULL = "/dev/null"


class Command(str):
    """A command line for a host's POSIX shell, made by this module's functions only (any
    other str, an f-string of one included, is not a Command)."""

    level: int
    joiner: str
    plain: bool  # words (and redirections) only: `exec` can run it

    def __new__(
        cls, text: str, level: int, joiner: str = "", plain: bool = False, *, key: object = None
    ) -> Command:
        if key is not _BUILT:
            raise TypeError("a Command is built by core.command's functions, from words")
        made = super().__new__(cls, text)
        made.level, made.joiner, made.plain = level, joiner, plain
        return made

    def exec_text(self) -> str:
        """The text a shell runs as this command's own process: `exec` of a plain command,
        else the list itself (the shell's process is then its own)."""
        return f"exec {self}" if self.plain else str(self)


def _word(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | os.PathLike):
        raise TypeError(f"a command word is a str, int or path, not {type(value).__name__}")
    text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if "\x00" in text:
        raise ValueError(f"{text!r}: a command word cannot hold a NUL character")
    return text


def command(*words: str | int | os.PathLike[str]) -> Command:
    """The command of these words, each quoted for sh: `command("tc", "-s", "qdisc", "show",
    "dev", iface)`."""
    if not words:
        raise ValueError("a command has at least one word")
    return Command(shlex.join(_word(w) for w in words), _SIMPLE, plain=True, key=_BUILT)


def script(source: str, *args: str | int | os.PathLike[str]) -> Command:
    """`source` (fixed shell text, a constant of its module) run by sh with `args` as its
    positional parameters $1, $2, ...: the values are words, never part of the text."""
    return command("sh", "-c", source, "sh", *args)


def built(cmd: Any) -> Command:
    """`cmd`, which must be a built command (else TypeError: its text would be run as is)."""
    if not isinstance(cmd, Command):
        raise TypeError(f"{str(cmd)[:80]!r} is not a built command (core.command.command)")
    return cmd


def _operand(cmd: Command, level: int, joiner: str) -> str:
    built(cmd)
    if cmd.level > level or (cmd.level == level and cmd.joiner != joiner):
        return f"{{ {cmd}; }}"
    return cmd


def _joined(cmds: tuple[Command, ...], level: int, joiner: str) -> Command:
    if not cmds:
        raise ValueError(f"nothing to join with {joiner.strip()!r}")
    if len(cmds) == 1:
        return built(cmds[0])
    text = joiner.join(_operand(c, level, joiner) for c in cmds)
    return Command(text, level, joiner, key=_BUILT)


def and_then(*cmds: Command) -> Command:
    """Each command once the one before it succeeded (&&)."""
    return _joined(cmds, _AND_OR, " && ")


def or_else(*cmds: Command) -> Command:
    """Each command only if the one before it failed (||)."""
    return _joined(cmds, _AND_OR, " || ")


def sequence(*cmds: Command) -> Command:
    """The commands one after the other, whatever each returns (;); the last one's status."""
    return _joined(cmds, _LIST, "; ")


def pipeline(*cmds: Command) -> Command:
    """Each command's output into the next one's input (|)."""
    return _joined(cmds, _PIPELINE, " | ")


def group(cmd: Command) -> Command:
    """`{ cmd; }`: one command, for a redirection or an operator of another level."""
    return Command(f"{{ {built(cmd)}; }}", _SIMPLE, key=_BUILT)


def redirected(
    cmd: Command,
    stdout: str | None = None,
    *,
    append: bool = False,
    stderr: str | None = None,
) -> Command:
    """`cmd` with its output into the file `stdout` (appended with `append`) and its errors
    into the file `stderr` (STDOUT: where its output goes; DEV_NULL: nowhere)."""
    cmd = built(cmd)
    text = str(cmd if cmd.level == _SIMPLE else group(cmd))
    if stdout is not None:
        text += f" {'>>' if append else '>'} {shlex.quote(_word(stdout))}"
    if stderr == STDOUT:
        text += " 2>&1"
    elif stderr is not None:
        text += f" 2> {shlex.quote(_word(stderr))}"
    return Command(text, _SIMPLE, plain=cmd.plain, key=_BUILT)
