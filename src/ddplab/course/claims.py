"""The claims register's rules: what a lab measured for a claim, and the one verdict made from it.

Each article sentence under test is one ``Claim`` in ``ddplab.course.claim_register.REGISTER`` (quotation,
citation, criterion, and the parts each lab's runs supply). A workbook module's
``claim_inputs(runs)`` turns its runs (a mapping, variant name -> run) into ``Inputs``: for each claim
it bears on, a sentence of what was measured and a ``Part`` per part it supplies. ``check(inputs)`` is what every notebook's
claim-check cell shows: the rows of the claims that notebook quotes, each judged once from the parts
of every lab that bears on it (this execution's for this lab; the stored notebooks' for the others,
until ``restamp`` rewrites every stored table from one execution's parts).

Rules of judgement (written here once; DESIGN.md states them):
- a part not measured, or measured on a stand-in for what it is about (a memory cap for GPU memory,
  a CPU emulation for nn.DataParallel, bf16 without scaling, loopback for a network), decides
  nothing: the verdict is then "partly" or "not tested here", never "holds" or "wrong";
- a statistical part holds (or fails) only at its stated level; an inconclusive test is
  "not established", and so is the verdict it leaves undecided;
- a claim's decisive part (what the sentence asserts, as against how it hedges) that a run shows
  false makes the verdict "wrong": a known article error is called wrong where a run shows it.
"""
from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddplab.course import claim_register
from ddplab.course.claim_register import Claim  # noqa: F401  (re-exported: a lab's claims are written with it)
from ddplab.course.notebook import P_LEVEL

HOLDS, FAILS, NOT_MEASURED, STAND_IN, NOT_ESTABLISHED = "holds", "fails", "not measured", "stand-in", "not established"
VERDICTS = ("holds", "partly", "wrong", "not established", "not tested here")
MIME = "application/vnd.ddplab.claims+json"      # the claim table's data in a stored notebook's output


@dataclass(frozen=True)
class Part:
    """What one lab measured for one part of a claim. Make it with ``fact``, ``test``, ``stand_in``
    or ``not_measured``; ``state`` is what the verdict is computed from."""
    holds: bool | None = None
    stand_in: str | None = None     # measured on this stand-in for what the part is about
    p: float | None = None          # a statistical part: its one-sided test's p-value (the claimed way)
    p_against: float | None = None  # ... and the other way's, where the lab tests it
    level: float | None = None
    why: str = ""                   # not measured: why

    @property
    def state(self) -> str:
        if self.stand_in is not None:
            return STAND_IN
        if self.p is not None:
            return (HOLDS if self.p <= self.level else
                    FAILS if self.p_against is not None and self.p_against <= self.level else NOT_ESTABLISHED)
        return NOT_MEASURED if self.holds is None else HOLDS if self.holds else FAILS

    def text(self) -> str:
        if self.stand_in is not None:
            return f"{STAND_IN} ({self.stand_in})"
        if self.p is not None:
            return f"{self.state} (p = {self.p:.3f}, level {self.level:g})"
        return f"{self.state} ({self.why})" if self.why else self.state


def fact(holds: bool) -> Part:
    return Part(holds=bool(holds))


def test(p: float, level: float = P_LEVEL, p_against: float | None = None) -> Part:
    return Part(p=float(p), level=level, p_against=p_against)


def stand_in(what: str) -> Part:
    return Part(stand_in=what)


def not_measured(why: str) -> Part:
    return Part(why=why)


@dataclass(frozen=True)
class Evidence:
    """One lab's share of one claim: what it measured (a sentence made from its runs' fields) and
    the parts it supplies."""
    measured: str
    parts: dict

    def to_dict(self) -> dict:
        return {"measured": self.measured, "parts": {k: asdict(v) for k, v in self.parts.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "Evidence":
        return cls(d["measured"], {k: Part(**v) for k, v in d["parts"].items()})


def evidence(measured: str, **parts: Part | bool) -> Evidence:
    """A bool part is a plain measured fact."""
    return Evidence(measured, {k: v if isinstance(v, Part) else fact(v) for k, v in parts.items()})


@dataclass(frozen=True)
class Inputs:
    """What lab ``lab``'s runs supply to the register: {claim key: Evidence}."""
    lab: str
    rows: dict

    def to_dict(self) -> dict:
        return {"lab": self.lab, "rows": {k: e.to_dict() for k, e in self.rows.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "Inputs":
        return cls(d["lab"], {k: Evidence.from_dict(e) for k, e in d["rows"].items()})


def verdict(states: dict[str, str], decisive: tuple = ()) -> str:
    """The one rule that turns part states into a verdict (see the module's docstring)."""
    values = list(states.values())
    if any(states.get(d) == FAILS for d in decisive):
        return "wrong"
    resolved = [s for s in values if s in (HOLDS, FAILS)]
    if values and len(resolved) == len(values):
        return "holds" if FAILS not in resolved else "wrong" if HOLDS not in resolved else "partly"
    if not resolved:
        return "not established" if NOT_ESTABLISHED in values else "not tested here"
    if NOT_ESTABLISHED in values and FAILS not in resolved:
        return "not established"
    return "partly"


@dataclass(frozen=True)
class Row:
    """A claim judged from every lab's parts: the same row wherever the claim is quoted."""
    claim: Claim
    measured: dict          # lab -> sentence
    parts: dict             # part -> Part (what a lab supplied, or not measured)
    verdict: str

    def to_dict(self) -> dict:
        c = self.claim
        return {"key": c.key, "article": c.article, "quote": c.quote, "source": c.source, "criterion": c.criterion,
                "labs": list(c.labs), "measured": self.measured,
                "parts": {k: {"state": v.state, "text": v.text()} for k, v in self.parts.items()},
                "verdict": self.verdict}


def judge(claim: Claim, inputs: dict[str, Inputs]) -> Row:
    """``claim``'s row from ``inputs`` ({lab: Inputs}); a part of a lab with no inputs is not measured."""
    parts, measured = {}, {}
    for lab, names in sorted(claim.parts.items()):
        ev = inputs[lab].rows.get(claim.key) if lab in inputs else None
        if ev is None:
            parts.update({n: not_measured(f"lab {lab} was not run in this execution") for n in names})
            continue
        if set(ev.parts) != set(names):
            raise ValueError(f"claim {claim.key!r}: lab {lab} supplies {sorted(ev.parts)}, the register asks for "
                             f"{sorted(names)} (ddplab.course.claim_register)")
        parts.update(ev.parts)
        measured[lab] = ev.measured
    parts.update({n: not_measured(why) for n, why in claim.unmeasured.items()})
    return Row(claim, measured, parts, verdict({k: v.state for k, v in parts.items()}, claim.decisive))


def judge_alone(key: str, lab: str, ev: Evidence) -> Row:
    """Claim ``key``'s row from lab ``lab``'s evidence alone (every other lab's parts not measured)."""
    return judge(register()[key], {lab: Inputs(lab, {key: ev})})


def register() -> dict[str, Claim]:
    return {c.key: c for c in claim_register.REGISTER}


def for_lab(lab: str) -> list[Claim]:
    """The claims notebook ``lab`` quotes, in the register's order."""
    return [c for c in register().values() if lab in c.labs]


def table(lab: str, inputs: dict[str, Inputs]) -> "ClaimTable":
    """Notebook ``lab``'s claim table, judged from ``inputs`` of every lab."""
    own = inputs.get(lab)
    if own is not None:
        owed = {c.key for c in for_lab(lab) if lab in c.parts}
        if set(own.rows) != owed:
            raise ValueError(f"lab {lab} supplies claims {sorted(own.rows)}; the register gives it {sorted(owed)} "
                             "(ddplab.course.claim_register)")
    return ClaimTable(lab, [judge(c, inputs) for c in for_lab(lab)], own)


def check(inputs: Inputs, others: dict[str, Inputs] | None = None) -> "ClaimTable":
    """What a notebook's claim-check cell shows: its claims judged from this execution's ``inputs``
    and the other labs' parts (``others``; by default those the stored notebooks hold)."""
    others = stored_inputs() if others is None else others
    return table(inputs.lab, {**others, inputs.lab: inputs})


def _current(i: Inputs) -> Inputs:
    """A stored lab's evidence for the claims whose parts the register still asks of it (a notebook
    stored before the register changed supplies nothing for the rest: those parts are not measured)."""
    reg = register()
    return Inputs(i.lab, {k: e for k, e in i.rows.items()
                          if k in reg and set(e.parts) == set(reg[k].parts.get(i.lab, ()))})


# --- the stored notebooks: where one execution's parts are read back, and every table rewritten ---

def _claim_output(nb: dict) -> dict | None:
    return next((o for c in nb.get("cells", []) if c.get("cell_type") == "code"
                 for o in c.get("outputs", []) if MIME in o.get("data", {})), None)


def inputs_of(nb: dict) -> Inputs | None:
    """The lab's own parts as its notebook stored them (the claim table's data, not its prose)."""
    out = _claim_output(nb)
    own = out["data"][MIME].get("own") if out else None
    return Inputs.from_dict(own) if own else None


def stored_inputs(folder: Path | None = None) -> dict[str, Inputs]:
    from ddplab.origins.catalog import REPO_DIR
    found = {}
    for p in sorted((folder or REPO_DIR / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        try:
            got = inputs_of(json.loads(p.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            got = None
        if got is not None:
            found[got.lab] = _current(got)
    return found


def restamp(nbs: list[dict], others: dict[str, Inputs] | None = None) -> list[dict]:
    """Every claim table in ``nbs`` (executed together) re-rendered from all of their parts (and
    ``others``' for labs not among them), so that a claim quoted in several notebooks shows one row."""
    inputs = dict(others or {})
    inputs.update({i.lab: i for i in map(inputs_of, nbs) if i is not None})
    for nb in nbs:
        out, own = _claim_output(nb), inputs_of(nb)
        if out is not None and own is not None:
            out["data"] = table(own.lab, inputs)._repr_mimebundle_()
    return nbs


class ClaimTable:
    """A notebook's claim-check table: plain text, HTML, and its data (MIME) for tests and restamp."""

    COLOURS = {"holds": "#1a7f37", "wrong": "#cf222e", "partly": "#9a6700", "not established": "#8250df"}

    def __init__(self, lab: str, rows: list[Row], own: Inputs | None = None):
        self.lab, self.rows, self.own = lab, list(rows), own

    def verdicts(self) -> dict[str, str]:
        return {r.claim.key: r.verdict for r in self.rows}

    def row(self, key: str) -> Row:
        return next(r for r in self.rows if r.claim.key == key)

    def to_dict(self) -> list[dict]:
        return [r.to_dict() for r in self.rows]

    def _measured(self, r: Row) -> list[str]:
        return [f"lab {lab}{'' if lab == self.lab else ' (its notebook)'}: {m}" for lab, m in r.measured.items()]

    def __repr__(self) -> str:
        return "\n".join(
            f"[{r.verdict}] “{r.claim.quote}”\n    {r.claim.source}\n    criterion: {r.claim.criterion}\n"
            + "".join(f"    measured, {m}\n" for m in self._measured(r))
            + "    parts: " + "; ".join(f"{k}: {v.text()}" for k, v in r.parts.items())
            for r in self.rows)

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(
            f"<tr><td>“{e(r.claim.quote)}”<br><small>{e(r.claim.source)}</small></td><td>{e(r.claim.criterion)}</td>"
            f"<td>{'<br>'.join(e(m) for m in self._measured(r))}<br><small>"
            + "<br>".join(f"<b>{e(k)}</b>: {e(v.text())}" for k, v in r.parts.items())
            + f"</small></td><td style='color:{self.COLOURS.get(r.verdict, '#6e7781')}'><b>{e(r.verdict)}</b></td></tr>"
            for r in self.rows)
        return ("<table><tr><th>the article says (quoted)</th><th>it holds if</th><th>measured here, and each part</th>"
                f"<th>verdict</th></tr>{rows}</table>")

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return {"text/plain": repr(self), "text/html": self._repr_html_(),
                MIME: {"lab": self.lab, "own": self.own.to_dict() if self.own else None, "rows": self.to_dict()}}
