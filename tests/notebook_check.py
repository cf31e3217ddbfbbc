"""One notebook executed once (papermill) and its cells tagged nbval-check-output
compared with the stored outputs.

A lab whose test file reads the notebook's own runs (``READ_BY_LAB_TESTS``) executes its notebook in
that file (``execute``: once per worker process), and its tests assert on the runs the notebook
made, loaded from their result.json, where the notebook ran the same variant with the same knobs
(``Executed.run_of``); a run the notebook did not make is started by the test as before. Every lab
does (01-12); notebook 00, whose one run no lab test reads, executes in tests/test_notebooks.py.
Why: the same lab variants ran twice in every CI, once in the notebook and once in the lab's tests,
and make test is CPU-bound on the ranks' torch imports (about 3 CPU-s a 2-rank run here); and each
notebook now runs on whichever pytest-xdist worker (--dist loadfile) runs its lab's file, so the
notebooks no longer pile up in two files."""
import json
from dataclasses import dataclass, field
from pathlib import Path

from ddplab import runfiles
from ddplab.course import build

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
OUT = ROOT / "build" / "test-notebooks"
# labs whose test file executes the notebook and reads its runs (tests/test_labNN.py)
READ_BY_LAB_TESTS = ("01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12")
ELSEWHERE = [p for p in NOTEBOOKS if p.name[:2] in READ_BY_LAB_TESTS]
HERE = [p for p in NOTEBOOKS if p not in ELSEWHERE]      # executed in tests/test_notebooks.py (00)


@dataclass
class Executed:
    """One execution of a notebook: what it showed and the runs it made (None: not executed, ``skipped`` says why)."""
    path: Path
    runs_dir: Path
    skipped: str | None = None
    errors: list = field(default_factory=list)
    images: int = 0
    differ: list = field(default_factory=list)
    _runs: list | None = None
    _folders: dict = field(default_factory=dict)     # id of a loaded run -> the folder it was loaded from

    def assert_clean(self) -> None:
        """The test of the execution: no error output, a plot in a lab notebook, every checked cell as
        stored, nothing of its runs left running."""
        if self.skipped:
            import pytest
            pytest.skip(self.skipped)
        assert not self.errors, self.errors
        if self.path.name[:2] != "00":
            assert self.images, "a lab notebook plots its measured difference"
        assert not self.differ, "\n".join(map(str, self.differ))
        from conftest import assert_nothing_left
        assert_nothing_left(str(self.runs_dir))

    def runs(self) -> list:
        """Every run the notebook made, as saved (RunResult.load of each result.json), oldest first."""
        if self._runs is None:
            from ddplab.result import RunResult
            found = sorted(self.runs_dir.glob("**/result.json")) if not self.skipped else []
            self._runs = [RunResult.load(f.parent) for f in found]
            self._folders = {id(r): f.parent for r, f in zip(self._runs, found)}
        return self._runs

    def run_of(self, variant: str, **kw):
        """The notebook's (first) run of ``variant`` launched as the test would launch it, or None (the
        test then runs it itself); ``runs_of`` says what counts as the same launch."""
        found = self.runs_of(variant, **kw)
        return found[0] if found else None

    def runs_of(self, variant: str, args: tuple = (), nproc: int = 2, check: bool = False,
                stall_s: float | None = None, env: dict | None = None, ignore: tuple = (), **knobs) -> list:
        """Every run of ``variant`` the notebook launched as the test would launch it, oldest first: the
        same knob values once the script's own parser has read both command lines (so ``max_k=8``
        given matches the default 8 not given), the same ranks, --check, stall window (the lab's own
        unless given) and extra environment (``env``, as command.json recorded it; a network
        variant's own environment aside: lab 03 runs gather-ragged with the same arguments twice,
        once with TORCH_DISTRIBUTED_DEBUG=DETAIL). ``ignore``: knobs whose value is not compared, for
        a test that reads the value off the run (lab 05's fixed port: a free one the notebook chose)."""
        from ddplab.course import contract
        from ddplab.defaults import Status
        lab = self._lab()
        argv, rest = contract.script_args(lab.number, knobs)
        assert not rest, f"not knobs of lab {lab.number}: {sorted(rest)}"
        want = self._parse(["--variant", variant, *argv, *args])
        stall_s = lab.stall_s if stall_s is None else stall_s
        network_env = ((lab.extra.get("network") or {}).get(variant) or {}).get("env", {})
        found = []
        for r in self.runs():
            if r.variant != variant or r.nproc != nproc or (r.check is not None) != check or r.stall_s != stall_s:
                continue
            if r.status == Status.INTERRUPTED:      # ended by the notebook on purpose (lab 11 stops one mid-wait)
                continue
            got = self.knobs_of(r)
            if got is None or {k: v for k, v in got.items() if k not in ignore} != \
                    {k: v for k, v in want.items() if k not in ignore}:
                continue
            ran_env = json.loads((self._folders[id(r)] / runfiles.COMMAND).read_text()).get("env", {})
            if {k: v for k, v in ran_env.items() if k not in network_env} == dict(env or {}):
                found.append(r)
        return found

    def knobs_of(self, r) -> dict | None:
        """The variant and knob values ``r``'s command line gave the lab's script, as the script's own
        parser reads them (None: not a run of this lab's script). A multi-node run's command is the
        cluster's agents (``python -m ddplab.origins.cluster agents cluster.json``): its script's
        command line is each node's, in cluster.json (node 0's; every node runs the same script)."""
        name = self._lab().path.name
        command = list(r.command)
        cluster = self._folders.get(id(r), Path(r.run_dir)) / runfiles.CLUSTER
        if not any(Path(w).name == name for w in command) and cluster.exists():
            command = json.loads(cluster.read_text())["nodes"][0]["command"]
        script = next((i for i, w in enumerate(command) if w.endswith(".py") and Path(w).name == name), None)
        if script is None:
            return None
        try:
            return self._parse(list(command[script + 1:]))
        except SystemExit:
            return None

    def _lab(self):
        from ddplab.origins import catalog
        return catalog.find_lab(self.path.name[:2])

    def _parse(self, argv: list) -> dict:
        from ddplab.course import contract
        from ddplab.rank import lab_args
        lab = self._lab()
        parser = lab_args.parser({"variants": [v.name for v in lab.variants],
                                  "knobs": contract.declared(lab.number)}, None)
        return vars(parser.parse_args(argv))


class Runs:
    """The runs a lab's tests assert on, each made once per test module: the notebook's own where it
    ran the same variant with the same knobs (``Executed.run_of``, loaded from its result.json), else
    one started here with ``start(variant, run_root=root, **knobs)`` (and ``args=[...]`` where given).
    Either way the launcher reported nothing left and the ranks' socket folder is gone; a run started
    here leaves no process."""

    def __init__(self, notebook: Executed, root: Path, start):
        self.notebook, self.root, self.start = notebook, root, start
        self._made: dict = {}

    def __call__(self, variant: str, args: tuple = (), **knobs):
        key = (variant, tuple(args), repr(sorted(knobs.items())))
        if key not in self._made:
            r = self.notebook.run_of(variant, args=tuple(args), **knobs)
            if r is None:
                r = self.start(variant, run_root=self.root, **({"args": list(args)} if args else {}), **knobs)
                from conftest import assert_nothing_left
                assert_nothing_left(str(self.root))
            from ddplab.origins.job import socket_dir
            assert r.leftover == (), f"{variant}: launcher reported leftovers: {r.leftover}"
            assert not socket_dir(r.run_dir).exists(), "the ranks' socket folder was left in the temp dir"
            self._made[key] = r
        return self._made[key]


def runs_fixture(lab: str, start):
    """The module fixture ``runs`` of tests/test_lab<lab>.py: ``Runs`` over the lab's notebook (the
    module's ``notebook`` fixture) and ``start``."""
    import pytest

    @pytest.fixture(scope="module")
    def runs(notebook, tmp_path_factory):
        return Runs(notebook, tmp_path_factory.mktemp(f"lab{lab}"), start)
    return runs


_EXECUTED: dict[str, Executed] = {}


def execute(path: Path, runs_dir: Path) -> Executed:
    """Execute ``path`` once in this process (later calls get the same execution)."""
    if path.name in _EXECUTED:
        return _EXECUTED[path.name]
    need = build.requirement(path.name[:2])      # the build skips the same notebooks, for the same reason
    runs = runs_dir / path.stem
    if need is not None:
        done = Executed(path, runs, skipped=f"{path.stem}: {need}")
    else:
        OUT.mkdir(parents=True, exist_ok=True)
        out = OUT / path.name
        build.execute_notebook(path, out, runs_dir=runs)
        nb = json.loads(out.read_text())
        outputs = [o for c in nb["cells"] for o in c.get("outputs", [])]
        done = Executed(path, runs, errors=[o for o in outputs if o.get("output_type") == "error"],
                        images=sum("image/png" in o.get("data", {}) for o in outputs),
                        differ=_compare_with_stored(path, nb))
    _EXECUTED[path.name] = done
    return done


def _compare_with_stored(path: Path, nb: dict) -> list:
    """The checked cells that differ from the stored execution (course-src/executed/; the learner's copy in
    notebooks/ holds no output)."""
    stored = build.stored_execution(path)
    if stored is None:
        return [build.Mismatch(-1, f"no stored execution of {path.name} in {build.EXECUTED_DIR.name}/ "
                                   "(make notebooks)", [], [])]
    return build.compare_checked(stored, nb)


def notebook_of(lab: str) -> Path:
    return next(p for p in NOTEBOOKS if p.name[:2] == lab)


def notebook_fixture(lab: str):
    """The module fixture ``notebook`` of tests/test_lab<lab>.py: the lab's notebook executed once."""
    import pytest

    @pytest.fixture(scope="module")
    def notebook(session_runs_dir):
        return execute(notebook_of(lab), session_runs_dir)
    return notebook


def _marked(test):
    import pytest
    # a hang guard, not a time target: lab 09's notebook took 466 s in make notebooks beside a CI run, and its
    # execution inside a loaded make test ran past 600 s (the lab's runs have limits of their own)
    for mark in (pytest.mark.notebook, pytest.mark.multiprocess, pytest.mark.timeout(1800)):
        test = mark(test)
    return test


@_marked
def test_notebook_executes_once_and_its_checked_cells_match(notebook):
    """Imported by each lab test file that reads its notebook's runs (pytest collects it there)."""
    notebook.assert_clean()


def execute_and_compare(path: Path, runs_dir: Path) -> None:
    execute(path, runs_dir).assert_clean()
