"""Fix-it exercises, graded for real: for each exercise the reference fix passes, the broken script fails
with feedback naming its failure, and each known wrong fix fails with its own feedback. Each case is one
real 2-rank run (a hang is judged by the exercise's stall window of 2-3 s)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_nothing_left

from ddplab.course import fixit
from ddplab.errors import DdplabError
from ddplab.course.fixit import Level, Outcome

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CASES = [(ex.id, "broken") for ex in fixit.exercises()] + [(ex.id, "reference") for ex in fixit.exercises()] + \
        [(ex.id, w.key) for ex in fixit.exercises() for w in ex.wrong_fixes]
# Exercises whose broken script ends ok with --check clean: only the result check sees them.
ENDS_OK_WRONG = {"07", "08", "11"}
_GRADED: dict[tuple[str, str], fixit.Grade] = {}


def _source(ex, case: str) -> str:
    if case == "broken":
        return ex.broken
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


# --- real runs: the reference passes, the broken fails, each wrong fix is named ----------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("exercise_id, case", CASES, ids=[f"{e}-{c}" for e, c in CASES])
def test_grading(exercise_id, case, session_runs_dir):
    ex = fixit.get(exercise_id)
    g = fixit.grade(exercise_id, _source(ex, case), progress=None, count=False)
    _GRADED[(exercise_id, case)] = g
    r = g.result
    assert r.leftover == () and r.check is not None and r.nproc == ex.nproc
    assert_nothing_left(str(session_runs_dir))
    shown = str(g)
    if case == "reference":
        assert g.passed and g.outcome is Outcome.PASSED and g.wrong_fix is None and g.mismatch is None, shown
        assert shown.startswith("Fixed")
        return
    assert not g.passed and shown.startswith("Not yet"), shown
    if case == "broken":
        assert g.wrong_fix is None, shown
        # the failure is named from the run's own evidence: the signature of a failed or hung run,
        # the --check finding of a silent one; the feedback is ddplab's own explanation of the attempt
        if ex.silent:
            assert g.outcome is Outcome.CHECK and ex.failure in g.findings
        elif exercise_id in ENDS_OK_WRONG:
            assert g.outcome is Outcome.WRONG_RESULT and g.mismatch.what == ex.failure and r.status == "ok"
        else:
            assert g.outcome is Outcome.NOT_OK and r.signature == ex.failure
            assert r.explain() in shown
        return
    w = ex.wrong_fix(case)
    assert g.wrong_fix == case, f"expected {case}, got {g.wrong_fix}: {shown}"
    assert w.why in shown


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_feedback_escalates_and_the_instructor_can_turn_the_reference_off(session_runs_dir):
    ex = fixit.get("03")
    first = _GRADED.get(("03", "broken")) or fixit.grade("03", ex.broken, progress=None, count=False)
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

def _fix_lines(ex) -> list[str]:
    broken = set(ex.broken.splitlines())
    return [line.strip() for line in ex.reference.splitlines() if line.strip() and line not in broken]


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
    for line in _fix_lines(ex):
        assert json.dumps(line)[1:-1] not in text, f"{nb.name} shows the reference fix: {line}"
    assert json.dumps(ex.hint)[1:-1] not in text


@pytest.mark.multiprocess
@pytest.mark.notebook
@pytest.mark.timeout(300)
def test_the_unfixed_section_runs_under_papermill_and_says_not_yet(tmp_path, session_runs_dir):
    """The stored notebook's fix-it cells, executed by papermill in a real kernel with the broken script
    unfixed: no cell fails, the grading cell says "not yet" with ddplab's explanation, and no output holds
    the hint or the reference fix (a first attempt gets neither)."""
    import nbformat
    import papermill
    ex = fixit.get("03")
    nb = nbformat.read(next(NOTEBOOKS.glob(f"{ex.lab}_*.ipynb")), as_version=4)
    start = next(i for i, c in enumerate(nb.cells) if "".join(c.source).startswith("## Fix it yourself"))
    nb.cells = nb.cells[start:]
    src = tmp_path / "fixit.ipynb"
    nbformat.write(nb, src)
    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(str(src), str(out), kernel_name="python3", progress_bar=False,
                               cwd=str(tmp_path))
    done = nbformat.read(out, as_version=4)
    grading = next(c for c in done.cells if c.cell_type == "code" and "fixit.grade(" in c.source)
    shown = "".join(o.get("data", {}).get("text/plain", "") + o.get("text", "") for o in grading.outputs)
    assert shown.startswith("Not yet") and "gloo" in shown, shown
    text = out.read_text()
    assert json.dumps(ex.hint)[1:-1] not in text
    for line in _fix_lines(ex):
        assert json.dumps(line)[1:-1] not in text
    assert_nothing_left(str(session_runs_dir))


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
