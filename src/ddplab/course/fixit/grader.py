"""The fix-it grader: run an attempt for real and judge it, in order.

1. it ends ok (else the feedback is ddplab's own explanation of the run);
2. ``--check`` is clean where the failure class is silent (the ranks' own records: replicas, data);
3. its result is right against a reference the grader computes itself (``Exercise.judge``): the final
   parameters of the one-process baseline within the stated tolerance, every sample once, the same
   number of steps; so deleting the collective, the loop or the data is not a fix;
4. no known wrong fix is in it (``Exercise.wrong_fixes``: evidence from its code and its run), each
   answered with why it is wrong.

Feedback escalates with the attempts made in this kernel: ddplab's explanation, then the hint, then the
reference fix (self-study). An instructor turns the last step off with one setting: ``settings.reference
= False``, or ``DDPLAB_FIXIT_REFERENCE=0`` in the kernel's environment. A ``Grade`` is data (fields);
its sentences are made when it is shown. Grading never raises for an attempt that is wrong or missing
(papermill runs the stored notebook with the broken cell unfixed): it says "not yet".
"""
from __future__ import annotations

import html as _html
import os
from dataclasses import dataclass, field
from enum import Enum

from ddplab.errors import DdplabError
from ddplab.course.fixit.exercise import Attempt, Exercise, Mismatch

ENV_REFERENCE = "DDPLAB_FIXIT_REFERENCE"


@dataclass
class Settings:
    """What the grader may show. ``reference``: the reference fix after ``REFERENCE_AFTER`` failed
    attempts (self-study); an instructor sets it False (or DDPLAB_FIXIT_REFERENCE=0)."""
    reference: bool = field(default_factory=lambda: os.environ.get(ENV_REFERENCE, "1") != "0")


settings = Settings()
HINT_AFTER = 2          # the hint from the second failed attempt on
REFERENCE_AFTER = 3     # the reference fix from the third (when settings.reference)


class Outcome(str, Enum):
    PASSED = "passed"
    NOT_RUN = "not-run"             # no attempt given (the cell was not run, or was refused)
    SYNTAX = "syntax-error"         # the source does not compile: nothing was started
    NOT_OK = "not-ok"               # the run did not end ok
    CHECK = "check"                 # --check found something where the class is silent
    WRONG_RESULT = "wrong-result"   # the result differs from the grader's reference
    WRONG_FIX = "wrong-fix"         # everything held, but a known wrong fix is in it

    def __str__(self) -> str:
        return self.value


class Level(str, Enum):
    EXPLAIN = "explain"
    HINT = "hint"
    REFERENCE = "reference"


@dataclass(frozen=True)
class Grade:
    exercise: str
    outcome: Outcome
    attempt: int                        # failed attempts at this exercise in this kernel, this one included
    level: Level
    wrong_fix: str | None = None        # the key of the known wrong fix the evidence shows
    mismatch: Mismatch | None = None
    findings: tuple[str, ...] = ()      # --check finding kinds
    result: object | None = None        # the RunResult judged
    syntax: str | None = None           # Python's own syntax error, with its line (Outcome.SYNTAX)

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASSED

    def __str__(self) -> str:
        return text(self)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return html(self)


_FAILED: dict[str, int] = {}


def reset(exercise_id: str | None = None) -> None:
    """Forget the failed attempts (all, or one exercise's): the feedback starts again at the explanation."""
    if exercise_id is None:
        _FAILED.clear()
    else:
        _FAILED.pop(exercise_id, None)


def _level(n: int) -> Level:
    if n >= REFERENCE_AFTER and settings.reference:
        return Level.REFERENCE
    return Level.HINT if n >= HINT_AFTER else Level.EXPLAIN


def grade(exercise_id: str, result_or_source=None, *, progress="auto", count: bool = True) -> Grade:
    """Judge an attempt: a ``RunResult`` from a ``%%ddplab`` cell (its script is read from its run folder),
    or the source itself. The attempt runs for real with the exercise's ranks, stall window and ``--check``
    (a result already run that way is judged as it is). ``count``: whether a failure counts towards the
    hint and the reference."""
    from ddplab.course.fixit.catalog import get
    from ddplab.course.magic import run_source, source_of, syntax_problem
    ex = get(exercise_id)
    if result_or_source is None:
        return Grade(ex.id, Outcome.NOT_RUN, _FAILED.get(ex.id, 0), Level.EXPLAIN)
    if isinstance(result_or_source, str):
        source, result = result_or_source, None
    else:
        result = result_or_source
        source = source_of(result)
        if source is None:
            raise DdplabError(f"the result in {result.run_dir} has no saved script",
                              hint="grade the result of a %%ddplab cell, or pass the script's source")
        if result.check is None or result.nproc != ex.nproc:
            result = None       # run it again the grader's way
    problem = syntax_problem(source)
    if problem is not None:
        return Grade(ex.id, Outcome.SYNTAX, _FAILED.get(ex.id, 0), Level.EXPLAIN, syntax=problem)
    if result is None:
        result = run_source(source, f"fixit{ex.id}", nproc=ex.nproc, stall_s=ex.stall_s, check=True,
                            progress=progress)
    return judge(ex, Attempt(source, result), count=count)


def judge(ex: Exercise, attempt: Attempt, count: bool = True) -> Grade:
    """The order of the module docstring, on a run already made."""
    r = attempt.result
    findings = tuple(sorted(attempt.findings()))
    if attempt.ok:
        attempt.mismatch = ex.judge(attempt, ex.nproc)
    if not attempt.ok:
        outcome = Outcome.NOT_OK
    elif ex.silent and not (r.check is not None and r.check.clean):
        outcome = Outcome.CHECK
    elif attempt.mismatch is not None:
        outcome = Outcome.WRONG_RESULT
    else:
        outcome = Outcome.PASSED
    wrong = next((w.key for w in ex.wrong_fixes if _applies(w, attempt)), None)
    if outcome is Outcome.PASSED and wrong is not None:
        outcome = Outcome.WRONG_FIX
    n = _FAILED.get(ex.id, 0)
    if outcome is not Outcome.PASSED and count:
        n = _FAILED[ex.id] = n + 1
    return Grade(ex.id, outcome, n, _level(n) if outcome is not Outcome.PASSED else Level.EXPLAIN,
                 wrong_fix=wrong, mismatch=attempt.mismatch, findings=findings, result=r)


def _applies(w, attempt: Attempt) -> bool:
    try:
        return bool(w.applies(attempt))
    except Exception:       # a predicate that cannot read this attempt's evidence names nothing
        return False


# ------------------------------------------------------------------------------------------------
# Views: made from the fields when shown
# ------------------------------------------------------------------------------------------------

_OUTCOME = {
    Outcome.PASSED: "Fixed: it ends ok{check}, and its result matches the reference computed in one process.",
    Outcome.NOT_RUN: "Not yet: run the %%ddplab cell above (with your repair), then this cell again.",
    Outcome.SYNTAX: "Not yet: {syntax}",
    Outcome.NOT_OK: "Not yet: the run did not end ok ({status}).",
    Outcome.CHECK: "Not yet: it ends ok, but --check found what the ranks' records should not show ({findings}).",
    Outcome.WRONG_RESULT: "Not yet: it ends ok, but its result is not the reference's ({mismatch}).",
    Outcome.WRONG_FIX: "Not yet: it ends ok with the right result, but it contains a fix that is wrong here.",
}


def _mismatch(m: Mismatch | None) -> str:
    if m is None:
        return ""
    tol = f" within {m.tolerance:g}" if m.tolerance is not None else ""
    exp, got = _short(m.expected), _short(m.got)
    return f"{m.what}: expected {exp}{tol}, got {got}"


def _short(v: object, limit: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def parts(g: Grade) -> list[tuple[str, str]]:
    """The grade as (kind, text) parts: "verdict", "wrong-fix", "explanation", "hint", "reference"."""
    from ddplab.course.fixit.catalog import get
    ex = get(g.exercise)
    r = g.result
    out = [("verdict", _OUTCOME[g.outcome].format(
        status=getattr(r, "status", ""), syntax=g.syntax, findings=", ".join(g.findings),
        mismatch=_mismatch(g.mismatch), check=" with --check clean" if ex.silent else ""))]
    if g.wrong_fix is not None:
        w = ex.wrong_fix(g.wrong_fix)
        out.append(("wrong-fix", f"Your change looks like '{w.key}', which does not fix this: {w.why}"))
    if g.outcome in (Outcome.PASSED, Outcome.NOT_RUN, Outcome.SYNTAX):
        return out
    if r is not None and g.outcome is Outcome.NOT_OK:
        out.append(("explanation", r.explain()))
    elif r is not None and g.outcome is Outcome.CHECK and r.check is not None:
        from ddplab.views.render_check import check_lines
        out.append(("explanation", "\n".join(check_lines(r.check))))
    if g.level in (Level.HINT, Level.REFERENCE):
        out.append(("hint", "Hint: " + ex.hint))
    if g.level is Level.REFERENCE:
        out.append(("reference", "A reference fix (yours may differ and still pass):\n" + ex.reference))
    elif g.level is Level.HINT and settings.reference:
        out.append(("next", f"After {REFERENCE_AFTER} attempts the reference fix is shown."))
    return out


def text(g: Grade) -> str:
    return "\n\n".join(t for _, t in parts(g))


def html(g: Grade) -> str:
    colour = "#1a7f37" if g.passed else "#9a6700"
    rows = []
    for kind, t in parts(g):
        if kind in ("reference", "explanation"):
            rows.append(f"<pre style='white-space:pre-wrap'>{_html.escape(t)}</pre>")
        elif kind == "verdict":
            rows.append(f"<p style='color:{colour};font-weight:bold'>{_html.escape(t)}</p>")
        else:
            rows.append(f"<p>{_html.escape(t)}</p>")
    return "<div class='ddplab-fixit'>" + "".join(rows) + "</div>"
