"""A CPU burner beside a checker's run: one process spinning on one core while the run that the checker
judges is measured, as a classroom of learners on one machine would load it (issue 34 read the checkers
under load 6-11). The checkers' tests run their measurement twice, idle and burning, and each time the
right answer must pass and the wrong ones fail: a right answer is right whatever the load.

    @pytest.fixture(scope="module", params=LOADS)
    def measured(request):
        with load(request.param):
            return run_the_measurement()

The burner side runs with ``make test-load`` (``DDPLAB_TEST_BURNER=1``), not in ``make test``: it is
31 runs of their own with a core spinning beside each (about 220 s of test time when they were added,
at load 3-6, plus the spinning core's CPU), against a CI that has to stay under 15 minutes on 2 cores;
and a CI machine is loaded by its three test workers already, so the idle side (mostly the notebook's
own runs) is judged under load there too. Without it, each burner case skips with the line that says
how to run it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

LOADS = ["idle", "burner"]
ENV = "DDPLAB_TEST_BURNER"      # "1": run the burner side (make test-load)
SPIN = "import os, sys\nsys.stdout.write('spinning\\n'); sys.stdout.flush()\nwhile True:\n    pass\n"


@contextmanager
def load(kind: str):
    """``kind`` "burner": a Python process spinning one core for the duration (started before, and seen
    spinning: its first line printed; ended by its own pid after); "idle": nothing."""
    if kind == "idle":
        yield None
        return
    assert kind == "burner", kind
    if os.environ.get(ENV) != "1":
        import pytest
        pytest.skip(f"the CPU-burner side runs with make test-load ({ENV}=1)")
    p = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "spinning"
        before = _cpu_s(p.pid)
        yield p
        assert p.poll() is None, "the burner ended before the measurement did"
        assert _cpu_s(p.pid) > before, "the burner did not burn"
    finally:
        p.kill()
        p.wait()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (/proc), or the wall clock where /proc is missing."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:  # pragma: no cover - not Linux
        return time.monotonic()


def judged_runs(request, tmp_path_factory, start, variants, name: str) -> dict:
    """The body of a lab's module fixture parametrized by ``LOADS``: the runs its checkers judge, by
    variant. "idle": the module's ``runs`` fixture's (the notebook's own runs, no new one); "burner":
    each variant started again by ``start(variant, run_root=..., progress=None)`` with a core spinning
    beside it. Either way nothing of the runs is left."""
    if request.param == "idle":
        runs = request.getfixturevalue("runs")
        return {v: runs[v] for v in variants}
    from conftest import assert_nothing_left
    root = tmp_path_factory.mktemp(f"{name}-burner")
    with load(request.param):
        out = {v: start(v, run_root=root, progress=None) for v in variants}
    assert_nothing_left(str(root))
    assert all(r.leftover == () for r in out.values()), {v: r.leftover for v, r in out.items()}
    return out
