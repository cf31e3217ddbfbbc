"""Small pieces every lab notebook uses: the claim-check table and exercise checks.

A notebook calls these; it holds no logic of its own (nbdev / d2l style). Results render as HTML in
Jupyter and as plain text under papermill logs or a terminal.
"""
from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    claim: str          # what the article says (quoted)
    source: str         # seed file and place, e.g. "000, Example 3"
    measured: str       # what this execution measured (computed, never a constant)
    verdict: str        # "holds", "wrong", "partly", "not testable here"

    def to_dict(self) -> dict:
        return {"claim": self.claim, "source": self.source, "measured": self.measured, "verdict": self.verdict}


class ClaimCheck:
    """A table of the article's claims against this execution's measurements."""

    COLOURS = {"holds": "#1a7f37", "wrong": "#cf222e", "partly": "#9a6700"}

    def __init__(self, claims: list[Claim]):
        self.claims = list(claims)

    def to_dict(self) -> list[dict]:
        return [c.to_dict() for c in self.claims]

    def __repr__(self) -> str:
        return "\n".join(f"[{c.verdict}] {c.claim} ({c.source})\n    measured: {c.measured}" for c in self.claims)

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(
            f"<tr><td>{e(c.claim)}<br><small>{e(c.source)}</small></td><td>{e(c.measured)}</td>"
            f"<td style='color:{self.COLOURS.get(c.verdict, '#6e7781')}'><b>{e(c.verdict)}</b></td></tr>"
            for c in self.claims)
        return ("<table><tr><th>the article says</th><th>measured here, this run</th><th>verdict</th></tr>"
                f"{rows}</table>")


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
