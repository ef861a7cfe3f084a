"""Which module-level names a piece of code reads and binds, under Python's scoping rules.

The capture needs three facts about each top-level statement of a cell:

- `binds`: the module names it binds (assignment targets, imports, def/class names, `for`
  and `with` targets, `except ... as`, walrus, match captures).
- `eager`: the module names it reads *while it runs* before binding them itself: a
  constant's right side, decorators, defaults, annotations, base classes, a class body, a
  comprehension. These must be bound before the statement, at its place in history.
- `late`: the module names that functions defined by it read when *called*. These must be
  bound by the time the cell runs, so the last binding in the whole history counts.

`symtable` knows the scopes but not the order of reads and writes, which is what decides
`x = x + 1` or a class body reading a name before rebinding it; hence this small walker.
Nested function scopes resolve names through enclosing function locals (arguments,
assignments, `nonlocal`), skip class bodies (as Python does), and send `global`-declared
names straight to the module.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

_FUNCTION_KINDS = ("function", "comprehension")


@dataclass
class Names:
    binds: list[str] = field(default_factory=list)
    eager: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    # Names assigned inside functions through `global x`: bound only when those functions run.
    global_stores: list[str] = field(default_factory=list)
    star_imports: list[str] = field(default_factory=list)


class _Scope(ast.NodeVisitor):
    def __init__(self, kind: str):
        self.kind = kind  # "module" | "class" | "function" | "comprehension"
        self.bound: dict[str, None] = {}
        self.reads: dict[str, None] = {}  # module/class: read before bound; else: all reads
        self.late: dict[str, None] = {}  # module: late reads; class: passed through to parent
        self.forced: dict[str, None] = {}  # `global`-declared reads, for the module
        self.global_stores: dict[str, None] = {}
        self.declared_global: set[str] = set()
        self.declared_nonlocal: set[str] = set()
        self.star_imports: list[str] = []

    # -- reads and binds --------------------------------------------------------------
    def read(self, name: str) -> None:
        if self.kind == "module":
            if name not in self.bound:
                self.reads.setdefault(name)
        elif name in self.declared_global:
            self.forced.setdefault(name)
        elif self.kind == "class" and name in self.bound:
            return
        else:
            self.reads.setdefault(name)

    def late_read(self, name: str) -> None:
        """A name a nested function reads when it is called."""
        if self.kind in _FUNCTION_KINDS:
            self.read(name)  # resolved against this function's locals at the end
        else:
            self.late.setdefault(name)  # class bodies are skipped; the module collects

    def bind(self, name: str) -> None:
        if self.kind != "module" and name in self.declared_global:
            self.global_stores.setdefault(name)
        elif name in self.declared_nonlocal:
            pass  # an enclosing function's local, never a module name
        else:
            self.bound.setdefault(name)

    # -- child scopes -----------------------------------------------------------------
    def _child(self, kind: str, body, params=(), targets_first=None) -> None:
        child = _Scope(kind)
        for name in params:
            child.bound.setdefault(name)
        if targets_first is not None:
            targets_first(child)
        for node in body if isinstance(body, list) else [body]:
            child.visit(node)
        self.forced.update(child.forced)
        self.global_stores.update(child.global_stores)
        self.star_imports.extend(child.star_imports)
        if kind == "class":
            for name in child.reads:
                self.read(name)  # a class body runs when the class statement runs
            for name in child.late:
                self.late_read(name)
        else:
            free = [n for n in child.reads if n not in child.bound or n in child.declared_nonlocal]
            for name in free:
                if kind == "comprehension" and self.kind == "class":
                    self.reads.setdefault(name)  # runs now, but cannot see the class's names
                elif kind == "comprehension":
                    self.read(name)  # runs on the spot
                else:
                    self.late_read(name)
        # Names the child assigned through `global` reach the module; nothing else leaks.

    @staticmethod
    def _params(args: ast.arguments) -> list[str]:
        every = args.posonlyargs + args.args + args.kwonlyargs
        every += [a for a in (args.vararg, args.kwarg) if a is not None]
        return [a.arg for a in every]

    def _signature_parts(self, args: ast.arguments, returns=None) -> None:
        for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(default)
        every = args.posonlyargs + args.args + args.kwonlyargs
        every += [a for a in (args.vararg, args.kwarg) if a is not None]
        for arg in every:
            if arg.annotation is not None:
                self.visit(arg.annotation)
        if returns is not None:
            self.visit(returns)

    # -- statements whose evaluation order differs from their field order ---------------
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.read(node.id)
        elif isinstance(node.ctx, ast.Del):
            self.read(node.id)  # `del x` needs x; afterwards the kernel has no x either
            self.bind(node.id)
        else:
            self.bind(node.id)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self.read(node.target.id)
            self.visit(node.value)
            self.bind(node.target.id)
        else:
            self.visit(node.target)
            self.visit(node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        if self.kind in ("module", "class"):
            self.visit(node.annotation)  # evaluated at module and class level, not in functions
        if isinstance(node.target, ast.Name):
            if node.value is not None or self.kind in _FUNCTION_KINDS:
                self.bind(node.target.id)
        else:
            self.visit(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        # In a comprehension the walrus binds in the enclosing scope; approximating it as
        # the comprehension's own name only hides a read that the comprehension just made.
        self.bind(node.target.id)

    def visit_For(self, node) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self.bind(node.name)
        for stmt in node.body:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.bind(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                self.star_imports.append(node.module or "")
            else:
                self.bind(alias.asname or alias.name)

    def visit_Global(self, node: ast.Global) -> None:
        if self.kind != "module":
            self.declared_global.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.declared_nonlocal.update(node.names)

    def visit_FunctionDef(self, node) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self._signature_parts(node.args, node.returns)
        self._child("function", node.body, params=self._params(node.args))
        self.bind(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._signature_parts(node.args)
        self._child("function", node.body, params=self._params(node.args))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        for base in node.bases:
            self.visit(base)
        for keyword in node.keywords:
            self.visit(keyword.value)
        self._child("class", node.body)
        self.bind(node.name)

    def _comprehension(self, node, results) -> None:
        first, rest = node.generators[0], node.generators[1:]
        self.visit(first.iter)  # the first iterable is evaluated in the enclosing scope

        def targets(child: _Scope) -> None:
            child.visit(first.target)
            for cond in first.ifs:
                child.visit(cond)
            for gen in rest:
                child.visit(gen.iter)
                child.visit(gen.target)
                for cond in gen.ifs:
                    child.visit(cond)

        self._child("comprehension", results, targets_first=targets)

    def visit_ListComp(self, node) -> None:
        self._comprehension(node, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node, [node.key, node.value])

    def visit_MatchAs(self, node) -> None:
        self.generic_visit(node)
        if node.name:
            self.bind(node.name)

    def visit_MatchStar(self, node) -> None:
        if node.name:
            self.bind(node.name)

    def visit_MatchMapping(self, node) -> None:
        self.generic_visit(node)
        if node.rest:
            self.bind(node.rest)


def analyze(code: ast.AST | list[ast.stmt]) -> Names:
    """Names of module-level code: a parsed cell, or one or more top-level statements."""
    scope = _Scope("module")
    for node in code if isinstance(code, list) else [code]:
        scope.visit(node)
    late = {n: None for n in list(scope.late) + list(scope.forced) if n not in scope.bound}
    return Names(
        binds=list(scope.bound),
        eager=list(scope.reads),
        late=list(late),
        global_stores=list(scope.global_stores),
        star_imports=scope.star_imports,
    )
