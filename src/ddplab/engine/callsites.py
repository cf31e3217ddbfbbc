"""Where the ranks' control flow parted, from their own call records (issue 41, item 2).

The rank hook numbers every torch.distributed call a rank's script makes and records its call site (the
innermost user frames). Ranks that run the same code call from the same places in the same order; the
first number at which they call from different places (or one makes a call the other never makes) is
where their paths parted, and the user's branch between the two places is the condition that sent them
apart. The places come from the run; the script's syntax tree is read only to name the condition that
holds one rank's call and not the other's (``ast``: the statement structure, no pattern over text).
Pure: no I/O.
"""
from __future__ import annotations

import ast
from typing import Mapping

from ddplab.engine.stacks import Frame
from ddplab.facts import ArgsDiffer, CallDivergence, CallSite


def divergence(calls: Mapping[int, tuple[CallSite, ...]], stands: Mapping[int, tuple[Frame, ...]] | None = None,
               sources: Mapping[str, str] | None = None) -> CallDivergence | None:
    """The first call number at which the ranks' recorded call sites differ (``calls``: rank -> its call
    records), with the call before it and the user's branch between; None when every rank that has
    records called from the same places (or fewer than two ranks have records). ``stands``: where each
    rank stands (every user frame of its stack, innermost first: live, or where it failed), used for a rank
    that made no call at that number; all of them, since a condition holding only its innermost line may
    hold its outer ones (``if __name__ == "__main__":``).
    Only numbers every rank still holds are compared (the hook keeps the last calls)."""
    have = {r: {c.n: c for c in cs} for r, cs in calls.items() if cs}
    if len(have) < 2:
        return None
    first_n = max(min(by_n) for by_n in have.values())
    last_n = max(max(by_n) for by_n in have.values())
    top = {r: max(by_n) for r, by_n in have.items()}
    for n in range(first_n, last_n + 1):
        if any(n not in by_n and n <= top[r] for r, by_n in have.items()):
            continue      # a number some rank no longer holds (the hook keeps the first and the last calls)
        here = {r: by_n.get(n) for r, by_n in sorted(have.items())}
        if len({c.place if c is not None else None for c in here.values()}) < 2:
            continue
        before = have[min(have)].get(n - 1)
        same = before if before is not None and all(
            (by_n.get(n - 1) is not None and by_n[n - 1].place == before.place) for by_n in have.values()) else None
        odd, branch = _branch(here, stands or {}, sources or {})
        return CallDivergence(n, same, here, odd, branch)
    return None


def _lines(c: CallSite | None, stand: tuple[Frame, ...] | None) -> list[Frame]:
    """A rank's user frames at the divergence: its call's, else where it stands."""
    if c is not None and c.user:
        return list(c.user)
    return list(stand or ())


def _branch(here: Mapping[int, CallSite | None], stands: Mapping[int, tuple[Frame, ...]],
            sources: Mapping[str, str]) -> tuple[tuple[int, ...], Frame | None]:
    """The ranks whose call stands inside a condition (``if``/``while``) that holds none of the other
    ranks' frames (their calls, or where they stand when they made none), and that condition (the innermost,
    in the innermost frame that has one). When every rank has such a condition (an if and its else), or none
    has, no rank is odd."""
    found: dict[int, Frame] = {}
    for r, c in here.items():
        # only a call stands under a branch: a rank that made no call at this number (still in a loop the
        # others left, say) is where it is for reasons no call record shows
        mine = list(c.user) if c is not None else []
        theirs = [f for q, d in here.items() if q != r for f in _lines(d, stands.get(q))]
        for f in mine:
            cond = _condition(f, [g.line for g in theirs if g.file == f.file], sources)
            if cond is not None:
                found[r] = cond
                break
    if not found or len(found) == len(here):
        return (), None
    odd = tuple(sorted(found))
    conds = {found[r] for r in odd}
    return odd, (conds.pop() if len(conds) == 1 else None)


def _condition(f: Frame, others: list[int], sources: Mapping[str, str]) -> Frame | None:
    """The innermost ``if``/``while`` of ``f``'s file whose block holds ``f.line`` and none of ``others``
    (lines of the other ranks in the same file), as a Frame on the condition's line."""
    text = sources.get(f.file)
    if not text:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    lines = text.splitlines()
    best = None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.If, ast.While)):
            continue
        for block in (node.body, node.orelse):
            if not block:
                continue
            a, b = block[0].lineno, max(getattr(s, "end_lineno", s.lineno) or s.lineno for s in block)
            if a <= f.line <= b and not any(a <= o <= b for o in others):
                # the else of an ``if`` is its own branch: the condition's line names it
                if best is None or node.lineno > best.lineno:
                    best = node
    if best is None:
        return None
    return Frame(f.func, f.file, best.lineno, lines[best.lineno - 1].strip() if best.lineno <= len(lines) else None)


SETUP_CALLS = ("init_process_group", "destroy_process_group", "new_group")


def pending_call(r) -> CallSite | None:
    """The call record of the collective a blocked rank stands in: its last recorded call, when that is the
    collective its stack shows (the op, or the object collective that issued it); None otherwise (a
    collective DDP issued from C++ is recorded by no call)."""
    if not r.calls or r.where is None or r.where.kind not in ("collective", "p2p"):
        return None
    c = r.calls[-1]
    if c.op in SETUP_CALLS or c.op not in (r.where.op, r.where.via):
        return None
    return c


def failed_in_flight(frames, calls):
    """The rank's last recorded call, when it was called with an exception in flight and the rank failed inside
    it (its failing stack passes through that torch.distributed function); None otherwise."""
    c = calls[-1] if calls else None
    if c is None or c.exc is None:
        return None
    inside = any(f.func.rsplit(".", 1)[-1] == c.op and "torch/distributed/" in f.file.replace("\\", "/")
                 for f in frames or ())
    return c if inside else None


# Which recorded arguments must agree across the ranks of one collective call (torch.distributed's contract for
# each op), compared by ``args_differ``. Point-to-point calls are not here: their peers differ by design (their
# tags are compared where they block, classify.tag_mismatch). Nor are all_to_all's tensors (each rank's splits may
# differ), gather's gather_list and scatter's scatter_list (given on the root only: compared only where every rank
# passed one), nor devices (each rank has its own).
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter", "broadcast_object_list", "gather_object",
                    "scatter_object_list"})
REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"})
SAME_TENSORS = frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather",
                          "scatter", "reduce_scatter", "reduce_scatter_tensor"})
SAME_LENGTH = frozenset({"all_gather", "reduce_scatter", "broadcast_object_list", "all_gather_object",
                         "all_to_all"})
COLLECTIVES = ROOTED | REDUCING | SAME_TENSORS | SAME_LENGTH | frozenset({"barrier", "all_to_all_single",
                                                                          "monitored_barrier"})


def args_differ(calls: Mapping[int, tuple[CallSite, ...]]) -> ArgsDiffer | None:
    """The first call number every rank holds (``calls``: rank -> its call records) at which every rank called the
    same collective with arguments that must agree and do not: the root (as a global rank), the group's members,
    the reduce op, a list's length, a tensor's shape or dtype (in that order: the first that differs is named).
    None when fewer than two ranks have records, or every such call agrees. Ranks that called different ops at a
    number are the call sites' divergence (``divergence``), not this."""
    have = {r: {c.n: c for c in cs} for r, cs in calls.items() if cs}
    if len(have) < 2:
        return None
    common = set.intersection(*(set(by_n) for by_n in have.values()))
    for n in sorted(common):
        here = {r: by_n[n] for r, by_n in sorted(have.items())}
        ops = {c.op for c in here.values()}
        if len(ops) != 1 or any(c.args is None for c in here.values()):
            continue
        op = ops.pop()
        if op not in COLLECTIVES:
            continue
        found = _first_difference(op, {r: c.args for r, c in here.items()})
        if found is not None:
            arg, param, values = found
            return ArgsDiffer(n, op, arg, param, tuple(values.items()),
                              tuple((r, c.frame) for r, c in here.items()))
    return None


def _first_difference(op: str, args: Mapping) -> tuple[str, str | None, dict] | None:
    """(argument kind, parameter, {rank: value}) of the first argument of ``op`` that must agree and does not."""
    def differ(values: dict) -> bool:
        return len({repr(v) for v in values.values()}) > 1

    if op in ROOTED:
        roots = {r: a.root for r, a in args.items()}
        if all(v is not None for v in roots.values()) and differ(roots):
            return "root", _root_param(args), roots
    groups = {r: a.group for r, a in args.items()}
    if differ(groups):
        return "group", "group", groups
    if op in REDUCING:
        ops = {r: a.reduce_op for r, a in args.items()}
        if all(v is not None for v in ops.values()) and differ(ops):
            return "reduce_op", "op", ops
    tensors = {r: dict(a.tensors) for r, a in args.items()}
    names = [k for k, _ in next(iter(args.values())).tensors if all(k in t for t in tensors.values())]
    if op in SAME_LENGTH or op in SAME_TENSORS:
        for k in names:
            lengths = {r: t[k].length for r, t in tensors.items()}
            if all(v is not None for v in lengths.values()) and differ(lengths):
                return "length", k, lengths
    if op in SAME_TENSORS:
        for what in ("shape", "dtype"):
            for k in names:
                vals = {r: getattr(t[k], what) for r, t in tensors.items()}
                if all(v is not None for v in vals.values()) and differ(vals):
                    return what, k, vals
    return None


def _root_param(args: Mapping) -> str | None:
    a = next(iter(args.values()))
    return next((k for k in ("src", "dst", "group_src", "group_dst") if getattr(a, k) is not None), None)
