"""The explanation of a failure beyond its catalog entry, from real 2-rank runs: the first failing
rank's whole exception (every line, its chained causes), the user's call that led into the library
with the values on that line, and the point-to-point waits and rendezvous asks of a hang."""
from pathlib import Path

import pytest

from ddplab.views import render

SCRIPTS = Path(__file__).parent / "scripts" / "reasons"

pytestmark = pytest.mark.timeout(240)


def test_a_multi_line_exception_keeps_every_line_and_the_users_call(run_lab):
    r = run_lab(SCRIPTS / "load_state_dict.py", nproc=2)
    assert r.status == "failed" and r.first_failure is not None, r.explain()
    e = r.rank(r.first_failure).error
    assert "Missing key(s)" in e.message and "Unexpected key(s)" in e.message
    assert e.frame.func == "restore" and "load_state_dict(state)" in e.frame.text
    assert set(e.values) == {"model", "state"} and "4 items" in e.values["state"]
    text = r.explain()
    assert '"backbone.weight", "backbone.bias"' in text and '"encoder.weight", "encoder.bias"' in text
    assert "called from your code at" in text and "`model.load_state_dict(state)`" in text


def test_a_chained_exception_shows_its_cause(run_lab):
    r = run_lab(SCRIPTS / "chained.py", nproc=2)
    e = r.rank(r.first_failure).error
    assert (r.first_failure, e.type) == (0, "ValueError"), r.explain()
    assert [(c.type, c.relation) for c in e.chain] == [("JSONDecodeError", "cause")]
    assert e.chain[0].frames[-1].func == "read_config"
    text = r.explain()
    assert "It was raised from JSONDecodeError: Expecting property name" in text
    assert "`return json.loads(text)`" in text


def test_an_exception_a_framework_turns_into_sys_exit_is_the_ranks_error(run_lab):
    r = run_lab(SCRIPTS / "hydra_like.py", nproc=2)
    e = r.rank(r.first_failure).error
    assert (e.type, e.message) == ("KeyError", "'optim'"), r.explain()
    assert e.frame.func == "train" and e.exited["code"] == "1"
    assert e.values == {"cfg": "{'optimizer': {'lr': 0.1}}"}
    assert "sys.exit(1) was called" in render.diagnosis(r)


@pytest.mark.parametrize("order,op", [("send-first", "send"), ("recv-first", "recv")])
def test_blocked_sends_are_point_to_point_with_their_peers_not_the_network(run_lab, order, op):
    r = run_lab(SCRIPTS / "p2p_both_send.py", nproc=2, args=["--order", order], stall_s=3)
    assert (r.status, r.signature) == ("hung", "hang-p2p-ordering"), r.explain()
    assert [(k.where.kind, k.where.op, k.peer["peer"]) for k in r.ranks] == [("p2p", op, 1), ("p2p", op, 0)]
    text = r.explain()
    assert "GLOO_SOCKET_IFNAME" not in text and "Lab 07" not in text and "network (" not in text
    assert "rank 0 " in text and "which is itself in " + op in text


def test_ordered_sends_finish(run_lab):
    r = run_lab(SCRIPTS / "p2p_both_send.py", nproc=2, args=["--order", "fixed"], stall_s=3)
    assert r.status == "ok", r.explain()


def test_parameters_used_until_the_script_changed_them_are_not_called_unused(run_lab):
    changed = run_lab(SCRIPTS / "unused_changed.py", nproc=2)
    assert (changed.status, changed.signature) == ("failed", "unused-parameters-changed"), changed.explain()
    assert "Lab 03" not in changed.explain()
    never = run_lab(SCRIPTS / "unused_changed.py", nproc=2, args=["--from-start"])
    assert (never.status, never.signature) == ("failed", "unused-parameters"), never.explain()


def test_an_unknown_exception_says_cause_not_identified_with_no_fix_and_no_lab(run_lab):
    r = run_lab(SCRIPTS.parent / "no_signature.py", nproc=2, args=["--mode", "keyerror"])
    assert (r.status, r.signature, r.first_failure) == ("failed", "python-exception", 1), r.explain()
    text = r.explain()
    assert "Cause not identified" in text and "Lab " not in text and "Read the traceback" not in text
    assert "KeyError: 'warmup_steps'" in text and "`print(config[\"warmup_steps\"])`" in text


@pytest.mark.parametrize("script,sig,words", [
    ("tutorial_torchrun_trainer.py", "accelerator-index-on-cpu", "self.gpu_id = {first}"),
    ("tutorial_accelerator_none.py", "no-accelerator-none", "`device_type = torch.accelerator.current_accelerator().type`"),
    ("tutorial_elastic_ddp.py", "no-gpu-device-count-zero", "`device_id = rank % torch.cuda.device_count()`"),
])
def test_tutorial_scripts_on_a_cpu_laptop_get_their_cause_in_their_own_terms(run_lab, script, sig, words):
    r = run_lab(SCRIPTS / script, nproc=2)
    assert (r.status, r.signature) == ("failed", sig), r.explain()
    assert words.format(first=r.first_failure) in r.explain()


def test_a_key_error_on_a_line_that_names_device_count_is_not_the_gpu_cause():
    from ddplab.engine import reasons, signatures
    from ddplab.facts import Frame
    facts = reasons.FailureFacts((Frame("f", "/tmp/x.py", 3, "n = cfg['gpus']"),))
    assert signatures.match_text("ZeroDivisionError: integer modulo by zero", facts)[0].id == "python-exception"


def test_the_tutorials_mp_spawn_under_torchrun_is_named(run_lab):
    import socket
    with socket.socket() as s:          # the tutorial's fixed port, made free for this run
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run_lab(SCRIPTS / "tutorial_spawn_under_torchrun.py", nproc=2, stall_s=3, env={"TUTORIAL_PORT": str(port)})
    assert (r.status, r.signature) == ("hung", "spawn-under-torchrun"), r.explain()
    assert "Lab 05" not in r.explain()


def test_two_processes_asking_for_the_same_rank_are_told_from_a_rank_that_never_came(run_lab):
    r = run_lab(SCRIPTS / "same_rank.py", nproc=2, stall_s=3)
    assert (r.status, r.signature) == ("hung", "rendezvous-ranks-conflict"), r.explain()
    assert [(k.asked["rank"], k.asked["env"]["RANK"]) for k in r.ranks] == [(0, "0"), (0, "1")]
    text = r.explain()
    assert "rank 0 was asked for 2 times" in text and "no waiting process asked for rank 1" in text
    # the lab named is the catalog's own for this signature (lab 06's duplicate-rank variant), issue 42
    assert "Lab 06 teaches this failure" in text


def test_a_rendezvous_that_times_out_on_a_rank_asked_for_twice_is_not_a_missing_rank(run_lab):
    """Both processes reached init_process_group and each recorded what it asked for (the exception's
    own frame): the timeout is the conflict's, not a rank that crashed, came late or cannot reach the master."""
    r = run_lab(SCRIPTS / "same_rank.py", nproc=2, stall_s=3, args=["--timeout-s", "3"])
    assert r.status == "failed" and r.signature == "rendezvous-ranks-conflict", r.explain()
    assert [(k.asked["rank"], k.asked["env"]["RANK"]) for k in r.ranks] == [(0, "0"), (0, "1")]
    assert r.culprits == (1,)
    text = r.explain()
    assert "rank 0 was asked for 2 times" in text and "cannot reach MASTER_ADDR" not in text


def test_a_world_size_other_than_the_jobs_is_named(run_lab):
    r = run_lab(SCRIPTS / "same_rank.py", nproc=2, stall_s=3, args=["--world-size", "3"])
    assert (r.status, r.signature) == ("hung", "rendezvous-ranks-conflict"), r.explain()
    assert "in a world of 3" in r.explain() and "the job started 2 processes" in r.explain()


def test_a_rank_that_never_came_stays_the_general_rendezvous_hang():
    from ddplab.engine import classify
    from ddplab.result import RankResult
    from ddplab.facts import Where
    waiting = RankResult(rank=0, pid=1, state="hung", exit_code=None, signal=None,
                         where=Where("rendezvous", "init_process_group"),
                         asked={"rank": 0, "world_size": 2, "env": {"RANK": "0", "WORLD_SIZE": "2"}})
    late = RankResult(rank=1, pid=2, state="hung", exit_code=None, signal=None, where=Where("sleep", "sleep"))
    assert classify.hang_signature((waiting, late), None) == "hang-rendezvous"


def test_where_every_other_rank_was_when_torchrun_ended_it(run_lab):
    r = run_lab(SCRIPTS / "others_when_one_fails.py", nproc=4)
    assert (r.status, r.first_failure) == ("failed", 0), r.explain()
    ended = {k.rank: k for k in r.ranks if k.rank}
    assert all(k.signal == "SIGTERM" and k.stack_source == "faulthandler (SIGTERM)" for k in ended.values())
    # rank 1 blocked inside gloo (C++): the dump still has its Python frames
    assert (ended[1].where.kind, ended[1].where.op, ended[1].frame.line) == ("collective", "all_reduce", 28)
    assert ended[2].frame.line == 30 and ended[3].frame.func == "busy_loop"
    assert "When it did, rank 1 was in all_reduce" in r.explain()


@pytest.mark.timeout(240)
def test_torchs_flight_recorder_dumps_give_each_ranks_own_line(tmp_path):
    """A plain torchrun job (no ddplab), gloo, each rank's dump written after its collective timed out:
    `ddplab explain` places every rank at the line of its own code that issued its last collective."""
    import os
    import subprocess
    import sys

    from ddplab.origins.explain import explain
    script = SCRIPTS.parent / "hang_last_rank.py"
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPLAB")}
    env.update(PYTHONPATH="", TORCH_FR_BUFFER_SIZE="200", TORCH_FR_DUMP_TEMP_FILE=str(dumps / "trace_"),
               OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--rdzv-backend",
                        "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(script), "--dump-after", "3"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)
    assert sorted(f.name for f in dumps.iterdir()) == ["trace_0", "trace_1", "trace_2"], p.stderr[-2000:]
    r = explain([dumps])
    assert [(k.where.op, k.frame is not None and k.frame.file == str(script)) for k in r.ranks] == \
        [("all_reduce", True), ("all_reduce", True), ("barrier", True)], r.explain()
    assert " in 0.0 s" not in r.explain() and "hang_last_rank.py:" in r.explain()


def test_a_split_made_on_each_rank_is_named_with_a_fix_that_keeps_the_sampler(run_lab):
    r = run_lab(SCRIPTS / "mingpt_split.py", nproc=2, check=True)
    assert r.status == "ok", r.explain()
    found = {f.kind: f for f in r.check.findings}
    assert set(found) == {"samples-overlap", "samples-dropped"} and {f.cause for f in found.values()} == {"split-differs"}
    over, never = found["samples-overlap"], found["samples-dropped"]
    assert never.held_out == 16 and over.count == never.count      # 48 shares: every sample twice is one missed
    assert "generator=torch.Generator().manual_seed(seed)" in over.fix and "sampler=DistributedSampler" not in over.fix
    seeded = run_lab(SCRIPTS / "mingpt_split.py", nproc=2, check=True, args=["--seeded"])
    assert seeded.status == "ok" and seeded.check.findings == (), seeded.explain()


@pytest.mark.timeout(200)
def test_attach_save_attributes_no_line_of_a_stdout_file_the_ranks_share(tmp_path):
    """torchrun's output redirected to one file: which rank printed a line is unknown, so neither
    rank's saved log holds the other's line."""
    import os
    import subprocess
    import sys

    import psutil

    from conftest import wait_until
    from ddplab import runfiles
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPLAB")}
    env["PYTHONPATH"] = ""
    out = open(tmp_path / "out.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend",
                             "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(SCRIPTS / "shared_stdout.py")],
                            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    agent = psutil.Process(proc.pid)
    try:
        wait_until(lambda: "rank 0 sleeps forever" in (tmp_path / "out.log").read_text(), "both ranks print",
                   limit_s=120, every_s=0.2)
        folder = tmp_path / "saved"
        p = subprocess.run([sys.executable, "-m", "ddplab.cli", "attach", str(proc.pid), "--save", str(folder),
                            "--watch", "60"], capture_output=True, text=True, timeout=150,
                           env={**os.environ, "DDPLAB_RUNS_DIR": str(tmp_path / "runs")})
        assert folder.exists(), p.stderr
        assert (folder / runfiles.RANKS / runfiles.rank_name(0, runfiles.INFO)).exists(), p.stderr
        # the only output is the one file both ranks write: no rank's log is made from it
        assert [Path(runfiles.rank_path(folder, r, runfiles.LOG)).exists() for r in (0, 1)] == [False, False]
    finally:
        for c in [agent] + agent.children(recursive=True):
            try:
                c.kill()
            except psutil.Error:
                pass
        proc.wait(timeout=10)
        out.close()


def test_a_receive_of_the_wrong_size_is_a_point_to_point_mismatch_not_a_collective_one(run_lab):
    r = run_lab(SCRIPTS / "recv_shape.py", nproc=2)
    assert (r.status, r.signature, r.first_failure) == ("failed", "p2p-size-mismatch", 1), r.explain()
    assert (r.rank(1).signal, r.rank(1).frame.line) == ("SIGABRT", 16)
    assert "Lab 01" not in r.explain() and "recv_shape.py:16" in r.explain()


def test_an_object_collective_is_named_around_the_tensor_collective_it_runs(run_lab):
    r = run_lab(SCRIPTS / "object_gather.py", nproc=2, stall_s=3)
    assert (r.status, r.signature) == ("hung", "hang-different-collectives"), r.explain()
    w0, w1 = r.rank(0).where, r.rank(1).where
    assert (w0.kind, w0.via, w0.frame.line) == ("collective", "all_gather_object", 14), r.explain()
    assert (w1.kind, w1.op) == ("collective", "barrier")
    assert "(inside all_gather_object)" in r.explain()


def test_ranks_stalled_outside_collectives_get_no_cause_and_no_lab(run_lab):
    r = run_lab(SCRIPTS.parent / "my_train.py", nproc=2, args=["--mode", "sleep"], stall_s=3)
    assert (r.status, r.signature) == ("hung", "stalled-outside-collectives"), r.explain()
    text = r.explain()
    assert "Cause not identified" in text and "Lab 05" not in text and "sleeping" in text


def test_a_timeout_shorter_than_a_peers_work_is_named_with_its_line(run_lab):
    r = run_lab(SCRIPTS / "short_timeout.py", nproc=2)
    assert (r.status, r.signature, r.first_failure) == ("failed", "timeout-too-short", 1), r.explain()
    from ddplab.engine import classify
    # rank 0 was still working: at its sleep when torchrun ended it, or (under load) it reached the barrier
    # after rank 1 had timed out, longer than the timeout after rank 1 (the ledgers' issue times)
    busy = r.rank(0)
    at_work = busy.where is not None and busy.where.kind not in ("collective", "p2p") and busy.frame.line == 24
    assert at_work or classify.late_peers(r.ranks, 1, 3000) == (0,), r.explain()
    assert r.culprits == (1,) and r.fix_at.line == 19 and "timeout=" in r.fix_at.text
    text = r.explain()
    assert "The line that set it up: " in text and "short_timeout.py:19" in text
    if at_work:
        assert "rank 0 was running outside any collective at short_timeout.py:24" in text


def test_a_short_timeout_is_not_the_cause_when_the_peer_was_blocked_too(run_lab):
    r = run_lab(SCRIPTS / "short_timeout.py", nproc=2, args=["--peer", "blocked"])
    assert r.status == "failed", r.explain()
    assert r.signature != "timeout-too-short" and r.fix_at is None, r.explain()


def test_a_read_of_a_file_another_rank_is_still_writing_is_named(run_lab):
    r = run_lab(SCRIPTS / "read_before_write.py", nproc=2)
    assert (r.status, r.signature, r.first_failure) == ("failed", "read-before-write", 1), r.explain()
    assert r.rank(1).error.type == "FileNotFoundError" and r.rank(1).frame.line == 28
    # where the writer was when torchrun ended it: still writing, or past the write (the file then exists,
    # written after the failing read: the premise holds either way)
    assert r.rank(0).frame.line in (25, 30)
    assert "dist.barrier()" in r.explain()


@pytest.mark.parametrize("variant,status", [("fixed", "ok"), ("nobody-writes", "failed")])
def test_no_read_before_write_without_a_writer(run_lab, variant, status):
    r = run_lab(SCRIPTS / "read_before_write.py", nproc=2, args=["--variant", variant])
    assert r.status == status and r.signature != "read-before-write", r.explain()


FAULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "faults"


def _mutant(op_id, tmp_path):
    import sys
    sys.path.insert(0, str(FAULTS))
    import mutate
    op = next(o for o in mutate.operators() if o["id"] == op_id)
    return mutate.build(op, tmp_path / "mutants")


def _run_mutant(run_lab, m, **kw):
    """A mutant run for real, and what it wrote in the temp folder (its snapshot) removed after it."""
    import sys
    sys.path.insert(0, str(FAULTS))
    import run as suite
    r = run_lab(Path(m.path), nproc=2, args=list(m.args), **kw)
    suite.remove_temp_of(r.port)
    return r


@pytest.mark.parametrize("op_id,status,signature,site", [
    # the argument torchrun no longer passes, defined one line above the parse that fails
    ("local-rank-argparse", "failed", "launch-local-rank-arg", 'add_argument("--local_rank"'),
    # the batch size whose number is the first dimension of the tensor that did not fit
    ("global-batch-per-rank", "failed", "cpu-oom", "batch_size = 8 * 512"),
    # the store address the script set over torchrun's (the ranks dial another port than they were given)
    ("master-port-override", "hung", "hang-rendezvous", 'os.environ["MASTER_PORT"]'),
    # rank 0 left the loop alone (a clean exit, no frame of its own): the rank condition that leaves
    ("early-stop-one-rank", "failed", "rank-exited-early", "if master_process and iter_num == 6"),
    # a barrier only rank 0 reaches: the rank condition above it
    ("barrier-in-save-branch", "hung", "hang-different-collectives", "if self.global_rank == 0"),
])
def test_the_line_that_set_the_failure_up_is_found_where_the_premise_holds(run_lab, tmp_path, op_id, status,
                                                                          signature, site):
    m = _mutant(op_id, tmp_path)
    r = _run_mutant(run_lab, m, stall_s=3)
    assert (r.status, r.signature) == (status, signature), r.explain()
    assert r.fix_at is not None and site in r.fix_at.text and Path(r.fix_at.file).name == Path(m.path).name
    if op_id == "early-stop-one-rank":
        assert r.culprits == (0,) and r.first_failure == 1
    if op_id == "barrier-in-save-branch":   # the barrier is the line to fix; the guard is the line above it
        assert r.culprits == (0,) and r.rank(0).frame.line in m.fix_lines and r.fix_at.line < r.rank(0).frame.line
    else:
        assert r.fix_at.line in m.fix_lines, (r.fix_at, m.fix_lines)
    assert "The line that set it up: " in r.explain()


def test_two_processes_on_one_rank_blame_the_one_that_asked_for_another_rank(run_lab):
    r = run_lab(SCRIPTS / "same_rank.py", nproc=2, stall_s=3)
    assert (r.signature, r.culprits) == ("rendezvous-ranks-conflict", (1,)), r.explain()
    assert "The evidence points at rank 1." in r.explain()


def test_a_hang_in_one_collective_gives_no_network_advice_without_a_premise():
    from ddplab.engine import signatures
    s = signatures.get("hang-same-collective")
    assert "GLOO_SOCKET_IFNAME" not in s.explanation and not s.lab
    assert "hang-same-collective" in signatures.UNIDENTIFIED


@pytest.mark.parametrize("op_id,signature,fix_words", [
    ("gather-list-non-dst", "gather-list-non-dst", "if rank == dst else None"),
    ("sampler-with-shuffle", "sampler-shuffle-exclusive", "Leave shuffle out of the DataLoader"),
])
def test_exceptions_no_entry_knew_now_name_their_cause_and_fix(run_lab, tmp_path, op_id, signature, fix_words):
    m = _mutant(op_id, tmp_path)
    r = _run_mutant(run_lab, m)
    assert (r.status, r.signature) == ("failed", signature), r.explain()
    assert r.rank(r.first_failure).frame.line in m.fix_lines
    text = r.explain()
    assert fix_words in text and "Cause not identified" not in text and "Lab " not in text


def test_the_premises_that_find_a_line_to_fix_read_the_script_and_decline_where_they_do_not_hold(tmp_path):
    """The text half of refine's four general rules, on the suite's mutants (their real runs are the fault
    suite's; the recv test above runs the receive case): each finds the labelled line, and each declines (None)
    on the unchanged base, where its premise does not hold. No processes: the rules read text only."""
    from ddplab.engine import classify
    from ddplab.facts import Frame
    from ddplab.result import RankError, RankResult

    def src(op_id):
        m = _mutant(op_id, tmp_path)
        return m, {m.path: Path(m.path).read_text()}
    m, s = src("unused-parameter")
    assert classify.unused_submodule_site(m.path, s).line in m.fix_lines
    base = str(FAULTS / "bases" / "ddp_trainer.py")
    assert classify.unused_submodule_site(base, {base: Path(base).read_text()}) is None
    m, s = src("rank0-sanity-forward")
    assert classify.guarded_collective_site(m.path, s).line in m.fix_lines
    assert classify.guarded_collective_site(base, {base: Path(base).read_text()}) is None
    m, s = src("eval-whole-split")
    call = next(i + 1 for i, t in enumerate(s[m.path].splitlines()) if "logits, loss = model(X, Y)" in t
                and i + 1 > m.fix_lines[0])
    err = RankError("RuntimeError", "can't allocate memory", (Frame("estimate_loss", m.path, call),), 0.0)
    assert classify.batch_made_site(err, s).line in m.fix_lines
    # the receive side: rank 0 got 512 bytes for a 256-byte buffer from rank 1, whose tensor comes from a
    # receive buffer of 512 bytes (the line to fix); where the peer's tensor is computed, the receiver's own buffer
    m, s = src("recv-wrong-shape")
    lines = s[m.path].splitlines()
    recv = next(i + 1 for i, t in enumerate(lines) if "dist.recv(grad" in t)
    send = next(i + 1 for i, t in enumerate(lines) if "dist.send(inputs[m].grad" in t)
    log = "op.preamble.length <= op.nbytes. 512 vs 256. Received data size doesn't match expected size."
    r0 = RankResult(0, 1, "exited", None, "SIGABRT", log_tail=log,
                    error=RankError("RuntimeError", "x", (Frame("main", m.path, recv),), 0.0))
    r1 = RankResult(1, 2, "exited", None, "SIGTERM",
                    error=RankError("RuntimeError", "reset", (Frame("main", m.path, send),), 0.0))
    culprits, at = classify.p2p_sent_site((r0, r1), 0, s)
    assert culprits == (1,) and at.line in m.fix_lines
    m, s = src("recv-buffer-dtype")
    lines = s[m.path].splitlines()
    recv = next(i + 1 for i, t in enumerate(lines) if "dist.recv(x" in t)
    send = next(i + 1 for i, t in enumerate(lines) if "dist.send(y.detach()" in t)
    log = "op.preamble.length <= op.nbytes. 256 vs 128. Received data size doesn't match expected size."
    r1 = RankResult(1, 2, "exited", None, "SIGABRT", log_tail=log,
                    error=RankError("RuntimeError", "x", (Frame("main", m.path, recv),), 0.0))
    r0 = RankResult(0, 1, "exited", None, "SIGTERM",
                    error=RankError("RuntimeError", "reset", (Frame("main", m.path, send),), 0.0))
    culprits, at = classify.p2p_sent_site((r0, r1), 1, s)
    assert culprits == (1,) and at.line in m.fix_lines
