"""Dependency capture: turn a %%dlc cell into a script that runs without the kernel.

The rule, exactly (README, "What a %%dlc cell takes from the notebook"):

1. The cell's *needed names* are the names it reads but does not bind first, under Python's
   scoping (arguments, comprehensions, class bodies, `global`/`nonlocal`, `del`, imports
   inside the cell). Builtins are not needed. Names the kernel does not have are left alone:
   the job fails on them just as the kernel would.
2. The kernel's history is every executed cell (`In[1]`, `In[2]`, ...), split into top-level
   statements in execution order. A statement that calls IPython (`%magic`, `!cmd`, `%%dlc`
   itself) is never captured. Nothing inside a cell magic (`%%time`), `%run` or `exec` is
   looked at.
3. Only *definitions* are captured as code:
   - `import m`, `import m as a`, `from m import x as y` (only the names needed are kept);
   - `def` and `class` statements (with their decorators);
   - simple assignments `NAME = expr`, `A, B = expr`, `NAME: T = expr`, `NAME op= expr`
     whose right side is made only of literals, names that are themselves definitions,
     attribute reads, operators, subscripts, containers, list/set/dict comprehensions
     (not generator expressions: a generator is a computed value), f-strings,
     lambdas, and calls to the
     builtins dict, list, tuple, set, frozenset, int, float, complex, str, bytes, bool,
     range, slice, len, min, max, abs, round, sum and sorted. Any other call makes it a
     *computed value* (`model = Net()`, `x = torch.randn(3)`, `n = len(data)` when data
     is computed).
   Every other statement (calls, loops, `with`, `if`, `try`, prints, plots, training) is a
   side effect: it is never replayed, and the names it binds are computed values.
4. A needed name resolves to the **last** statement in history that binds it (including
   side-effect statements and `del`), as in the kernel. What a definition itself reads is
   resolved the same way, transitively: what it reads when it runs (decorators, defaults,
   annotations, base classes, class bodies, a constant's right side) against the
   statements before it; what its functions read when called against the whole history.
5. If that last statement binds a computed value, the name is refused at submit (a
   `CaptureError` naming the name and the cell) unless `--push NAME` sends the value. A
   value that cannot be pickled (open files, generators, sockets, locks, modules) cannot
   be pushed either. Pushed values are loaded after the captured code, just before the
   cell, so they win; captured definitions do not see them while they are being defined.
6. `--include-cell N` includes all of cell N, in its place, side effects and all (its
   IPython lines dropped); its names then count as definitions.
7. The script is the captured statements in execution order, each run of statements from
   one cell under a `# from cell [N]` comment, then the loader of pushed values, then the
   cell. A name bound by no statement but by a `from m import *` is captured through it.
"""

from __future__ import annotations

import ast
import builtins
import copy
import os
import sys
import tempfile
import types
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Iterable

from . import push as _push
from .scope import analyze

END = float("inf")
DEFAULT_SIZE_LIMIT = 100 * 2**20

SAFE_CALLS = frozenset(
    "dict list tuple set frozenset int float complex str bytes bool range slice len min max "
    "abs round sum sorted".split()
)
# Module attributes every script has; never captured.
_SCRIPT_NAMES = frozenset(
    {"__name__", "__file__", "__doc__", "__builtins__", "__spec__", "__loader__", "__package__",
     "__annotations__", "__cached__"}
)
# `exit`/`quit` exist in a plain script too (site); other IPython builtins do not.
_PLAIN_BUILTINS = frozenset({"exit", "quit"})
_CAPTURABLE = ("import", "def", "const", "included")


class CaptureError(ValueError):
    """One line, naming the name and the cell that bound it; raised before anything starts."""

    def __init__(self, message: str, name: str | None = None, cell: int | None = None):
        super().__init__(message)
        self.name = name
        self.cell = cell


@dataclass
class Capture:
    script: str  # what the ranks run: captured code, pushed-value loader, the cell
    code: str  # the part before the cell (for --show-capture)
    summary: str  # one line for the cell output
    files: dict[str, str]  # JobSpec.files: "NAME.pt|.pkl" -> staged path
    by_cell: dict[int, list[str]]  # cell number -> names captured from it
    pushed: list[str] = field(default_factory=list)
    included: list[int] = field(default_factory=list)
    cell_line: int = 1  # 1-based line of the cell's first line in `script`
    # Where each line of `script` came from, for diagnoses that point at the notebook:
    # runs [first script line, cell, first line in that cell, count], 1-based; lines that
    # capture added (comments, the push loader) are in no run.
    source_map: list[list[int]] = field(default_factory=list)
    cell: int | None = None  # the %%dlc cell's own number (In[N]), when known


@dataclass(eq=False)
class _Stmt:
    cell: int
    pos: int  # global execution order
    node: ast.stmt
    text: str
    kind: str  # import | def | const | computed | magic | deleted | future | noop | included
    binds: list[str]
    eager: list[str]
    late: list[str]
    star: list[str] = field(default_factory=list)
    aliases: dict[str, None] = field(default_factory=dict)  # needed names of an import


# -- reading history --------------------------------------------------------------------

def _is_ipython_call(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                and isinstance(sub.func.value, ast.Call)
                and isinstance(sub.func.value.func, ast.Name)
                and sub.func.value.func.id == "get_ipython"):
            return True
    return False


def _simple_targets(targets: list[ast.expr]) -> bool:
    for target in targets:
        if isinstance(target, ast.Starred):
            target = target.value
        if isinstance(target, (ast.Tuple, ast.List)):
            if not _simple_targets(target.elts):
                return False
        elif not isinstance(target, ast.Name):
            return False
    return True


def _const_expr(node: ast.AST, calls: list[str]) -> bool:
    """Literal-like right side; the names of the builtins it calls are appended to `calls`."""
    if isinstance(node, ast.Lambda):
        # The body runs when called, like a def's; only the defaults run now.
        defaults = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
        return all(_const_expr(d, calls) for d in defaults)
    if isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id in SAFE_CALLS):
            return False
        calls.append(node.func.id)
        parts = list(node.args) + [k.value for k in node.keywords]
        return all(_const_expr(p, calls) for p in parts)
    allowed = (ast.Constant, ast.Name, ast.Attribute, ast.UnaryOp, ast.BinOp, ast.BoolOp,
               ast.Compare, ast.IfExp, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Subscript,
               ast.Slice, ast.Starred, ast.JoinedStr, ast.FormattedValue, ast.ListComp,
               ast.SetComp, ast.DictComp, ast.comprehension, ast.expr_context,
               ast.operator, ast.unaryop, ast.boolop, ast.cmpop)
    if not isinstance(node, allowed):
        return False
    return all(_const_expr(child, calls) for child in ast.iter_child_nodes(node))


def _classify(node: ast.stmt) -> tuple[str, list[str]]:
    if isinstance(node, ast.ImportFrom) and node.module == "__future__":
        return "future", []
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return "import", []
    # A def stays a definition even if its body uses a magic: that only fails when called.
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return "def", []
    if _is_ipython_call(node):
        return "magic", []
    if isinstance(node, ast.Delete):
        return "deleted", []
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return "noop", []
    calls: list[str] = []
    if isinstance(node, ast.Assign) and _simple_targets(node.targets):
        value = node.value
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        value = node.value
    else:
        return "computed", []
    if value is not None and _const_expr(value, calls):
        return "const", calls
    return "computed", []


def _statement_texts(source: str, body: list[ast.stmt]) -> list[str]:
    """Each statement's own lines (comments kept), or its unparsed form where lines are shared."""
    lines = source.splitlines()
    spans = []
    for node in body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        spans.append((start, node.end_lineno))
    texts = []
    for i, (node, (start, end)) in enumerate(zip(body, spans, strict=True)):
        shares = (i > 0 and spans[i - 1][1] >= start) or (i + 1 < len(spans) and spans[i + 1][0] <= end)
        texts.append(ast.unparse(node) if shares else "\n".join(lines[start - 1:end]))
    return texts


def _history(shell) -> list[tuple[int, str]]:
    cells = getattr(getattr(shell, "history_manager", None), "input_hist_parsed", None)
    if cells is None:
        cells = shell.user_ns.get("In", [])
    return [(n, src) for n, src in enumerate(cells) if n > 0 and isinstance(src, str) and src.strip()]


# -- the capture --------------------------------------------------------------------------

class _Capturer:
    def __init__(self, shell, push: list[str], include: set[int]):
        self.shell = shell
        self.ns = shell.user_ns
        self.hidden = getattr(shell, "user_ns_hidden", {})
        self.push = push
        self.include = include
        self.stmts: list[_Stmt] = []
        self.events: dict[str, list[_Stmt]] = {}  # name -> binding statements, in order
        self.stars: list[_Stmt] = []
        self.taken: dict[int, _Stmt] = {}  # pos -> statement in the script
        self.named: dict[str, list[int]] = {}  # summary: name -> cells, in discovery order
        self.cell_sources: dict[int, str] = {}

    # history → statements with a status
    def read_history(self) -> None:
        last: dict[str, _Stmt] = {}
        for cell, source in _history(self.shell):
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue  # never ran
            self.cell_sources[cell] = source
            for node, text in zip(tree.body, _statement_texts(source, tree.body), strict=True):
                kind, calls = _classify(node)
                names = analyze(node)
                stmt = _Stmt(cell, len(self.stmts), node, text, kind, names.binds, names.eager,
                             names.late, names.star_imports)
                if cell in self.include and kind not in ("magic", "future"):
                    stmt.kind = "included"
                elif kind == "const" and not self._const_inputs_ok(stmt, calls, last):
                    stmt.kind = "computed"
                self.stmts.append(stmt)
                if stmt.star and stmt.kind in ("import", "included"):
                    self.stars.append(stmt)
                for name in stmt.binds:
                    self.events.setdefault(name, []).append(stmt)
                    last[name] = stmt

    @staticmethod
    def _const_inputs_ok(stmt: _Stmt, calls: list[str], last: dict[str, _Stmt]) -> bool:
        for name in stmt.eager:
            bound = last.get(name)
            if name in calls:
                if bound is not None:
                    return False  # a user-defined `dict` could do anything
            elif bound is None:
                if not hasattr(builtins, name):
                    return False  # bound by a magic or exec: nothing to replay
            elif bound.kind not in _CAPTURABLE:
                return False
        return True

    def last_before(self, name: str, pos: float) -> _Stmt | None:
        events = self.events.get(name, [])
        i = bisect_left([e.pos for e in events], pos)
        return events[i - 1] if i else None

    # resolution
    def need(self, name: str, pos: float, by: _Stmt | None, via: str = "") -> None:
        if name in _SCRIPT_NAMES:
            return
        if pos == END and name in self.push and not via:
            return  # loaded just before the cell
        stmt = self.last_before(name, pos)
        if stmt is None:
            self._unbound(name, pos, by, via)
        elif stmt.kind == "deleted" or (pos == END and name not in self.ns):
            return  # the kernel has no such name now: the job fails on it as the kernel would
        elif stmt.kind in _CAPTURABLE:
            self.take(stmt, name)
        else:
            self._refuse(name, stmt, pos, by, via)

    def take(self, stmt: _Stmt, name: str | None) -> None:
        if name is not None and stmt.kind != "included":  # included cells are listed whole
            cells = self.named.setdefault(name, [])
            if stmt.cell not in cells:
                cells.append(stmt.cell)
            if stmt.kind == "import":
                stmt.aliases.setdefault(name)
        if stmt.pos in self.taken:
            return
        self.taken[stmt.pos] = stmt
        for read in stmt.eager:
            self.need(read, stmt.pos, stmt)
        for read in stmt.late:
            self.need(read, END, stmt)

    def _who(self, by: _Stmt | None, via: str) -> str:
        if via:
            return f" (used by the pushed value {via})"
        if by is None:
            return ""
        what = ", ".join(by.binds[:2]) if by.kind != "included" and by.binds else "a statement"
        return f" (used by {what} from cell [{by.cell}])"

    def _unbound(self, name: str, pos: float, by: _Stmt | None, via: str) -> None:
        if name in _PLAIN_BUILTINS:
            return
        if name in self.ns and pos == END:
            if self.hidden.get(name, object()) is self.ns[name] and not name.startswith("_"):
                raise CaptureError(f"name {name!r}{self._who(by, via)} belongs to IPython and does not "
                                   "exist in the job's script", name)
            for star in reversed(self.stars):
                module = sys.modules.get(star.star[0])
                if module is not None and getattr(module, name, object()) is self.ns[name]:
                    self.take(star, name)
                    return
            self._refuse_value(name, None, by, via, "is in the kernel but no plain statement of an "
                               "executed cell binds it (cell magics, %run and exec are not looked into)")
        elif name in self.ns and not hasattr(builtins, name):
            raise CaptureError(
                f"name {name!r}{self._who(by, via)} is not bound by a plain statement before cell "
                f"[{by.cell if by else '?'}] (cell magics, %run and exec are not looked into); "
                "bind it in a cell before that one", name)
        elif hasattr(builtins, name) and name not in _PLAIN_BUILTINS:
            value = getattr(builtins, name)
            module = getattr(value, "__module__", "") or ""
            if module.startswith(("IPython", "ipykernel")) or getattr(value, "__self__", None) is self.shell:
                raise CaptureError(f"name {name!r}{self._who(by, via)} exists only inside IPython; the job "
                                   "runs as a plain script", name)

    def _refuse(self, name: str, stmt: _Stmt, pos: float, by: _Stmt | None, via: str) -> None:
        if pos != END:
            raise CaptureError(
                f"name {name!r}{self._who(by, via)} is bound in cell [{stmt.cell}] by a statement that "
                f"is not a definition, which is not replayed; use --include-cell {stmt.cell}, or "
                "define it with a plain statement", name, stmt.cell)
        self._refuse_value(name, stmt.cell, by, via, f"is bound in cell [{stmt.cell}] to")

    def _refuse_value(self, name: str, cell: int | None, by, via: str, where: str) -> None:
        value = self.ns[name]
        who = self._who(by, via)
        try:
            _push.main_references(value)
        except _push.Unsendable as exc:
            lead = f"{where} {exc.what}" if cell is not None else f"{where}; it is {exc.what}"
            raise CaptureError(f"name {name!r}{who} {lead}, which cannot be sent to the ranks; "
                               f"{exc.advice}", name, cell) from None
        if via:  # a pushed value names it by reference, so it must come as code
            advice = "define it with a plain def or class statement"
            advice += f", or use --include-cell {cell}" if cell is not None else ""
        else:
            advice = f"use --push {name}, or define it inside the cell"
        lead = (f"{where} a computed value ({_push.type_name(value)}), which is not captured as code"
                if cell is not None else where)
        raise CaptureError(f"name {name!r}{who} {lead}; {advice}", name, cell)

    # output
    def statement_text(self, stmt: _Stmt) -> str:
        if stmt.kind != "import" or set(stmt.aliases) >= set(stmt.binds):
            return stmt.text
        node = copy.deepcopy(stmt.node)
        node.names = [a for a in node.names
                      if (a.asname or (a.name if isinstance(node, ast.ImportFrom) else a.name.split(".")[0]))
                      in stmt.aliases]
        return ast.unparse(node)

    def label(self, name: str) -> str:
        stmt = next((s for s in self.taken.values() if name in s.binds and s.kind == "import"), None)
        if stmt is None:
            return name
        for alias in stmt.node.names:
            bound = alias.asname or (alias.name if isinstance(stmt.node, ast.ImportFrom)
                                     else alias.name.split(".")[0])
            if bound == name and alias.asname and alias.asname != alias.name:
                return f"{alias.name} (as {alias.asname})"
        return name


def _future_lines(cell_code: str, tree: ast.Module) -> tuple[list[str], str]:
    """`from __future__` lines must open a script: lift them out of the cell (blanked, so the
    cell keeps its line numbers)."""
    lines = cell_code.splitlines()
    lifted = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            lifted.extend(lines[node.lineno - 1:node.end_lineno])
            for i in range(node.lineno - 1, node.end_lineno):
                lines[i] = ""
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            break
    return lifted, "\n".join(lines)


def capture(cell_code: str, shell, push: Iterable[str] = (), include_cells: Iterable[int] = (),
            size_limit: int = DEFAULT_SIZE_LIMIT, staging_dir: str | None = None) -> Capture:
    """Resolve what `cell_code` needs from the kernel `shell`; see the module docstring.

    Raises CaptureError (a ValueError with a one-line message) for anything that cannot be
    sent to the ranks, before anything is started. Pushed values are written to
    `staging_dir` (a new temporary directory when None and something is pushed).
    """
    push = list(dict.fromkeys(push))
    include = sorted(set(int(n) for n in include_cells))
    try:
        tree = ast.parse(cell_code)
    except SyntaxError as exc:
        raise CaptureError(f"the cell is not valid Python (line {exc.lineno}: {exc.msg}); a %%dlc cell "
                           "runs as a plain script, without IPython magics") from None
    cap = _Capturer(shell, push, set(include))
    cap.read_history()
    for n in include:
        if n not in cap.cell_sources:
            ran = sorted(cap.cell_sources)
            known = f"cells [{ran[0]}]..[{ran[-1]}]" if ran else "no cells"
            raise CaptureError(f"--include-cell {n}: no executed cell [{n}] of valid Python (this "
                               f"kernel has run {known})")
        if not any(s.cell == n and s.kind == "included" for s in cap.stmts):
            raise CaptureError(f"--include-cell {n}: cell [{n}] holds only IPython commands; "
                               "nothing to include")

    for name in push:
        if name not in shell.user_ns:
            raise CaptureError(f"--push {name}: the kernel has no name {name!r}", name)
        value = shell.user_ns[name]
        if isinstance(value, (type, types.FunctionType)) and getattr(value, "__module__", "") == "__main__":
            raise CaptureError(f"--push {name}: {name} is defined in the notebook and is captured as "
                               "code; push values, not definitions", name)

    for stmt in cap.stmts:
        if stmt.kind == "included":
            cap.take(stmt, None)
    names = analyze(tree)
    stores = set(names.binds) | set(names.global_stores)
    needed = [n for n in names.eager if n not in names.global_stores]
    needed += [n for n in names.late if n not in stores and n not in needed]
    for name in needed:
        cap.need(name, END, None)

    files: dict[str, str] = {}
    if push:
        staging_dir = staging_dir or tempfile.mkdtemp(prefix="dlc-push-")
    for name in push:
        value = shell.user_ns[name]
        cell = _last_cell(cap, name)
        where = f" (bound in cell [{cell}])" if cell else ""
        try:
            for ref in _push.main_references(value):
                cap.need(ref, END, None, via=name)
            path = _push.write_value(name, value, staging_dir, size_limit)
        except _push.Unsendable as exc:
            raise CaptureError(f"--push {name}{where}: it is {exc.what}, which cannot be sent to the "
                               f"ranks; {exc.advice}", name, cell) from None
        files[os.path.basename(path)] = path

    return _assemble(cap, cell_code, tree, files, push, include)


def _last_cell(cap: _Capturer, name: str) -> int | None:
    stmt = cap.last_before(name, END)
    return stmt.cell if stmt else None


class _SourceMap:
    """Runs of script lines that come from one cell, line for line (see Capture.source_map)."""

    def __init__(self) -> None:
        self.runs: list[list[int]] = []

    def add(self, script_line: int, cell: int | None, cell_line: int, count: int) -> None:
        if cell is None or count <= 0:
            return
        last = self.runs[-1] if self.runs else None
        if last and last[1] == cell and last[0] + last[3] == script_line and last[2] + last[3] == cell_line:
            last[3] += count
        else:
            self.runs.append([script_line, cell, cell_line, count])

    def shifted(self, by: int) -> list[list[int]]:
        return [[start + by, cell, line, count] for start, cell, line, count in self.runs]


def _magic_cell(shell) -> int | None:
    """The running cell's In[N]: IPython counts it up only once the cell has run."""
    count = getattr(shell, "execution_count", None)
    return count if isinstance(count, int) and count > 0 else None


def _cell_runs(smap: _SourceMap, script_line: int, cell: int | None, text: str, lines: range) -> None:
    """Map `text` (placed at `script_line`) to `lines` of `cell`: line for line where it is
    the cell's own text, else every line to the statement's first line."""
    count = text.count("\n") + 1
    if count == len(lines):
        smap.add(script_line, cell, lines.start, count)
    else:
        for i in range(count):
            smap.add(script_line + i, cell, lines.start, 1)


def _assemble(cap: _Capturer, cell_code: str, tree: ast.Module, files: dict[str, str],
              push: list[str], include: list[int]) -> Capture:
    parts: list[str] = []
    smap = _SourceMap()  # script lines of `parts`, counted from 1 before the header is known
    previous = None
    for pos in sorted(cap.taken):
        stmt = cap.taken[pos]
        if stmt.cell != previous:
            if parts:
                parts.append("")
            note = " (--include-cell)" if stmt.kind == "included" else ""
            parts.append(f"# from cell [{stmt.cell}]{note}")
            previous = stmt.cell
        text = cap.statement_text(stmt)
        node = stmt.node
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        _cell_runs(smap, sum(p.count("\n") + 1 for p in parts) + 1, stmt.cell, text,
                   range(start, (node.end_lineno or start) + 1))
        parts.append(text)
    if files:
        if parts:
            parts.append("")
        parts.append("# pushed from the kernel (--push): loaded on every rank")
        parts.append(_push.LOADER.rstrip("\n"))
        for name, filename in zip(push, files, strict=True):
            parts.append(f"{name} = _dlc_load({filename!r})")
        parts.append("del _dlc_load")

    by_cell: dict[int, list[str]] = {}
    for name, cells in cap.named.items():
        for cell in cells:
            by_cell.setdefault(cell, []).append(name)
    for cell in include:
        by_cell.setdefault(cell, [])
    by_cell = dict(sorted(by_cell.items()))

    summary = _summary(cap, push, include)
    cell = _magic_cell(cap.shell)
    # The cell's body starts on the cell's line 2: line 1 is the `%%dlc ...` line.
    body_lines = cell_code.count("\n") + 1
    if not parts:
        return Capture(cell_code, "", summary, files, by_cell, push, include, 1,
                       [[1, cell, 2, body_lines]] if cell else [], cell)
    lifted, body = _future_lines(cell_code, tree)
    head = lifted + ([""] if lifted else [])
    code = "\n".join(head + ["# captured from the notebook kernel by jupyter-dlc"] + parts) + "\n"
    preamble = code + "\n# the %%dlc cell\n"
    script = preamble + body + ("" if body.endswith("\n") else "\n")
    cell_line = preamble.count("\n") + 1
    runs = _SourceMap()
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    for i, node in enumerate(future[:len(lifted)] if lifted else []):
        runs.add(1 + sum((f.end_lineno or f.lineno) - f.lineno + 1 for f in future[:i]), cell,
                 node.lineno + 1, (node.end_lineno or node.lineno) - node.lineno + 1)
    runs.runs += smap.shifted(len(head) + 1)
    runs.add(cell_line, cell, 2, body_lines)
    return Capture(script, code, summary, files, by_cell, push, include, cell_line,
                   runs.runs, cell)


def _summary(cap: _Capturer, push: list[str], include: list[int]) -> str:
    pieces = []
    captured = [f"{cap.label(name)} from [{', '.join(map(str, sorted(cells)))}]"
                for name, cells in cap.named.items()]
    if captured:
        pieces.append("captured " + ", ".join(captured))
    if include:
        pieces.append("included " + ", ".join(f"cell [{n}]" for n in include))
    if push:
        pieces.append("pushed " + ", ".join(push))
    return "; ".join(pieces) if pieces else "nothing captured: the cell uses nothing from the kernel"
