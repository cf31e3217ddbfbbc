"""The user's script as a syntax tree (``ast``): the one way the engine reads a script's source.

The line that set a failure up is found from statements, calls, the names a statement reads and the constants it
holds, never from a pattern over the text: a word match named a line because "rank" stood inside a string literal,
and missed a call split over two lines (issue 41). What a reading needs of the script (a call to ``init_process_group``
with a ``timeout`` keyword, an ``if`` on the rank whose block begins by leaving) is a predicate over these nodes in
``engine/classify.py``; this module only walks the tree. Parsed trees are cached by text (a verdict asks several
readings of one script).
"""
from __future__ import annotations

import ast
from functools import lru_cache
from typing import Callable, Iterator, Mapping

BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")   # the fields of a compound statement that hold blocks
# the names by which a script holds its rank or its being the main process: any name or attribute with "rank" in it,
# these, and torchrun's environment variables read by key
MAIN_NAMES = frozenset({"master_process", "is_main_process", "is_master", "main_process", "is_global_zero",
                        "is_local_main_process", "is_local_zero"})
RANK_KEYS = frozenset({"RANK", "LOCAL_RANK", "GROUP_RANK"})


@lru_cache(maxsize=32)
def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def tree(file: str, sources: Mapping[str, str]) -> ast.Module | None:
    """The script's syntax tree (None: no text, or not Python that parses)."""
    text = sources.get(file) or ""
    return _parse(text) if text else None


def text_of(file: str, sources: Mapping[str, str], line: int) -> str:
    """A line of the script as written, stripped (shown with a place; never read for a decision)."""
    lines = (sources.get(file) or "").splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def dotted(node) -> str | None:
    """``torch.distributed.all_reduce`` for a chain of attributes on a name; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def called(node) -> str:
    """The called function's own name (``save`` of ``torch.save(...)``, ``model`` of ``model(x)``); "" when the
    callee is not a name or an attribute."""
    f = node.func if isinstance(node, ast.Call) else node
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def calls(nodes) -> Iterator[ast.Call]:
    for n in _walk(nodes):
        if isinstance(n, ast.Call):
            yield n


def _walk(nodes) -> Iterator[ast.AST]:
    for node in (nodes if isinstance(nodes, (list, tuple)) else [nodes]):
        yield from ast.walk(node)


def names(nodes) -> set[str]:
    """The variables the nodes read or bind (``x`` of ``x.grad``; not attributes, not keyword names)."""
    return {n.id for n in _walk(nodes) if isinstance(n, ast.Name)}


def identifiers(nodes) -> set[str]:
    """Every name and attribute name in the nodes (``self``, ``x`` and ``grad`` of ``self.x.grad``)."""
    return {n.id if isinstance(n, ast.Name) else n.attr for n in _walk(nodes) if isinstance(n, (ast.Name, ast.Attribute))}


def strings(nodes) -> set[str]:
    """The string constants in the nodes (a path, a key), the fixed parts of an f-string included."""
    return {n.value for n in _walk(nodes) if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value}


def chain(root: ast.AST, line: int) -> list[tuple[ast.AST, str]]:
    """The compound statements whose blocks hold ``line``, outermost first: (statement, the field of the block
    that holds it: "body", "orelse", ...); the module is the first."""
    out, node = [], root
    while True:
        found = None
        for field in BLOCKS:
            for child in getattr(node, field, None) or ():
                start = getattr(child, "lineno", None)
                if start is not None and start <= line <= (getattr(child, "end_lineno", None) or start):
                    found = (child, field)
                    break
            if found:
                break
        if found is None:
            return out
        out.append((node, found[1]))
        node = found[0]


def statements_at(root: ast.AST, line: int) -> list[ast.stmt]:
    """The innermost statements that hold ``line``: one, or several written on it (``time.sleep(3); torch.save(x,
    path)``)."""
    c = chain(root, line)
    if not c:
        return []
    node, field = c[-1]
    return [s for s in getattr(node, field) or () if s.lineno <= line <= (s.end_lineno or s.lineno)]


def header(stmt: ast.AST | None) -> list[ast.AST]:
    """What a statement evaluates itself: all of a simple statement; a compound one's own line (an ``if``'s test,
    a ``with``'s items, a ``for``'s target and iterable), without its blocks."""
    if stmt is None:
        return []
    out: list[ast.AST] = []
    for field, value in ast.iter_fields(stmt):
        if field in BLOCKS or field == "decorator_list":
            continue
        out.extend(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, ast.AST))
    return out


def at_line(root: ast.AST, line: int) -> list[ast.AST]:
    """What the statements on ``line`` evaluate themselves (the line a frame stands on)."""
    return [n for st in statements_at(root, line) for n in header(st)]


def scope(root: ast.AST, line: int) -> ast.AST:
    """The innermost function (or the module) whose body holds ``line``."""
    fn = root
    for node, _ in chain(root, line):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = node
    return fn


def on_rank(test: ast.AST) -> bool:
    """A condition that reads the rank: a name or attribute with "rank" in it (``rank``, ``self.global_rank``,
    ``dist.get_rank()``), a main-process flag (``master_process``, ``accelerator.is_main_process``,
    ``trainer.is_global_zero``), or torchrun's RANK read from the environment by key. Strings are values, not
    names: "rank" inside a message does not count."""
    if any("rank" in i.lower() or i in MAIN_NAMES for i in identifiers(test)):
        return True
    return any(isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value in RANK_KEYS
               or isinstance(n, ast.Call) and called(n) in ("get", "getenv") and n.args
               and isinstance(n.args[0], ast.Constant) and n.args[0].value in RANK_KEYS for n in ast.walk(test))


def rank_if(root: ast.AST, line: int) -> ast.If | None:
    """The innermost ``if`` (or ``elif``) on the rank whose block (not its ``else``) holds ``line``, within the
    function that holds it (None: the line is under no such condition)."""
    for node, field in reversed(chain(root, line)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            return None
        if isinstance(node, ast.If) and field == "body" and on_rank(node.test):
            return node
    return None


def int_value(node, consts: Mapping[str, int] | None = None) -> int | None:
    """The value of a whole-number expression of constants and the script's constants (``8 * 512``,
    ``WIDTH * MICRO``), without evaluating code; None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and consts and node.id in consts:
        return consts[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add)):
        a, b = int_value(node.left, consts), int_value(node.right, consts)
        return None if a is None or b is None else (a * b if isinstance(node.op, ast.Mult) else a + b)
    return None


def constants(root: ast.AST | None) -> dict[str, int]:
    """The module-level whole-number constants (``WIDTH, MICRO = 16, 4``)."""
    out: dict[str, int] = {}
    for st in (root.body if root is not None else ()):
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            t, v = st.targets[0], st.value
            pairs = (zip(t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple)
                     and len(t.elts) == len(v.elts) else [(t, v)])
            for a, b in pairs:
                if isinstance(a, ast.Name) and isinstance(b, ast.Constant) and type(b.value) is int:
                    out[a.id] = b.value
    return out


def one_line(root: ast.AST | None, pred: Callable[[ast.AST], bool]) -> int | None:
    """The one line of the script where a node the predicate holds for stands (None: none, or more lines)."""
    if root is None:
        return None
    lines = {n.lineno for n in ast.walk(root) if hasattr(n, "lineno") and pred(n)}
    return lines.pop() if len(lines) == 1 else None


def assignments(root: ast.AST) -> Iterator[tuple[ast.stmt, list[ast.AST]]]:
    """(statement, its targets) of every assignment under ``root``."""
    for n in ast.walk(root):
        if isinstance(n, ast.Assign):
            yield n, n.targets
        elif isinstance(n, (ast.AnnAssign, ast.AugAssign)) and n.value is not None:
            yield n, [n.target]
