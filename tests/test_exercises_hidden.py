"""Exercises keep their answers: in the stored notebooks, no output above a checker shows an answer
that checker accepts.

Each checker's output carries, in its metadata, the exercise's key and the answers it accepted in
that execution (`ddplab.course.answers.Checked`); the answer's kind (`ddplab.course.answers`) says how such an
answer reads in an output (its needles). Nothing here parses the checkers' sentences."""
import html
import importlib
import json
import re
from pathlib import Path

import pytest

from ddplab.course import answers

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("00_"))


def _joined(v) -> str:
    return "".join(v) if isinstance(v, list) else v


def output_texts(cell: dict) -> list[str]:
    """Each output of a cell as the text a reader sees: streams, tracebacks, and a rich output's HTML
    where it has one (what Jupyter, nbviewer and GitHub show), else its plain text."""
    texts = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            texts.append(_joined(o["text"]))
        elif o["output_type"] == "error":
            texts.append("\n".join(o.get("traceback", [])))
        elif "text/html" in o.get("data", {}):
            texts.append(html.unescape(re.sub(r"<[^>]+>", " ", _joined(o["data"]["text/html"]))))
        else:
            texts.append(_joined(o.get("data", {}).get("text/plain", "")))
    return texts


def checkers(cells: list[dict]) -> list[tuple[int, str, list]]:
    """(cell index, exercise key, accepted answers) for every checker output in a notebook."""
    found = []
    for i, c in enumerate(cells):
        for o in c.get("outputs", []):
            meta = o.get("metadata", {}).get("ddplab", {})
            if "exercise" in meta:
                found.append((i, meta["exercise"], [answers.from_json(a) for a in meta["accepted"]]))
    return found


def revealed(cells: list[dict], index: int, kind: answers.Kind, accepted: list) -> list[tuple[int, object]]:
    """(cell, answer) for every output above cell ``index`` that shows an accepted answer."""
    return [(i, a) for i in range(index) for text in output_texts(cells[i]) for a in accepted
            if answers.shows(kind, a, text)]


def _module(nb: Path):
    return importlib.import_module(f"ddplab.course.lab{nb.name[:2]}")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_accepted_answer_is_shown_above_its_checker(nb):
    cells = json.loads(nb.read_text())["cells"]
    exercises = _module(nb).EXERCISES
    shown = {key: revealed(cells, i, exercises[key].kind, accepted) for i, key, accepted in checkers(cells)}
    assert not {k: v for k, v in shown.items() if v}, f"{nb.name}: answers shown above their checker (cell, answer)"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_exercise_is_checked_in_its_stored_notebook(nb):
    """The test above has something to look at: every exercise's checker ran in the stored execution,
    and each one that judges runs made above it names what it accepted."""
    cells = json.loads(nb.read_text())["cells"]
    found = {key: accepted for _, key, accepted in checkers(cells)}
    exercises = _module(nb).EXERCISES
    assert set(found) == set(exercises), f"{nb.name}: checkers in the stored outputs {sorted(found)}"
    runs_own = {k for k, e in exercises.items() if e.runs_answer}
    assert all(found[k] for k in set(found) - runs_own), f"{nb.name}: a checker accepted nothing: {found}"


def test_needles_find_each_kind_of_answer_and_nothing_else():
    rank = answers.Pair(answers.Rank(2), answers.collective())
    assert answers.shows(rank, (0, "all_reduce"), "rank 0: hung, waits in barrier\nrank 1: waits in all_reduce")
    assert not answers.shows(rank, (0, "all_reduce"), "rank 0: hung, waits in barrier")
    step = answers.Whole(0, 2, label="step")
    assert answers.shows(step, 1, "failed at step: 1")
    assert not answers.shows(step, 1, "step 0: in 1.5 s")          # 1.5 is not 1
    assert not answers.shows(step, 2, "2/3 clients joined, step 0")  # a count, not the number 2
    frac = answers.Number(0, 1, label="padding")
    assert answers.shows(frac, answers.Interval(0.6, 0.7), "random padding 64.6%")
    assert not answers.shows(frac, answers.Interval(0.6, 0.7), "bucketed padding 13.8%")
    fix = answers.Choice(("batch", "bucket"), labels={"batch": "batch x k"})
    assert answers.shows(fix, "batch", "best fix here: batch x k: 3.18x")
    assert not answers.shows(fix, "batch", "per-rank batch 8")
    assert answers.shows(answers.Ranks(2), (0, 1), "skipped on rank 0 and rank 1")
