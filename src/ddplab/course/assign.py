"""The learner's and the instructor's notebooks, made by otter-grader's ``otter assign`` from one source
notebook per lab (``course-src/NN_topic.ipynb``, otter's format: solutions and hidden tests in the
notebook, marked by raw cells and comment lines; DESIGN.md, "Source notebooks and otter-grader").

    python -m ddplab.course.assign sources     # course-src/ from notebooks/, solutions/ and the fix-its
    python -m ddplab.course.assign build       # notebooks/ (learner) and build/instructor/ from course-src/

What a source adds to the learner's notebook, and where each text comes from (each is typed once):
- a fix-it's reference fix (``ddplab.course.fixit.exNN.REFERENCE``): inside the ``%%ddplab`` cell, each
  changed block of the broken script is an otter prompt (the broken lines, what the learner gets) followed by
  the solution (the fixed lines, only in the instructor's copy), plus a hidden test that grades it;
- each exercise's and the recap's instructor answers (``solutions/NN_topic.md``, one markdown solution cell a
  section, after the checker the section names): removed from the learner's copy;
- a hidden test per closed-form checker: the call the notebook's checker cell makes, raising with the
  verdict's message, so otter's ``check`` and autograder show ddplab's feedback.

Why sources are made by a script today: several people still edit notebooks/ (lesson_shape, the labs), so
the learner cells are read from notebooks/ and a test keeps course-src/ in step; ``build`` then makes
notebooks/ again from the sources: otter's student notebook, with no output (the outputs of the stored
execution are in course-src/executed/, ``make notebooks``), keeping the stored notebook's metadata.ddplab.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import copy
import difflib
import json
import re
import sys
import tempfile
from pathlib import Path

from ddplab.errors import DdplabError

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "course-src"
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = ROOT / "solutions"
INSTRUCTOR = ROOT / "build" / "instructor"

CONFIG_MARK = "# ASSIGNMENT CONFIG"
# otter assign's settings, the same for every lab: no otter cells in the learner's notebook (it runs without
# otter installed), nothing executed while building (a lab's cells start real jobs), tests as files.
CONFIG = """\
# ASSIGNMENT CONFIG
init_cell: false
check_all_cell: false
export_cell: false
run_tests: false
generate: false
solutions_pdf: false
suppress_no_tests_warning: true
tests:
  files: true
  ok_format: false"""
MAGIC = "%%ddplab"
HIDDEN_MARK = "# HIDDEN"
NOTEBOOK_KEYS = ("kernelspec", "language_info")     # the notebook metadata a source keeps


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else (source or "")


# ---------------------------------------------------------------------------------------------
# Sources: notebooks/ + solutions/ + the fix-its' reference fixes -> course-src/
# ---------------------------------------------------------------------------------------------


def _raw(text: str) -> dict:
    return {"cell_type": "raw", "metadata": {}, "source": text}


def _markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _clean(cell: dict) -> dict:
    """A learner cell as a source holds it: its id, source and own metadata (tags, lesson marks), no outputs
    and no record of an execution."""
    c = {k: copy.deepcopy(v) for k, v in cell.items() if k not in ("outputs", "execution_count")}
    c["metadata"] = {k: v for k, v in c.get("metadata", {}).items() if k not in ("execution", "papermill", "otter")}
    if "tags" in c["metadata"]:      # what otter assign gave the learner's copy, it gives again
        c["metadata"]["tags"] = [t for t in c["metadata"]["tags"] if not t.startswith("otter_")]
    c["source"] = _text(c["source"])
    if c["cell_type"] == "code":
        c["outputs"], c["execution_count"] = [], None
    return c


def prompt_and_solution(broken: str, reference: str) -> str:
    """``reference`` written as otter's solution over ``broken``: each block that differs becomes the broken
    lines as a prompt (a raw string in the instructor's copy, the code itself in the learner's) and the fixed
    lines as a solution block; the lines both share stay as they are."""
    old, new = broken.split("\n"), reference.split("\n")
    out: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if op == "equal":
            out += old[i1:i2]
            continue
        chunk = [ln for ln in old[i1:i2] + new[j1:j2] if ln.strip()]
        indent = min((len(ln) - len(ln.lstrip()) for ln in chunk), default=0) * " "
        if i2 > i1:
            quote = '"""' if not any('"""' in ln for ln in old[i1:i2]) else "'''"
            out += [f"{indent}r{quote} # BEGIN PROMPT", *old[i1:i2], f"{indent}{quote}; # END PROMPT"]
        out += [f"{indent}# BEGIN SOLUTION NO PROMPT", *new[j1:j2], f"{indent}# END SOLUTION"]
    return "\n".join(out)


def fixit_cells(nb_name: str, cell: dict) -> list[dict]:
    """The ``%%ddplab`` cell as otter's question: the broken script as its prompt, the reference fix as its
    solution, and a hidden test that grades the attempt with ``fixit.grade``."""
    from ddplab.course.fixit import get
    ex = get(nb_name[:2])
    source = _text(cell["source"])
    magic, _, body = source.partition("\n")
    if body.rstrip("\n") != ex.broken.rstrip("\n"):
        raise DdplabError(f"{nb_name}: the %%ddplab cell is not fix-it {ex.id}'s broken script",
                          hint=f"make the cell the magic line plus ddplab.course.fixit.{'ex' + ex.lab}.BROKEN")
    name = re.search(r"--name\s+(\w+)", magic)
    if not name:
        raise DdplabError(f"{nb_name}: the %%ddplab cell names no result", hint="add --name to its magic line")
    solved = dict(cell, source=magic + "\n" + prompt_and_solution(ex.broken.rstrip("\n"), ex.reference.rstrip("\n"))
                  + body[len(body.rstrip("\n")):])
    test = _test_cell(f"fix{ex.lab}", [name.group(1)], [
        "from ddplab.course import fixit",
        f"grade = fixit.grade({ex.id!r}, {name.group(1)}, progress=None)",
        "assert grade.passed, str(grade)"])
    return [_raw(f"# BEGIN QUESTION\nname: fix{ex.lab}\ncheck_cell: false"), _raw("# BEGIN SOLUTION"), solved,
            _raw("# END SOLUTION"), _raw("# BEGIN TESTS"), test, _raw("# END TESTS"), _raw("# END QUESTION")]


def _test_cell(name: str, args: list[str], body: list[str]) -> dict:
    """A hidden test in otter's exception-based format: a function of the notebook's names that raises with
    ddplab's own feedback (a fix-it's grade, a checker's verdict) when the answer does not pass."""
    source = [HIDDEN_MARK, f"def test_{name}({', '.join(args)}):", *("    " + ln for ln in body)]
    return {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": "\n".join(source)}


def checker_call(source: str, checker: str) -> tuple[str, list[str]] | None:
    """The call of ``checker`` in a notebook cell (``lab01.check_waiting_rank((rank, collective), broken)``) and
    the notebook names it reads, or None where the cell holds no such call."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        f = getattr(node, "func", None)
        if isinstance(node, ast.Call) and (getattr(f, "attr", None) or getattr(f, "id", None)) == checker:
            names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not hasattr(builtins, n.id)})
            return ast.unparse(node), names
    return None


def checker_test(checker: str, call: tuple[str, list[str]]) -> dict:
    """The hidden test of a closed-form exercise: the checker the notebook calls, judged the same way (the
    one answer that counts, against this execution's runs), its verdict's message as the feedback."""
    expr, names = call
    return _test_cell(checker, names, [f"verdict = {expr}", "assert verdict.passed, verdict.message"])


def solution_sections(path: Path) -> list[tuple[str, str]]:
    """(the checker a section names, or "", the section's text) for each ``## `` section of a solutions file;
    the text before the first section (the title and any preamble) is a section of its own."""
    text = path.read_text()
    parts = re.split(r"(?m)^(?=## )", text)
    out = []
    for part in parts:
        if not part.strip():
            continue
        head = part.splitlines()[0]
        checker = re.search(r"`(?:[\w.]+\.)?(check_\w+)", head) if head.startswith("## ") else None
        out.append((checker.group(1) if checker else "", part.rstrip("\n")))
    return out


def _solution_question(name: str, text: str, test: dict | None = None) -> list[dict]:
    tests = [_raw("# BEGIN TESTS"), test, _raw("# END TESTS")] if test else []
    return [_raw(f"# BEGIN QUESTION\nname: {name}\ncheck_cell: false"), _raw("# BEGIN SOLUTION"),
            _markdown(text), _raw("# END SOLUTION"), *tests, _raw("# END QUESTION")]


def _number(cells: list[dict], lab: str) -> list[dict]:
    """An id for each cell the source adds (nbformat 4.5 wants one): the lab and its place, stable across runs."""
    for i, c in enumerate(cells):
        c.setdefault("id", f"otter-{lab}-{i}")
    return cells


def make_source(notebook: Path, solutions: Path) -> dict:
    """The source notebook of one lab: its learner cells, each solution after the cell it answers."""
    nb = json.loads(notebook.read_text())
    cells = [_clean(c) for c in nb["cells"]]
    sections = solution_sections(solutions) if solutions.exists() else []
    after: dict[int, list[dict]] = {}
    lab = notebook.stem
    for k, (checker, text) in enumerate(sections):
        at = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"
                   and re.search(rf"\b{checker}\(", c["source"])), None) if checker else None
        if at is None:   # the title, the recap answers, discussion points: at the end, after the recap
            after.setdefault(len(cells) - 1, []).extend(_solution_question(f"{lab[:2]}-notes-{k}", text))
            continue
        call = checker_call(cells[at]["source"], checker)
        test = checker_test(checker, call) if call else None
        after.setdefault(at, []).extend(_solution_question(f"{lab[:2]}-{checker}", text, test))
    out = []
    for i, c in enumerate(cells):
        if c["cell_type"] == "code" and c["source"].lstrip().startswith(MAGIC):
            out += fixit_cells(notebook.name, c)
        else:
            out.append(c)
        out += after.get(i, [])
    meta = {k: v for k, v in nb.get("metadata", {}).items() if k in NOTEBOOK_KEYS}
    return {"cells": _number([_raw(CONFIG)] + out, lab[:2]), "metadata": meta, "nbformat": 4,
            "nbformat_minor": nb.get("nbformat_minor", 5)}


def _write(path: Path, nb: dict) -> None:
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def make_sources(notebooks: Path = NOTEBOOKS, solutions: Path = SOLUTIONS, out: Path = SOURCES) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for nb in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        _write(out / nb.name, make_source(nb, solutions / (nb.stem + ".md")))
        written.append(out / nb.name)
    return written


# ---------------------------------------------------------------------------------------------
# Build: course-src/ -> the learner's notebooks and the instructor's, by otter assign
# ---------------------------------------------------------------------------------------------


def check_source(path: Path) -> dict:
    """A source notebook that otter can read: valid JSON whose first cell is its ASSIGNMENT CONFIG."""
    try:
        nb = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DdplabError(f"{path}: not a notebook ({e})",
                          hint="make it again: python -m ddplab.course.assign sources")
    cells = nb.get("cells") or [{}]
    if cells[0].get("cell_type") != "raw" or not _text(cells[0].get("source")).startswith(CONFIG_MARK):
        raise DdplabError(f"{path.name}: a source notebook without its {CONFIG_MARK} raw cell first",
                          hint="make it again: python -m ddplab.course.assign sources")
    return nb


def _otter_assign(source: Path, out: Path) -> None:
    """otter assign into ``out`` (student/ and autograder/), quietly: its log goes to the logger."""
    try:
        from otter.assign import main as assign
    except ImportError:
        raise DdplabError("otter-grader is not installed", hint='pip install -e ".[assign]" (make assign does it)')
    import logging
    logging.getLogger("otter").setLevel(logging.WARNING)
    try:
        assign(str(source), str(out), no_pdfs=True, no_run_tests=True)
    except Exception as e:   # otter's own errors (a bad marker, an unclosed block) as one line
        first = (str(e).splitlines() or [""])[0]
        raise DdplabError(f"{source.name}: otter assign failed: {type(e).__name__}: {first}",
                          hint="fix the source notebook's markers (otter-grader's format)")


def sources_of(nb: dict) -> list[tuple[str, str]]:
    return [(c["cell_type"], _text(c["source"])) for c in nb["cells"]]


def _place(learner: dict, stored: Path) -> bool:
    """Write the learner's notebook (otter's student notebook: no output, otter's tag and metadata on the
    fix-it cell) over ``stored``, keeping the stored notebook's metadata (metadata.ddplab: where and when the
    stored execution ran, ``build.LEARNER_METADATA``); False when ``stored`` already is that notebook. The
    outputs are the stored execution's, in course-src/executed/, never the learner's (issue 42)."""
    if stored.exists():
        old = json.loads(stored.read_text())
        learner["metadata"] = {**old.get("metadata", {}), **learner["metadata"]}
    for c in learner["cells"]:
        if c["cell_type"] == "code":
            c["outputs"], c["execution_count"] = [], None
    text = json.dumps(learner, indent=1, ensure_ascii=False) + "\n"
    if stored.exists() and stored.read_text() == text:
        return False
    stored.write_text(text)
    return True


def build(sources: Path = SOURCES, learner: Path = NOTEBOOKS, instructor: Path = INSTRUCTOR) -> dict[str, bool]:
    """Every source -> the learner's notebook in ``learner`` and the instructor's (solutions, hidden tests as
    otter's test files in tests/) in ``instructor``. Returns {notebook: whether notebooks/ changed}."""
    found = sorted(sources.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise DdplabError(f"no source notebooks in {sources}", hint="python -m ddplab.course.assign sources")
    for src in found:
        check_source(src)
    learner.mkdir(parents=True, exist_ok=True)
    (instructor / "tests").mkdir(parents=True, exist_ok=True)
    changed = {}
    with tempfile.TemporaryDirectory(prefix="ddplab-assign-") as tmp:
        for src in found:
            out = Path(tmp) / src.stem
            _otter_assign(src, out)
            student = json.loads((out / "student" / src.name).read_text())
            changed[src.name] = _place(student, learner / src.name)
            (instructor / src.name).write_text((out / "autograder" / src.name).read_text())
            for t in (out / "autograder" / "tests").glob("*.py"):
                (instructor / "tests" / t.name).write_text(t.read_text())
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddplab.course.assign", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sources", help="course-src/ from notebooks/, solutions/ and the fix-its' reference fixes")
    s.add_argument("--out", type=Path, default=SOURCES)
    b = sub.add_parser("build", help="notebooks/ (learner) and build/instructor/ from course-src/ (otter assign)")
    b.add_argument("--src", type=Path, default=SOURCES)
    b.add_argument("--learner", type=Path, default=NOTEBOOKS)
    b.add_argument("--instructor", type=Path, default=INSTRUCTOR)
    a = p.parse_args(argv)
    try:
        if a.what == "sources":
            for path in make_sources(out=a.out):
                print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        else:
            changed = build(a.src, a.learner, a.instructor)
            for name, ch in changed.items():
                print(f"{name}: {'written (otter student notebook)' if ch else 'unchanged'}")
            print(f"instructor's notebooks and hidden tests: {a.instructor}")
    except DdplabError as e:
        print(f"ddplab: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
