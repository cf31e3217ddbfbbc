"""The libraries users train with, run for real: PyTorch Lightning (Trainer, strategy="ddp", CPU) and
Hugging Face accelerate under torchrun, 2 ranks, a tiny model, a few steps (the ``clients`` extra,
pinned in constraints.txt). Ok runs end ok with no finding; a collective that only one rank reaches
through the library is placed at the user's own call, with the library frame it led into named from
``ddplab.engine.libraries``' data; a library's own exception is the cause in its terms.

The seven jobs run two at a time (a module fixture: most of a hung job is the stall window), and
every assertion is on the results' fields."""
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="the clients extra is not installed: pip install -e '.[clients]'")
pytest.importorskip("accelerate", reason="the clients extra is not installed: pip install -e '.[clients]'")

import ddplab  # noqa: E402
from ddplab.engine import libraries  # noqa: E402
from conftest import assert_nothing_left  # noqa: E402

pytestmark = pytest.mark.multiprocess
CLIENTS = Path(__file__).parent / "scripts" / "clients"
LIGHTNING, ACCELERATE = CLIENTS / "lightning_train.py", CLIENTS / "accelerate_train.py"
JOBS = {"lightning-ok": (LIGHTNING, "ok", True), "lightning-log": (LIGHTNING, "log", False),
        "lightning-barrier": (LIGHTNING, "barrier", False), "lightning-gpu": (LIGHTNING, "gpu", False),
        "accelerate-ok": (ACCELERATE, "ok", True), "accelerate-gather": (ACCELERATE, "gather", False),
        "accelerate-wait": (ACCELERATE, "wait", False)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("clients")

    def one(name):
        script, mode, check = JOBS[name]
        return ddplab.run(script, args=["--mode", mode], nproc=2, run_root=root / name, progress=None,
                          check=check)

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(JOBS, pool.map(one, JOBS)))
    assert_nothing_left(str(root))
    return results


def _line(script: Path, code: str) -> int:
    """The line of ``code`` in the script (the test's own lookup of where the call stands: the last
    line that holds it, not the docstring's mention)."""
    return [i for i, t in enumerate(script.read_text().splitlines(), 1) if code in t][-1]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", ["lightning-ok", "accelerate-ok"])
def test_ok_runs_end_ok_with_no_finding(runs, name):
    r = runs[name]
    assert r.status == "ok" and r.signature is None and r.cause is None and r.first_failure is None, r.explain()
    assert [x.exit_code for x in r.ranks] == [0, 0]
    assert r.stall is None and r.divergence is None
    assert r.check is not None and not r.check.findings, r.explain()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name,script,call,role,other", [
    ("lightning-log", LIGHTNING, 'self.log("train_loss"', "core/module.py:log", "core/module.py:backward"),
    ("lightning-barrier", LIGHTNING, "self.trainer.strategy.barrier()", "strategies/ddp.py:barrier",
     "core/module.py:backward"),
    ("accelerate-gather", ACCELERATE, "accelerator.gather_for_metrics(", "accelerator.py:gather_for_metrics",
     "accelerator.py:backward"),
    ("accelerate-wait", ACCELERATE, "accelerator.wait_for_everyone()", "accelerator.py:wait_for_everyone",
     "accelerator.py:backward"),
])
def test_a_collective_one_rank_reaches_through_the_library_is_placed_at_the_users_call(
        runs, name, script, call, role, other):
    r = runs[name]
    assert r.status in ("hung", "failed"), r.explain()
    w0, w1 = r.rank(0).where, r.rank(1).where
    # rank 0: the user's own call, not the trainer.fit line; the library frame it led into, named
    assert w0 is not None and w0.frame is not None, r.explain()
    assert (Path(w0.frame.file).resolve(), w0.frame.line) == (script.resolve(), _line(script, call)), r.explain()
    lib = "lightning" if script == LIGHTNING else "accelerate"
    assert w0.library is not None and (w0.library.library, w0.library.role) == (lib, role), w0
    assert libraries.describe(lib, role) is not None
    # rank 1 went on to the next step's backward, inside the library
    assert w1 is not None and w1.library is not None and (w1.library.library, w1.library.role) == (lib, other), w1
    # the view says it in the library's terms
    assert libraries.describe(lib, role) in r.explain()


@pytest.mark.timeout(400)
def test_lightnings_own_exception_is_the_cause_in_its_terms(runs):
    r = runs["lightning-gpu"]
    assert r.status == "failed" and r.signature == "lightning-misconfiguration-exception", r.explain()
    assert r.cause is not None and r.cause.type == "MisconfigurationException"
    assert "gpu" in r.cause.message.lower()
