"""`ddplab attach PID`: a torchrun job that ddplab did not start (plain torchrun, no rank hook, no
flight-recorder door), found through the process tree, diagnosed from outside, left running or
stopped."""
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import requires_pyspy, wait_until

SCRIPT = Path(__file__).parent / "scripts" / "my_train.py"
pytestmark = [pytest.mark.multiprocess, requires_pyspy]


def _ddplab(*args, env=None, timeout=90):
    return subprocess.run([sys.executable, "-m", "ddplab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def plain_job(tmp_path):
    """A hung 2-rank torchrun job started the way a learner starts it: no ddplab anywhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPLAB")}
    env["PYTHONPATH"] = ""
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(SCRIPT), "--mode", "hang"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path)
    agent = psutil.Process(proc.pid)
    try:
        wait_until(lambda: len(agent.children()) >= 2, "torchrun starts both ranks", every_s=0.2)
        yield proc
    finally:
        tree = [agent] + agent.children(recursive=True) if proc.poll() is None else []
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
        proc.wait(timeout=10)


@pytest.mark.timeout(150)
def test_attach_to_torchrun_and_to_a_rank_then_stop(plain_job, tmp_path):
    env = {**os.environ, "DDPLAB_RUNS_DIR": str(tmp_path / "runs")}
    # through torchrun's pid: the job is watched until no rank makes progress, and left running
    p = _ddplab("attach", str(plain_job.pid), "--json", "--watch", "60", env=env)
    assert p.returncode == 3, p.stderr
    d = json.loads(p.stdout)
    assert d["status"] == "hung" and d["signature"] == "hang-different-collectives"
    assert d["attached_pid"] == plain_job.pid
    ranks = {r["rank"]: r for r in d["ranks"]}
    assert ranks[0]["where"]["op"] == "barrier" and ranks[0]["where"]["frame"]["file"].endswith("my_train.py")
    assert ranks[1]["where"]["via"] == "ddp-backward" and ranks[1]["stack_source"] == "py-spy"
    assert d["stall"]["window_s"] == 3.0
    assert plain_job.poll() is None, "attach without --stop must leave the job running"
    # through a rank's pid, with --stop: the whole job (torchrun and both ranks) ends
    rank_pid = psutil.Process(plain_job.pid).children()[0].pid
    p = _ddplab("attach", str(rank_pid), "--stop", "--json", "--watch", "60", env=env)
    d = json.loads(p.stdout)
    assert d["status"] == "hung" and d["leftover"] == []
    plain_job.wait(timeout=15)
    assert not psutil.pid_exists(rank_pid) or psutil.Process(rank_pid).status() == psutil.STATUS_ZOMBIE
