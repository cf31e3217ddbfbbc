"""What a fix-it exercise is, as data, and the evidence an attempt gives the grader.

An exercise is a short broken script of one lab's failure class, in a setting other than the lab's own
script, that the learner repairs in a ``%%ddplab`` cell. Everything the grader needs is a field: the
broken source, the reference fix, the hint, the known wrong fixes (each with the evidence that shows it
and why it is wrong), the ranks it runs on, the stall window and the tolerance of its result check.
The result check (``judge``) compares what the attempt's ranks recorded (``ddplab.rank.lab.record("final",
...)``, read back as data from the run folder) with a reference the grader computes itself in one
process, so deleting the collective, the loop or the data is not a fix.
"""
from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Callable

# The record every exercise script writes on each rank, read back by its judge.
FINAL = "final"


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (found exactly once) by ``new``: how a wrong fix is written into the broken source."""
    old: str
    new: str

    def apply(self, source: str) -> str:
        if source.count(self.old) != 1:
            raise ValueError(f"edit target found {source.count(self.old)} times, not once: {self.old!r}")
        return source.replace(self.old, self.new)


class Invariant(str, Enum):
    """What makes a fix right, each measured from the run (``ddplab.course.fixit.grader`` checks them in
    this order, in every layout of the exercise)."""
    ENDS_OK = "ends-ok"              # the run ends ok (its status)
    FINISHES = "finishes"            # it ends within its limit (collectives, from the reference run)
    CHECK = "check-clean"            # --check: replicas, gradients, the samples each rank saw
    RANKS = "every-rank"             # every rank recorded its result, as its own rank
    STEPS = "steps"                  # the steps taken, against the one-process baseline
    RESULT = "result"                # the final parameters / values, against the one-process baseline
    COLLECTIVES = "collectives"      # the collectives of every kind on each rank (ledger), against the task

    def __str__(self) -> str:
        return self.value


# a judge's ``what`` that names an invariant other than the result itself
_WHAT = {"steps": Invariant.STEPS, "ranks": Invariant.RANKS, "world": Invariant.RANKS}


@dataclass(frozen=True)
class Layout:
    """Where an attempt runs: ``nodes`` torchrun agents (on this machine's loopback) of ``nproc`` ranks
    each. The first of an exercise's layouts is the one the learner's cell uses."""
    nproc: int = 2
    nodes: int = 1

    @property
    def world(self) -> int:
        return self.nproc * self.nodes

    @property
    def key(self) -> str:
        return f"{self.nodes}x{self.nproc}"


@dataclass(frozen=True)
class Mismatch:
    """An invariant that failed: ``what`` (a key such as "steps", "params", "status", "collectives"),
    what the reference has (``expected``) and what the attempt's run measured (``got``); the invariant
    it belongs to, and the layout it was measured in (None: the learner's own)."""
    what: str
    expected: object
    got: object
    tolerance: float | None = None
    invariant: Invariant | None = None
    layout: Layout | None = None

    @property
    def kind(self) -> Invariant:
        return self.invariant or _WHAT.get(self.what, Invariant.RESULT)


@dataclass
class Attempt:
    """One graded attempt: its source and its run (a ``ddplab.RunResult``)."""
    source: str
    result: object
    mismatch: Mismatch | None = None    # set by the grader once the result check has run

    @cached_property
    def tree(self) -> ast.Module:
        return ast.parse(self.source)

    @property
    def ok(self) -> bool:
        return self.result.status == "ok"

    def finals(self) -> dict[int, dict]:
        """Each rank's ``final`` record (the last one it wrote), by rank."""
        out = {}
        for rec in self.result.records_of(FINAL):
            out[int(rec["rank"])] = rec
        return out

    def findings(self) -> set[str]:
        report = self.result.check
        return report.kinds() if report is not None else set()


@dataclass(frozen=True)
class WrongFix:
    """A fix people write that does not repair this failure.

    ``edits`` write it into the broken source (the tests run exactly that); ``applies`` is the evidence
    that an attempt contains it (the attempt's code and what its run did: a wrong fix is named only when
    the run shows it did not work, or, for a fix that changes nothing but cost, when the run shows what
    it costs); ``why`` says why it is wrong; ``source`` is where people reported or advised it."""
    key: str
    edits: tuple[Edit, ...]
    applies: Callable[[Attempt], bool]
    why: str
    source: str

    def write(self, broken: str) -> str:
        for e in self.edits:
            broken = e.apply(broken)
        return broken


@dataclass(frozen=True)
class Exercise:
    id: str                       # "01-early-stop": the lab's number first
    lab: str                      # "01"
    title: str
    task: str                     # what the script must do, stated so that one result is right
    broken: str                   # the script the learner opens
    reference: str                # the reference fix (shown only after attempts, in self-study)
    hint: str
    judge: Callable[[Attempt, int], Mismatch | None]   # the result against the grader's own reference
    wrong_fixes: tuple[WrongFix, ...]
    nproc: int = 2
    stall_s: float = 2.0
    tolerance: float | None = None   # of the result check, where it compares numbers
    silent: bool = False          # the class is silent (ends ok): --check must then be clean
    failure: str = ""             # the failure the broken script shows (the signature or the check finding)
    sources: tuple[str, ...] = field(default_factory=tuple)   # where the broken pattern comes from
    # the layouts a fix must also hold in, beyond the learner's (``nproc`` ranks on one node): two nodes
    # (RANK != LOCAL_RANK) for rank and init classes, another world size for data and gather classes
    layouts: tuple[Layout, ...] = ()
    # the task bounds communication: no rank may issue more collectives (of any kind) than the reference
    bounded_collectives: bool = False
    # an attempt is ended past grader.LIMIT_FACTOR times its reference's collectives, read from each rank's
    # flight recorder while it runs; off where that read would change the run (02: torch builds the dump
    # inside the rank, under the rank's memory cap, and the cap is the exercise)
    limited: bool = True

    @property
    def all_layouts(self) -> tuple[Layout, ...]:
        return (Layout(self.nproc),) + self.layouts

    def wrong_fix(self, key: str) -> WrongFix:
        return next(w for w in self.wrong_fixes if w.key == key)


# ------------------------------------------------------------------------------------------------
# Evidence in an attempt's code (ast, never its text): the predicates the wrong fixes are made of
# ------------------------------------------------------------------------------------------------

def call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute):
            return f.attr
        if isinstance(f, ast.Name):
            return f.id
    return None


def calls(tree: ast.AST, *names: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if call_name(n) in names]


def has_keyword(tree: ast.AST, funcs: tuple[str, ...], *keywords: str, value: object = ...) -> bool:
    """A call to one of ``funcs`` passes one of ``keywords`` (with that constant ``value``, if given)."""
    for c in calls(tree, *funcs):
        for kw in c.keywords:
            if kw.arg in keywords:
                if value is ... or (isinstance(kw.value, ast.Constant) and kw.value.value == value):
                    return True
    return False


def in_try(tree: ast.AST, *names: str) -> bool:
    """A call to one of ``names`` sits in the body of a ``try`` that has an ``except`` clause."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and node.handlers:
            if any(calls(stmt, *names) for stmt in node.body):
                return True
    return False


def in_loop(tree: ast.AST, *names: str) -> bool:
    """A call to one of ``names`` sits inside a ``for`` or ``while`` loop."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While)):
            if any(calls(stmt, *names) for stmt in node.body):
                return True
    return False


def imports_or_calls(tree: ast.AST, name: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(a.name.split(".")[-1] == name for a in node.names):
            return True
        if isinstance(node, ast.Name) and node.id == name:
            return True
        if isinstance(node, ast.Attribute) and node.attr == name:
            return True
    return False


def collectives(result) -> dict[int, Counter]:
    """Each rank's collectives by kind (op), from its ledger (torch's flight recorder, which keeps a
    rank's last TORCH_FR_BUFFER_SIZE entries: 2000 under ddplab, far more than an exercise issues)."""
    out = {}
    for r in result.ranks:
        out[r.rank] = Counter(c.op for c in r.ledger)
    return out


def every_rank(finals: dict, nproc: int) -> "Mismatch | None":
    """Every rank recorded its final result; else the mismatch names the ranks that did."""
    if sorted(finals) != list(range(nproc)):
        return Mismatch("ranks", list(range(nproc)), sorted(finals))
    return None


def params_match(attempt: "Attempt", nproc: int, want: list[float], tol: float) -> "Mismatch | None":
    """Every rank ended with the parameters ``want`` (the one-process reference), within ``tol``."""
    finals = attempt.finals()
    missing = every_rank(finals, nproc)
    if missing is not None:
        return missing
    for rank in sorted(finals):
        got = flat(finals[rank].get("params", []))
        if not close(got, want, tol):
            return Mismatch("params", want, got, tol)
    return None


def every_rank_joined_and_summed(attempt: "Attempt", nproc: int) -> "Mismatch | None":
    """Every rank joined as its own rank, in a world of ``nproc``, and the all_reduce added every rank's
    number (1 + 2 + ... + nproc): the result of an init exercise (05, 06), which deleting the
    collective or the rendezvous cannot give."""
    finals = attempt.finals()
    ranks = sorted(int(r.get("rank", -1)) for r in attempt.result.records_of("final"))
    if ranks != list(range(nproc)):
        return Mismatch("ranks", list(range(nproc)), ranks)
    want = float(sum(range(1, nproc + 1)))
    for rec in finals.values():
        if rec.get("world") != nproc:
            return Mismatch("world", nproc, rec.get("world"))
        if rec.get("total") != want:
            return Mismatch("total", want, rec.get("total"))
    return None


def close(a: list[float], b: list[float], tol: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def flat(params: list) -> list[float]:
    """A ``params`` record (a list of lists of floats) as one list."""
    out: list[float] = []
    for p in params:
        out.extend(p if isinstance(p, list) else [p])
    return out


def reduces_with(tree: ast.AST, op: str) -> bool:
    """The code names ``ReduceOp.<op>`` (MIN, MAX, ...): evidence of what a reduction was asked to do."""
    return any(isinstance(n, ast.Attribute) and n.attr == op and
               isinstance(n.value, (ast.Attribute, ast.Name)) and
               (getattr(n.value, "attr", None) or getattr(n.value, "id", None)) == "ReduceOp"
               for n in ast.walk(tree))


def constant_keyword(tree: ast.AST, funcs: tuple[str, ...], keyword: str) -> bool:
    """A call to one of ``funcs`` passes ``keyword`` a constant (a number written into the code)."""
    return any(kw.arg == keyword and isinstance(kw.value, ast.Constant)
               for c in calls(tree, *funcs) for kw in c.keywords)


def sets_env(tree: ast.AST, name: str) -> bool:
    """``os.environ[name] = ...`` somewhere in the code."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == name:
                    return True
    return False
