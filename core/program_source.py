"""The source text of a Python program sent to a host (`python3 -c SOURCE`) with the core
modules it imports carried inside it: the host has no checkout, and the program reads the
same rules as the controller (core/link_rules.py, core/ipfw_text.py) instead of a copy.

The text is the program's own with a prologue before its first statement (after its
docstring and __future__ imports): it puts each core module the program imports, directly or
through another core module, into sys.modules, built from that module's source, so that the
program's own `from core.X import ...` finds it. A module already imported (the controller's
interpreter, where the tests run the text) is left as it is. Carried modules may import only
the standard library and core.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE_DIR = Path(__file__).resolve().parent

_PROLOGUE = """\
def _carry_core_modules(sources):
    import sys
    import types

    package = sys.modules.setdefault("core", types.ModuleType("core"))
    if not hasattr(package, "__path__"):
        package.__path__ = []
    for name, source in sources.items():
        if name not in sys.modules:
            module = sys.modules[name] = types.ModuleType(name)
            module.__file__ = name.replace(".", "/") + ".py"  # where it came from, relative
            exec(compile(source, module.__file__, "exec"), module.__dict__)
        setattr(package, name.split(".", 1)[1], sys.modules[name])


_carry_core_modules({sources})
del _carry_core_modules
"""


def core_imports(source: str) -> list[str]:
    """The core modules a source imports (core.X), in the order it names them."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "core":
                names += [f"core.{alias.name}" for alias in node.names]
            elif node.module.startswith("core."):
                names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names if alias.name.startswith("core.")]
    return list(dict.fromkeys(names))


def carried_modules(source: str) -> dict[str, str]:
    """{module name: its source} of every core module `source` needs, each after those it
    imports."""
    out: dict[str, str] = {}
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in out or name in visiting:
            return
        visiting.add(name)
        text = (CORE_DIR / f"{name.removeprefix('core.')}.py").read_text()
        for dependency in core_imports(text):
            visit(dependency)
        out[name] = text

    for name in core_imports(source):
        visit(name)
    return out


def program_source(path: Path) -> str:
    """The program at `path` as one text that runs where no core package is installed."""
    source = path.read_text()
    modules = carried_modules(source)
    if not modules:
        return source
    body = ast.parse(source).body
    first = next(
        (
            node
            for i, node in enumerate(body)
            if not (
                (i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
                or (isinstance(node, ast.ImportFrom) and node.module == "__future__")
            )
        ),
        None,
    )
    lines = source.splitlines(keepends=True)
    if first is None:
        at = len(lines)
    else:  # a decorated statement starts at its first decorator
        at = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))]) - 1
    prologue = _PROLOGUE.replace("{sources}", repr(modules))
    return "".join(lines[:at]) + prologue + "".join(lines[at:])
