"""Small pieces every lab notebook uses: the claim-check table and exercise checks.

A notebook calls these; it holds no logic of its own (nbdev / d2l style). Results render as HTML in
Jupyter and as plain text under papermill logs or a terminal.
"""
from __future__ import annotations

import html
from dataclasses import dataclass


VERDICTS = ("holds", "partly", "wrong", "not tested here")


@dataclass(frozen=True)
class ClaimSpec:
    """One claim under test, as data: the article, the exact words, and what would decide it.

    ``quote`` is a sentence (or a contiguous part of one) copied word for word from the article;
    tests/test_claims.py checks it against the article text wherever that is at hand. ``criterion``
    says, before any run, what measurement makes the claim hold or fail; ``parts`` names the
    conditions the criterion is made of (the keys ``judge`` expects)."""
    key: str
    article: str        # "000".."003" (ddplab.articles)
    quote: str
    criterion: str
    parts: tuple[str, ...] = ("holds",)

    def judge(self, measured: str, imitation: str | None = None, **parts: bool) -> "ClaimResult":
        """The verdict, computed: every part true -> holds, none -> wrong, some -> partly. An
        ``imitation`` (what this run stands in for the real thing with) makes it "not tested here",
        whatever the parts say."""
        if imitation is None and set(parts) != set(self.parts):
            raise ValueError(f"claim {self.key!r} is judged on {self.parts}, got {tuple(parts)}")
        values = [bool(parts[p]) for p in self.parts] if imitation is None else []
        verdict = ("not tested here" if imitation is not None else
                   "holds" if all(values) else "wrong" if not any(values) else "partly")
        return ClaimResult(self, measured, verdict, {p: bool(v) for p, v in parts.items()}, imitation)


@dataclass(frozen=True)
class ClaimResult:
    """A claim's row for this execution: the spec, what was measured (made from the run's fields),
    the verdict computed by ``ClaimSpec.judge`` and the parts it was computed from."""
    spec: ClaimSpec
    measured: str
    verdict: str
    parts: dict
    imitation: str | None = None

    @property
    def claim(self) -> str:
        return self.spec.quote

    @property
    def source(self) -> str:
        from .articles import article

        return article(self.spec.article).cite()

    def to_dict(self) -> dict:
        return {"key": self.spec.key, "article": self.spec.article, "quote": self.spec.quote,
                "source": self.source, "criterion": self.spec.criterion, "measured": self.measured,
                "parts": self.parts, "imitation": self.imitation, "verdict": self.verdict}


class ClaimCheck:
    """A table of the article's claims against this execution's measurements."""

    COLOURS = {"holds": "#1a7f37", "wrong": "#cf222e", "partly": "#9a6700"}

    def __init__(self, claims: list[ClaimResult]):
        self.claims = list(claims)

    def verdicts(self) -> dict[str, str]:
        return {c.spec.key: c.verdict for c in self.claims}

    def to_dict(self) -> list[dict]:
        return [c.to_dict() for c in self.claims]

    def __repr__(self) -> str:
        return "\n".join(
            f"[{c.verdict}] “{c.claim}”\n    {c.source}\n    criterion: {_criterion(c)}\n"
            f"    measured: {c.measured}" + (f"\n    imitation: {c.imitation}" if c.imitation else "")
            for c in self.claims)

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(
            f"<tr><td>“{e(c.claim)}”<br><small>{e(c.source)}</small></td><td>{e(_criterion(c))}</td>"
            f"<td>{e(c.measured)}" + (f"<br><small><b>imitation:</b> {e(c.imitation)}</small>" if c.imitation else "")
            + f"</td><td style='color:{self.COLOURS.get(c.verdict, '#6e7781')}'><b>{e(c.verdict)}</b></td></tr>"
            for c in self.claims)
        return ("<table><tr><th>the article says (quoted)</th><th>it holds if</th><th>measured here, this run</th>"
                f"<th>verdict</th></tr>{rows}</table>")


P_LEVEL = 0.05          # a timing claim's part holds when its test's p-value is at most this


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


def _criterion(c: ClaimResult) -> str:
    return c.spec.criterion


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
        from .catalog import labs

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
