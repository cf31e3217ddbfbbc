"""Views of ``ddplab.facts.PrintedDiff`` (what the ranks printed, compared across ranks: ``engine.printed``):
one sentence made from the fact's fields when shown; never parsed back."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ddplab.spans import span

if TYPE_CHECKING:  # pragma: no cover
    from ddplab.facts import PrintedDiff


def _nth(k: int) -> str:
    n = k + 1
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _who(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + span(ranks)


def values_phrase(d: "PrintedDiff") -> str:
    """"rank 0 0.1, rank 1 0.2": the ranks grouped by the value they printed, the lowest rank's group first."""
    groups: dict[str | None, list[int]] = {}
    for v in d.values:
        groups.setdefault(v.value, []).append(v.rank)
    return "; ".join(f"{_who(rs)} {val if val is not None else 'never printed it'}" for val, rs in groups.items())


def printed_sentence(d: "PrintedDiff") -> str:
    """What the ranks printed differently, in one sentence, with the first line where they part."""
    at = d.of(d.first)
    where = (f"rank {d.first}'s {at.stream or 'output'} line {at.line}: `{at.text}`"
             if at is not None and at.line else "")
    if d.kind == "count":
        counts: dict[int, list[int]] = {}
        for v in d.values:
            counts.setdefault(v.count, []).append(v.rank)
        shown = "; ".join(f"{_who(rs)} {n} time{'s' if n != 1 else ''}" for n, rs in sorted(counts.items()))
        return (f"The ranks printed the line with `{d.label}` a different number of times ({shown}), with the same "
                f"values where both printed it, and the ranks that printed it fewer times ended on their own; the "
                f"first print only some ranks made is {where}.")
    how = ""
    if d.agreed:
        how = f" after {d.agreed} print{'s' if d.agreed != 1 else ''} alike on every rank"
    elif d.held:
        how = ", the same on each rank every time it printed it"
    offset = (" (each rank's value is the lowest rank's plus its rank number, as a per-rank seed is: it may be "
              "meant)" if d.by_rank else "")
    return (f"The ranks printed different values of `{d.label}`{how}: {values_phrase(d)} (its {_nth(d.occurrence)} "
            f"print{', ' + where if where else ''}){offset}.")
