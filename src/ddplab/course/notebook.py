"""Small pieces every lab notebook uses: exercise checks, the lab table, the timing tests (the claim
tables are ddplab.course.claims).

A notebook calls these; it holds no logic of its own (nbdev / d2l style). Results render as HTML in
Jupyter and as plain text under papermill logs or a terminal.
"""
from __future__ import annotations

import html
from dataclasses import dataclass


P_LEVEL = 0.05          # a timing claim's part holds when its test's p-value is at most this
GAIN = 1.1              # an article's "more than 10 % faster" (labs 07 and 09 test their claims against it)


def sign_test_p(k: int, n: int) -> float:
    """One-sided sign test: the chance of k or more of n paired rounds going one way if either way
    were equally likely. A claim about a small timing effect is judged by rounds that ran its two
    configurations back to back (the same machine load on both), never by one ratio."""
    from math import comb
    return sum(comb(n, i) for i in range(k, n + 1)) / 2 ** n if n else 1.0


RANK_SUM_EXACT_PAIRS = 2500   # n x m up to this: the exact distribution (50 steps a run); above, the normal one


def rank_sum_p(slower: list[float], than: list[float]) -> float:
    """One-sided Mann-Whitney rank-sum test: the chance that ``slower``'s values rank at least this
    high among both lists' if both came from one distribution (ties share their average rank).
    Exact up to RANK_SUM_EXACT_PAIRS pairs (the null distribution counted by dynamic programming over
    the doubled ranks, so a tie's half ranks stay whole); above that the normal approximation with
    the tie correction and a continuity correction, as every statistics package does."""
    n, m = len(slower), len(than)
    if not n or not m:
        return 1.0
    both = sorted(slower + than)
    first, last = {}, {}
    for i, v in enumerate(both, start=1):
        first.setdefault(v, i)
        last[v] = i
    observed = sum(first[v] + last[v] for v in slower)    # 2 x the rank sum
    if n * m > RANK_SUM_EXACT_PAIRS:
        from math import erfc, sqrt
        big = n + m
        ties = sum((last[v] - first[v] + 1) ** 3 - (last[v] - first[v] + 1) for v in first)
        var = n * m / 12 * ((big + 1) - ties / (big * (big - 1)))
        if var <= 0:
            return 1.0
        u = observed / 2 - n * (n + 1) / 2
        return 0.5 * erfc((u - n * m / 2 - 0.5) / sqrt(var) / sqrt(2))
    import numpy as np
    twice = [first[v] + last[v] for v in both]
    top = sum(sorted(twice)[-n:])
    ways = np.zeros((n + 1, top + 1))                     # ways[j, s]: j values chosen, doubled rank sum s
    ways[0, 0] = 1.0
    for k, r in enumerate(twice, start=1):
        for j in range(min(n, k), 0, -1):
            ways[j, r:] += ways[j - 1, :top + 1 - r]
    return float(ways[n, observed:].sum() / ways[n].sum())


@dataclass(frozen=True)
class Check:
    """The verdict on an exercise answer, checked against a real run."""
    passed: bool
    message: str

    def __repr__(self) -> str:
        return ("PASS: " if self.passed else "NOT YET: ") + self.message

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.passed else "#cf222e"
        return f"<p style='color:{colour}'><b>{'PASS' if self.passed else 'NOT YET'}</b>: {html.escape(self.message)}</p>"


class LabTable:
    """The lab list (from the lab scripts' LAB dicts) as a table."""

    def __init__(self):
        from ddplab.origins.catalog import labs

        self.labs = labs()

    def to_dict(self) -> list[dict]:
        return [l.to_dict() for l in self.labs]

    def __repr__(self) -> str:
        return "\n".join(f"{l.number}  {l.title}  [{', '.join(v.name for v in l.variants)}]" for l in self.labs)

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(
            f"<tr><td>{l.number}</td><td>{e(l.title)}</td><td>{e(l.article[:3])}</td>"
            f"<td>{'<br>'.join(f'<code>{e(v.name)}</code> → {e(v.expect)}' for v in l.variants)}</td></tr>"
            for l in self.labs)
        return f"<table><tr><th>lab</th><th>title</th><th>article</th><th>variants → outcome</th></tr>{rows}</table>"


# --- key points made from the notebook's own runs (issue 42) ----------------------------------------

@dataclass(frozen=True)
class KeyPoints:
    """A notebook's key points, every number and every comparative word made from the runs it was given
    (a lab's ``keypoints(runs)``): Markdown in Jupyter, the same text elsewhere."""
    points: tuple[str, ...]

    def markdown(self) -> str:
        return "## Key points\n\n" + "\n".join(f"- {p}" for p in self.points)

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __repr__(self) -> str:
        return self.markdown()


FASTER, SAME, SLOWER = "faster", "about the same", "slower"


def compared(ratio: float, gain: float = GAIN) -> str:
    """How one measured ratio of two rates reads, by the claims' threshold for "faster" (``GAIN``, the
    articles' "more than 10 %"): at least ``gain`` is faster, at most 1/``gain`` slower, between them
    about the same. For one ratio shown beside its value; a claim about a small effect is judged by
    paired rounds (``sign_test_p``), never by this."""
    if ratio >= gain:
        return FASTER
    if ratio <= 1 / gain:
        return SLOWER
    return SAME
