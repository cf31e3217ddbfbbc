"""The instructor's gradebook: collect the learners' fix-it notebooks, grade each by real runs with
otter-grader, one CSV row per learner and exercise (learner, exercise, outcome, reason).

    ddplab classroom grade --homes /home/learner* --out build/gradebook.csv     # after (or during) a session

- Collect: each learner's copy of a lab notebook (``~/ddplab/01_hang.ipynb``, what the hub serves them) gives its
  fix-it cell, found by the cell id the repository's notebook gives the exercise's broken script; the submission
  is that cell after ``%load_ext ddplab``, in a notebook of its own (the rest of the lab is not graded, and its
  runs would cost minutes per learner).
- Grade: ``otter run`` (otter-grader's grader without containers: ``otter grade`` needs Docker) with an
  autograder made by ``otter assign`` and ``otter generate`` from the exercise's hidden test, the one
  ``make assign`` writes (``fixit.grade(...)`` on the learner's ``--name`` result; ddplab.course.assign). So the
  verdict is a real run judged by ddplab's grader; otter carries it.
- Bounded: each submission's grading is a process group of its own with a time limit derived from the
  reference fix graded the same way on this machine (``LIMIT_FACTOR`` times its seconds, at least
  ``LIMIT_FLOOR_S``); at the limit everything it started is ended (found by a mark in its environment) and
  the row says so. A hang is the grader's own verdict (ddplab's stall rule, seconds); a job that never ends
  (progress for ever) is the limit's. ``WORKERS`` submissions are graded at once, so one that never ends holds
  one worker, never the others.
- The row's outcome is data: ``passed``, ``failed`` (ddplab's grade outcome beside it, e.g. ``not-ok``,
  ``wrong-result``, and the run's status, e.g. ``hung``), ``time-limit``, or ``error`` (the notebook could not
  be graded); the reason is made from those fields and the grade's own first line.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

from ddplab.errors import DdplabError

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOKS = ROOT / "notebooks"
LEARNER_DIR = "ddplab"         # each learner's copy of notebooks/ in their home (ddplab.tools.hub.NOTEBOOKS_DIR)
LIMIT_FACTOR = 4.0             # a submission's limit: this many times the reference fix's grading here...
LIMIT_FLOOR_S = 60.0           # ...and never less than this
WORKERS = max(1, min(2, os.cpu_count() or 1))
MARK = "DDPLAB_GRADING"        # in each grading's environment: how the limit finds everything it started
RECORD = "DDPLAB_GRADE_RECORD"  # where the hidden test writes the grade's fields (data, not its text)
FIELDS = ("learner", "exercise", "outcome", "reason", "grade", "run_status", "seconds", "limit_s")


class Outcome(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    TIME_LIMIT = "time-limit"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Submission:
    learner: str
    exercise: str
    path: str          # the submission notebook (load_ext + the learner's fix-it cell)


@dataclass(frozen=True)
class Row:
    learner: str
    exercise: str
    outcome: Outcome
    grade: str | None          # ddplab's grade outcome (fixit.Outcome's value), None when none was made
    run_status: str | None     # the attempt's run status (hung, failed, ok, ...)
    seconds: float
    limit_s: float
    message: str = ""          # the grade's first line (its own view), or otter's error

    @property
    def reason(self) -> str:
        if self.outcome is Outcome.TIME_LIMIT:
            return (f"still running at the limit of {self.limit_s:.0f} s: ended, with everything it "
                    "started; a job that never ends")
        if self.outcome is Outcome.ERROR:
            return f"could not be graded: {self.message}"
        return self.message

    def to_csv(self) -> dict:
        d = {k: getattr(self, k) for k in FIELDS}
        d["outcome"] = str(self.outcome)
        d["seconds"] = round(self.seconds, 1)
        d["limit_s"] = round(self.limit_s, 1)
        return d


def record(grade) -> None:
    """Called by the gradebook's hidden test: the grade's fields as JSON where the gradebook reads them."""
    path = os.environ.get(RECORD)
    if path:
        r = getattr(grade, "result", None)
        Path(path).write_text(json.dumps({
            "passed": bool(grade.passed), "outcome": str(grade.outcome),
            "status": str(r.status) if r is not None else None,
            "message": str(grade).strip().splitlines()[0] if str(grade).strip() else ""}))


# ------------------------------------------------------------------------------------------------
# Collect
# ------------------------------------------------------------------------------------------------

def _fixit_cells() -> dict[str, tuple[str, str, str]]:
    """exercise id -> (notebook name, fix-it cell id, magic line) from the repository's learner notebooks."""
    from ddplab.course import fixit
    found = {}
    for ex in fixit.exercises():
        for nb_path in sorted(NOTEBOOKS.glob(f"{ex.lab}_*.ipynb")):
            nb = json.loads(nb_path.read_text())
            for c in nb["cells"]:
                src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                magic, _, body = src.partition("\n")
                if magic.startswith("%%ddplab") and body.rstrip("\n") == ex.broken.rstrip("\n"):
                    found[ex.id] = (nb_path.name, c["id"], magic)
    return found


def collect(homes: list[str | Path], out: Path, exercises: list[str] | None = None) -> list[Submission]:
    """Each learner's fix-it cells as submission notebooks in ``out``: the ``exercises`` named, or by default
    every fix-it whose cell the learner changed (an untouched cell is the broken script: nothing handed in)."""
    import nbformat

    from ddplab.course import fixit
    cells = _fixit_cells()
    wanted = exercises or sorted(cells)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    subs = []
    for home in homes:
        home = Path(home)
        for ex in wanted:
            if ex not in cells:
                raise DdplabError(f"no notebook in {NOTEBOOKS} holds fix-it {ex}'s cell",
                                  hint="choose from " + ", ".join(sorted(cells)))
            name, cell_id, magic = cells[ex]
            mine = home / LEARNER_DIR / name
            if not mine.exists():
                continue
            nb = nbformat.read(mine, as_version=4)
            cell = next((c for c in nb.cells if c.get("id") == cell_id), None)
            if cell is None:
                continue
            if exercises is None and cell.source.rstrip("\n") == (magic + "\n" + fixit.get(ex).broken).rstrip("\n"):
                continue
            sub = nbformat.v4.new_notebook()
            sub.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
            sub.cells = [nbformat.v4.new_code_cell("%load_ext ddplab"), nbformat.v4.new_code_cell(cell.source)]
            path = out / f"{home.name}-fix{ex}.ipynb"
            nbformat.write(sub, path)
            subs.append(Submission(home.name, ex, str(path)))
    return subs


# ------------------------------------------------------------------------------------------------
# The autograder (otter assign + otter generate), and one submission graded under its limit
# ------------------------------------------------------------------------------------------------

def autograder(exercise: str, out: Path) -> Path:
    """otter's autograder.zip for one fix-it: its hidden test (ddplab.course.assign's, with the grade's fields
    recorded) over a source notebook holding only the fix-it question."""
    import nbformat
    from otter.assign import main as assign
    from otter.generate import main as generate

    from ddplab.course import assign as course_assign
    name, cell_id, magic = _fixit_cells()[exercise]
    from ddplab.course import fixit
    cell = {"cell_type": "code", "id": cell_id, "metadata": {}, "outputs": [], "execution_count": None,
            "source": magic + "\n" + fixit.get(exercise).broken}
    question = course_assign.fixit_cells(name, cell)
    for c in question:
        src = c["source"] if isinstance(c["source"], str) else "".join(c["source"])
        if src.startswith(course_assign.HIDDEN_MARK):
            lines = src.splitlines()
            at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("assert grade.passed"))
            indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
            lines.insert(at, f"{indent}from ddplab.course import gradebook; gradebook.record(grade)")
            c["source"] = "\n".join(lines)
    src_nb = nbformat.v4.new_notebook()
    src_nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src_nb.cells = [nbformat.from_dict(course_assign._raw(course_assign.CONFIG)),
                    nbformat.v4.new_code_cell("%load_ext ddplab"),
                    *[nbformat.from_dict(c) for c in question]]
    for i, c in enumerate(src_nb.cells):
        c["id"] = f"fix{exercise}-{i}"
    out = Path(out)
    work = out / f"assign-{exercise}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    nbformat.write(src_nb, work / f"fix{exercise}.ipynb")
    import logging
    logging.getLogger("otter").setLevel(logging.WARNING)
    assign(str(work / f"fix{exercise}.ipynb"), str(work / "dist"), no_pdfs=True, no_run_tests=True)
    zip_path = out / f"autograder-fix{exercise}.zip"
    generate(tests_dir=str(work / "dist" / "autograder" / "tests"), output_path=str(zip_path),
             no_config=True, no_requirements=True, no_environment=True)
    return zip_path


def _marked(tag: str | None) -> list:
    """Live processes whose environment carries the grading mark ``tag`` (None: any grading's)."""
    import psutil
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            mark = p.environ().get(MARK)
            if mark is not None and (tag is None or mark == tag):
                found.append(p)
        except psutil.Error:
            pass
    return found


def _marked_any() -> list:
    return _marked(None)


def _end_all(tag: str) -> None:
    """End every process the grading marked ``tag`` started (its kernel and its jobs run in sessions of their
    own, so the process group is not enough), until none is left."""
    from ddplab.tools.hub import end_processes
    for _ in range(10):
        left = _marked(tag)
        if not left:
            return
        end_processes(left, grace_s=0)


def grade_one(sub: Submission, zip_path: Path, limit_s: float, work: Path,
              stop: threading.Event | None = None) -> Row:
    """``otter run`` on one submission in a process group of its own, its runs in a folder of its own, ended
    (everything it started) at ``limit_s``, or at once when ``stop`` is set (the gradebook was interrupted)."""
    work = Path(work) / f"{sub.learner}-fix{sub.exercise}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "runs").mkdir(parents=True)
    tag = f"{os.getpid()}-{sub.learner}-{sub.exercise}-{time.monotonic_ns()}"
    rec = work / "grade.json"
    env = {**os.environ, MARK: tag, RECORD: str(rec), "DDPLAB_RUNS_DIR": str(work / "runs"),
           "DDPLAB_FIXIT_REFERENCE": "0", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "otter", "run", "--no-logo", "-a", str(zip_path), "-o", str(work), sub.path]
    t0 = time.monotonic()
    with open(work / "otter.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = interrupted = False
        while proc.poll() is None:
            timed_out = time.monotonic() - t0 >= limit_s
            interrupted = stop is not None and stop.is_set()
            if timed_out or interrupted:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                break
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
    seconds = time.monotonic() - t0
    _end_all(tag)
    data = json.loads(rec.read_text()) if rec.exists() else None
    if interrupted:
        return Row(sub.learner, sub.exercise, Outcome.ERROR, None, None, seconds, limit_s,
                   "the gradebook was interrupted: this submission was not graded")
    if timed_out:
        return Row(sub.learner, sub.exercise, Outcome.TIME_LIMIT, None, None, seconds, limit_s)
    results = work / "results.json"
    if data is None or not results.exists():
        tail = (work / "otter.log").read_text(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return Row(sub.learner, sub.exercise, Outcome.ERROR, None, None, seconds, limit_s, tail[0][:300])
    # otter's scored tests (its "Public Tests" summary entry has no score)
    tests = [t for t in json.loads(results.read_text()).get("tests", []) if "max_score" in t]
    passed = bool(tests) and all(t.get("score") == t["max_score"] for t in tests)
    outcome = Outcome.PASSED if passed and data["passed"] else Outcome.FAILED
    return Row(sub.learner, sub.exercise, outcome, data["outcome"], data["status"], seconds, limit_s,
               data["message"])


def calibrate(exercise: str, zip_path: Path, work: Path) -> tuple[float, Row]:
    """The reference fix graded the same way here, alone: the limit is derived from its seconds."""
    import nbformat
    from ddplab.course import fixit
    _, _, magic = _fixit_cells()[exercise]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("%load_ext ddplab"),
                nbformat.v4.new_code_cell(magic + "\n" + fixit.get(exercise).reference)]
    path = Path(work) / f"reference-fix{exercise}.ipynb"
    nbformat.write(nb, path)
    row = grade_one(Submission("reference", exercise, str(path)), zip_path, 3600, work)
    if row.outcome is not Outcome.PASSED:
        raise DdplabError(f"the reference fix of {exercise} does not pass here ({row.outcome}: {row.reason})",
                          hint="ddplab doctor; the gradebook needs a machine where the reference passes")
    return max(LIMIT_FLOOR_S, LIMIT_FACTOR * row.seconds), row


def grade(subs: list[Submission], out_csv: Path, work: Path | None = None, limit_s: float | None = None,
          progress=print) -> list[Row]:
    """Every submission graded, ``WORKERS`` at once, each under its limit; the gradebook CSV written."""
    work = Path(work or tempfile.mkdtemp(prefix="ddplab-gradebook-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    for ex in sorted({s.exercise for s in subs}):
        zip_path = autograder(ex, work)
        limit = limit_s
        if limit is None:
            limit, ref = calibrate(ex, zip_path, work)
            if progress:
                progress(f"fix-it {ex}: the reference fix graded in {ref.seconds:.1f} s here; limit {limit:.0f} s")
        mine = [s for s in subs if s.exercise == ex]
        stop = threading.Event()
        with ThreadPoolExecutor(WORKERS) as pool:
            try:
                for row in pool.map(lambda s: grade_one(s, zip_path, limit, work, stop), mine):
                    rows.append(row)
                    if progress:
                        progress(f"  {row.learner:<16} fix{row.exercise}  {row.outcome}  ({row.seconds:.1f} s)")
            except BaseException:          # Ctrl-C, a test's timeout: end every grading now, leave nothing
                stop.set()
                raise
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for row in rows:
            w.writerow(row.to_csv())
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--homes", nargs="+", required=True, help="the learners' home folders (e.g. /home/learner*)")
    p.add_argument("--exercise", action="append", help="a fix-it id (default: every one in their notebooks)")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "gradebook.csv", help="the gradebook CSV")
    p.add_argument("--limit", type=float, help="seconds per submission (default: derived from the reference fix)")


def run_args(a: argparse.Namespace) -> int:
    try:
        import otter  # noqa: F401
    except ImportError:
        raise DdplabError("the gradebook needs otter-grader", hint='pip install -e ".[classroom]"') from None
    work = Path(tempfile.mkdtemp(prefix="ddplab-gradebook-"))
    subs = collect(a.homes, work / "submissions", a.exercise)
    if not subs:
        raise DdplabError(f"no fix-it notebook found under {', '.join(map(str, a.homes))}",
                          hint=f"each learner's notebooks are in ~/{LEARNER_DIR}")
    grade(subs, a.out, work, a.limit)
    print(f"gradebook: {a.out} ({len(subs)} submissions)")
    return 0
