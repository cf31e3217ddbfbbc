"""The architecture as the code has it: the import directions are import-linter contracts
(pyproject.toml's [tool.importlinter]) run here with `lint-imports`; the lab scripts (labs/ is not a
package, so no contract sees them) import only ddplab.rank, read here with ast; no module imports itself
back through others; DESIGN.md's layout names the package's folders as they are."""
import ast
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


# (old module, old name, new module, new name): what moved below the engine and below the rank (issue 41)
MOVED = [("ddplab.engine.stacks", n, "ddplab.facts", n)
         for n in ("Frame", "Where", "short_path", "short_paths", "is_user_file", "PACKAGE_DIR")] + [
    ("ddplab.engine.stacks", "KINDS", "ddplab.facts", "WHERE_KINDS"),
    ("ddplab.engine.ledger", "Collective", "ddplab.facts", "Collective"),
    ("ddplab.engine.ledger", "Divergence", "ddplab.facts", "Divergence"),
    ("ddplab.engine.ledger", "numel", "ddplab.facts", "numel"),
    ("ddplab.engine.reasons", "ChainedError", "ddplab.facts", "ChainedError"),
    ("ddplab.engine.check", "CheckReport", "ddplab.facts", "CheckReport"),
    ("ddplab.engine.check", "Finding", "ddplab.facts", "Finding"),
    ("ddplab.engine.check", "NotChecked", "ddplab.facts", "NotChecked"),
    ("ddplab.engine.check", "FIXES", "ddplab.facts", "CHECK_FIXES"),
    ("ddplab.engine.check", "KINDS", "ddplab.facts", "CHECK_KINDS"),
    ("ddplab.engine.check", "CAUSE_FIXES", "ddplab.facts", "CHECK_CAUSE_FIXES"),
    ("ddplab.engine.groups", "span", "ddplab.spans", "span"),
    ("ddplab.engine.groups", "label", "ddplab.spans", "label"),
    ("ddplab.origins.ports", "check_port", "ddplab.rank.ports", "check_port"),
    ("ddplab.origins.ports", "PortStatus", "ddplab.rank.ports", "PortStatus"),
    ("ddplab.origins.ports", "holder", "ddplab.rank.ports", "holder"),
    ("ddplab.origins.ports", "free_port", "ddplab.rank.ports", "free_port"),
]


@pytest.mark.parametrize("old, name, new, new_name", MOVED, ids=[f"{o}.{n}" for o, n, _, _ in MOVED])
def test_moved_names_stay_importable_from_their_old_module(old, name, new, new_name):
    """Code written against the old homes (other branches, learners' notebooks) gets the same object."""
    import importlib
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), new_name)


def test_a_result_loads_and_prints_with_no_engine_or_view_module():
    """In a fresh interpreter: importing ddplab.result, loading a saved result and printing it import no
    module of the engine and no view (the facts it holds live in ddplab.facts)."""
    code = ("import sys, json, ddplab.result as r\n"
            "d = {'target': 't', 'variant': None, 'nproc': 1, 'status': 'failed', 'signature': None, "
            "'excerpt': None, 'ranks': [{'rank': 0, 'pid': 1, 'state': 'exited', 'exit_code': 1, 'signal': None, "
            "'where': {'kind': 'collective', 'op': 'barrier', 'frame': {'func': 'f', 'file': '/x/t.py', 'line': 3}}, "
            "'ledger': [{'seq': 1, 'op': 'barrier', 'backend': 'gloo', 'sizes': [[1]], 'dtypes': ['Float'], "
            "'completed': False, 'pg': '0', 'created_ns': 0, 'timeout_ms': None}]}], "
            "'wall_s': 1.0, 'run_dir': '/tmp/x', 'command': [], 'check': {'every': 10}}\n"
            "res = r.RunResult.from_dict(json.loads(json.dumps(d)))\n"
            "print(repr(res), res.ranks[0].frame.short(), res.ranks[0].ledger[0].numel)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('ddplab.engine', 'ddplab.views'))))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "t.py:3 in f 1" in r.stdout and r.stdout.strip().splitlines()[-1] == "[]", r.stdout


def _outside_rank(source: str) -> list[str]:
    """The modules of ddplab other than ddplab.rank (and its modules) that a script imports, with their
    lines: ``from ddplab import x`` counts as ``ddplab.x``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" if node.module == "ddplab" else node.module for a in node.names]
        else:
            continue
        out += [f"line {node.lineno}: {n}" for n in names
                if n.split(".")[0] == "ddplab" and n != "ddplab.rank" and not n.startswith("ddplab.rank.")]
    return out


def test_lab_scripts_import_only_the_rank_side():
    """Every lab script imports of ddplab only ddplab.rank (what runs inside a rank), never the launcher,
    the engine, a view or the course; the check itself catches each way of importing something else."""
    scripts = sorted((ROOT / "labs").glob("*.py"))
    assert len(scripts) >= 12
    found = {s.name: _outside_rank(s.read_text()) for s in scripts}
    assert {k: v for k, v in found.items() if v} == {}
    assert _outside_rank("from ddplab.rank import lab\nfrom ddplab.rank.lab import Dist\nimport ddplab.rank.ports\n") == []
    assert _outside_rank("from ddplab.origins import ports\n") == ["line 1: ddplab.origins"]
    assert _outside_rank("def f():\n    from ddplab import rank, runfiles\n") == ["line 2: ddplab.runfiles"]
    assert _outside_rank("import ddplab\nimport ddplab.engine.stacks as s\n") == ["line 1: ddplab",
                                                                                "line 2: ddplab.engine.stacks"]


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
