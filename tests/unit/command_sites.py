"""Where the product hands a command to a rack host, and whether that command was built by
core/command.py, read from the source (ast) of core, collect, analysis and trials.

A call site is a call of Rack.run or Rack.run_parallel, Daemons.spawn, Host.login_command, or
of what carries a login command over SSH (a Fabric connection's run, paramiko's exec_command).
Its command is built when it is a call of core.command's functions, a call of a function whose
return type says Command (whose own returns are checked the same way), or a name, loop
variable, lambda default or mapping value bound only to such values. Anything else (an
f-string, a +, a str.join, a constant) is reported with its file and line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "collect", "analysis", "trials")
BUILDER = "core/command.py"
BUILDERS = frozenset(
    {"command", "script", "and_then", "or_else", "sequence", "pipeline", "group", "redirected",
     "built"}
)  # fmt: skip
# The receivers of .run / .run_parallel / .spawn calls: those that reach a rack host, and
# those that do not (every other receiver is a finding until it is put in one of them).
RACKS = frozenset({"rack", "self.rack", "self.ctx.rack"})
DAEMONS = frozenset({"daemons", "self.ctx.daemons"})
NOT_HOSTS = frozenset(
    {("run", "subprocess"), ("run", "queries"), ("run", "self.queries"), ("run", "runner"),
     ("run", "cli_results"), ("run", "cli_record"), ("run", "commands"),
     ("spawn", "np.random.SeedSequence([seed, stream])")}
)  # fmt: skip
# (method, position of the command, keyword of the command, what it must be)
SINKS = {
    "run": (1, "command", "command"),
    "run_parallel": (0, "commands", "mapping"),
    "spawn": (2, "program", "command"),
    "login_command": (0, "command", "command"),
    "exec_command": (0, "command", "login"),
}
MUTATORS = frozenset({"update", "setdefault", "append", "insert", "extend"})
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ListComp, ast.SetComp,
          ast.DictComp, ast.GeneratorExp, ast.Module)  # fmt: skip


@dataclass
class Site:
    path: str
    line: int
    sink: str  # method.receiver
    ok: bool
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.sink}: {self.why}"


class Module:
    def __init__(self, path: Path, tree: ast.Module):
        self.path, self.tree = path, tree
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.imports: dict[str, tuple[str, str]] = {}  # name -> (module, name there)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)

    @property
    def name(self) -> str:
        return ".".join(self.path.with_suffix("").parts)

    def scopes(self, node: ast.AST) -> Iterator[ast.AST]:
        """The scopes in which a name at `node` is looked up, innermost first: a default
        value or a comprehension's first iterable is evaluated outside its own scope."""
        path = [node]
        while node in self.parent:
            node = self.parent[node]
            path.append(node)
            if not isinstance(node, SCOPES):
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                if node.args in path:
                    continue
            elif (
                not isinstance(node, ast.Module)
                and len(path) >= 3
                and path[-3] is node.generators[0].iter
            ):
                continue
            yield node

    def enclosing_class(self, node: ast.AST) -> str | None:
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, ast.ClassDef):
                return node.name
        return None


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a scope, not those of the scopes inside it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _is_def(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name


def _targets(target: ast.AST) -> Iterator[tuple[str, int | None]]:
    """(name, index in the unpacked tuple or None) of an assignment or loop target."""
    if isinstance(target, ast.Name):
        yield target.id, None
    elif isinstance(target, ast.Tuple):
        for i, elt in enumerate(target.elts):
            if isinstance(elt, ast.Name):
                yield elt.id, i


class Checker:
    """Decides, for an expression of one module, whether it is a built command (cmd), a
    mapping of them (cmd_map), an iterable of them (cmd_iter), or an iterable of tuples with
    one at a position (cmd_at)."""

    def __init__(self, modules: dict[str, Module]):
        self.modules: dict[str, Module] = {}
        self.functions: dict[str, list[tuple[Module, ast.FunctionDef]]] = {}
        for name, module in modules.items():
            self.add(name, module)

    def extended(self, name: str, module: Module) -> Checker:
        """This checker with one more module (the others are not read again)."""
        other = Checker({})
        other.modules = dict(self.modules)
        other.functions = {k: list(v) for k, v in self.functions.items()}
        other.add(name, module)
        return other

    def add(self, name: str, module: Module) -> None:
        self.modules[name] = module
        for node in ast.walk(module.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions.setdefault(node.name, []).append((module, node))

    # -- annotations ------------------------------------------------------------------------

    @staticmethod
    def _is_cmd_type(ann: ast.AST | None) -> bool:
        return ann is not None and ast.unparse(ann) in ("Command", "Command | None")

    def _ann(self, ann: ast.AST | None, kind: str, pos: int | None = None) -> bool:
        if ann is None:
            return False
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):  # X | None
            sides = [s for s in (ann.left, ann.right) if ast.unparse(s) != "None"]
            return len(sides) == 1 and self._ann(sides[0], kind, pos)
        if kind == "cmd":
            return self._is_cmd_type(ann)
        if not isinstance(ann, ast.Subscript):
            return False
        outer = ast.unparse(ann.value).rsplit(".", 1)[-1]
        args = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if kind == "map":
            return outer in ("dict", "Mapping") and len(args) == 2 and self._is_cmd_type(args[1])
        if kind == "iter":
            return outer in ("list", "tuple", "Iterable", "Iterator", "Sequence") and (
                self._is_cmd_type(args[0])
            )
        if kind == "callable":
            return outer == "Callable" and len(args) == 2 and self._is_cmd_type(args[1])
        if kind == "at" and outer in ("list", "Iterable", "Iterator", "Sequence"):
            inner = args[0]
            if isinstance(inner, ast.Subscript) and ast.unparse(inner.value) == "tuple":
                elts = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
                return pos is not None and pos < len(elts) and self._is_cmd_type(elts[pos])
        return False

    # -- names --------------------------------------------------------------------------------

    def _bound(self, module: Module, node: ast.Name, kind: str, pos: int | None) -> bool:
        """Every binding of the name, in the innermost scope that binds it, is of `kind`."""
        for scope in module.scopes(node):
            found = list(self._bindings(module, scope, node.id, kind, pos))
            if found:
                return all(found)
        return False

    def _bindings(self, module: Module, scope: ast.AST, name: str, kind: str, pos):
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = scope.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            positional = args.posonlyargs + args.args
            defaults = dict(
                zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
            )
            defaults.update(
                {
                    a: d
                    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                    if d is not None
                }
            )
            for arg in every:
                if arg.arg == name:
                    if isinstance(scope, ast.Lambda) and arg in defaults:
                        yield self.check(module, defaults[arg], kind, pos)  # the outer value
                    else:
                        yield self._ann(arg.annotation, kind, pos)
        if isinstance(scope, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            for gen in scope.generators:
                for bound, index in _targets(gen.target):
                    if bound == name:
                        yield self._element(module, gen.iter, kind, pos, index)
        for node in _own_nodes(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Subscript) and ast.unparse(target.value) == name:
                        yield kind == "map" and self.check(module, node.value)  # cmds[h] = ...
                    for bound, index in _targets(target):
                        if bound == name:
                            yield (
                                self.check(module, node.value, kind, pos)
                                if index is None
                                else kind == "cmd"
                                and isinstance(node.value, ast.Tuple)
                                and self.check(module, node.value.elts[index])
                            )
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.target.id == name and node.value is not None:
                    yield self.check(module, node.value, kind, pos)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and ast.unparse(node.func.value) == name
                and node.func.attr in MUTATORS
            ):
                yield self._mutation(module, node, kind, pos)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                if node.target.id == name:  # list += more: the more must be of the kind
                    yield kind in ("iter", "at") and self.check(module, node.value, kind, pos)
            elif isinstance(node, ast.For):
                for bound, index in _targets(node.target):
                    if bound == name:
                        yield self._element(module, node.iter, kind, pos, index)
            elif isinstance(node, ast.NamedExpr) and node.target.id == name:
                yield self.check(module, node.value, kind, pos)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        yield False  # an imported value is no command
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                yield False

    def _mutation(self, module: Module, call: ast.Call, kind: str, pos) -> bool:
        """`name.update(...)`, `.append(...)`, ...: what goes in is of the name's kind."""
        method, args = call.func.attr, call.args  # type: ignore[attr-defined]
        if kind == "map" and method == "update":
            return len(args) == 1 and self.check(module, args[0], "map")
        if kind == "map" and method == "setdefault":
            return len(args) == 2 and self.check(module, args[1])
        if kind in ("iter", "at") and method in ("append", "insert"):
            return bool(args) and self._item(module, args[-1], kind, pos)
        if kind in ("iter", "at") and method == "extend":
            return len(args) == 1 and self.check(module, args[0], kind, pos)
        return False

    def _element(self, module: Module, iterable: ast.AST, kind: str, pos, index) -> bool:
        """A loop variable (`index`: its place in the unpacked tuple) is of `kind`."""
        if kind != "cmd":
            return False  # loops over mappings of commands are not needed yet
        if index is None:
            return self.check(module, iterable, "iter")
        return self.check(module, iterable, "at", index)

    # -- calls --------------------------------------------------------------------------------

    def _defs(self, module: Module, call: ast.Call) -> list[ast.FunctionDef] | None:
        """The functions a call may run: by import or module-level name for a plain name, by
        method name anywhere for an attribute; None when unknown."""
        func = call.func
        if isinstance(func, ast.Name):
            if func.id in module.imports:
                source, name = module.imports[func.id]
                target = self.modules.get(source)
                if target is None:
                    return None
                defs = [n for n in target.tree.body if _is_def(n, name)]
                return defs or None
            defs = [n for n in module.tree.body if _is_def(n, func.id)]
            return defs or None
        if isinstance(func, ast.Attribute):
            defs = [d for _, d in self.functions.get(func.attr, [])]
            return defs or None
        return None

    def _call(self, module: Module, call: ast.Call, kind: str, pos) -> bool:
        func = call.func
        if isinstance(func, ast.Name):
            imported = module.imports.get(func.id)
            if imported == ("core.command", func.id) and func.id in BUILDERS:
                return kind == "cmd"
            if module.path.as_posix() == BUILDER and func.id in BUILDERS:
                return kind == "cmd"
            # a parameter that is a function returning a command: before(host)
            for scope in module.scopes(call):
                if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                    for arg in [*scope.args.args, *scope.args.kwonlyargs]:
                        if arg.arg == func.id:
                            return kind == "cmd" and self._ann(arg.annotation, "callable")
        if isinstance(func, ast.Attribute) and func.attr == "items" and kind == "at":
            return pos == 1 and self.check(module, func.value, "map")
        defs = self._defs(module, call)
        return bool(defs) and all(self._ann(d.returns, kind, pos) for d in defs)

    # -- expressions --------------------------------------------------------------------------

    def check(self, module: Module, expr: ast.AST, kind: str = "cmd", pos: int | None = None):
        if isinstance(expr, ast.Call):
            return self._call(module, expr, kind, pos)
        if isinstance(expr, ast.Name):
            return self._bound(module, expr, kind, pos)
        if isinstance(expr, ast.IfExp):
            return self.check(module, expr.body, kind, pos) and self.check(
                module, expr.orelse, kind, pos
            )
        if kind == "cmd" and isinstance(expr, ast.Subscript):
            return self.check(module, expr.value, "map") or self.check(module, expr.value, "iter")
        if kind == "map" and isinstance(expr, ast.Dict):
            return all(self.check(module, v) for v in expr.values)
        if kind == "map" and isinstance(expr, ast.DictComp):
            return self.check(module, expr.value)
        if kind in ("iter", "at") and isinstance(expr, ast.List | ast.Tuple):
            return all(self._item(module, e, kind, pos) for e in expr.elts)
        if kind in ("iter", "at") and isinstance(expr, ast.ListComp | ast.GeneratorExp):
            return self._item(module, expr.elt, kind, pos)
        if kind in ("iter", "at") and isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return self.check(module, expr.left, kind, pos) and self.check(
                module, expr.right, kind, pos
            )
        return False

    def _item(self, module: Module, elt: ast.AST, kind: str, pos) -> bool:
        if kind == "iter":
            return self.check(module, elt)
        return (
            isinstance(elt, ast.Tuple) and pos < len(elt.elts) and self.check(module, elt.elts[pos])
        )

    # -- call sites ---------------------------------------------------------------------------

    def sites(self, module: Module) -> Iterator[Site]:
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Call):
                continue
            func, args = node.func, node.args
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "submit"
                and args
                and isinstance(args[0], ast.Attribute)
                and args[0].attr in SINKS
            ):
                func, args = args[0], args[1:]  # pool.submit(self.run, name, cmd)
            elif not isinstance(func, ast.Attribute) or func.attr not in SINKS:
                continue
            receiver = ast.unparse(func.value)
            what = self._kind(module, node, func.attr, receiver)
            if what is None:
                continue
            sink = f"{receiver}.{func.attr}"
            if what == "unknown":
                yield Site(str(module.path), node.lineno, sink, False, "a receiver this test "
                           "does not know: add it to RACKS, DAEMONS or NOT_HOSTS")  # fmt: skip
                continue
            index, keyword, _ = SINKS["exec_command" if what == "login" else func.attr]
            given = args[index] if len(args) > index else None
            given = given or next((k.value for k in node.keywords if k.arg == keyword), None)
            if given is None:
                yield Site(str(module.path), node.lineno, sink, False, "no command argument")
                continue
            if what == "login":
                ok = self._login(module, given)
            else:
                ok = self.check(module, given, "map" if what == "mapping" else "cmd")
            why = "built" if ok else f"not built by core.command: {ast.unparse(given)[:100]}"
            yield Site(str(module.path), node.lineno, sink, ok, why)

    def _kind(self, module: Module, call: ast.Call, method: str, receiver: str) -> str | None:
        """What the call hands a host: a command, a mapping of them, a login command (the
        transport's), nothing (None), or 'unknown'."""
        if (method, receiver) in NOT_HOSTS:
            return None
        in_rack = module.path.as_posix() == "core/rack.py" and (
            module.enclosing_class(call) == "Rack"
        )
        if method in ("run", "run_parallel"):
            if receiver in RACKS or (in_rack and receiver == "self"):
                return SINKS[method][2]
            if in_rack and receiver == "self.connection(name)":
                return "login"
            return "unknown"
        if method == "spawn":
            return "command" if receiver in DAEMONS else "unknown"
        if method == "exec_command":
            return "login"
        return "command"  # login_command: whatever host it is called on

    def _login(self, module: Module, given: ast.AST) -> bool:
        """A login command: Host.login_command's result, directly or through a name."""
        if isinstance(given, ast.Call):
            return isinstance(given.func, ast.Attribute) and given.func.attr == "login_command"
        if isinstance(given, ast.Name):
            for scope in module.scopes(given):
                values = [
                    n.value
                    for n in _own_nodes(scope)
                    if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == given.id for t in n.targets)
                ]
                if values:
                    return all(self._login(module, v) for v in values)
        return False

    # -- what the checks above trust ------------------------------------------------------------

    def returns(self, module: Module) -> Iterator[Site]:
        """Every function whose return type says Command returns (or yields) built values."""
        if module.path.as_posix() == BUILDER:
            return
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.returns:
                continue
            kinds = [
                (kind, pos)
                for kind, pos in [("cmd", None), ("map", None), ("iter", None)]
                + [("at", i) for i in range(8)]
                if self._ann(node.returns, kind, pos)
            ]
            if not kinds:
                continue
            for value in _own_nodes(node):
                if isinstance(value, ast.Return | ast.Yield) and value.value is not None:
                    if isinstance(value, ast.Yield):  # Iterator[...]: one element
                        ok = all(self._item(module, value.value, k, p) for k, p in kinds)
                    else:
                        ok = all(self.check(module, value.value, k, p) for k, p in kinds)
                    why = "built" if ok else f"returns {ast.unparse(value.value)[:100]}"
                    yield Site(str(module.path), value.lineno, f"{node.name} -> "
                               f"{ast.unparse(node.returns)}", ok, why)  # fmt: skip


def load(packages: tuple[str, ...] = PACKAGES, root: Path = PROJECT) -> dict[str, Module]:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            module = Module(relative, ast.parse(path.read_text(), str(relative)))
            modules[module.name.removesuffix(".__init__")] = module
    return modules


def script_sources(module: Module) -> Iterator[Site]:
    """core.command.script's source is fixed text: a constant, here or at the module's top."""
    constants = {
        t.id
        for n in module.tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    for node in ast.walk(module.tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and module.imports.get(node.func.id) == ("core.command", "script")
        ):
            source = node.args[0] if node.args else None
            ok = isinstance(source, ast.Constant) and isinstance(source.value, str)
            ok = ok or (isinstance(source, ast.Name) and source.id in constants)
            why = "a constant" if ok else f"not a constant: {ast.unparse(source or node)[:80]}"
            yield Site(str(module.path), node.lineno, "script source", ok, why)


def constructions(module: Module) -> Iterator[Site]:
    """Only core/command.py makes a Command."""
    if module.path.as_posix() == BUILDER:
        return
    for node in ast.walk(module.tree):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Name | ast.Attribute) and ast.unparse(func).split(".")[-1] == (
            "Command"
        ):
            yield Site(str(module.path), node.lineno, "Command(...)", False, "made outside "
                       f"{BUILDER}")  # fmt: skip
