"""ddplab.origins.warm for real: each run's torchrun agent forked from a process that imported torch once.
The forked agent must be torchrun in every way the launcher and a learner can see (status, exit
code, evidence, nothing left running), go cold when it cannot be warm, and the warm process must
go when its launcher goes, however the launcher ends."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from conftest import wait_until

import ddplab
from ddplab.defaults import ALIVE
from ddplab.origins import warm

pytestmark = pytest.mark.skipif(not warm.enabled(), reason="warm agents fork after importing torch: Linux only")


def _agent(result) -> dict:
    return json.loads((Path(result.run_dir) / "command.json").read_text())


def test_runs_use_one_warm_process_and_judge_as_cold_runs_do(tmp_path, monkeypatch):
    runs = {}
    for kind in ("cold", "warm"):
        monkeypatch.setenv(warm.ENV, "0" if kind == "cold" else "1")
        runs[kind] = [ddplab.run("01", variant=v, run_root=tmp_path / kind) for v in ("fixed-sampler", "broken")]
        runs[kind].append(ddplab.run("06", variant="missing-rank", run_root=tmp_path / kind))
    srv = warm.server()
    for cold, hot in zip(runs["cold"], runs["warm"]):
        assert _agent(cold)["warm_parent"] is None
        assert _agent(hot)["warm_parent"] == srv.proc.pid       # one warm process for every run
        assert (hot.status, hot.signature, hot.returncode, hot.leftover) == \
            (cold.status, cold.signature, cold.returncode, cold.leftover)
        # where each live rank stood; a rank torchrun ended has a place only if it was still running when
        # SIGTERM came (its term dump), which is timing, not warm or cold (06's rank 0 sleeps 2 s, then exits)
        assert [r.where and r.where.kind for r in hot.ranks if r.state in ALIVE] == \
            [r.where and r.where.kind for r in cold.ranks if r.state in ALIVE]
        if hot.returncode is not None:   # it ended by itself: ddplab.origins._torchrun's outcome, as data
            assert json.loads((Path(hot.run_dir) / "torchrun.json").read_text())["returncode"] == hot.returncode
    ok, hung, failed = runs["warm"]
    assert (ok.status, ok.returncode) == ("ok", 0)
    assert hung.status == "hung" and hung.returncode is None and hung.leftover == ()
    assert failed.status == "failed" and failed.returncode == 1     # torchrun's ChildFailedError: exit 1
    # the agent's console is the run's torchrun.log, as a cold agent's is
    assert "ChildFailedError" in (Path(failed.run_dir) / "torchrun.log").read_text()
    # the ranks were the forked agent's children: fresh processes, not forks of the warm process
    info = json.loads((Path(ok.run_dir) / "ranks" / "rank0.json").read_text())
    assert info["pid"] != _agent(ok)["agent_pid"]


def test_an_environment_torch_reads_at_import_goes_cold(tmp_path, monkeypatch):
    monkeypatch.setenv(warm.ENV, "1")
    r = ddplab.run("01", variant="fixed-sampler", env={"TORCH_CPP_LOG_LEVEL": "INFO"}, run_root=tmp_path)
    assert r.status == "ok"
    assert _agent(r)["warm_parent"] is None
    # the launcher's own per-run variables do not make a run cold
    assert warm.import_environment({"PYTHONPATH": "x", "TORCH_FR_BUFFER_SIZE": "9", "OMP_NUM_THREADS": "1"}) == {}


LAUNCHER = textwrap.dedent("""
    import os, sys, time
    import ddplab
    from ddplab.origins import warm
    r = ddplab.run("01", variant="fixed-sampler", run_root=sys.argv[1])
    print(r.status, warm.server().proc.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_the_warm_process_goes_with_its_launcher(tmp_path, how):
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, warm.ENV: "1"})
    try:
        status, pid = proc.stdout.readline().split()
        assert status == "ok"
        srv = psutil.Process(int(pid))
        assert srv.ppid() == proc.pid
        proc.send_signal(getattr(signal, how))
        proc.wait(timeout=30)
        gone, alive = psutil.wait_procs([srv], timeout=30)   # it sees its end of the pair close
        assert not alive, f"the warm process {pid} outlived its launcher ({how})"
    finally:
        if proc.poll() is None:
            proc.kill()


ORPHAN_JOB = textwrap.dedent("""
    import os, sys, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.pid"), "w").write(str(os.getpid()))
    time.sleep(600)
""")
ORPHAN_LAUNCHER = textwrap.dedent("""
    import sys
    import ddplab
    ddplab.run(sys.argv[1], nproc=2, args=[sys.argv[2]], stall_s=600, run_root=sys.argv[3], progress=None)
""")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["warm", "cold"])
def test_a_run_whose_launcher_is_killed_mid_run_ends_with_it(tmp_path, kind):
    """A kernel killed or restarted while a run is in flight. Warm: the warm process sees its launcher
    go and exits; the run's agent, forked from it, gets SIGTERM (PR_SET_PDEATHSIG). Cold (the agent
    started by Popen: DDPLAB_WARM_AGENT=0, off Linux, an environment torch reads at import): the agent
    gets SIGTERM when the launcher goes (the same flag, set before torchrun is exec'd). torchrun
    then ends its ranks. Nothing of the run is left."""
    job, pids = tmp_path / "job.py", tmp_path / "pids"
    job.write_text(ORPHAN_JOB)
    pids.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN_LAUNCHER, str(job), str(pids), str(tmp_path / "runs")],
                            env={**os.environ, warm.ENV: "1" if kind == "warm" else "0"})
    try:
        # both ranks joined and are sleeping (or the launcher ended first: then it fails below)
        wait_until(lambda: len(list(pids.glob("rank*.pid"))) >= 2 or proc.poll() is not None,
                   "the ranks started", limit_s=120)
        assert proc.poll() is None, "the launcher ended before its ranks started"
        ranks = [psutil.Process(int(f.read_text())) for f in sorted(pids.glob("rank*.pid"))]
        agent = psutil.Process(ranks[0].ppid())
        command = json.loads(next((tmp_path / "runs").rglob("command.json")).read_text())
        assert bool(command["warm_parent"]) == (kind == "warm") and command["agent_pid"] == agent.pid
        proc.kill()                                             # no finally, no atexit: as a killed kernel
        proc.wait(timeout=30)
        gone, alive = psutil.wait_procs([agent, *ranks], timeout=60)
        assert not alive, f"left running after the launcher was killed: {[p.pid for p in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for f in pids.glob("rank*.pid"):
            try:
                os.kill(int(f.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_attach_to_the_warm_process_says_what_it_is(tmp_path, monkeypatch):
    from ddplab.origins.attach import find_job
    from ddplab.errors import DdplabError

    monkeypatch.setenv(warm.ENV, "1")
    ddplab.run("01", variant="fixed-sampler", run_root=tmp_path)
    with pytest.raises(DdplabError, match="warm process"):
        find_job(warm.server().proc.pid)


def _run_in_forked_worker(run_root: str) -> tuple:
    forgot = warm._server is None
    r = ddplab.run("01", variant="fixed-sampler", run_root=run_root)
    return forgot, r.status, _agent(r)["warm_parent"], warm.server().proc.pid


def test_a_forked_worker_gets_a_warm_process_of_its_own(tmp_path, monkeypatch):
    # make workbook's ProcessPoolExecutor forks its workers from a process that may hold one
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    monkeypatch.setenv(warm.ENV, "1")
    parent = warm.server()
    assert parent is not None and parent.wait_ready()
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork")) as pool:
        forgot, status, used, own = pool.submit(_run_in_forked_worker, str(tmp_path)).result(timeout=120)
    assert forgot and status == "ok"
    assert used == own != parent.proc.pid
    r = ddplab.run("01", variant="fixed-sampler", run_root=tmp_path)    # the parent's pair still works
    assert r.status == "ok" and _agent(r)["warm_parent"] == parent.proc.pid
