"""A lesson's shape (issue 34, The Carpentries' template as the model), read from the stored notebooks:
learner minutes and objectives at the top, key points and 3-5 recap questions at the end, no test marker
in the learner's code, glossary links that land on a definition, and recap answers only in solutions/.
The notebooks are shaped by `python -m ddplab.course.lesson_shape notebooks/`; the script's own rules
(what it links, what a second run does) are tested on made-up notebooks below."""
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from ddplab.course import build, lesson_shape as ls

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
GLOSSARY = ROOT / "docs" / "glossary.md"
RERUN = "run `python -m ddplab.course.lesson_shape notebooks/`"
REQUIRED = ["stall window", "signature", "ledger", "flight recorder", "stand-in", "rank", "world size", "rendezvous",
            "collective", "verdict", "--check", "fix-it"]


def _nb(path: Path) -> dict:
    return json.loads(path.read_text())


def _src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading (lower case, punctuation but - and _ dropped, spaces to -)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def glossary_anchors() -> set[str]:
    return {_slug(m) for m in re.findall(r"^#{2,3} (.+)$", GLOSSARY.read_text(), re.M)}


def test_every_notebook_has_lesson_data():
    assert {p.name[:2] for p in NOTEBOOKS} == set(ls.LESSONS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_opening_gives_learner_minutes_and_one_objectives_list(path):
    nb = _nb(path)
    first = _src(nb["cells"][0])
    lesson = ls.LESSONS[path.name[:2]]
    m = re.search(r"Teaching: (\d+) min, Exercises: (\d+) min", first)
    assert m, f"{path.name}: no learner minutes in the first cell ({RERUN})"
    fixit = any(c["cell_type"] == "code" and _src(c).startswith("%%ddplab") for c in nb["cells"])
    assert (int(m.group(1)), int(m.group(2))) == ls.learner_minutes(lesson, fixit), RERUN
    assert build.MEASURED_TIME.search(first), "the machine's time is still there for the build to stamp"
    assert first.count("**Objectives.**") == 1 and "**You will:**" not in first
    block = first.split("**Objectives.**", 1)[1]
    items = re.findall(r"^- .+", block.split(ls.HEADER_END)[0], re.M)
    assert len(items) == len(lesson.objectives) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_notebook_ends_with_key_points_and_recap_questions(path):
    cells = _nb(path)["cells"]
    kinds = [c.get("metadata", {}).get("ddplab", {}).get("lesson") for c in cells]
    assert kinds[-2:] == ["keypoints", "recap"] and kinds.count("keypoints") == kinds.count("recap") == 1, RERUN
    keypoints, recap = _src(cells[-2]), _src(cells[-1])
    assert keypoints.startswith("## Key points") and 3 <= len(re.findall(r"^- ", keypoints, re.M)) <= 5
    questions = re.findall(r"^\d+\. (.+)$", recap, re.M)
    assert recap.startswith("## Recap questions") and 3 <= len(questions) <= 5
    assert all(q.endswith("?") for q in questions)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_test_marker_in_the_learners_code(path):
    code = [c for c in _nb(path)["cells"] if c["cell_type"] == "code"]
    assert not [_src(c)[:60] for c in code if "NBVAL" in _src(c)], RERUN
    assert any(build.is_checked(c) for c in code)


def test_the_glossary_defines_every_term_the_issue_names():
    anchors = glossary_anchors()
    assert {_slug(t) for t in REQUIRED} <= anchors
    assert set(ls.TERMS) <= anchors, "every term the script links has an entry"
    for a, b in re.findall(r"\[([^\]]+)\]\(#([^)]+)\)", GLOSSARY.read_text()):
        assert b in anchors, f"glossary links #{b} ({a}), which is no heading"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_glossary_links_resolve(path):
    nb = _nb(path)
    md = "\n".join(_src(c) for c in nb["cells"] if c["cell_type"] == "markdown")
    targets = re.findall(r"\]\(\.\./docs/glossary\.md#([^)]+)\)", md)
    assert targets, f"{path.name} links no glossary term ({RERUN})"
    assert set(targets) <= glossary_anchors()
    assert len(targets) == len(set(targets)), "each term is linked once, at its first use"
    assert (path.parent / "../docs/glossary.md").resolve() == GLOSSARY


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_recap_answers_are_in_solutions_not_in_the_notebook(path):
    lesson = ls.LESSONS[path.name[:2]]
    text = path.read_text()
    solutions = (ROOT / "solutions" / f"{path.stem}.md").read_text()
    assert ls.SOLUTIONS_HEADING in solutions, RERUN
    recap = solutions.split(ls.SOLUTIONS_HEADING, 1)[1]
    for question, answer in lesson.recap:
        assert answer in recap and question in recap
        # no answer, nor a sentence of one, in the notebook (as JSON stores it)
        for sentence in re.split(r"(?<=[.:;])\s+", answer):
            if len(sentence) > 40:
                assert json.dumps(sentence)[1:-1] not in text, f"{path.name} shows a recap answer: {sentence}"


def test_the_stored_notebooks_are_what_the_script_writes(tmp_path):
    """Running the script on the stored notebooks changes nothing: they were shaped by it, with this
    data (after a merge that changed a notebook, run it again)."""
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    assert ls.main([str(tmp_path / "notebooks")]) == 0
    for p in NOTEBOOKS:
        assert (tmp_path / "notebooks" / p.name).read_text() == p.read_text(), f"{p.name}: {RERUN}"
    for p in (ROOT / "solutions").glob("*.md"):
        assert (tmp_path / "solutions" / p.name).read_text() == p.read_text(), f"{p.name}: {RERUN}"


# --- the script's rules, on made-up notebooks ---------------------------------------------------

def _made_up(tmp_path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Lab 01 — x\n\n*Measured time: 12 s, on 2 cores.*\n\n"
                                      "**You will:** make a job hang.\n\nThe script is `labs/01_hang.py`."),
        nbformat.v4.new_markdown_cell("## What the article says\n\n> \"a rank and a collective\"\n\n"
                                      "Each two-rank job: a `rank` in code, \"rank\" quoted, [rank](x) linked.\n"
                                      "Then a rank waits in a collective; run it with `--check`."),
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(1)"),
        nbformat.v4.new_code_cell("%%ddplab --nproc 2\nimport torch"),
    ]
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    for i, c in enumerate(nb.cells):
        c["id"] = f"cell-{i}"
    d = tmp_path / "notebooks"
    d.mkdir()
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "01_hang.md").write_text("# Lab 01\n\n## waiting-rank\n\nanswer\n")
    nbformat.write(nb, d / "01_hang.ipynb")
    return d / "01_hang.ipynb"


def test_the_script_shapes_a_notebook_and_a_second_run_changes_nothing(tmp_path):
    path = _made_up(tmp_path)
    assert ls.main([str(path.parent)]) == 0
    once, sol = path.read_text(), (tmp_path / "solutions" / "01_hang.md").read_text()
    assert ls.main([str(path.parent)]) == 0
    assert path.read_text() == once and (tmp_path / "solutions" / "01_hang.md").read_text() == sol
    nb = json.loads(once)
    first = _src(nb["cells"][0])
    assert "**You will:**" not in first and first.count("**Objectives.**") == 1
    assert "Exercises: 25 min" in first                          # 10 for the predictions, 15 for the fix-it
    assert build.stamp_measured_time({"metadata": {"ddplab": {"seconds": 30}}, "cells": [nb["cells"][0]]})[
        "cells"][0]["source"].count("Measured time: 30 s") == 1
    assert sol.startswith("# Lab 01\n\n## waiting-rank") and sol.count(ls.SOLUTIONS_HEADING) == 1
    checked = nb["cells"][2]
    assert _src(checked) == "print(1)" and checked["metadata"]["tags"] == ["nbval-check-output"]
    assert _src({"source": checked["outputs"][0]["text"]}) == "1\n"
    assert [c.get("metadata", {}).get("ddplab", {}).get("lesson") for c in nb["cells"][-2:]] == ["keypoints", "recap"]


def test_an_executed_notebook_shapes_to_itself(tmp_path):
    """What an execution adds to the lesson's cells (papermill's metadata) stays, and the cells move back
    to the end when someone appended a cell after them."""
    path = _made_up(tmp_path)
    ls.main([str(path.parent)])
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        c.metadata["papermill"] = {"status": "completed"}
    nb.cells.append(nbformat.v4.new_markdown_cell("## On a real cluster", id="late-cell"))
    nbformat.write(nb, path)
    ls.main([str(path.parent)])
    nb = nbformat.read(path, as_version=4)
    assert [c.get("id") for c in nb.cells[-3:]] == ["late-cell", "ddplab-lesson-keypoints", "ddplab-lesson-recap"]
    assert all(c.metadata.get("papermill") for c in nb.cells[-2:])
    once = path.read_text()
    ls.main([str(path.parent)])
    assert path.read_text() == once


def test_a_term_is_linked_once_where_it_is_prose():
    """Not in a heading, a quotation, code, an existing link, or a hyphenated word; a code-span term
    (`--check`) is linked whole."""
    cells = [nbformat.v4.new_markdown_cell("## a rank\n\n> a rank\n\nA two-rank job, `rank`, \"a rank\", [rank](x).\n"
                                           "Then the rank waits; run `--check`; another rank.")]
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    ls.link_terms(nb)
    text = _src(nb.cells[0])
    assert text.count("../docs/glossary.md#rank") == 1
    assert "Then the [rank](../docs/glossary.md#rank) waits" in text
    assert "[`--check`](../docs/glossary.md#--check)" in text
    assert text.startswith("## a rank\n\n> a rank\n\nA two-rank job, `rank`, \"a rank\", [rank](x).")
    ls.link_terms(nb)
    assert _src(nb.cells[0]) == text


def test_recap_answers_replace_their_section_in_place(tmp_path):
    path = tmp_path / "01_hang.md"
    path.write_text(f"# Lab 01\n\n{ls.SOLUTIONS_HEADING}\n\nold\n\n## later section\n\nkept\n")
    assert ls.shape_solutions(path, ls.LESSONS["01"], "x")
    text = path.read_text()
    assert "old" not in text and text.endswith("## later section\n\nkept\n") and text.count(ls.SOLUTIONS_HEADING) == 1
    assert not ls.shape_solutions(path, ls.LESSONS["01"], "x")
