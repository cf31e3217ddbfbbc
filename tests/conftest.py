"""Shared test helpers: real runs in a temporary run directory, and the check that no process of a
job outlives its test."""
from __future__ import annotations

import os
import shutil
import time

import psutil
import pytest

import ddplab
from ddplab.origins.job import socket_dir


# Gone with the deadline-judged engine (a hang is judged by progress now); kept defined, as None,
# until no test module imports it any more.
HANG_DEADLINE_S = None


def gpu_count() -> int:
    """CUDA GPUs this machine has (imports torch only when asked)."""
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # pragma: no cover - torch missing
        return 0


def requires_gpus(n: int):
    """Skip unless this machine has at least ``n`` CUDA GPUs."""
    have = gpu_count()
    return pytest.mark.skipif(have < n, reason=f"needs {n} CUDA GPU(s), this machine has {have}")


def wait_until(cond, what: str, limit_s: float = 60.0, every_s: float = 0.01) -> None:
    """Poll ``cond()`` until it is true. ``limit_s`` only stops a stuck test (a failure naming
    ``what``); nothing is asserted on how long the wait took."""
    end = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(every_s)


requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
requires_pyspy = pytest.mark.skipif(shutil.which("py-spy") is None and not os.path.exists(
    os.path.join(os.path.dirname(os.sys.executable), "py-spy")), reason="py-spy is not installed")


def job_processes(marker: str | None = None) -> list[psutil.Process]:
    """Processes of any ddplab/torchrun job still alive (optionally only those whose command line
    or environment mentions ``marker``, e.g. a run directory)."""
    found = []
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmd = " ".join(p.info["cmdline"] or [])
        hit = "torch.distributed.run" in cmd or "torchrun" in cmd
        if not hit:
            try:
                hit = "DDPLAB_RUN_DIR" in p.environ()
            except psutil.Error:
                hit = False
        if hit and (marker is None or marker in cmd or marker in str(_env(p).get("DDPLAB_RUN_DIR", ""))):
            found.append(p)
    return found


def _env(p: psutil.Process) -> dict:
    try:
        return p.environ()
    except psutil.Error:
        return {}


def assert_nothing_left(marker: str | None = None, wait_s: float = 30.0) -> None:
    """No process of the job is alive. A process that is exiting (already signalled) gets up to
    ``wait_s`` to go: a limit that only stops a stuck test, not a bound on how fast it exits."""
    end = time.monotonic() + wait_s
    while True:
        left = job_processes(marker)
        if not left or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert not left, "processes outlived the run: " + "; ".join(
        f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}" for p in left)


@pytest.fixture(scope="session", autouse=True)
def session_runs_dir(tmp_path_factory):
    """Every run this test process starts without an explicit run_root (notebook kernels included)
    goes under its own directory, so the leftover check of one pytest-xdist worker never sees the
    jobs of the other, and nothing is written into the checkout's runs/."""
    path = tmp_path_factory.mktemp("runs-" + os.environ.get("PYTEST_XDIST_WORKER", "main"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DDPLAB_RUNS_DIR", str(path))
        yield path


@pytest.fixture
def run_lab(tmp_path):
    """Run a lab or script for real into a temporary run directory; afterwards assert that no process
    of that job is left (the result's own check and an independent scan with psutil)."""
    def _run(target, **kw):
        kw.setdefault("run_root", tmp_path / "runs")
        result = ddplab.run(target, **kw)
        assert result.leftover == (), f"launcher reported leftovers: {result.leftover}"
        assert_nothing_left(str(kw["run_root"]))
        assert not socket_dir(result.run_dir).exists(), "the ranks' socket folder was left in the temp dir"
        return result
    return _run


# The longest files first (CI at 35f6534: the notebook files 460 and 381 s, test_launch 232 s, every
# other file under 85 s). pytest-xdist's --dist loadfile hands files to the workers in collection
# order, and the notebook files came last alphabetically: one worker ran the last of them alone
# while the other had finished. Longest first, the short files fill in around them. Since each lab's
# test file executes its notebook (tests/notebook_check.py), the longest are these (CI at f9031c3:
# test_fixit 395 s, test_lab09 355, test_reasoning 240, test_lab12 188, test_launch 164; labs 01, 06
# and 07 with their notebooks about 100-160 s here; test_warm 106, test_lab11 98).
LONGEST_FIRST = ("test_fixit.py", "test_lab09.py", "test_reasoning.py", "test_lab12.py", "test_clients.py",
                 "test_launch.py", "test_lab06.py", "test_lab01.py", "test_lab07.py", "test_warm.py", "test_lab11.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))     # stable: files keep their order
