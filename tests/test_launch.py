"""The launcher, for real: torchrun jobs (gloo, 2 ranks) of scripts that know nothing of ddplab.

Every assertion is on a result's fields (status, signature, first_failure, cause, divergence, each
rank's where / error / given / dialling), never on its prose, and none on how long anything took.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import ddplab
from ddplab.origins import launch
from conftest import assert_nothing_left, wait_until

SCRIPTS = Path(__file__).parent / "scripts"
SCRIPT = SCRIPTS / "my_train.py"
pytestmark = pytest.mark.multiprocess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the learner's own script: ok, crash, hang, sleep, busy ---------------------------------------

@pytest.mark.timeout(120)
def test_own_script_ok(run_lab):
    r = run_lab(SCRIPT, args=["--mode", "ok"])
    assert r.status == "ok" and r.signature is None and r.first_failure is None and r.cause is None
    assert [x.exit_code for x in r.ranks] == [0, 0]
    assert [x.state for x in r.ranks] == ["exited", "exited"]
    assert r.returncode == 0 and r.port and r.port > 0
    assert r.stall is None and r.divergence is None
    assert "finished 3 steps" in r.rank(0).log_tail
    assert ddplab.RunResult.load(r.run_dir) == r


@pytest.mark.timeout(120)
def test_children_a_rank_forks_do_not_end_it_or_write_its_records(run_lab):
    # CI: a DataLoader worker ran the hook's exit handler and shut down the rank's own server socket
    r = run_lab(SCRIPTS / "forked_children.py")
    assert r.status == "ok" and r.cause is None and r.first_failure is None
    assert [x.exit_code for x in r.ranks] == [0, 0]
    assert "child exit code 3" in r.rank(0).log_tail
    assert not list((Path(r.run_dir) / "ranks").glob("rank*.error.json"))


@pytest.mark.timeout(120)
def test_a_rank_that_raised_and_is_slow_to_exit_makes_the_job_failed_not_hung(run_lab):
    # CI: lab 06 late-rank's rank 0 recorded DistStoreError, then sat in interpreter shutdown while
    # its peer lingered in time.sleep; the stall window passed and the job was called hung.
    r = run_lab(SCRIPTS / "slow_exit.py", stall_s=2.0)
    assert r.status == "failed" and r.first_failure == 1
    assert r.cause.type == "ConnectionError" and r.cause.message == "rank 1 lost its data server"
    assert r.stall is not None                 # ddplab ended it at the stall (rank 1 was still exiting)
    assert r.rank(1).state == "hung" and r.rank(1).error is not None


@pytest.mark.timeout(120)
def test_an_error_raised_after_the_ending_began_leaves_the_hang_a_hang(run_lab):
    # CI (test_wheel, at dbe84ca): torchrun ended rank 0 first; rank 1's all_reduce then raised
    # "Connection closed by peer", and the hang was reported as a failure (exit 1, not 3)
    r = run_lab(SCRIPTS / "dies_at_the_ending.py", stall_s=2.0)
    errors = sorted(Path(r.run_dir, "ranks").glob("rank*.error.json"))
    assert [p.name for p in errors] == ["rank1.error.json"]          # the late error was recorded (gloo's lost peer)
    assert r.status == "hung" and r.signature == "hang-different-collectives"
    assert r.first_failure is None and r.cause is None
    assert r.rank(1).error is None and r.rank(1).where.op == "all_reduce"
    assert_nothing_left(str(SCRIPTS / "dies_at_the_ending.py"))


@pytest.mark.timeout(120)
def test_a_rank_probed_while_it_exits_answers_and_ends(run_lab, tmp_path):
    # CI: lab 06 timeout-sweep's ranks wrote their exit records and never ended. The hook shut its
    # worker server down at exit, and shutdown() keeps the GIL while it waits for a request in flight,
    # whose handler waits for the GIL. Here every probe made while the ranks compute is in flight then.
    from ddplab.engine import probe
    go, runs = tmp_path / "go", tmp_path / "runs"
    seen = {"answered": set(), "unanswered": 0}
    done = threading.Event()

    def ask_every_rank():
        while not done.is_set():
            for info in runs.glob("**/ranks/rank[0-9].json"):
                try:
                    sock = json.loads(info.read_text())["socket"]
                except (OSError, ValueError, KeyError):
                    continue
                if not os.path.exists(sock):
                    # the rank is gone (or not serving yet): a probe would only make its lock file again,
                    # racing the launcher's removal of the socket folder (CI: the folder was left behind)
                    continue
                answer = probe.ask(sock, "ddplab_rendezvous", timeout_s=0.3)
                if answer is not None:
                    seen["answered"].add(info.name)
                elif go.exists():
                    seen["unanswered"] += 1
            if len(seen["answered"]) == 2:
                go.touch()
            time.sleep(0.005)

    prober = threading.Thread(target=ask_every_rank, daemon=True)
    prober.start()
    try:
        r = run_lab(SCRIPTS / "probed_at_exit.py", args=["--go", str(go)], run_root=runs)
    finally:
        done.set()
        prober.join()
    assert r.status == "ok" and r.cause is None, r.explain()
    assert [x.exit_code for x in r.ranks] == [0, 0]
    assert seen["unanswered"] >= 1       # a probe did wait on a computing rank: the case under test


@pytest.mark.timeout(120)
def test_own_script_crash_names_the_rank_its_exception_and_line(run_lab):
    r = run_lab(SCRIPT, args=["--mode", "crash"])
    assert r.status == "failed"
    assert r.first_failure == 1
    assert r.cause.type == "ValueError" and r.cause.message == "rank 1 found a corrupt batch"
    assert r.rank(1).frame.file == str(SCRIPT) and r.rank(1).frame.func == "main"
    assert r.rank(1).exit_code == 1 and r.rank(1).consequence is False
    # rank 0 waited in its barrier and lost its peer: an error, but only a consequence
    assert r.rank(0).consequence is True
    assert ddplab.RunResult.load(r.run_dir).cause == r.cause


@pytest.mark.timeout(120)
def test_own_script_hang_is_diagnosed_from_the_ledger_and_stacks(run_lab):
    r = run_lab(SCRIPT, args=["--mode", "hang"])
    assert r.status == "hung" and r.signature == "hang-different-collectives"
    d = r.divergence
    assert d.kind == "different-op" and d.ops == {0: "barrier", 1: "all_reduce"}
    assert r.rank(0).where.seq == r.rank(1).where.seq == d.seq
    assert r.rank(0).where.kind == r.rank(1).where.kind == "collective"
    assert r.rank(0).where.op == "barrier"
    assert r.rank(1).where.op == "all_reduce" and r.rank(1).where.via == "ddp-backward"
    assert all(x.state == "hung" and x.frame.file == str(SCRIPT) for x in r.ranks)
    assert r.rank(0).frame.line != r.rank(1).frame.line
    assert {x.stack_source for x in r.ranks} == {"worker-server"}
    assert r.stall.window_s == r.stall_s and r.stall.last_seq == d.seq - 1
    assert r.returncode is None and r.first_failure is None


@pytest.mark.timeout(120)
def test_faulthandler_fallback_gives_the_same_diagnosis(run_lab, monkeypatch):
    # What a learner gets where neither the worker server nor py-spy can be used: SIGUSR1 to the
    # faulthandler that the rank hook registered in the unchanged script.
    monkeypatch.setenv("DDPLAB_STACKS", "faulthandler")
    r = run_lab(SCRIPT, args=["--mode", "hang"])
    assert r.status == "hung" and r.signature == "hang-different-collectives"
    assert {x.stack_source for x in r.ranks} == {"faulthandler"}
    assert r.rank(0).where.op == "barrier"
    assert r.rank(1).where.via == "ddp-backward"
    assert r.divergence.kind == "different-op"


@pytest.mark.timeout(120)
def test_ranks_sleeping_outside_collectives(run_lab):
    r = run_lab(SCRIPT, args=["--mode", "sleep"])
    assert r.status == "hung" and r.signature == "stalled-outside-collectives"
    assert [x.where.kind for x in r.ranks] == ["sleep", "sleep"]
    assert all(x.frame.file == str(SCRIPT) for x in r.ranks)
    assert r.divergence is None


@pytest.mark.timeout(180)
def test_a_busy_job_on_a_loaded_machine_is_slow_not_hung(run_lab):
    # The ranks compute for 8 s, eight times the 1 s stall window, while two CPU burners take the
    # machine's cores: progress is CPU time, not the clock.
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        r = run_lab(SCRIPT, args=["--mode", "busy"], stall_s=1.0, env={"BUSY_S": "8"})
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert r.status == "ok", r.explain()
    assert r.stall_s == 1.0 and r.stall is None


@pytest.mark.timeout(120)
def test_the_outer_deadline_ends_a_job_still_computing(run_lab):
    r = run_lab(SCRIPT, args=["--mode", "busy"], deadline_s=10, env={"BUSY_S": "600"})
    assert r.status == "deadline" and r.signature == "deadline-exceeded"
    assert r.deadline_s == 10 and r.stall is None
    assert all(x.state in ("running", "not-started") for x in r.ranks)


# --- the learner cases of issue 14 -----------------------------------------------------------------

@pytest.mark.timeout(120)
def test_an_error_no_signature_knows_is_named_from_the_rank(run_lab):
    r = run_lab(SCRIPTS / "no_signature.py", args=["--mode", "keyerror"])
    assert r.status == "failed" and r.first_failure == 1
    assert r.cause.type == "KeyError" and r.cause.message == "'warmup_steps'"
    assert r.rank(1).frame.file == str(SCRIPTS / "no_signature.py")
    assert r.rank(0).consequence is True


@pytest.mark.timeout(120)
def test_a_usage_error_is_named_from_the_rank(run_lab):
    r = run_lab(SCRIPTS / "no_signature.py")          # --mode is required: argparse exits 2
    assert r.status == "failed" and r.first_failure in (0, 1)
    assert r.cause.type == "SystemExit" and r.cause.message == "2"
    assert 2 in {x.exit_code for x in r.ranks}


@pytest.mark.timeout(120)
def test_a_rank_blocked_in_ddps_buffer_broadcast_inside_forward(run_lab):
    r = run_lab(SCRIPTS / "buffer_sync.py")
    assert r.status == "hung" and r.signature == "hang-different-collectives"
    w1 = r.rank(1).where
    assert (w1.kind, w1.op, w1.via) == ("collective", "broadcast", "ddp-forward-buffers")
    assert w1.frame.file == str(SCRIPTS / "buffer_sync.py") and w1.frame.func == "main"
    assert r.rank(0).where.op == "all_reduce" and r.rank(0).where.via is None
    assert r.divergence.kind == "different-op" and r.divergence.ops == {0: "all_reduce", 1: "broadcast"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how,kind,op", [("socket", "socket", "accept"), ("pipe", "other", "read from a pipe"),
                                         ("sleep", "sleep", "sleep")])
def test_a_rank_outside_any_collective_while_its_peer_waits(run_lab, how, kind, op):
    r = run_lab(SCRIPTS / "rank_elsewhere.py", args=["--how", how])
    assert r.status == "hung" and r.signature == "hang-rank-elsewhere"
    assert (r.rank(1).where.kind, r.rank(1).where.op) == (kind, op)
    assert r.rank(1).frame.func == "wait_for_input"
    assert (r.rank(0).where.kind, r.rank(0).where.op) == ("collective", "all_reduce")
    assert r.divergence.kind == "shorter-ledger" and r.divergence.ops == {0: "all_reduce", 1: None}


@pytest.mark.timeout(120)
def test_init_pointed_at_a_port_nobody_serves_hangs_in_the_rendezvous(run_lab):
    dead = _free_port()
    r = run_lab(SCRIPTS / "dead_port.py", args=[str(dead)])
    assert r.status == "hung" and r.signature == "hang-rendezvous"
    for x in r.ranks:
        assert x.where.kind == "rendezvous"
        assert x.dialling["port"] == dead
        assert x.given["port"] == r.port != dead


@pytest.mark.timeout(120)
def test_init_pointed_at_a_port_nobody_serves_fails_with_torchs_own_error(run_lab):
    # A 2 s init timeout: PyTorch's own DistNetworkError comes well within the stall rule's patience.
    dead = _free_port()
    r = run_lab(SCRIPTS / "dead_port.py", args=[str(dead), "2"])
    assert r.status == "failed" and r.signature == "store-unreachable"
    assert r.cause.type == "DistNetworkError"
    first = r.rank(r.first_failure)
    assert first.error.env["MASTER_PORT"] == str(dead)
    assert first.given["port"] == r.port != dead


@pytest.mark.timeout(120)
def test_the_same_collective_with_different_sizes(run_lab):
    r = run_lab(SCRIPTS / "size_mismatch.py", args=["--sizes", "1,3"])
    assert r.status == "hung" and r.signature == "hang-different-sizes"
    d = r.divergence
    assert d.kind == "different-sizes" and d.ops == {0: "all_reduce", 1: "all_reduce"}
    assert d.sizes == {0: ((1,),), 1: ((3,),)}
    assert r.rank(1).where.op == "all_reduce" and r.rank(1).where.seq == d.seq


@pytest.mark.timeout(120)
def test_different_sizes_that_gloo_aborts_name_the_aborted_rank(run_lab):
    r = run_lab(SCRIPTS / "size_mismatch.py", args=["--sizes", "7,5"])
    assert r.status == "failed" and r.signature == "gloo-size-mismatch"
    assert r.first_failure == 1 and r.rank(1).signal == "SIGABRT"
    assert r.rank(1).stack_source == "faulthandler (fatal signal)"
    assert r.rank(0).consequence is True


@pytest.mark.timeout(120)
def test_a_rank_that_exited_while_its_peer_waits(run_lab):
    r = run_lab(SCRIPTS / "rank_exits.py", args=["--helper"])
    assert r.status == "hung" and r.signature == "hang-rank-exited"
    assert (r.rank(1).state, r.rank(1).exit_code) == ("exited", 0)
    assert r.rank(1).ledger and all(c.completed for c in r.rank(1).ledger)    # its exit record's ledger
    last = r.rank(1).ledger[-1].seq
    d = r.divergence
    assert d.kind == "shorter-ledger" and d.seq == last + 1 and d.ops == {0: "all_reduce", 1: None}
    assert d.last == {0: last + 1, 1: last}
    assert r.rank(0).where.op == "all_reduce" and r.rank(0).where.seq == last + 1


@pytest.mark.timeout(120)
def test_a_rank_that_exited_makes_its_peer_fail_under_gloo(run_lab):
    # Without a helper holding its sockets, rank 1's exit closes them and rank 0 fails at once.
    r = run_lab(SCRIPTS / "rank_exits.py")
    assert r.status == "failed" and r.signature == "rank-exited-early"
    assert (r.rank(1).state, r.rank(1).exit_code, r.rank(1).error) == ("exited", 0, None)
    assert r.rank(0).consequence is True
    assert r.divergence.kind == "shorter-ledger" and r.divergence.ops == {0: "all_reduce", 1: None}


# --- input, command, Ctrl-C ----------------------------------------------------------------------

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
    (dict(target="01", deadline_s=0), "--deadline must be more than 0 seconds"),
    (dict(target="01", deadline_s=-1), "--deadline must be more than 0 seconds"),
    (dict(target="01", stall_s=0), "--stall must be more than 0 seconds"),
    (dict(target="01", stall_s=-2), "--stall must be more than 0 seconds"),
    (dict(target="01", stall_s="soon"), "--stall must be a number of seconds"),
    (dict(target="no/such/train.py"), "no such script"),
    (dict(target=str(SCRIPT), variant="broken"), "--variant is for labs"),
    (dict(target="01", progress="loud"), "is not a way to show progress"),
    (dict(target="01", progress=3), "is not a way to show progress"),
])
def test_bad_input_is_one_clear_error(kw, words, tmp_path):
    target = kw.pop("target")
    with pytest.raises(ddplab.DdplabError) as e:
        ddplab.run(target, run_root=tmp_path, **kw)
    assert words in str(e.value)
    assert e.value.hint
    assert not any(tmp_path.iterdir())


def test_launch_command_is_built_in_one_place(tmp_path):
    job = launch.resolve("01", "broken", None, None, run_root=tmp_path)
    assert job.deadline_s is None and job.stall_s > 0           # a lab: no outer limit by default
    cmd = launch.build_launch_command(job)
    assert cmd[1:3] == ["-m", "ddplab.origins._torchrun"]
    assert "127.0.0.1:0" in cmd and cmd[-2:] == ["--variant", "broken"]
    env = launch.launch_environment(job)
    assert env["DDPLAB_RUN_DIR"] == str(job.run_dir)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(launch.HOOK_DIR)
    assert int(env["TORCH_FR_BUFFER_SIZE"]) > 0                 # the collective ledger
    assert "DDPLAB_RUN_DIR" not in os.environ  # the caller's environment is untouched
    script = launch.resolve(SCRIPT, None, None, None, run_root=tmp_path)
    assert script.deadline_s == launch.DEFAULT_SCRIPT_DEADLINE_S and script.stall_s == launch.DEFAULT_STALL_S


@pytest.mark.timeout(120)
def test_sigint_to_ddplab_run_ends_everything(tmp_path):
    # A job that keeps computing (never stalls), so only Ctrl-C ends it.
    env = {**os.environ, "DDPLAB_RUNS_DIR": str(tmp_path), "BUSY_S": "600"}
    proc = subprocess.Popen([sys.executable, "-m", "ddplab.cli", "run", str(SCRIPT), "--quiet", "--", "--mode", "busy"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait until both ranks compute (each rank's collective ledger holds DDP's first collectives:
        # past init and into the training loop, read through its worker server), then Ctrl-C.
        wait_until(lambda: _ranks_with_a_ledger(tmp_path) == 2, "both ranks reach DDP's collectives", every_s=0.2)
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


def _ranks_with_a_ledger(runs_dir: Path) -> int:
    """How many ranks of the one job under ``runs_dir`` have issued a collective (their flight recorder says so)."""
    from ddplab.engine import evidence, ledger, probe
    dirs = {p.parent.parent for p in runs_dir.glob("*/*/ranks/rank?.json")}
    infos = evidence.rank_infos(next(iter(dirs))) if dirs else {}
    return sum(bool(ledger.parse(probe.ledger(i["socket"], timeout_s=1.0))) for i in infos.values() if i.get("socket"))


def _stacks_of_tree(pid: int) -> str:
    import psutil
    from ddplab.engine.stacks import pyspy_path

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


def test_runs_named_in_one_millisecond_get_their_own_folders(tmp_path):
    """Two jobs started together (lab 05's pair) once shared a folder, each reading the other's records."""
    from concurrent.futures import ThreadPoolExecutor

    from ddplab.origins.job import new_run_dir
    with ThreadPoolExecutor(4) as pool:
        dirs = list(pool.map(lambda _: new_run_dir(tmp_path, "fixed"), range(200)))
    assert len(set(dirs)) == 200 and all(d.parent == tmp_path and d.name.split("-", 3)[3].startswith("fixed")
                                         for d in dirs)
