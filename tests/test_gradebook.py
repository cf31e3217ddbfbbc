"""The instructor's gradebook (ddplab.course.gradebook): four learners' fix-it 01 notebooks, collected from their
homes and graded by otter-grader with real runs, two at a time: the right fix passes, a wrong fix (it ends, with
the wrong model) fails on its result, a barrier in the loop hangs and fails on ddplab's stall rule, and one that
never ends (progress for ever) is ended at the limit derived from the reference fix, without holding up the
others. The gradebook CSV's rows are those outcomes."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("otter", reason="otter-grader is not installed (pip install -e '.[test]')")

from ddplab.course import fixit, gradebook  # noqa: E402
from ddplab.defaults import Status  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# only ends a stuck test: the never-ending submission runs to a limit derived from the reference fix graded
# here, which a loaded machine makes long (430 s -> 1720 s at load average 40)
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(3600)]

REF = fixit.get("01").reference
BROKEN = fixit.get("01").broken
ATTEMPTS = {
    "right": REF,
    # decided together, but on the SUM of the ranks' losses: it ends, later than one process would
    "wrong": REF.replace("mean.item() / d.world_size < 0.05", "mean.item() < 0.05"),
    # a barrier in the loop (a wrong fix learners make): still hangs, judged by ddplab's stall rule
    "hung": BROKEN.replace("    if loss.item() < 0.05:", "    dist.barrier()\n    if loss.item() < 0.05:", 1),
    # decided together on a threshold never reached, in a loop without end: every rank makes progress for ever
    "never-ending": REF.replace("for step in range(500):", "while True:").replace(
        "/ d.world_size < 0.05", "/ d.world_size < 0.0"),
}


def _home(root: Path, learner: str, body: str) -> Path:
    """A learner's home as the hub leaves it: ~/ddplab/01_hang.ipynb with their fix-it cell saved."""
    home = root / learner
    (home / gradebook.LEARNER_DIR).mkdir(parents=True)
    nb = json.loads((ROOT / "notebooks" / "01_hang.ipynb").read_text())
    name, cell_id, magic = gradebook._fixit_cells()["01"]
    cell = next(c for c in nb["cells"] if c.get("id") == cell_id)
    cell["source"] = magic + "\n" + body
    (home / gradebook.LEARNER_DIR / name).write_text(json.dumps(nb))
    return home


def test_gradebook_of_right_wrong_hung_and_never_ending(tmp_path):
    for name, body in ATTEMPTS.items():
        assert body not in (REF, BROKEN) or name == "right", f"the {name} attempt is not what its name says"
    homes = [_home(tmp_path / "home", name, body) for name, body in ATTEMPTS.items()]
    # an untouched fix-it (the broken script as handed out) is not a submission
    untouched = _home(tmp_path / "home", "untouched", BROKEN)
    subs = gradebook.collect([*homes, untouched], tmp_path / "submissions")
    assert sorted(s.learner for s in subs) == sorted(ATTEMPTS) and {s.exercise for s in subs} == {"01"}
    out = ROOT / "build" / "gradebook.csv"
    rows = {r.learner: r for r in gradebook.grade(subs, out, tmp_path / "work")}

    assert rows["right"].outcome is gradebook.Outcome.PASSED, rows["right"]
    assert rows["wrong"].outcome is gradebook.Outcome.FAILED, rows["wrong"]
    assert rows["wrong"].grade == fixit.Outcome.WRONG_RESULT.value and rows["wrong"].run_status == Status.OK.value
    assert rows["hung"].outcome is gradebook.Outcome.FAILED, rows["hung"]
    assert rows["hung"].run_status == Status.HUNG.value, rows["hung"]
    never = rows["never-ending"]
    assert never.outcome is gradebook.Outcome.TIME_LIMIT and never.seconds >= never.limit_s, never
    # the never-ending one held one worker only: the others were graded while it ran
    assert all(r.seconds < never.seconds for n, r in rows.items() if n != "never-ending"), rows
    # nothing of any grading is left
    assert not gradebook._marked_any(), "a grading's processes outlived it"

    with open(out) as f:
        book = {r["learner"]: r for r in csv.DictReader(f)}
    assert list(next(iter(book.values()))) == list(gradebook.FIELDS)
    assert {n: r["outcome"] for n, r in book.items()} == {
        "right": "passed", "wrong": "failed", "hung": "failed", "never-ending": "time-limit"}
    assert all(r["reason"] for r in book.values()), book
    shutil.copy(out, tmp_path / "gradebook.csv")
