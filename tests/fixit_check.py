"""The fix-it attempt each lab notebook runs unfixed, graded from the notebook's own run.

Every lab notebook's ``%%ddplab`` cell runs the exercise's broken script as the learner first meets it,
and the next cell grades it ("not yet", with ddplab's explanation). tests/test_fixit.py graded the same
broken script again in a run of its own; the lab test files that execute their notebook
(tests/notebook_check.py) now grade the notebook's run instead (``fixit.grade`` on a result judges it as
it is, without running it again), with the same assertions (``assert_broken``), and read the grading
cell's output as the learner sees it: "Not yet", and neither the hint nor a line of the reference fix."""
from __future__ import annotations

import json

import pytest

from ddplab.course import fixit, magic
from ddplab.course.fixit import Outcome

# Exercises whose broken script ends ok with --check clean: only the result check sees them.
ENDS_OK_WRONG = {"07", "08", "11"}


def assert_broken(ex, g) -> None:
    """What grading the exercise's broken script gives: not yet, the failure named from the run's own
    evidence (the signature of a failed or hung run, the --check finding of a silent one, the result's
    mismatch of one that ends ok), and ddplab's explanation of the attempt as the feedback."""
    shown = str(g)
    assert not g.passed and shown.startswith("Not yet"), shown
    assert g.wrong_fix is None, shown
    # every exercise's ranks import torch: the question whether any did is never asked (issue 42)
    assert "did any rank import torch" not in shown, shown
    r = g.result
    if ex.silent:
        assert g.outcome is Outcome.CHECK and ex.failure in g.findings
    elif ex.id in ENDS_OK_WRONG:
        assert g.outcome is Outcome.WRONG_RESULT and g.mismatch.what == ex.failure and r.status == "ok"
    else:
        assert g.outcome is Outcome.NOT_OK and r.signature == ex.failure
        assert r.explain() in shown


def fix_lines(ex) -> list[str]:
    """The reference fix's lines that the broken script does not have."""
    broken = set(ex.broken.splitlines())
    return [line.strip() for line in ex.reference.splitlines() if line.strip() and line not in broken]


@pytest.mark.notebook
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_the_notebooks_unfixed_attempt_is_graded_not_yet(notebook):
    """Imported by each lab test file that executes its notebook (pytest collects it there)."""
    if notebook.skipped:
        pytest.skip(notebook.skipped)
    from notebook_check import OUT
    ex = fixit.get(notebook.path.name[:2])       # one exercise a lab, its id the lab's number
    attempts = [r for r in notebook.runs() if magic.source_of(r) == ex.broken]
    assert len(attempts) == 1, f"{notebook.path.name} ran the broken script of fix-it {ex.id} {len(attempts)} times"
    r = attempts[0]
    assert r.leftover == () and r.check is not None and r.nproc == ex.nproc
    assert_broken(ex, fixit.grade(ex.id, r, count=False))
    # the grading cell as the learner sees it after a first, unfixed attempt
    cells = json.loads((OUT / notebook.path.name).read_text())["cells"]
    grading = next(c for c in cells if c["cell_type"] == "code" and f'fixit.grade("{ex.id}"' in "".join(c["source"]))
    shown = "".join("".join(o.get("data", {}).get("text/plain", "")) + "".join(o.get("text", ""))
                    for o in grading["outputs"])
    assert shown.startswith("Not yet"), shown
    for text in (ex.hint, *fix_lines(ex)):
        assert text not in shown
