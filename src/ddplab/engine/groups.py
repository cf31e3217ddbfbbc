"""Ranks grouped by what they were doing: the size of an explanation follows the distinct states, not the ranks.

A job of 1,024 ranks that hangs because one rank entered a barrier has two states ("in all_reduce
#21 at train.py:18", "in barrier #21 at train.py:16"), so it is explained in two lines. ``group``
makes those groups from a result's fields, the odd one first (the likely cause), and ``span``
writes a set of ranks as ranges ("0-6", "7", "0,2,4-6"). Pure functions of data; every view
(``ddplab.views.render``, the ``--json`` summary, ``ddplab.views.timeline``) shows ranks through them.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ddplab.defaults import ALIVE
from ddplab.spans import label, span  # noqa: F401  (re-exported: they live below the engine)

if TYPE_CHECKING:  # pragma: no cover
    from ddplab.result import RankResult, RunResult


def _masked(text: str) -> str:
    """An error's first line with its numbers masked: the same failure on every rank names each
    rank's own address, port or rank number, and must still be one state."""
    line = next((l.strip() for l in (text or "").splitlines() if l.strip()), "")
    return re.sub(r"\d+", "#", line)[:200]


def state_key(r: "RankResult") -> tuple:
    """What makes two ranks' end states the same: their state, what they waited in (op, number,
    who issued it, size), their own line, how they ended, the kind of error they raised."""
    w = r.where if r.state in ALIVE else None
    pending = None
    if w is not None and w.seq is not None:
        pending = next((c.numel for c in reversed(r.ledger) if c.seq == w.seq and not c.completed), None)
    frame = r.frame
    last = r.ledger[-1].seq if r.ledger and r.state not in ALIVE else None
    err = (r.error.type, _masked(r.error.message), r.consequence) if r.error is not None else None
    return (r.state, w.kind if w else None, w.op if w else None, w.via if w else None, w.seq if w else None,
            pending, (frame.file, frame.line, frame.func) if frame else None, r.exit_code, r.signal, last, err)


@dataclass(frozen=True)
class Group:
    """Ranks that ended in the same state; ``rep`` is the lowest of them, whose fields stand for all."""
    ranks: tuple[int, ...]
    rep: "RankResult"
    odd: bool = False             # the group that differs from the rest: the likely cause

    @property
    def label(self) -> str:
        return label(self.ranks)

    def to_dict(self) -> dict:
        """The group as data: its ranks as ranges (``span``), their count, and the shared state."""
        r, w = self.rep, self.rep.where if self.rep.state in ALIVE else None
        return {"ranks": span(self.ranks), "count": len(self.ranks), "odd": self.odd, "state": r.state,
                "kind": w.kind if w else None, "op": w.op if w else None, "seq": w.seq if w else None,
                "via": w.via if w else None, "frame": r.frame.to_dict() if r.frame else None,
                "exit_code": r.exit_code, "signal": r.signal,
                "error": {"type": r.error.type, "message": r.error.message.splitlines()[0] if r.error.message else ""}
                if r.error else None}


def _odd(groups: list[tuple[tuple, list]], first_failure: int | None) -> int | None:
    """Index of the group that differs: the first failing rank's; else the one group smaller than
    every other; else the one group of live ranks outside a collective (or gone) while the others
    wait in one."""
    if len(groups) < 2:
        return None
    if first_failure is not None:
        return next((i for i, (_, rs) in enumerate(groups) if any(r.rank == first_failure for r in rs)), None)
    sizes = sorted(len(rs) for _, rs in groups)
    if sizes[0] < sizes[1]:
        return next(i for i, (_, rs) in enumerate(groups) if len(rs) == sizes[0])
    waiting = [i for i, (k, _) in enumerate(groups) if k[0] in ALIVE and k[1] == "collective"]
    if waiting:
        others = [i for i in range(len(groups)) if i not in waiting]
        if len(others) == 1:
            return others[0]
    return None


def group(result_or_ranks: "RunResult | Sequence[RankResult]", first_failure: int | None = None) -> tuple[Group, ...]:
    """The ranks in groups of one state: the odd group first, then the others from the smallest,
    ties by their lowest rank."""
    ranks = getattr(result_or_ranks, "ranks", result_or_ranks)
    if first_failure is None:
        first_failure = getattr(result_or_ranks, "first_failure", None)
    by_key: dict[tuple, list] = {}
    for r in ranks:
        by_key.setdefault(state_key(r), []).append(r)
    items = sorted(by_key.items(), key=lambda kv: (len(kv[1]), min(r.rank for r in kv[1])))
    for _, rs in items:
        rs.sort(key=lambda r: r.rank)
    odd = _odd(items, first_failure)
    order = ([odd] if odd is not None else []) + [i for i in range(len(items)) if i != odd]
    return tuple(Group(tuple(r.rank for r in items[i][1]), items[i][1][0], odd=(i == odd)) for i in order)


def to_dicts(result_or_ranks) -> list[dict]:
    """The groups as data, for the ``--json`` summary."""
    return [g.to_dict() for g in group(result_or_ranks)]


def first_divergence(result) -> dict | None:
    """Where the collectives diverged first, as facts: the collective number, and the smallest group
    of ranks that issued something else there (another op, other sizes, or nothing: a rank that
    never issued it comes first on a tie), each with its node; the other groups by op."""
    d = result.divergence
    if d is None:
        return None
    groups: dict = {}
    for rank, op in sorted(d.ops.items()):
        groups.setdefault((op, json.dumps(d.sizes.get(rank))), []).append(rank)
    odd = min(groups, key=lambda k: (len(groups[k]), k[0] is not None, groups[k][0]))
    node = {r.rank: r.node for r in result.ranks}
    return {"seq": d.seq, "kind": d.kind, "op": odd[0],
            "ranks": [{"rank": r, "node": node.get(r)} for r in groups[odd]],
            "others": [{"op": k[0], "ranks": rs} for k, rs in groups.items() if k != odd]}
