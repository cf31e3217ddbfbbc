"""The launcher, for real: torchrun jobs of a script that knows nothing of ddplab."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ddplab
from ddplab import launch
from conftest import HANG_DEADLINE_S, assert_nothing_left, requires_pyspy

SCRIPT = Path(__file__).parent / "scripts" / "my_train.py"
pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(90)
def test_own_script_ok(run_lab):
    r = run_lab(SCRIPT, args=["--mode", "ok"], deadline_s=60)
    assert r.status == "ok" and r.signature is None
    assert [x.exit_code for x in r.ranks] == [0, 0]
    assert r.returncode == 0 and r.port and r.port > 0
    assert "finished 3 steps" in r.rank(0).log_tail
    saved = ddplab.RunResult.load(r.run_dir)
    assert saved == r


@pytest.mark.timeout(90)
def test_own_script_crash_names_the_rank_and_line(run_lab):
    r = run_lab(SCRIPT, args=["--mode", "crash"], deadline_s=60)
    assert r.status == "failed"
    assert r.first_failure == 1
    assert r.rank(1).user_frame and "my_train.py" in r.rank(1).user_frame
    assert "rank 1 failed first" in r.diagnosis
    assert "corrupt batch" in r.rank(1).log_tail


@requires_pyspy
@pytest.mark.timeout(90)
def test_own_script_hang_is_diagnosed_from_stacks(run_lab):
    r = run_lab(SCRIPT, args=["--mode", "hang"], deadline_s=HANG_DEADLINE_S)
    assert r.status == "hung"
    assert r.signature == "hang-different-collectives"
    assert r.rank(0).waits_in == "barrier"
    assert "backward" in r.rank(1).waits_in
    assert {x.stack_source for x in r.ranks} == {"py-spy"}
    assert all(x.state == "hung" and "my_train.py" in x.user_frame for x in r.ranks)


@pytest.mark.timeout(90)
def test_faulthandler_fallback_gives_the_same_diagnosis(run_lab, monkeypatch):
    # What a learner gets where py-spy may not attach (macOS, ptrace_scope=1): SIGUSR1 to the
    # faulthandler that the launcher's sitecustomize registered in the unchanged script.
    monkeypatch.setenv("DDPLAB_STACKS", "faulthandler")
    r = run_lab(SCRIPT, args=["--mode", "hang"], deadline_s=HANG_DEADLINE_S)
    assert r.status == "hung" and r.signature == "hang-different-collectives"
    assert {x.stack_source for x in r.ranks} == {"faulthandler"}
    assert r.rank(0).waits_in == "barrier" and "backward" in r.rank(1).waits_in


@pytest.mark.timeout(90)
def test_job_still_working_at_deadline_is_not_called_a_collective_hang(run_lab):
    r = run_lab(SCRIPT, args=["--mode", "sleep"], deadline_s=HANG_DEADLINE_S)
    assert r.status == "hung" and r.signature == "deadline-exceeded"
    assert all(x.waits_in is None for x in r.ranks)


@pytest.mark.timeout(90)
def test_a_busy_job_gets_more_time_than_its_deadline(run_lab):
    # ranks computing (using CPU) at the deadline are slow, not stuck: the launcher extends the
    # deadline (up to twice) and says so; a job blocked in a collective uses no CPU and is ended on time
    # the ranks compute until 12 s after launch, however long torch takes to import: past the
    # 8 s deadline, well before twice it
    r = run_lab(SCRIPT, args=["--mode", "busy"], deadline_s=8, env={"BUSY_UNTIL": str(time.time() + 12)})
    assert r.status == "ok" and r.wall_s > 8
    assert any("extended" in n for n in r.notes)


@pytest.mark.timeout(60)
def test_taken_port_is_refused_before_starting(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ddplab.DdplabError) as e:
            ddplab.run(SCRIPT, port=port, run_root=tmp_path)
    msg = str(e.value)
    assert f"port {port} is taken by pid {os.getpid()}" in msg and "--port 0" in msg
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("kw,words", [
    (dict(target="99"), "unknown lab '99'"),
    (dict(target="01", variant="nope"), "no variant 'nope'"),
    (dict(target="01", nproc=0), "too few"),
    (dict(target="01", nproc=10_000), "more ranks than this machine"),
    (dict(target="01", deadline_s=0), "more than 0 seconds"),
    (dict(target="01", deadline_s=-1), "more than 0 seconds"),
    (dict(target="no/such/train.py"), "no such script"),
    (dict(target=str(SCRIPT), variant="broken"), "--variant is for labs"),
])
def test_bad_input_is_one_clear_error(kw, words, tmp_path):
    target = kw.pop("target")
    with pytest.raises(ddplab.DdplabError) as e:
        ddplab.run(target, run_root=tmp_path, **kw)
    assert words in str(e.value)
    assert e.value.hint


def test_launch_command_is_built_in_one_place(tmp_path):
    job = launch.resolve("01", "broken", None, None, run_root=tmp_path)
    cmd = launch.build_launch_command(job)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "127.0.0.1:0" in cmd and cmd[-2:] == ["--variant", "broken"]
    env = launch.launch_environment(job)
    assert env["DDPLAB_RUN_DIR"] == str(job.run_dir)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(launch.HOOK_DIR)
    assert "DDPLAB_RUN_DIR" not in os.environ  # the caller's environment is untouched


@pytest.mark.timeout(120)
def test_sigint_to_ddplab_run_ends_everything(tmp_path):
    env = {**os.environ, "DDPLAB_RUNS_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "ddplab.cli", "run", str(SCRIPT), "--deadline", "100",
                             "--quiet", "--", "--mode", "hang"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait until both ranks are up and stuck (their pid files exist), then Ctrl-C.
        end = time.monotonic() + 60
        while time.monotonic() < end and len(list(tmp_path.glob("*/*/ranks/rank*.json"))) < 2:
            time.sleep(0.2)
        assert len(list(tmp_path.glob("*/*/ranks/rank*.json"))) == 2, "ranks never started"
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            # Evidence before the kill (as torch's MultiProcessTestCase dumps stacks): where the
            # launcher and its children are stuck.
            pytest.fail("ddplab run did not end within 30 s of SIGINT; stacks:\n" + _stacks_of_tree(proc.pid))
    finally:
        if proc.poll() is None:  # a failed test must not leave the job behind either
            import psutil
            tree = psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
            for p in tree:
                try:
                    p.kill()
                except psutil.Error:
                    pass
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert_nothing_left(str(tmp_path))
    result = json.loads(next(tmp_path.glob("*/*/result.json")).read_text())
    assert result["status"] == "interrupted"
    assert result["leftover"] == []


def _stacks_of_tree(pid: int) -> str:
    import psutil
    from ddplab.stacks import pyspy_path

    exe, out = pyspy_path(), []
    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return "(process gone)"
    for p in procs:
        try:
            head = f"--- pid {p.pid} {p.status()} {' '.join(p.cmdline())[:150]}"
        except psutil.Error:
            continue
        dump = ""
        if exe:
            try:
                dump = subprocess.run([exe, "dump", "--pid", str(p.pid)], capture_output=True, text=True,
                                      timeout=10).stdout
            except subprocess.TimeoutExpired:
                dump = "(py-spy timed out)"
        out.append(head + "\n" + dump)
    return "\n".join(out)


def test_first_failure_is_the_rank_with_the_error_not_torchruns_root_cause(tmp_path):
    """Captured from a real lab 02 `oom` run in CI: rank 1 ran out of memory, rank 0 lost its
    connection in the all-reduce and died of SIGABRT before rank 1 had finished exiting, so
    torchrun's summary named rank 0 as the root cause. The result must name rank 1."""
    import shutil
    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "data" / "run_lab02_oom_root_cause_is_the_peer", run_dir)
    job = launch.Job(target="02_oom", script=Path("labs/02_oom.py"), lab=None, variant="oom", nproc=2,
                     deadline_s=60.0, port=0, host="127.0.0.1", args=(), run_dir=run_dir)
    assert "rank      : 0" in (run_dir / "torchrun.log").read_text().split("Root Cause")[1]
    r = launch.collect(job, [], returncode=1, ended_by=None, wall_s=9.0, stacks_by_rank={}, alive_at_end=(),
                       leftover=(), notes=[])
    assert (r.status, r.signature, r.first_failure) == ("failed", "cpu-oom", 1)
    assert r.rank(0).signal == "SIGABRT" and r.rank(1).signal == "SIGTERM"
    assert r.rank(1).user_frame and "02_oom.py" in r.rank(1).user_frame
    assert r.diagnosis.startswith("rank 1 failed first") and "root cause" in r.diagnosis
    assert launch.RunResult.load(run_dir).first_failure == 1
