"""Fix-it exercises, graded for real: for each exercise the reference fix passes and each known wrong fix
fails with its own feedback. Each case is one real 2-rank run (a hang is judged by the exercise's stall
window of 2-3 s). The broken script fails with feedback naming its failure: graded on the run each lab
notebook makes of it (tests/fixit_check.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_nothing_left
from fixit_check import assert_broken, fix_lines

from ddplab.course import fixit
from ddplab.errors import DdplabError
from ddplab.course.fixit import Level, Outcome
from ddplab.course.fixit.grader import measure, reference

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
# The broken script is graded from each lab notebook's own unfixed run (tests/fixit_check.py, collected
# in the lab test files that execute their notebook): each case here is a run no notebook makes.
CASES = [(ex.id, "reference") for ex in fixit.exercises()] + \
        [(ex.id, w.key) for ex in fixit.exercises() for w in ex.wrong_fixes]


def _source(ex, case: str) -> str:
    if case == "reference":
        return ex.reference
    return ex.wrong_fix(case).write(ex.broken)


# --- the exercises as data ------------------------------------------------------------------------

@pytest.mark.parametrize("ex", fixit.exercises(), ids=lambda e: e.id)
def test_each_exercise_is_complete_data(ex):
    assert ex.lab == ex.id[:2] and ex.broken != ex.reference and ex.hint and ex.task
    compile(ex.broken, "broken", "exec")
    compile(ex.reference, "reference", "exec")
    assert len(ex.wrong_fixes) >= 3
    keys = [w.key for w in ex.wrong_fixes]
    assert len(set(keys)) == len(keys)
    for w in ex.wrong_fixes:
        src = w.write(ex.broken)          # every edit finds its place exactly once
        assert src != ex.broken and src != ex.reference
        compile(src, w.key, "exec")
        assert w.why and w.source        # the feedback, and where people reported or advised it


def test_an_unknown_exercise_is_one_clear_error():
    with pytest.raises(DdplabError, match="use one of 01"):
        fixit.get("99")


def test_nothing_to_grade_says_not_yet_and_raises_nothing():
    g = fixit.grade("01", None)
    assert g.outcome is Outcome.NOT_RUN and not g.passed
    assert str(g).startswith("Not yet") and "Not yet" in g._repr_html_()


# --- real runs: the reference passes, each wrong fix is named (the broken: tests/fixit_check.py) ----

@pytest.mark.multiprocess
@pytest.mark.timeout(600)      # a reference runs in each layout of its exercise (two runs for most)
@pytest.mark.parametrize("exercise_id, case", CASES, ids=[f"{e}-{c}" for e, c in CASES])
def test_grading(exercise_id, case, session_runs_dir):
    ex = fixit.get(exercise_id)
    g = fixit.grade(exercise_id, _source(ex, case), progress=None, count=False)
    r = g.result
    assert r.leftover == () and r.check is not None and r.nproc == ex.nproc
    assert_nothing_left(str(session_runs_dir))
    shown = str(g)
    if case == "reference":
        assert g.passed and g.outcome is Outcome.PASSED and g.wrong_fix is None and g.mismatch is None, shown
        assert shown.startswith("Fixed")
        # it held in every layout, and each run's collectives are the ones its limit and budget come from
        assert len(g.runs) == len(ex.layouts)
        for layout, run in zip(ex.all_layouts, (r, *g.runs)):
            assert run.nproc == layout.world and measure(run) == reference(ex, layout), (layout, measure(run))
        return
    assert not g.passed and shown.startswith("Not yet"), shown
    w = ex.wrong_fix(case)
    assert g.wrong_fix == case, f"expected {case}, got {g.wrong_fix}: {shown}"
    assert w.why in shown


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_feedback_escalates_and_the_instructor_can_turn_the_reference_off(session_runs_dir):
    ex = fixit.get("03")
    first = fixit.grade("03", ex.broken, progress=None, count=False)
    assert_broken(ex, first)
    result = first.result           # a result run the grader's way is judged as it is, not run again
    fixit.reset("03")
    try:
        levels = [fixit.grade("03", result) for _ in range(3)]
        assert [g.level for g in levels] == [Level.EXPLAIN, Level.HINT, Level.REFERENCE]
        assert all(g.result.run_dir == result.run_dir for g in levels)
        assert ex.hint not in str(levels[0]) and ex.reference not in str(levels[0])
        assert ex.hint in str(levels[1]) and ex.reference not in str(levels[1])
        assert ex.hint in str(levels[2]) and ex.reference in str(levels[2])
        fixit.settings.reference = False
        fourth = fixit.grade("03", result)
        assert fourth.level is Level.HINT and ex.reference not in str(fourth)
        assert ex.reference not in fourth._repr_html_()
    finally:
        fixit.settings.reference = True
        fixit.reset("03")
    assert_nothing_left(str(session_runs_dir))


# --- the notebooks hold the broken script, never the answers --------------------------------------

@pytest.mark.parametrize("ex", fixit.exercises(), ids=lambda e: e.id)
def test_the_lab_notebook_opens_the_broken_script_and_holds_no_reference(ex):
    nb = next(NOTEBOOKS.glob(f"{ex.lab}_*.ipynb"))
    cells = json.loads(nb.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    magic = [s for s in sources if s.startswith("%%ddplab")]
    assert magic, f"{nb.name} has no %%ddplab cell"
    assert any(s.split("\n", 1)[1] == ex.broken for s in magic), f"{nb.name}'s %%ddplab cell is not exercise {ex.id}"
    assert any(f'fixit.grade("{ex.id}"' in s for s in sources)
    text = nb.read_text()
    for line in fix_lines(ex):
        assert json.dumps(line)[1:-1] not in text, f"{nb.name} shows the reference fix: {line}"
    assert json.dumps(ex.hint)[1:-1] not in text


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_wrong_fix_is_named_even_when_the_attempt_passes_everything_else(session_runs_dir):
    """find_unused_parameters=True where nothing is unused: the reference with it ends ok with the right
    result, and the grade says it is not yet fixed, with why (it costs a graph traversal every step)."""
    ex = fixit.get("10")
    w = ex.wrong_fix("find-unused-parameters")
    g = fixit.grade("10", w.write(ex.reference), progress=None, count=False)
    assert g.result.status == "ok" and g.mismatch is None
    assert g.outcome is Outcome.WRONG_FIX and g.wrong_fix == w.key and not g.passed
    assert w.why in str(g)
    assert_nothing_left(str(session_runs_dir))


def test_a_source_that_does_not_compile_is_not_yet_and_starts_nothing(session_runs_dir):
    before = set(Path(session_runs_dir).rglob("*"))
    broken = fixit.get("06").broken
    line = next(i for i, text in enumerate(broken.splitlines(), 1) if text.startswith("world_size = int("))
    g = fixit.grade("06", broken.replace("world_size = int(", "world_size = int(("), count=False)
    assert g.outcome is Outcome.SYNTAX and g.result is None and f"line {line}:" in g.syntax
    assert str(g).startswith("Not yet: SyntaxError")
    assert set(Path(session_runs_dir).rglob("*")) == before
