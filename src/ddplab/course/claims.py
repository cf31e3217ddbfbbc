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
  false makes the verdict "wrong": a known article error is called wrong where a run shows it;
- "partly" needs at least one part that holds; with none, the verdict is "wrong" (every part shown
  false, or a decisive one), "not established" (something measured, nothing settled) or "not tested here";
- a part the sentence hedges ("can", "might", "potentially", "suggests": ``Claim.hedged``) is not
  refuted by the settings a lab measured: shown false there, it is "not shown", never "fails";
- a frequency word in the quotation ("primary reason", "typically", "a common issue", ...) is a part no run
  measures: ``judge`` adds it, not measured, to every claim whose quotation has one;
- a stand-in judges only claims about itself: a part measured on one is made with ``judged_on``
  (or ``stand_in``) and decides nothing about the real thing.
"""
from __future__ import annotations

import datetime
import hashlib
import html
import json
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddplab.course import claim_register
from ddplab.course.claim_register import Claim  # noqa: F401  (re-exported: a lab's claims are written with it)
from ddplab.course.notebook import P_LEVEL

HOLDS, FAILS, NOT_MEASURED, STAND_IN, NOT_ESTABLISHED = "holds", "fails", "not measured", "stand-in", "not established"
NOT_SHOWN = "not shown"        # a hedged part ("can ...") that the settings measured did not show: not refuted
STATES = (HOLDS, FAILS, NOT_MEASURED, STAND_IN, NOT_ESTABLISHED, NOT_SHOWN)
# Words that make a sentence a statement of how often (a frequency no run counts), longest first
FREQUENCY_WORDS = ("most frequently", "less frequently", "less frequent", "frequently", "primary reason", "typically",
                   "generally", "usually", "often", "common", "rarely")
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
    why: str = ""                   # not measured, not established or not shown: why
    unsettled: bool = False         # measured, but not in the claim's own setting: settles nothing
    hedge: str | None = None        # shown false, but the sentence only says it "can" happen (this word)

    @property
    def state(self) -> str:
        if self.stand_in is not None:
            return STAND_IN
        if self.unsettled:
            return NOT_ESTABLISHED
        if self.hedge is not None:
            return NOT_SHOWN
        if self.p is not None:
            return (HOLDS if self.p <= self.level else
                    FAILS if self.p_against is not None and self.p_against <= self.level else NOT_ESTABLISHED)
        return NOT_MEASURED if self.holds is None else HOLDS if self.holds else FAILS

    def text(self) -> str:
        if self.stand_in is not None:
            return f"{STAND_IN} ({self.stand_in})"
        if self.hedge is not None:
            return (f"{NOT_SHOWN} here, not refuted (‘{self.hedge}’: one setting that did not show it refutes no "
                    f"claim of what can happen{'; ' + self.why if self.why else ''})")
        if self.p is not None and not self.unsettled:
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


def not_established(why: str) -> Part:
    """Measured, but not in the setting the claim is about (e.g. a timeout other than the default):
    what it showed settles nothing."""
    return Part(unsettled=True, why=why)


def judged_on(stand: str | None, holds: bool) -> Part:
    """A stand-in judges only claims about itself: measured on the real thing (``stand`` None) the part is
    a fact; measured on a stand-in (``stand`` says what stands in for what), it decides nothing, whatever
    it showed."""
    return fact(holds) if stand is None else stand_in(stand)


def not_shown(part: Part, hedge: str) -> Part:
    """A hedged part a lab showed false: kept as measured (``holds`` False), judged "not shown"."""
    return Part(**{**asdict(part), "hedge": hedge})


def frequency_words(quote: str) -> list[str]:
    """The frequency words of ``quote`` (``FREQUENCY_WORDS``), in order: each a part no run measures."""
    pattern = r"\b(" + "|".join(re.escape(w) for w in FREQUENCY_WORDS) + r")\b"
    return [m.group(1).lower() for m in re.finditer(pattern, quote, re.I)]


def frequency_part(word: str) -> Part:
    return not_measured(f"‘{word}’ says how often, across real jobs: a frequency no run counts")


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


def this_machine() -> dict:
    """Which machine made a lab's parts: ``id`` tells two machines apart (a digest, no name shown),
    ``about`` and ``at`` are what a table says of a run made elsewhere."""
    try:
        mid = Path("/etc/machine-id").read_text().strip()
    except OSError:
        mid = ""
    return {"id": hashlib.sha256(f"{platform.node()}|{mid}".encode()).hexdigest()[:12],
            "about": f"{os.cpu_count()} CPUs, {platform.system()} {platform.machine()}",
            "at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


@dataclass(frozen=True)
class Inputs:
    """What lab ``lab``'s runs supply to the register: {claim key: Evidence}, and the machine they ran on
    (None: a notebook stored before machines were recorded)."""
    lab: str
    rows: dict
    machine: dict | None = field(default_factory=this_machine)

    def to_dict(self) -> dict:
        return {"lab": self.lab, "rows": {k: e.to_dict() for k, e in self.rows.items()}, "machine": self.machine}

    @classmethod
    def from_dict(cls, d: dict) -> "Inputs":
        return cls(d["lab"], {k: Evidence.from_dict(e) for k, e in d["rows"].items()}, d.get("machine"))


def verdict(states: dict[str, str], decisive: tuple = ()) -> str:
    """The one rule that turns part states into a verdict (see the module's docstring). "partly" only
    where a part holds; "holds" and "wrong" only where every part is settled (or a decisive one fails)."""
    values = list(states.values())
    unknown = set(values) - set(STATES)
    if unknown:
        raise ValueError(f"unknown part state(s) {sorted(unknown)}: one of {STATES}")
    if any(states.get(d) == FAILS for d in decisive):
        return "wrong"
    holds, fails = HOLDS in values, FAILS in values
    if values and all(s in (HOLDS, FAILS) for s in values):
        return "holds" if not fails else "wrong" if not holds else "partly"
    if NOT_ESTABLISHED in values and not fails:
        return "not established"          # an inconclusive part leaves undecided what the others hold
    if holds:
        return "partly"
    if fails or NOT_ESTABLISHED in values or NOT_SHOWN in values:
        return "not established"          # measured, yet no part holds and not every part was shown false
    return "not tested here"


@dataclass(frozen=True)
class Row:
    """A claim judged from every lab's parts: the same row wherever the claim is quoted."""
    claim: Claim
    measured: dict          # lab -> sentence
    parts: dict             # part -> Part (what a lab supplied, or not measured)
    verdict: str
    machines: dict = field(default_factory=dict)    # lab -> the machine its parts came from (Inputs.machine)
    part_lab: dict = field(default_factory=dict)    # part -> the lab that supplies it (none: no run can)

    def to_dict(self) -> dict:
        c = self.claim
        return {"key": c.key, "article": c.article, "quote": c.quote, "source": c.source, "criterion": c.criterion,
                "labs": list(c.labs), "measured": self.measured, "machines": self.machines,
                "parts": {k: {"state": v.state, "text": v.text()} for k, v in self.parts.items()},
                "verdict": self.verdict}


def judge(claim: Claim, inputs: dict[str, Inputs]) -> Row:
    """``claim``'s row from ``inputs`` ({lab: Inputs}); a part of a lab with no inputs is not measured, a
    hedged part shown false is not shown, and each frequency word of the quotation is a part not measured."""
    parts, measured, machines, part_lab = {}, {}, {}, {}
    for lab, names in sorted(claim.parts.items()):
        part_lab.update({n: lab for n in names})
        ev = inputs[lab].rows.get(claim.key) if lab in inputs else None
        if ev is None:
            parts.update({n: not_measured(f"lab {lab} was not run in this execution") for n in names})
            continue
        if set(ev.parts) != set(names):
            raise ValueError(f"claim {claim.key!r}: lab {lab} supplies {sorted(ev.parts)}, the register asks for "
                             f"{sorted(names)} (ddplab.course.claim_register)")
        parts.update(ev.parts)
        measured[lab], machines[lab] = ev.measured, inputs[lab].machine
    parts.update({n: not_shown(parts[n], word) for n, word in claim.hedged.items() if parts[n].state == FAILS})
    parts.update({n: not_measured(why) for n, why in claim.unmeasured.items()})
    parts.update({f"how often: ‘{w}’": frequency_part(w) for w in frequency_words(claim.quote)})
    return Row(claim, measured, parts, verdict({k: v.state for k, v in parts.items()}, claim.decisive),
               machines, part_lab)


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
                          if k in reg and set(e.parts) == set(reg[k].parts.get(i.lab, ()))}, i.machine)


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
    """Each lab's own parts as the stored execution (course-src/executed/, ``catalog.EXECUTED_DIR``; the
    learner's notebooks hold no output) or the executed notebooks in ``folder`` hold them."""
    if folder is None:
        from ddplab.origins.catalog import EXECUTED_DIR as folder
    found = {}
    for p in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
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


def label(part: str) -> str:
    """A part's name as the learner reads it (no snake_case)."""
    return part.replace("_", " ")


def unreached(text: str, lab: str) -> str:
    """``text`` (the register's or a lab's) as notebook ``lab`` shows it: a lab the learner has not
    reached yet is not cited ("lab 12's" -> "a later notebook's")."""
    def sub(m: re.Match) -> str:
        return m.group(0) if m.group(2) <= lab else ("A" if m.group(1) == "L" else "a") + " later notebook"
    return re.sub(r"\b([Ll])abs? (\d\d)\b", sub, text)


class ClaimTable:
    """A notebook's claim-check table, one compact row per sentence (its verdict and quotation; the
    criterion, what was measured and each part folded under it): plain text, HTML, and its data (MIME)
    for tests and restamp. A lab the learner has not reached is not cited; a lab whose parts came from
    another machine (a learner's re-run beside the stored notebooks) is marked as such."""

    COLOURS = {"holds": "#1a7f37", "wrong": "#cf222e", "partly": "#9a6700", "not established": "#8250df"}

    def __init__(self, lab: str, rows: list[Row], own: Inputs | None = None):
        self.lab, self.rows, self.own = lab, list(rows), own

    def verdicts(self) -> dict[str, str]:
        return {r.claim.key: r.verdict for r in self.rows}

    def row(self, key: str) -> Row:
        return next(r for r in self.rows if r.claim.key == key)

    def to_dict(self) -> list[dict]:
        return [r.to_dict() for r in self.rows]

    def _where(self, lab: str, machine: dict | None) -> str:
        """Where lab ``lab``'s parts of a row come from, said for this notebook."""
        if lab == self.lab:
            return "this notebook's runs"
        here = (self.own.machine or {}).get("id") if self.own else None
        if machine is None or here is None:
            return f"lab {lab}'s stored notebook"
        if machine.get("id") == here:
            return f"lab {lab}'s notebook, run on this machine ({machine.get('at', '?')})"
        return (f"lab {lab}'s stored notebook, run on another machine ({machine.get('about', '?')}, "
                f"{machine.get('at', '?')}), not this one")

    def _measured(self, r: Row) -> list[str]:
        """Each earlier or this lab's measurement; a later lab's is named only as 'a later notebook'."""
        out = [f"{self._where(lab, r.machines.get(lab))}: {unreached(m, self.lab)}"
               for lab, m in r.measured.items() if lab <= self.lab]
        if any(lab > self.lab for lab in r.claim.parts):
            out.append("a later notebook measures the parts marked (later); they count in this verdict")
        return out

    def _parts(self, r: Row) -> list[tuple[str, str, str]]:
        """(label, state, text) of each part; a later lab's part shows its state alone."""
        out = []
        for k, v in r.parts.items():
            later = r.part_lab.get(k, "") > self.lab
            out.append((label(k) + (" (later)" if later else ""), v.state,
                        v.state if later else unreached(v.text(), self.lab)))
        return out

    @staticmethod
    def _tally(parts: list[tuple[str, str, str]]) -> str:
        states = [s for _, s, _ in parts]
        return ", ".join(f"{states.count(s)} {s}" for s in STATES if s in states)

    def __repr__(self) -> str:
        out = []
        for r in self.rows:
            parts = self._parts(r)
            out.append(f"[{r.verdict}] “{r.claim.quote}” ({r.claim.source})\n"
                       f"    parts: {'; '.join(f'{k}: {t}' for k, _, t in parts)}\n"
                       f"    holds if: {unreached(r.claim.criterion, self.lab)}"
                       + "".join(f"\n    measured, {m}" for m in self._measured(r)))
        return "\n".join(out)

    def _repr_html_(self) -> str:
        e = html.escape
        rows = []
        for r in self.rows:
            parts = self._parts(r)
            rows.append(
                f"<tr><td style='color:{self.COLOURS.get(r.verdict, '#6e7781')};white-space:nowrap'>"
                f"<b>{e(r.verdict)}</b></td><td style='text-align:left'>“{e(r.claim.quote)}” "
                f"<small>(article {e(r.claim.article)})</small><details><summary><small>why: {e(self._tally(parts))}"
                f"</small></summary><small>{e(r.claim.source)}<ul>"
                + "".join(f"<li><b>{e(k)}</b>: {e(t)}</li>" for k, _, t in parts)
                + f"</ul><b>it holds if</b> {e(unreached(r.claim.criterion, self.lab))}<ul>"
                + "".join(f"<li>{e(m)}</li>" for m in self._measured(r))
                + "</ul></small></details></td></tr>")
        return ("<table><tr><th>verdict</th><th style='text-align:left'>the article says (quoted); open a row for "
                f"its parts and what was measured</th></tr>{''.join(rows)}</table>")

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return {"text/plain": repr(self), "text/html": self._repr_html_(),
                MIME: {"lab": self.lab, "own": self.own.to_dict() if self.own else None, "rows": self.to_dict()}}
