"""`make workbook`: execute every notebook once, headless, and build the summary from their runs.

    python -m ddplab.course.build --out build [--labs 01 02] [-p quick True] [--store]

Each notebook (notebooks/NN_*.ipynb, found by glob) runs once under papermill with its runs in a
folder of its own (build/runs/NN_name/, given to the kernel as DDPLAB_RUNS_DIR); its seconds are
printed as it finishes, and the cells tagged ``nbval-check-output`` (nbval's own cell tag, kept in the
cell's metadata so the learner never sees it) are compared with the stored notebook. The summary table (lab, variant, expected, status, signature, where it was run) is then
built from the result.json files those runs saved. A catalog variant that no notebook ran, or
that no notebook ran with the outcome the catalog expects (a notebook may turn a knob on purpose),
is run once more here with the lab's defaults (build/runs/_build/), so every variant is in the
table and judged. The executed notebooks go to build/notebooks/ with `metadata.ddplab` (commit,
executed_at, torch, cores, seconds, the code hash); `--store` keeps them as the stored execution in
course-src/executed/ and writes the learner's copies (the same cells, no output) into notebooks/ when no
notebook failed (a checked cell that differs is reported, and the new output becomes the reference).
A lab whose workbook module's ``requirement()`` names something this machine lacks (lab 09: nft,
ip, root) is skipped, notebook and variants, with that one line ("09_network: skipped (needs nft:
apt-get install nftables)"); the table shows its variants as skipped.
Exits 1 if a notebook failed or a variant did not show its expected outcome; a skip is neither.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ddplab.origins import catalog, turns
from ddplab import runfiles
from ddplab.front import run
from ddplab.result import RunResult

NOTEBOOK_DIR = catalog.REPO_DIR / "notebooks"
# The stored execution (`make notebooks`): every notebook as it was executed, outputs and all, for the
# build and the tests (its checked cells, claim tables, runs) and for the instructor. notebooks/ holds the
# learner's copies of the same cells with no output (``learner_copy``): a stored output above or below an
# exercise is an answer on screen before the learner answers (issue 42).
EXECUTED_DIR = catalog.EXECUTED_DIR
# what of metadata.ddplab a learner's copy keeps: where and when it was executed, never what its runs showed
LEARNER_METADATA = ("commit", "dirty", "executed_at", "seconds", "torch", "cores", "python", "code_hash")
# nbval's cell tag for "compare this cell's output" (nbval/plugin.py's metadata_tags: NBVAL_CHECK_OUTPUT
# lower-cased, dashes for underscores). A tag, not the comment: the learner's code stays free of test markers.
CHECK_TAG = "nbval-check-output"


# --- the notebooks ----------------------------------------------------------------------------
def notebooks(numbers: list[str] | None = None) -> list[Path]:
    """notebooks/NN_*.ipynb in order (00 always, the others filtered by lab number)."""
    found = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    return [nb for nb in found if not numbers or nb.name[:2] in numbers or nb.name[:2] == "00"]


@contextmanager
def _runs_dir(path: Path | None):
    """DDPLAB_RUNS_DIR for the kernel papermill starts (it inherits this process's environment).
    This is the build's own process, never a notebook kernel, and the value is restored after."""
    if path is None:
        yield
        return
    old = os.environ.get("DDPLAB_RUNS_DIR")
    os.environ["DDPLAB_RUNS_DIR"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DDPLAB_RUNS_DIR", None)
        else:
            os.environ["DDPLAB_RUNS_DIR"] = old


def declared_parameters(nb: Path) -> set[str]:
    """The names the notebook's `parameters` cell assigns (papermill's own reading of it)."""
    import papermill as pm
    return set(pm.inspect_notebook(str(nb)))


def execute_notebook(nb: Path, out: Path, parameters: dict | None = None, runs_dir: Path | None = None) -> None:
    """Execute one notebook headless with papermill, in its own folder; raises papermill's error
    with the failing cell's output. ``parameters`` the notebook does not declare are left out (papermill
    would only warn); ``runs_dir`` is where its runs go (DDPLAB_RUNS_DIR)."""
    import papermill as pm

    params = dict(parameters or {})
    if params:
        known = declared_parameters(nb)
        params = {k: v for k, v in params.items() if k in known}
    with _runs_dir(runs_dir):
        pm.execute_notebook(str(nb), str(out), parameters=params or None, cwd=str(nb.parent),
                            progress_bar=False, kernel_name="python3",
                            # the kernel's own startup warning (TCP without encryption, on localhost)
                            # printed once per notebook would bury the table
                            extra_arguments=["--IPKernelApp.log_level=ERROR"])


# --- the checked cells (tagged nbval-check-output): compared with the stored notebook ----------------------------------------
def is_checked(cell: dict) -> bool:
    """A code cell whose outputs are compared with the stored notebook: tagged ``nbval-check-output``."""
    return cell.get("cell_type") == "code" and CHECK_TAG in (cell.get("metadata") or {}).get("tags", [])


def _checked_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if is_checked(c)
            and "injected-parameters" not in c.get("metadata", {}).get("tags", [])]


def _text(x) -> str:
    return "".join(x) if isinstance(x, list) else str(x)


def stored_execution(nb: Path) -> dict | None:
    """The stored execution of notebook ``nb`` (course-src/executed/<name>), or None when there is none."""
    path = EXECUTED_DIR / nb.name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def learner_copy(executed: dict) -> dict:
    """The learner's notebook from an executed one: every cell as it is, with no output, no execution count
    and no execution timings; metadata.ddplab keeps where and when it was executed (``LEARNER_METADATA``),
    not what its runs showed (their statuses answer exercises); no papermill metadata."""
    import copy
    nb = copy.deepcopy(executed)
    for c in nb.get("cells", []):
        if c.get("cell_type") == "code":
            c["outputs"], c["execution_count"] = [], None
        for key in ("papermill", "execution"):
            (c.get("metadata") or {}).pop(key, None)
    meta = nb.setdefault("metadata", {})
    meta.pop("papermill", None)
    if "ddplab" in meta:
        meta["ddplab"] = {k: v for k, v in meta["ddplab"].items() if k in LEARNER_METADATA}
    return nb


def comparable_outputs(cell: dict) -> list[tuple[str, str]]:
    """What nbval compares, minus what it cannot compare usefully: stream text by stream name,
    text/plain of results and displays, the error's name; trailing spaces ignored. Images and HTML are
    left out (a plot's bytes and a widget's id differ on every run)."""
    out = []
    for o in cell.get("outputs", []):
        kind = o.get("output_type")
        if kind == "stream":
            out.append((o.get("name", "stdout"), _text(o.get("text", ""))))
        elif kind in ("execute_result", "display_data") and "text/plain" in o.get("data", {}):
            out.append(("text/plain", _text(o["data"]["text/plain"])))
        elif kind == "error":
            out.append(("error", o.get("ename", "")))
    # streams arrive in pieces; join consecutive ones of the same stream
    merged: list[tuple[str, str]] = []
    for name, text in out:
        if merged and merged[-1][0] == name and name in ("stdout", "stderr"):
            merged[-1] = (name, merged[-1][1] + text)
        else:
            merged.append((name, text))
    return [(n, "\n".join(line.rstrip() for line in t.rstrip().splitlines())) for n, t in merged]


@dataclass(frozen=True)
class Mismatch:
    index: int          # the checked cell's position among the checked cells
    source: str         # its first line that is not blank
    stored: list
    executed: list

    def __str__(self) -> str:
        return f"checked cell {self.index + 1} ({self.source!r}): stored {self.stored!r}, now {self.executed!r}"


def compare_checked(stored: dict, executed: dict) -> list[Mismatch]:
    """The checked cells whose outputs differ between the stored notebook and this execution."""
    a, b = _checked_cells(stored), _checked_cells(executed)
    if len(a) != len(b):
        return [Mismatch(-1, f"{len(a)} checked cells stored, {len(b)} executed", [], [])]
    bad = []
    for i, (x, y) in enumerate(zip(a, b)):
        ox, oy = comparable_outputs(x), comparable_outputs(y)
        if ox != oy:
            first = next((l for l in _text(x["source"]).splitlines() if l.strip()), "")
            bad.append(Mismatch(i, first[:80], ox, oy))
    return bad


# --- provenance: the commit the outputs come from -----------------------------------------------
# What a stored execution depends on (issue 42, item 7): the lab scripts, the package's code below its CLI
# and tools (engine, origins, rank, views, course and the shared facts), and the code cells of the
# notebooks. Comments, blank lines and docstrings do not count (a wording change leaves the outputs as
# they were); every other token does.
CODE_TREES = ("labs", "src/ddplab")
NOT_CODE = ("src/ddplab/cli.py", "src/ddplab/tools")


def _code_tokens(text: str) -> str:
    """``text`` (Python) without its comments, blank lines and docstrings: a string that is a statement of
    its own (first on its line and last before the line ends) is a docstring."""
    import io
    import tokenize
    try:
        toks = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
                if t.type not in (tokenize.COMMENT, tokenize.NL)]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return text
    kept, start = [], True
    for i, t in enumerate(toks):
        after = toks[i + 1].type if i + 1 < len(toks) else tokenize.ENDMARKER
        if t.type == tokenize.STRING and start and after in (tokenize.NEWLINE, tokenize.ENDMARKER):
            continue
        start = t.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT) or (start and t.type == tokenize.STRING)
        kept.append(t.string)
    return " ".join(kept)


def code_files(root: Path | None = None) -> list[Path]:
    """The files ``code_hash`` reads, relative to ``root`` (the repository)."""
    root = root or catalog.REPO_DIR
    found = [p for tree in CODE_TREES for p in (root / tree).rglob("*.py")
             if not any(p.is_relative_to(root / n) for n in NOT_CODE) and "__pycache__" not in p.parts]
    found += list((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return sorted(p.relative_to(root) for p in found)


def code_hash(root: Path | None = None) -> str:
    """sha256 of the code a stored execution depends on (``CODE_TREES``, the notebooks' code cells), with
    comments, blank lines and docstrings left out: recorded in each stored notebook's metadata.ddplab at
    execution and recomputed by tests/test_notebooks.py."""
    import hashlib
    root = root or catalog.REPO_DIR
    h = hashlib.sha256()
    for rel in code_files(root):
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        if rel.suffix == ".ipynb":
            try:
                cells = json.loads(text)["cells"]
            except (ValueError, KeyError):
                cells = []
            text = "\n# cell\n".join(_text(c.get("source", "")) for c in cells if c.get("cell_type") == "code")
        else:
            text = _code_tokens(text)
        h.update(f"{rel.as_posix()}\0{text}\0".encode())
    return h.hexdigest()


def _git(*args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(catalog.REPO_DIR), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.rstrip("\n") if p.returncode == 0 else None


def provenance() -> dict:
    """metadata.ddplab of an executed notebook: the commit, the uncommitted changes that could change
    outputs (labs/, src/ddplab/, notebooks/), when, torch's version and the cores."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = None
    status = _git("status", "--porcelain", "--untracked-files=no", "--", "labs", "src/ddplab", "notebooks")
    return {
        "commit": _git("rev-parse", "HEAD"),
        "dirty": [line[3:] for line in (status or "").splitlines()],
        "executed_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch_version,
        "cores": os.cpu_count(),
        "python": ".".join(map(str, sys.version_info[:3])),
        "code_hash": code_hash(),
    }


# --- the runs the notebooks made -------------------------------------------------------------
@dataclass
class Row:
    lab: str
    variant: str
    expected: str
    status: str
    signature: str | None
    wall_s: float
    as_expected: bool
    source: str                      # the notebook whose run is shown, or "build" (run here)
    notebook_runs: list = field(default_factory=list)   # every notebook run of it: (notebook, status, signature)
    skipped: str | None = None       # what this machine lacks for it (system.Need as text), when not run

    def to_dict(self) -> dict:
        return self.__dict__.copy()


@dataclass
class NotebookRun:
    name: str
    status: str                      # "ok", "failed: ...", "checked output differs: ..." or "skipped"
    seconds: float
    runs: int                        # result.json files its runs left
    skipped: str | None = None       # what this machine lacks for it (system.Need as text)

    @property
    def failed(self) -> bool:
        return self.status != "ok" and self.skipped is None

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def read_results(folder: Path) -> list[dict]:
    """Every result.json under ``folder`` (a notebook's runs), as saved (facts, never re-rendered)."""
    found = []
    for p in sorted(folder.rglob(runfiles.RESULT)):
        try:
            found.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return found


def _matches(v: catalog.Variant, status: str, signature: str | None) -> bool:
    return status == v.expect and (v.signature is None or signature == v.signature)


def _expected(v: catalog.Variant) -> str:
    return v.expect + (f" [{v.signature}]" if v.signature else "")


def _module(number: str):
    """Lab ``number``'s workbook module (ddplab.course.labNN), or None when it has none."""
    try:
        return importlib.import_module(f"ddplab.course.lab{number}")
    except ModuleNotFoundError:
        return None


def requirement(number: str):
    """What this machine lacks for lab ``number`` (its workbook module's ``requirement()``: a
    system.Need), or None when it can run here (or declares no requirement)."""
    fn = getattr(_module(number), "requirement", None)
    return fn() if fn is not None else None


def _runner(number: str):
    """A lab's own workbook runner when it has one (it sets the variant's knobs: a port held by
    another process, a rank that starts late, ...), else the plain launcher with the lab's defaults."""
    mod = _module(number)
    fn = getattr(mod, "run_variant", None) or getattr(mod, "run", None)
    return fn if fn is not None else (lambda variant: run(number, variant=variant, progress=None))


def run_here(number: str, variant: str, out: Path) -> dict:
    """One run of a variant with the lab's defaults, made by the build (its runs in out/runs/_build/,
    its result in out/results/); the result as saved."""
    lab = catalog.find_lab(number)
    (out / "results").mkdir(parents=True, exist_ok=True)
    # judged by status and signature only: it shares the machine even where its variant measures
    with _runs_dir(out / "runs" / "_build"), turns.judged_by_status():
        r: RunResult = _runner(lab.number)(variant)
    return json.loads(r.save(out / "results" / f"{lab.id}-{variant}.json").read_text())


def _print_here(lab: str, variant: str, d: dict, ok: bool, when: str) -> None:
    print(f"{'  ' if ok else '!!'} {lab} {variant:<24} {d['status']:<7} {d.get('signature') or '':<28} "
          f"{float(d.get('wall_s') or 0):6.1f} s (no notebook run shows it: run here{when})", flush=True)


def summarise_runs(numbers: list[str] | None, by_notebook: dict[str, list[dict]], out: Path,
                   ran_here: list[dict] | None = None) -> list[Row]:
    """One row per catalog variant: a notebook's run that showed the expected outcome, else a run
    the build made beside the notebooks (``ran_here``), else a run made now with the lab's defaults
    (printed as it finishes)."""
    rows = []
    (out / "results").mkdir(parents=True, exist_ok=True)
    for lab in catalog.labs():
        if numbers and lab.number not in numbers:
            continue
        need = requirement(lab.number)
        if need is not None:
            rows += [Row(lab.number, v.name, _expected(v), "skipped", None, 0.0, False, "build", [], str(need))
                     for v in lab.variants]
            continue
        for v in lab.variants:
            seen = [(nb, d) for nb, results in by_notebook.items() for d in results
                    if d.get("target") == lab.id and d.get("variant") == v.name]
            listed = [(nb, d["status"], d.get("signature")) for nb, d in seen]
            good = next(((nb, d) for nb, d in seen if _matches(v, d["status"], d.get("signature"))), None)
            if good is not None:
                nb, d = good
                row = Row(lab.number, v.name, _expected(v), d["status"], d.get("signature"),
                          float(d.get("wall_s") or 0.0), True, nb, listed)
            else:
                d = next((d for d in ran_here or () if d.get("target") == lab.id and d.get("variant") == v.name), None)
                if d is None:
                    d = run_here(lab.number, v.name, out)
                    _print_here(lab.number, v.name, d, _matches(v, d["status"], d.get("signature")), "")
                row = Row(lab.number, v.name, _expected(v), d["status"], d.get("signature"),
                          float(d.get("wall_s") or 0.0), _matches(v, d["status"], d.get("signature")), "build", listed)
            rows.append(row)
    return rows


def shown_by_stored(chosen: list[Path]) -> list[tuple[str, str]] | None:
    """The variants (lab number, name) that no stored execution of a notebook among ``chosen`` showed as
    the catalog expects, by the runs its metadata lists; None when one does not list its runs (then
    nothing is foreseen, and they are run after the notebooks)."""
    expect = {(lab.id, v.name): v for lab in catalog.labs() for v in lab.variants}
    shown = set()
    for nb in chosen:
        try:
            runs = stored_execution(nb)["metadata"]["ddplab"]["runs"]
        except (KeyError, TypeError):
            return None
        shown.update((t, v) for t, v, status, sig in runs
                     if (t, v) in expect and _matches(expect[(t, v)], status, sig))
    numbers = {nb.name[:2] for nb in chosen}
    return [(lab.number, v.name) for lab in catalog.labs() if lab.number in numbers
            for v in lab.variants if (lab.id, v.name) not in shown]


def execute_one(nb: Path, out: Path, parameters: dict | None = None) -> tuple["NotebookRun", list[dict]]:
    """Execute one notebook into out/notebooks/ with its runs under out/runs/<notebook>/, compare its
    checked cells, record metadata.ddplab; its NotebookRun and the results its runs saved. A notebook
    whose lab this machine cannot run (``requirement``) is not executed: its run says what is missing."""
    import nbformat

    need = requirement(nb.name[:2])
    if need is not None:
        return NotebookRun(nb.name, "skipped", 0.0, 0, str(need)), []

    out = out.resolve()   # the kernel runs in notebooks/: a relative runs folder would land there
    runs_dir = out / "runs" / nb.stem
    shutil.rmtree(runs_dir, ignore_errors=True)     # only this execution's runs are read back
    runs_dir.mkdir(parents=True)
    target = out / "notebooks" / nb.name
    meta = provenance()
    t0 = time.monotonic()
    try:
        execute_notebook(nb, target, parameters, runs_dir)
        status = "ok"
    except Exception as e:  # papermill raises PapermillExecutionError with the cell's error
        text = str(e).strip()
        status = f"failed: {text.splitlines()[-1][:120] if text else type(e).__name__}"
    seconds = time.monotonic() - t0
    results = read_results(runs_dir)
    if target.exists():
        executed = json.loads(target.read_text())
        stored = stored_execution(nb)
        if status == "ok" and stored is not None:     # a notebook never stored has nothing to compare yet
            bad = compare_checked(stored, executed)
            if bad:
                status = f"checked output differs: {bad[0]}"[:300]
        executed["metadata"]["ddplab"] = {**meta, "seconds": round(seconds, 1),
                                          "parameters": executed["metadata"].get("papermill", {}).get("parameters", {}),
                                          # what its runs showed: the next build runs the variants no
                                          # notebook shows beside the notebooks, not after them
                                          "runs": [[d.get("target"), d.get("variant"), d.get("status"),
                                                    d.get("signature")] for d in results]}
        nbformat.write(nbformat.from_dict(executed), str(target))
    return NotebookRun(nb.name, status, seconds, len(results)), results


def run_notebooks(numbers: list[str] | None, out: Path, parameters: dict | None = None, jobs: int = 1
                  ) -> tuple[list[NotebookRun], dict[str, list[dict]], list[dict]]:
    """Execute each notebook once (``jobs`` at a time, each in its own process when more than one),
    printing each one's seconds as it finishes."""
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    chosen = notebooks(numbers)
    done: dict[str, NotebookRun] = {}
    results: dict[str, list[dict]] = {}

    def _report(run: NotebookRun, res: list[dict]) -> None:
        done[run.name], results[Path(run.name).stem] = run, res
        if run.skipped:
            print(f"-- notebook {Path(run.name).stem}: skipped ({run.skipped})", flush=True)
            return
        print(f"{'  ' if run.status == 'ok' else '!!'} notebook {run.name:<28} {run.seconds:6.1f} s  "
              f"{run.runs:3d} runs  {run.status}", flush=True)

    together, alone = schedule(chosen, jobs)
    ran_here: list[dict] = []
    if together:
        os.environ[turns.ENV] = str(out / "turns")     # the kernels papermill starts inherit it
        from concurrent.futures import ProcessPoolExecutor, as_completed
        # the variants the stored notebooks did not show are short runs: they go into the pool
        # right after the first notebooks. Last, they made the build's tail one run at a time
        # (about 20 s; 07's dataparallel then had the machine alone, now it shares: run_here)
        extra = [(n, v) for n, v in shown_by_stored(chosen) or [] if requirement(n) is None]
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(execute_one, nb, out, parameters): None for nb in together[:jobs]}
            futures.update({pool.submit(run_here, n, v, out): (n, v) for n, v in extra})
            futures.update({pool.submit(execute_one, nb, out, parameters): None for nb in together[jobs:]})
            for f in as_completed(futures):
                if futures[f] is None:
                    _report(*f.result())
                    continue
                n, v = futures[f]
                try:
                    d = f.result()
                except Exception as e:     # foreseen, not needed yet: summarise_runs runs it again if it is
                    print(f"!! {n} {v}: could not be run beside the notebooks ({type(e).__name__}: {e})", flush=True)
                    continue
                ran_here.append(d)
                _print_here(n, v, d, _matches(catalog.find_lab(n).variant(v), d["status"], d.get("signature")),
                            " beside the notebooks")
    for nb in alone:
        _report(*execute_one(nb, out, parameters))
    return [done[nb.name] for nb in chosen if nb.name in done], results, ran_here


def schedule(chosen: list[Path], jobs: int) -> tuple[list[Path], list[Path]]:
    """(notebooks executed ``jobs`` at a time, notebooks executed one by one). With jobs 1 every
    notebook runs alone, in order (make notebooks: each one's seconds measured alone); otherwise all
    share the cores, longest first (by the stored execution's seconds, so the last to start is a short
    one), and a run whose verdicts compare times has the machine alone (ddplab.origins.turns: the variants
    the catalog marks ``measured``)."""
    if jobs <= 1:
        return [], list(chosen)
    return sorted(chosen, key=lambda nb: -stored_seconds(nb)), []


def seconds_of(nb: dict) -> float | None:
    """How long an execution of this notebook took, as its metadata recorded it (metadata.ddplab.seconds)."""
    seconds = ((nb.get("metadata") or {}).get("ddplab") or {}).get("seconds")
    return None if seconds is None else float(seconds)


def stored_seconds(nb: Path) -> float:
    """How long the stored execution of this notebook took (metadata.ddplab.seconds; 0 if unknown)."""
    try:
        return seconds_of(json.loads(nb.read_text())) or 0.0
    except (OSError, ValueError, AttributeError, TypeError):
        return 0.0


MEASURED_TIME = re.compile(r"(Measured time:(?:\*\*)? )(\d+) s")


def stamp_measured_time(nb: dict) -> dict:
    """The opening cell's "Measured time: N s" set to this execution's seconds (metadata.ddplab): the
    number a learner reads is the one recorded, never typed in by hand."""
    seconds = seconds_of(nb)
    cell = nb["cells"][0] if nb.get("cells") else None
    if seconds is None or cell is None or cell.get("cell_type") != "markdown":
        return nb
    text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    cell["source"] = MEASURED_TIME.sub(lambda m: f"{m.group(1)}{round(seconds)} s", text, count=1)
    return nb


ROUTE = catalog.REPO_DIR / "docs" / "instructor.md"
_ROUTE_ROW = re.compile(r"(\| )((?:\d\d_[a-z_]+)(?: or \d\d_[a-z_]+)*)( \| )([\d /]+)( s \|)")
_ROUTE_TEXT = re.compile(r"(\d\d_[a-z_]+)(\s+\()(\d+)( s)")


def route_seconds(text: str) -> list[tuple[str, int]]:
    """(notebook, seconds) as docs/instructor.md's route quotes them: table rows and "NN_name (N s"."""
    quoted = []
    for m in _ROUTE_ROW.finditer(text):
        quoted += zip([n.strip() for n in m.group(2).split(" or ")], [int(v) for v in m.group(4).split("/")])
    return quoted + [(m.group(1), int(m.group(3))) for m in _ROUTE_TEXT.finditer(text)]


def stamp_route(text: str, seconds: dict[str, float]) -> str:
    """The route with every notebook's seconds as its stored execution recorded them (a notebook not
    in ``seconds`` keeps its number)."""
    def row(m):
        names = [n.strip() for n in m.group(2).split(" or ")]
        old = [v.strip() for v in m.group(4).split("/")]
        new = [str(round(seconds[n])) if n in seconds else v for n, v in zip(names, old)]
        return f"{m.group(1)}{m.group(2)}{m.group(3)}{' / '.join(new)}{m.group(5)}"
    text = _ROUTE_ROW.sub(row, text)
    return _ROUTE_TEXT.sub(lambda m: f"{m.group(1)}{m.group(2)}"
                                     f"{round(seconds[m.group(1)]) if m.group(1) in seconds else m.group(3)}{m.group(4)}",
                           text)


def accepted_in(runs: Path) -> dict:
    """The answers the checkers of one execution accepted, as they wrote them beside its runs (JSON)."""
    from ddplab.course import answers
    try:
        return json.loads((runs / answers.ANSWERS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def store(out: Path, names: list[str]) -> list[Path]:
    """Store one execution: each executed notebook (its outputs and metadata.ddplab) in
    course-src/executed/, opening with its own measured seconds and every claim table judged from the
    parts of all of them (a claim quoted in several notebooks shows one row:
    ddplab.course.claims.restamp); and the learner's copy of each (``learner_copy``: the same cells, no
    output) in notebooks/. The stored execution keeps the answers its checkers accepted
    (metadata.ddplab.accepted) for tests/test_exercises_hidden.py; the learner's copy does not."""
    import nbformat

    from ddplab.course import claims

    nbs = [stamp_measured_time(json.loads((out / "notebooks" / name).read_text())) for name in names]
    for name, nb in zip(names, nbs):   # the answers its checkers accepted: for the tests, never the learner's
        nb["metadata"].setdefault("ddplab", {})["accepted"] = accepted_in(out / "runs" / Path(name).stem)
    claims.restamp(nbs, claims.stored_inputs(EXECUTED_DIR))
    EXECUTED_DIR.mkdir(parents=True, exist_ok=True)
    copied = []
    for name, nb in zip(names, nbs):
        nbformat.write(nbformat.from_dict(nb), str(EXECUTED_DIR / name))
        nbformat.write(nbformat.from_dict(learner_copy(nb)), str(NOTEBOOK_DIR / name))
        copied.append(NOTEBOOK_DIR / name)
    if ROUTE.is_file():   # the instructor's route quotes each notebook's seconds: from the same metadata
        seconds = {Path(n).stem: seconds_of(nb) for n, nb in zip(names, nbs)}
        ROUTE.write_text(stamp_route(ROUTE.read_text(), {n: s for n, s in seconds.items() if s is not None}))
    return copied


def summary(rows: list[Row], nbs: list[NotebookRun]) -> str:
    lines = ["| lab | variant | expected | status | failure signature | wall s | as expected | run by |",
             "|---|---|---|---|---|---:|---|---|"]
    for r in rows:
        judged = f"skipped ({r.skipped})" if r.skipped else "yes" if r.as_expected else "NO"
        lines.append(f"| {r.lab} | {r.variant} | {r.expected} | {r.status} | {r.signature or ''} | "
                     f"{r.wall_s:.1f} | {judged} | {r.source} |")
    if nbs:
        lines += ["", "| notebook | seconds | runs | status |", "|---|---:|---:|---|"]
        lines += [f"| {n.name} | {n.seconds:.1f} | {n.runs} | {n.status}{f' ({n.skipped})' if n.skipped else ''} |"
                  for n in nbs]
    return "\n".join(lines) + "\n"


def _param(text: str):
    """A -p value as papermill's CLI reads it (YAML: True, 3, 0.5, [1, 2], text)."""
    import yaml
    return yaml.safe_load(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="build", help="output folder (default: build)")
    p.add_argument("--labs", nargs="*", help="only these lab numbers (default: all)")
    p.add_argument("--no-notebooks", action="store_true", help="run the variants only (no notebook)")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="a papermill parameter for every notebook that declares it (e.g. -p quick True)")
    p.add_argument("--jobs", type=int, default=1,
                   help="notebooks executed at once (default 1: each notebook's seconds measured alone; "
                        "with more, a run whose verdicts compare times still has the machine alone)")
    p.add_argument("--store", action="store_true",
                   help="store the executed notebooks in course-src/executed/ and their learner's copies "
                        "(no output) in notebooks/ when no notebook failed")
    a = p.parse_args(argv)
    if a.store and a.parameter:
        p.error("--store keeps notebooks executed with their own defaults (papermill would add an "
                "injected-parameters cell): leave out -p")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    params = {k: _param(v) for k, v in a.parameter}
    chosen = [] if a.no_notebooks else notebooks(a.labs)
    print(f"ddplab workbook: {len(chosen)} notebooks, once each; then any variant no notebook showed "
          f"({len(catalog.labs())} labs)", flush=True)
    nbs, results, ran_here = run_notebooks(a.labs, out, params, max(1, a.jobs)) if chosen else ([], {}, [])
    rows = summarise_runs(a.labs, results, out, ran_here)
    text = summary(rows, nbs)
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"runs": [r.to_dict() for r in rows],
                                                  "notebooks": [n.to_dict() for n in nbs],
                                                  "provenance": provenance()}, indent=2))
    print("\n" + text + f"\nwritten to {out / 'summary.md'} in {time.monotonic() - t0:.0f} s", flush=True)
    bad = [r for r in rows if not r.as_expected and not r.skipped] + [n for n in nbs if n.failed]
    skipped = sorted({(r.lab, r.skipped) for r in rows if r.skipped})
    for lab, why in skipped:
        name = next((nb.stem for nb in chosen if nb.name[:2] == lab), catalog.find_lab(lab).id)
        print(f"{name}: skipped ({why})", flush=True)
    if a.store:
        # every notebook or none: the stored outputs must all come from this one execution (a
        # variant the build ran itself that showed NO is in the table, but is not a notebook's output).
        # A checked cell that differs does not block: storing is how a maintainer takes the new
        # outputs as the reference (the table above shows what changed); a failed cell does.
        if any(n.status.startswith("failed") for n in nbs):
            print("not stored in notebooks/: a notebook above failed", flush=True)
        elif any(n.skipped for n in nbs):
            print("not stored in notebooks/: a notebook above was skipped (every notebook comes from one "
                  "execution)", flush=True)
        else:
            for path in store(out, [n.name for n in nbs]):
                print(f"stored {path}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
