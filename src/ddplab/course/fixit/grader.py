"""The fix-it grader: run an attempt for real and judge it by the invariants of the job, measured
from the run (``exercise.Invariant``), in order, in each of the exercise's layouts:

1. it ends ok (else ddplab's own explanation of the run), and within its limit: a rank that issues
   more than ``LIMIT_FACTOR`` times the reference run's collectives is ended ("does not finish: still
   making progress after N collectives"); an interrupted attempt is described by its state then;
2. ``--check``: the samples each rank saw (no sample on two ranks, none dropped) always, and every
   finding where the failure class is silent (replicas, gradients, order);
3. its result against a reference the grader computes itself in one process (``Exercise.judge``):
   every rank's result, the steps, the final parameters within the stated tolerance; so deleting the
   collective, the loop or the data is not a fix;
4. its collectives (each rank's ledger: torch's flight recorder): the same kinds and counts on every
   rank, and, where the task bounds communication, no more than the reference run issues;
5. the same again in the layouts its failure class depends on (``Exercise.layouts``: two torchrun
   agents, RANK != LOCAL_RANK, for rank and init exercises; another world size for data and gather
   exercises), run only once the learner's layout holds.

A known wrong fix (``Exercise.wrong_fixes``) is named only when its evidence (the code and the run)
holds; otherwise the failed invariant, with its measured and expected values, is the reason.

Feedback escalates with the attempts made in this kernel: ddplab's explanation, then the hint, then the
reference fix (self-study). An instructor turns the last step off with one setting: ``settings.reference
= False``, or ``DDPLAB_FIXIT_REFERENCE=0`` in the kernel's environment. A ``Grade`` is data (fields);
its sentences are made when it is shown. Grading never raises for an attempt that is wrong or missing
(papermill runs the stored notebook with the broken cell unfixed): it says "not yet".
"""
from __future__ import annotations

import html as _html
import json
import os
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from ddplab.errors import DdplabError
from ddplab.course.fixit.exercise import Attempt, Exercise, Invariant, Layout, Mismatch, collectives

ENV_REFERENCE = "DDPLAB_FIXIT_REFERENCE"


@dataclass
class Settings:
    """What the grader may show. ``reference``: the reference fix after ``REFERENCE_AFTER`` failed
    attempts (self-study); an instructor sets it False (or DDPLAB_FIXIT_REFERENCE=0)."""
    reference: bool = field(default_factory=lambda: os.environ.get(ENV_REFERENCE, "1") != "0")


settings = Settings()
HINT_AFTER = 2          # the hint from the second failed attempt on
REFERENCE_AFTER = 3     # the reference fix from the third (when settings.reference)
# An attempt's limit: this many times the collectives its reference run issues (at least LIMIT_MIN).
LIMIT_FACTOR = 5
LIMIT_MIN = 200       # a floor where the reference issues few: 07 per tensor issues 40 where it issues 5
# What each exercise's reference fix did, measured from real runs in each layout (``measure``):
# the collectives of every kind on each rank. Written by ``python -m ddplab.course.fixit.grader
# measure``; tests/test_fixit.py compares every reference run with it.
REFERENCE_RUNS = Path(__file__).with_name("reference_runs.json")
# The --check findings about the samples each rank saw: a data invariant of every exercise.
SAMPLE_FINDINGS = frozenset({"samples-overlap", "samples-dropped"})


class Outcome(str, Enum):
    PASSED = "passed"
    NOT_RUN = "not-run"             # no attempt given (the cell was not run, or was refused)
    SYNTAX = "syntax-error"         # the source does not compile: nothing was started
    NOT_OK = "not-ok"               # the run did not end ok
    NOT_FINISHED = "does-not-finish"   # still making progress at its limit (collectives)
    INTERRUPTED = "interrupted"     # the learner interrupted it: described by its state then
    COLLECTIVES = "collectives"     # it ends ok, but its collectives are not the task's
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
    runs: tuple = ()                    # the runs of the other layouts (RunResults), in order
    limit: int | None = None            # the collective limit the attempt ran under
    reference_collectives: int | None = None   # what the reference run issued (the busiest rank)

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
    or the source itself. The attempt runs for real with the exercise's ranks, stall window, ``--check``
    and collective limit (a result already run that way is judged as it is), then, once it holds there,
    in the exercise's other layouts. ``count``: whether a failure counts towards the hint and the
    reference."""
    from ddplab.course.fixit.catalog import get
    from ddplab.course.magic import source_of, syntax_problem
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
    first, *others = ex.all_layouts
    if result is None:
        result = run_attempt(ex, source, first, progress)
    attempt = Attempt(source, result)
    failed = invariants(ex, attempt, first)
    runs = []
    for layout in others if failed is None else ():
        other = Attempt(source, run_attempt(ex, source, layout, progress))
        runs.append(other.result)
        failed = invariants(ex, other, layout)
        if failed is not None:
            break
    return judge(ex, attempt, count=count, failed=failed, runs=tuple(runs))


def grading_of(ex: Exercise, result, count: bool = False) -> Grade:
    """The grade of a run already made, judged as it is in the learner's layout (nothing is run)."""
    from ddplab.course.magic import source_of
    return judge(ex, Attempt(source_of(result) or "", result), count=count)


def run_attempt(ex: Exercise, source: str, layout: Layout, progress="auto"):
    """One real run of ``source`` in ``layout``, the grader's way (stall window, --check, the limit)."""
    from ddplab.course.magic import run_source
    return run_source(source, f"fixit{ex.id}", nproc=layout.nproc, nodes=layout.nodes, stall_s=ex.stall_s,
                      check=True, progress=progress, max_collectives=limit(ex, layout))


def reference_runs() -> dict:
    try:
        return json.loads(REFERENCE_RUNS.read_text())
    except (OSError, ValueError):
        return {}


def reference(ex: Exercise, layout: Layout) -> dict | None:
    """What the reference fix did in ``layout`` (``measure``), or None where it was not measured."""
    return reference_runs().get(ex.id, {}).get(layout.key)


def measure(result) -> dict:
    """A run's collectives as the reference facts store them: each rank's by kind, and the most any
    rank issued."""
    per = {str(rank): dict(sorted(c.items())) for rank, c in sorted(collectives(result).items())}
    return {"collectives": per, "issued": max((sum(c.values()) for c in collectives(result).values()), default=0)}


def limit(ex: Exercise | str, layout: Layout | None = None) -> int | None:
    """The collectives an attempt may issue on a rank before it is ended: LIMIT_FACTOR times the
    reference run's (None where the reference was not measured in this layout). ``ex`` may be an id:
    ``%%ddplab --limit {fixit.limit("01")}`` runs a notebook's attempt under the grader's limit."""
    if isinstance(ex, str):
        from ddplab.course.fixit.catalog import get
        ex = get(ex)
    ref = reference(ex, layout or ex.all_layouts[0])
    return None if ref is None or not ex.limited else max(LIMIT_FACTOR * int(ref["issued"]), LIMIT_MIN)


def issued(result) -> int:
    """The most collectives any rank of the run issued (its ledger's highest number)."""
    from ddplab.engine.ledger import issued as _issued
    return max((_issued(r.ledger) for r in result.ranks), default=0)


def invariants(ex: Exercise, attempt: Attempt, layout: Layout) -> Mismatch | None:
    """The first invariant the run breaks (in the order of the module docstring), or None. Sets
    ``attempt.mismatch`` to the result check's mismatch (the evidence the wrong fixes read)."""
    r = attempt.result
    at = None if layout == ex.all_layouts[0] else layout
    ref = reference(ex, layout)
    status = getattr(r.status, "value", r.status)
    if status in ("deadline", "interrupted"):
        stopped = getattr(r, "stopped", None)
        state = {"collectives": issued(r), "status": status}
        if stopped is not None:
            state.update(idle_s=stopped.idle_s, since_s=stopped.since_s, window_s=stopped.window_s,
                         progressing=stopped.idle_s < stopped.window_s)
        return Mismatch("collectives", ref["issued"] if ref else None, state, invariant=Invariant.FINISHES,
                        layout=at)
    if status != "ok":
        return Mismatch("status", "ok", {"status": status, "signature": r.signature},
                        invariant=Invariant.ENDS_OK, layout=at)
    findings = set(attempt.findings())
    bad = findings if ex.silent else findings & SAMPLE_FINDINGS
    if ex.silent and not (r.check is not None and r.check.clean):
        return Mismatch("findings", [], sorted(bad) or ["not checked"], invariant=Invariant.CHECK, layout=at)
    if bad:
        return Mismatch("findings", [], sorted(bad), invariant=Invariant.CHECK, layout=at)
    attempt.mismatch = ex.judge(attempt, layout.world)
    if attempt.mismatch is not None:
        m = attempt.mismatch
        return Mismatch(m.what, m.expected, m.got, m.tolerance, invariant=m.kind, layout=at)
    counts = collectives(r)
    kinds = {rank: dict(sorted(c.items())) for rank, c in counts.items()}
    if len({tuple(sorted(c.items())) for c in counts.values()}) > 1:
        return Mismatch("collectives on every rank", "the same on every rank", kinds,
                        invariant=Invariant.COLLECTIVES, layout=at)
    if ex.bounded_collectives and ref is not None:
        steps = max(ref["collectives"].get("0", {}).values(), default=0)
        for rank in sorted(counts):
            if stepwise(counts[rank], steps) > steps:
                return Mismatch("collectives", ref["collectives"].get(str(rank)), kinds[rank],
                                invariant=Invariant.COLLECTIVES, layout=at)
    return None


def stepwise(kinds: dict, steps: int) -> int:
    """The collectives a rank issued step by step: every kind it issued at least once a step (``steps``:
    a bounded exercise's reference issues one kind, once a step). A kind issued fewer times is not a
    step's: set-up or a one-off, as the broadcasts a DDP wrapper makes when it is built and when it
    rebuilds its buckets after the first step (measured: 4 broadcasts and an all_gather on 07)."""
    return sum(n for n in kinds.values() if n >= steps)


_OUTCOME_OF = {Invariant.ENDS_OK: Outcome.NOT_OK, Invariant.CHECK: Outcome.CHECK,
               Invariant.COLLECTIVES: Outcome.COLLECTIVES}


def judge(ex: Exercise, attempt: Attempt, count: bool = True, failed: Mismatch | None = ...,
          runs: tuple = ()) -> Grade:
    """The grade of a run already made (its invariants checked here unless given)."""
    r = attempt.result
    if failed is ...:
        failed = invariants(ex, attempt, ex.all_layouts[0])
    findings = tuple(sorted(attempt.findings()))
    if failed is None:
        outcome = Outcome.PASSED
    elif failed.kind is Invariant.FINISHES:
        outcome = Outcome.INTERRUPTED if failed.got.get("status") == "interrupted" else Outcome.NOT_FINISHED
    else:
        outcome = _OUTCOME_OF.get(failed.kind, Outcome.WRONG_RESULT)
    wrong = next((w.key for w in ex.wrong_fixes if _applies(w, attempt)), None)
    if outcome is Outcome.PASSED and wrong is not None:
        outcome = Outcome.WRONG_FIX
    n = _FAILED.get(ex.id, 0)
    if outcome is not Outcome.PASSED and count:
        n = _FAILED[ex.id] = n + 1
    first = ex.all_layouts[0]
    ref = reference(ex, first)
    return Grade(ex.id, outcome, n, _level(n) if outcome is not Outcome.PASSED else Level.EXPLAIN,
                 wrong_fix=wrong, mismatch=failed, findings=findings, result=r, runs=runs,
                 limit=limit(ex, first), reference_collectives=ref["issued"] if ref else None)


def _applies(w, attempt: Attempt) -> bool:
    try:
        return bool(w.applies(attempt))
    except Exception:       # a predicate that cannot read this attempt's evidence names nothing
        return False


# ------------------------------------------------------------------------------------------------
# Views: made from the fields when shown
# ------------------------------------------------------------------------------------------------

_OUTCOME = {
    Outcome.PASSED: "Fixed: it ends ok{check}, its result matches the reference computed in one process, and "
                    "its collectives are the task's{layouts}.",
    Outcome.NOT_RUN: "Not yet: run the %%ddplab cell above (with your repair), then this cell again.",
    Outcome.SYNTAX: "Not yet: {syntax}",
    Outcome.NOT_OK: "Not yet: {at}the run did not end ok ({status}).",
    Outcome.NOT_FINISHED: "Not yet: {at}does not finish: still making progress after {n} collectives "
                          "(the reference needs {m}).",
    Outcome.INTERRUPTED: "Not yet: {at}interrupted {state}.",
    Outcome.CHECK: "Not yet: {at}it ends ok, but --check found what the ranks' records should not show ({findings}).",
    Outcome.WRONG_RESULT: "Not yet: {at}it ends ok, but its result is not the reference's ({mismatch}).",
    Outcome.COLLECTIVES: "Not yet: {at}it ends ok with the right result, but its collectives are not the task's "
                         "({mismatch}).",
    Outcome.WRONG_FIX: "Not yet: it ends ok with the right result, but it contains a fix that is wrong here.",
}


def layout_name(layout: Layout) -> str:
    if layout.nodes > 1:
        return (f"{layout.nodes} nodes of {layout.nproc} rank{'s' if layout.nproc > 1 else ''} "
                f"(two torchrun agents: RANK differs from LOCAL_RANK)")
    return f"{layout.world} ranks"


def _mismatch(m: Mismatch | None) -> str:
    if m is None:
        return ""
    tol = f" within {m.tolerance:g}" if m.tolerance is not None else ""
    exp, got = _short(m.expected), _short(m.got)
    what = "" if m.what == str(m.kind) else f"{m.what}: "
    return f"{m.kind}: {what}expected {exp}{tol}, measured {got}"


def _state(m: Mismatch) -> str:
    """An interrupted attempt's state at the interrupt, from its facts (RunResult.stopped)."""
    st = m.got
    n = st.get("collectives")
    ref = f"; the reference needs {m.expected}" if m.expected is not None else ""
    if st.get("progressing") is None:
        return f"after {n} collectives (its progress at the interrupt was not recorded){ref}"
    if st["progressing"]:
        return f"while still making progress, after {n} collectives{ref}"
    return (f"after no rank had made progress for {st['idle_s']:g} s (since {st['since_s']:g} s after it started), "
            f"at {n} collectives{ref}")


def _short(v: object, limit: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def parts(g: Grade) -> list[tuple[str, str]]:
    """The grade as (kind, text) parts: "verdict", "wrong-fix", "explanation", "hint", "reference"."""
    from ddplab.course.fixit.catalog import get
    ex = get(g.exercise)
    r = g.result
    m = g.mismatch
    at = f"on {layout_name(m.layout)}, " if m is not None and m.layout is not None else ""
    others = ex.layouts
    verdict = _OUTCOME[g.outcome]
    if m is not None:               # the invariant that failed, by its name
        verdict = verdict.replace("Not yet: ", f"Not yet [{m.kind}]: ", 1)
    out = [("verdict", verdict.format(
        status=m.got.get("status") if m is not None and isinstance(m.got, dict) else getattr(r, "status", ""),
        syntax=g.syntax, findings=", ".join(str(f) for f in (m.got if m is not None and m.kind is Invariant.CHECK
                                                              else g.findings)),
        mismatch=_mismatch(m), check=" with --check clean" if ex.silent else "", at=at,
        n=m.got.get("collectives") if m is not None and isinstance(m.got, dict) else None,
        m=g.reference_collectives, state=_state(m) if g.outcome is Outcome.INTERRUPTED else "",
        layouts=(", on " + layout_name(ex.all_layouts[0]) + " and on " + " and ".join(layout_name(x) for x in others))
        if others else ""))]
    if g.wrong_fix is not None:
        w = ex.wrong_fix(g.wrong_fix)
        out.append(("wrong-fix", f"Your change looks like '{w.key}', which does not fix this: {w.why}"))
    if g.outcome in (Outcome.PASSED, Outcome.NOT_RUN, Outcome.SYNTAX):
        return out
    shown = (m.layout is None and r) if m is not None else r
    run = shown or (g.runs[-1] if g.runs else None)
    if run is not None and g.outcome is Outcome.NOT_OK:
        out.append(("explanation", run.explain()))
    elif run is not None and g.outcome is Outcome.CHECK and run.check is not None:
        from ddplab.views.render_check import check_lines
        out.append(("explanation", "\n".join(check_lines(run.check))))
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


if __name__ == "__main__":      # python -m ddplab.course.fixit.grader measure [ID ...]
    import sys
    from ddplab.course.fixit.catalog import exercises
    if sys.argv[1:2] != ["measure"]:
        sys.exit("usage: python -m ddplab.course.fixit.grader measure [ID ...]")
    wanted = set(sys.argv[2:])
    facts = reference_runs()
    for ex in exercises():
        if wanted and ex.id not in wanted:
            continue
        for layout in ex.all_layouts:
            t0 = time.monotonic()
            res = run_attempt(ex, ex.reference, layout, progress=None)
            a = Attempt(ex.reference, res)
            bad = invariants(ex, a, layout) if str(res.status) == "ok" else res.status
            facts.setdefault(ex.id, {})[layout.key] = measure(res)
            print(ex.id, layout.key, res.status, bad, measure(res)["issued"], f"{time.monotonic() - t0:.1f} s",
                  flush=True)
            REFERENCE_RUNS.write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
