"""The learner's and the instructor's notebooks come from course-src/ by otter-grader's ``otter assign``
(``ddplab.course.assign``, DESIGN.md "Source notebooks and otter-grader"): the learner's copy has today's
cells and nothing of the solutions or the hidden tests, the instructor's has every solution. One build of
the 13 sources into a temporary folder (no notebook is executed, no job is started); files read as text."""
import importlib
import json
import re
from pathlib import Path

import pytest

from ddplab.course import assign, fixit
from ddplab.errors import DdplabError

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "course-src").glob("[0-9][0-9]_*.ipynb"))
NAMES = [p.name for p in SOURCES]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("assign")
    changed = assign.build(ROOT / "course-src", out / "learner", out / "instructor")
    return out, changed


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def solution_lines(source: Path) -> list[str]:
    """The lines a source holds only for the instructor: its markdown solution cells and the fixed lines of
    its fix-it (inside ``# BEGIN SOLUTION NO PROMPT`` blocks); lines long enough to say something."""
    lines, inside = [], False
    for c in _cells(source):
        s = _src(c)
        if c["cell_type"] == "raw":
            inside = s.startswith("# BEGIN SOLUTION") or (inside and not s.startswith("# END SOLUTION"))
            continue
        if not inside:
            continue
        if c["cell_type"] == "markdown":
            lines += s.splitlines()
            continue
        block = False
        for ln in s.splitlines():
            if ln.strip() in ("# BEGIN SOLUTION NO PROMPT", "# END SOLUTION"):
                block = ln.strip() != "# END SOLUTION"
            elif block:
                lines.append(ln)
    return [ln.strip() for ln in lines if len(ln.strip()) >= 25]


def test_every_notebook_has_its_source_in_step():
    """course-src/ is what `python -m ddplab.course.assign sources` makes from notebooks/, solutions/ and the
    fix-its today: nothing is typed twice, and a source out of step fails here (make sources)."""
    assert NAMES == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for src in SOURCES:
        made = assign.make_source(ROOT / "notebooks" / src.name, ROOT / "solutions" / (src.stem + ".md"))
        assert made == json.loads(src.read_text()), f"course-src/{src.name} is out of step: make sources"


@pytest.mark.parametrize("name", NAMES)
def test_the_learner_notebook_is_the_stored_one(built, name):
    """Every cell of the built learner's notebook, its type, id and source byte for byte, is the stored
    notebook's; the fix-it cell is the broken script as the exercise defines it."""
    out, changed = built
    got = [(c["cell_type"], c.get("id"), _src(c)) for c in _cells(out / "learner" / name)]
    want = [(c["cell_type"], c.get("id"), _src(c)) for c in _cells(ROOT / "notebooks" / name)]
    assert got == want
    assert changed[name]                      # written into an empty folder
    for _, _, s in got:
        if s.startswith(assign.MAGIC):
            assert s.split("\n", 1)[1].rstrip("\n") == fixit.get(name[:2]).broken.rstrip("\n")


@pytest.mark.parametrize("name", NAMES)
def test_no_solution_no_test_no_answer_in_the_learner_files(built, name):
    """Read as text: neither the built learner's notebook nor the stored one holds a line of a solution or
    of a hidden test, nor otter's markers; the built one has no output and no metadata that could carry an
    accepted answer (the stored one's outputs: tests/test_exercises_hidden.py)."""
    out, _ = built
    sol = solution_lines(ROOT / "course-src" / name)
    assert sol
    hidden = [ln.strip() for c in _cells(ROOT / "course-src" / name) if _src(c).startswith(assign.HIDDEN_MARK)
              for ln in _src(c).splitlines()[1:]
              if ln.strip().startswith(("def test_", "assert", "verdict =", "grade ="))]
    assert bool(hidden) == (name[:2] != "00")
    for path in (out / "learner" / name, ROOT / "notebooks" / name):
        text = path.read_text()
        found = [ln for ln in sol + hidden if json.dumps(ln)[1:-1] in text]
        assert not found, f"{path}: instructor's lines in the learner's file: {found[:3]}"
        assert not re.search(r"# (BEGIN|END) (SOLUTION|PROMPT|TESTS|QUESTION)|# HIDDEN|ASSIGNMENT CONFIG", text)
    nb = json.loads((out / "learner" / name).read_text())
    assert all(not c.get("outputs") for c in nb["cells"])
    assert set(nb["metadata"]) <= set(assign.NOTEBOOK_KEYS)
    assert not [c for c in nb["cells"] if set(c["metadata"]) - {"tags", "ddplab", "otter"}]
    assert "accepted" not in json.dumps([c["metadata"] for c in nb["cells"]])


@pytest.mark.parametrize("name", NAMES)
def test_the_instructor_notebook_holds_each_solution(built, name):
    """Every section of solutions/NN_topic.md is a markdown cell of the instructor's notebook, its fix-it cell
    read without otter's prompt blocks is the exercise's reference fix (and is Python), and the hidden test
    that grades it is in the instructor's tests/, marked hidden."""
    out, _ = built
    cells = _cells(out / "instructor" / name)
    markdown = [_src(c) for c in cells if c["cell_type"] == "markdown"]
    for _, section in assign.solution_sections(ROOT / "solutions" / (Path(name).stem + ".md")):
        assert section in markdown, section[:80]
    fix = [_src(c) for c in cells if _src(c).startswith(assign.MAGIC)]
    if name[:2] == "00":
        assert not fix
        return
    body = fix[0].split("\n", 1)[1]
    compile(body, name, "exec")
    kept, prompt = [], False
    for ln in body.split("\n"):
        if ln.rstrip().endswith("# BEGIN PROMPT") or ln.rstrip().endswith("# END PROMPT"):
            prompt = ln.rstrip().endswith("# BEGIN PROMPT")
        elif not prompt and ln.strip() not in ("# BEGIN SOLUTION NO PROMPT", "# END SOLUTION"):
            kept.append(ln)
    ex = fixit.get(name[:2])
    assert "\n".join(kept).rstrip("\n") == ex.reference.rstrip("\n")
    test = (out / "instructor" / "tests" / f"fix{ex.lab}.py").read_text()
    assert f"fixit.grade({ex.id!r}" in test and "hidden=True" in test


@pytest.mark.parametrize("name", [n for n in NAMES if n[:2] != "00"])
def test_every_checker_has_its_hidden_test(built, name):
    """Each closed-form exercise of the lab (its module's EXERCISES) has a hidden otter test that calls the
    checker the notebook calls, as the notebook calls it."""
    out, _ = built
    exercises = importlib.import_module(f"ddplab.course.lab{name[:2]}").EXERCISES
    tests = {p.stem.split("-", 1)[1]: p.read_text()
             for p in (out / "instructor" / "tests").glob(f"{name[:2]}-check_*.py")}
    assert set(tests) == {ex.__name__ for ex in exercises.values()}
    stored = (ROOT / "notebooks" / name).read_text()
    for checker, text in tests.items():
        call = re.search(r"verdict = (.+)", text).group(1)
        assert "hidden=True" in text and json.dumps(call)[1:-1].split("(")[0] + "(" in stored, (checker, call)


def test_otter_check_shows_ddplabs_feedback(built, tmp_path, monkeypatch):
    """otter's own grading call (``otter.Notebook(tests_dir).check``) on lab 01's instructor tests, with the
    names as a learner's notebook has them before any answer (the answer variables None, the fix-it not run):
    every question fails, and the failure otter shows is ddplab's verdict: the checker's message for an unset
    answer, the fix-it grade's "not run" feedback. No job starts."""
    import otter
    from ddplab.course import lab01
    out, _ = built
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPLAB_RUNS_DIR", str(tmp_path / "runs"))
    grader = otter.Notebook(tests_dir=str(out / "instructor" / "tests"))
    env = {"lab01": lab01, "rank": None, "collective": None, "broken": None, "error_after_s": None, "tta": None,
           "fix01": None}
    ex = lab01.EXERCISES
    want = {"01-check_waiting_rank": ex["waiting-rank"]._verdict((None, None), None).message,
            "01-check_error_seconds": ex["timeout-seconds"]._verdict(None, None).message,
            "fix01": str(fixit.grade("01", None, progress=None))}
    for question, feedback in want.items():
        result = grader.check(question, global_env=env)
        assert not result.passed_all and feedback in repr(result), (question, repr(result))


def test_a_source_without_its_config_is_one_line(tmp_path, capsys):
    """A source whose ASSIGNMENT CONFIG cell is gone, or one whose solution block is not closed: one line
    that names the notebook, nothing written to the learner's folder."""
    src = json.loads(SOURCES[1].read_text())
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / SOURCES[1].name).write_text(json.dumps(dict(src, cells=src["cells"][1:])))
    with pytest.raises(DdplabError) as e:
        assign.build(tmp_path / "src", tmp_path / "learner", tmp_path / "instructor")
    assert SOURCES[1].name in str(e.value) and "ASSIGNMENT CONFIG" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "learner").exists()
    rc = assign.main(["build", "--src", str(tmp_path / "src"), "--learner", str(tmp_path / "learner"),
                      "--instructor", str(tmp_path / "instructor")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("ddplab: ")

    unclosed = [c for c in src["cells"] if not _src(c).startswith("# END SOLUTION")]
    (tmp_path / "src" / SOURCES[1].name).write_text(json.dumps(dict(src, cells=unclosed)))
    with pytest.raises(DdplabError) as e:
        assign.build(tmp_path / "src", tmp_path / "learner", tmp_path / "instructor")
    assert "otter assign failed" in str(e.value) and "\n" not in str(e.value)


def test_make_assign_writes_otters_learner_notebook_and_keeps_its_metadata(tmp_path):
    """make assign over notebooks/ (issue 42: it reported every learner notebook "unchanged" and added no
    otter metadata): the learner's notebook becomes otter's student notebook (the fix-it cell tagged
    ``otter_answer_cell`` with ``metadata.otter.tests``), with no output, keeping the stored metadata.ddplab;
    a second build leaves it byte for byte; the instructor's notebook is another file, with the solutions."""
    name = SOURCES[1].name
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / name).write_text(SOURCES[1].read_text())
    learner = tmp_path / "learner"
    learner.mkdir()
    old = json.loads((ROOT / "notebooks" / name).read_text())
    for c in old["cells"]:
        c.get("metadata", {}).pop("otter", None)
        c.get("metadata", {}).get("tags", []).clear() if c["source"] and _src(c).startswith(assign.MAGIC) else None
    old["metadata"]["ddplab"] = {"commit": "abc", "seconds": 12.0}
    (learner / name).write_text(json.dumps(old))
    assert assign.build(tmp_path / "src", learner, tmp_path / "instructor") == {name: True}
    new = json.loads((learner / name).read_text())
    fix = next(c for c in new["cells"] if _src(c).startswith(assign.MAGIC))
    assert "otter_answer_cell" in fix["metadata"]["tags"] and fix["metadata"]["otter"]["tests"]
    assert all(not c.get("outputs") for c in new["cells"] if c["cell_type"] == "code")
    assert new["metadata"]["ddplab"] == {"commit": "abc", "seconds": 12.0}
    written = (learner / name).read_text()
    assert assign.build(tmp_path / "src", learner, tmp_path / "instructor") == {name: False}
    assert (learner / name).read_text() == written
    instructor = (tmp_path / "instructor" / name).read_text()
    assert instructor != written and any(ln in instructor for ln in solution_lines(SOURCES[1]))
