"""The architecture as the code has it: the import directions are import-linter contracts
(pyproject.toml's [tool.importlinter]) run here with `lint-imports`; no module imports itself back
through others; DESIGN.md's layout names the package's folders as they are."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ddplab"


def _lint_imports(config: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "lint-imports"
    if not exe.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    return subprocess.run([str(exe), "--config", str(config), "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_the_import_contracts_hold():
    r = _lint_imports(ROOT / "pyproject.toml")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Contracts: " in r.stdout and " broken" not in r.stdout.split("Contracts: ")[-1].split("\n")[0].replace("0 broken", "")


def test_a_broken_direction_is_caught(tmp_path):
    """The same tool on a contract the code breaks (the views do import the engine's groups): it fails."""
    config = tmp_path / "contracts.toml"
    config.write_text('[tool.importlinter]\nroot_package = "ddplab"\n\n[[tool.importlinter.contracts]]\n'
                      'name = "views import nothing of the engine"\ntype = "forbidden"\n'
                      'source_modules = ["ddplab.views"]\nforbidden_modules = ["ddplab.engine.groups"]\n')
    r = _lint_imports(config)
    assert r.returncode != 0 and "BROKEN" in r.stdout


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), over direct imports."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    mods = sorted(graph.modules)
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for m in mods:
        if m not in index:
            visit(m)
    return out


def test_no_import_circle():
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("ddplab", exclude_type_checking_imports=True)
    # the one lazy import from the facts to a view (result's explain/_repr_html_) is not a circle of
    # modules that load each other: leave it out, as the contracts do
    graph.remove_import(importer="ddplab.result", imported="ddplab.views.render")
    assert _cycles(graph) == []


def test_design_names_the_folders_the_code_has():
    text = (ROOT / "DESIGN.md").read_text()
    have = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    layout = text[text.index("## Layout"):text.index("## Data flow")]
    named = sorted(set(re.findall(r"src/ddplab/(\w+)/", layout)))
    assert named == have, (named, have)


@pytest.mark.multiprocess
def test_the_watch_loop_never_calls_back_into_an_origin(tmp_path):
    """A real run traced call by call (sys.setprofile, this thread): while the engine's loop
    (supervise.watch) runs, nothing defined in ddplab.origins is entered except through the job
    handle's Popen interface (poll, wait: the started process, whatever forked it); the run still
    gives its catalog verdict."""
    import ddplab
    from conftest import assert_nothing_left

    depth = {"loop": 0, "handle": 0}
    from_loop, handle_calls = [], [0]

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        mod, name = frame.f_globals.get("__name__", ""), frame.f_code.co_name
        if mod == "ddplab.engine.supervise" and name == "watch":
            depth["loop"] += 1 if event == "call" else -1
            return
        if not depth["loop"] or not mod.startswith("ddplab.origins"):
            return
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if name in ("poll", "wait") and caller == "ddplab.engine.supervise":     # the job handle
            depth["handle"] += 1 if event == "call" else -1
            handle_calls[0] += event == "call"
        elif event == "call" and not depth["handle"]:
            from_loop.append(f"{mod}.{name} (from {caller})")

    sys.setprofile(profile)
    try:
        r = ddplab.run("01", variant="broken", run_root=tmp_path, progress=None)
    finally:
        sys.setprofile(None)
    assert r.status == "hung" and r.signature == "hang-different-collectives"
    assert depth == {"loop": 0, "handle": 0} and handle_calls[0] > 0
    assert from_loop == [], sorted(set(from_loop))
    assert_nothing_left(str(tmp_path))
