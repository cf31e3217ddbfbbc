"""Who waited for whom: in a hang or a collective timeout, the ranks that waited in a collective,
the ranks they waited for, and whether those were busy (their CPU time still growing), blocked
or gone. Pure function of a result's fields (``RankResult.cpu_busy`` is the supervisor's last
CPU sample); ``ddplab.views.render`` makes the sentence.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ddplab.engine import groups, ledger, signatures
from ddplab.defaults import CPU_PROGRESS_CORES, RankState

if TYPE_CHECKING:  # pragma: no cover
    from ddplab.result import RankResult, RunResult


@dataclass(frozen=True)
class Wait:
    waiters: tuple[int, ...]      # ranks blocked in (or timed out in) a collective
    op: str | None                # the collective they waited in
    seq: int | None               # its number
    waited: tuple[int, ...]       # the ranks they waited for
    how: str                      # "busy" (CPU time growing), "blocked" (alive, no CPU) or "gone" (had exited)
    rep: "RankResult"             # the lowest waited-for rank, whose fields stand for the rest

    def to_dict(self) -> dict:
        return {"waiters": groups.span(self.waiters), "op": self.op, "seq": self.seq,
                "waited": groups.span(self.waited), "how": self.how, "cpu_busy": self.rep.cpu_busy}


def _how(r: "RankResult", result: "RunResult") -> str:
    own_end = r.exit_code == 0 or (r.error is not None and not r.consequence)
    if r.state in (RankState.EXITED, RankState.NOT_STARTED) and (result.status == "hung" or own_end):
        return "gone"
    return "busy" if (r.cpu_busy or 0) >= CPU_PROGRESS_CORES else "blocked"


def _timed_out(r: "RankResult") -> bool:
    if r.error is None:
        return False
    m = signatures.match_text(f"{r.error.type}: {r.error.message}")
    return m is not None and m[0].id == "collective-timeout"


def waited_for(result: "RunResult") -> Wait | None:
    """The wait that explains a hang (the odd group of ranks, while the others wait in a
    collective) or a collective timeout (the ranks that never issued the collective that timed
    out); None when no single group stands out."""
    if result.status == "hung":
        gs = groups.group(result)
        odd = next((g for g in gs if g.odd), None)
        if odd is None:
            return None
        waiting = [r for g in gs if not g.odd for r in (result.rank(n) for n in g.ranks)
                   if r.where is not None and r.where.kind == "collective"]
        if not waiting:
            return None
        w = waiting[0].where
        return Wait(tuple(r.rank for r in waiting), w.op, w.seq, odd.ranks, _how(odd.rep, result), odd.rep)
    # timeout-too-short is a collective timeout whose cause refine() read (engine.classify): the same wait
    if result.status == "failed" and result.signature in ("collective-timeout", "timeout-too-short"):
        waiters = [r for r in result.ranks if _timed_out(r)]
        if not waiters:
            return None
        own = waiters[0].ledger
        pend = ledger.pending(own) or (own[-1] if own else None)   # gloo may retire the one that timed out
        seq = pend.seq if pend is not None else None
        others = [r for r in result.ranks if r not in waiters
                  and (seq is None or not any(c.seq == seq for c in r.ledger))]
        if not others:
            return None
        return Wait(tuple(r.rank for r in waiters), pend.op if pend else None, seq,
                    tuple(r.rank for r in others), _how(others[0], result), others[0])
    return None
