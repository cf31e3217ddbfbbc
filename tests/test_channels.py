"""The rank hook's evidence channels (issue 41), each on a real 2-rank gloo run of tests/scripts/channels.py:
call sites with the exception in flight, the divergence of call sites and the user's branch between, the threads
that keep a finished rank alive, os._exit's value and line, and a DataLoader worker's own exception. Each test
fails without its channel (what it asserts is read from the hook's records, never from the script's text)."""
from pathlib import Path

import pytest

from ddplab.engine import callsites, signatures
from ddplab.engine.reasons import FailureFacts
from ddplab.engine.stacks import Frame
from ddplab.facts import CallSite, InFlight

SCRIPT = Path(__file__).parent / "scripts" / "channels.py"
LINES = SCRIPT.read_text().splitlines()


CODE = LINES.index("import argparse") + 1     # past the docstring, which quotes some lines


def line_of(text: str, after: int = CODE) -> int:
    """The 1-based number of the first line of code at or after ``after`` that contains ``text``."""
    return next(i + 1 for i, t in enumerate(LINES) if i + 1 >= after and text in t)


@pytest.mark.timeout(150)
def test_the_branch_comes_from_the_call_sites_not_from_a_word_on_a_line(run_lab):
    """Rank 0 alone all-reduces under `if self.trainer.is_global_zero:` inside `if "rank" not in ...:`: the line
    that set it up is the attribute's branch (the word match named the string's line), from the ranks' calls."""
    r = run_lab(SCRIPT, args=["--how", "guarded"])
    assert r.status == "hung" and r.signature == "hang-different-collectives", r.explain()
    d = r.calls_diverged
    assert d is not None and d.odd == (0,), r.explain()
    guarded = line_of("dist.all_reduce(t)             # only rank 0")
    assert d.first[0].op == "all_reduce" and d.first[0].frame.line == guarded
    assert d.first[1].frame.line == line_of("dist.all_reduce(t)", line_of('if how == "guarded"'))
    assert d.last_same is not None and d.last_same.frame.line == line_of("dist.all_reduce(t)", line_of("side = "))
    assert r.culprits == (0,)
    assert r.fix_at.line == line_of("if self.trainer.is_global_zero:"), r.fix_at
    # each rank's record of its calls, numbered, with the user's frames (innermost first)
    assert [c.op for c in r.rank(0).calls[:3]] == ["init_process_group", "new_group", "all_reduce"]
    assert r.rank(0).calls[0].user[0].func == "main" and r.rank(0).calls[0].exc is None


def test_the_branch_of_accelerate_s_main_process_from_call_records():
    """The same reading for `if accelerator.is_main_process:`, on call records as the hook writes them."""
    src = {str(SCRIPT): SCRIPT.read_text()}
    top = line_of('elif how == "main-process"')
    f = lambda line, func="main": Frame(func, str(SCRIPT), line)   # noqa: E731
    same = CallSite(3, "all_reduce", (f(line_of("dist.all_reduce(t)", line_of("side = "))),), None)
    calls = {0: (same, CallSite(4, "all_reduce", (f(line_of("dist.all_reduce(t)", top)),), None)),
             1: (same, CallSite(4, "all_reduce", (f(line_of("dist.all_reduce(t)", line_of("if accelerator.is_main_process") + 2)),), None))}
    d = callsites.divergence(calls, {}, src)
    assert d.n == 4 and d.odd == (0,) and d.branch.text == "if accelerator.is_main_process:"
    assert d.last_same == same
    # the same places on every rank: no divergence
    assert callsites.divergence({0: calls[0], 1: calls[0]}, {}, src) is None


@pytest.mark.timeout(150)
def test_an_exception_in_flight_at_a_collective_is_the_reading_not_control_flow(run_lab):
    """Rank 1 enters a barrier in the except block of its failed read: the exception in flight is recorded at the
    call; it rules out the generic control-flow reading (hang-different-collectives) and is shown instead."""
    r = run_lab(SCRIPT, args=["--how", "in-flight"])
    assert r.status == "hung" and r.signature == "hang-collective-while-handling", r.explain()
    c = callsites.pending_call(r.rank(1))
    assert c is not None and c.op == "barrier" and c.frame.line == line_of("dist.barrier(group=side)", line_of("except ValueError"))
    assert c.exc.type == "ValueError" and "batch 2 is corrupt" in c.exc.message
    assert (c.exc.at.func, c.exc.at.line) == ("read_batch", line_of("raise ValueError"))
    assert "while handling ValueError" in r.explain()
    assert callsites.pending_call(r.rank(0)).exc is None


@pytest.mark.timeout(150)
def test_a_non_daemon_thread_keeping_a_finished_rank_alive_is_named_with_its_line(run_lab):
    r = run_lab(SCRIPT, args=["--how", "thread"])
    assert (r.status, r.signature) == ("hung", "non-daemon-thread"), r.explain()
    w = r.rank(1).where
    assert (w.kind, w.op) == ("thread", "metrics-uploader"), r.explain()
    assert (w.frame.func, w.frame.line) == ("forever", line_of("threading.Event().wait()"))
    assert any(t.name == "metrics-uploader" and not t.daemon for t in r.rank(1).threads)
    # the line that started it (the hook's record of Thread.start): what the thread's own stack never shows
    started = line_of('threading.Thread(target=forever, name="metrics-uploader").start()')
    assert r.culprits == (1,) and r.fix_at is not None and r.fix_at.line == started, r.fix_at
    assert "kept alive by thread 'metrics-uploader'" in r.explain()


@pytest.mark.timeout(150)
def test_os_exit_is_the_first_failure_with_its_value_and_line(run_lab):
    """os._exit(3) leaves no traceback and runs no handler: the hook's record makes rank 1 the first failure
    (not rank 0's lost connection), and the peer-lost reading is not named."""
    r = run_lab(SCRIPT, args=["--how", "os-exit"])
    assert r.status == "failed" and r.first_failure == 1, r.explain()
    e = r.rank(1).ended
    assert e is not None and (e.how, e.code) == ("os._exit", 3)
    assert any(f.line == line_of("os._exit(3)") for f in e.frames)
    assert r.signature is None, r.explain()
    assert f"os._exit(3) at tests/scripts/channels.py:{line_of('os._exit(3)')}" in r.explain()


@pytest.mark.timeout(150)
def test_a_dataloader_worker_s_exception_is_unwrapped_with_its_own_frames(run_lab):
    r = run_lab(SCRIPT, args=["--how", "worker"])
    assert r.status == "failed" and r.first_failure == 1, r.explain()
    n = r.rank(1).error.nested
    assert n is not None and n.type == "KeyError" and "DataLoader worker process 0" in n.where
    assert any(f.func == "__getitem__" and f.line == line_of("raise KeyError") for f in n.frames)
    assert "no label for item 3" in n.message
    assert "re-raised from another process" in r.explain()


# ---- premises (issue 41, item 4): each reading is withheld where its premise fails --------------------------------

def test_init_recorded_in_the_process_rules_out_call_init_first():
    text = "ValueError: Default process group has not been initialized, please make sure to call init_process_group."
    init = CallSite(1, "init_process_group", (), None)
    named = signatures.match_text(text, FailureFacts())
    assert named is not None and named[0].id == "process-group-not-initialized"
    assert signatures.match_text(text, FailureFacts(calls=(init,))) is None or \
        signatures.match_text(text, FailureFacts(calls=(init,)))[0].id != "process-group-not-initialized"
    # destroyed after it: the reading holds again
    destroyed = (init, CallSite(2, "destroy_process_group", (), None))
    assert signatures.match_text(text, FailureFacts(calls=destroyed))[0].id == "process-group-not-initialized"


def test_an_exception_in_flight_rules_out_each_control_flow_reading():
    from ddplab.engine.classify import HangFacts
    # the control-flow readings (the rules for a rank kept alive at exit have premises of their own)
    control = {"hang-different-collectives", "hang-rank-elsewhere", "hang-different-sizes", "hang-rank-exited"}
    assert control <= {s.id for s in signatures.HANG_RULES if s.rules_out is not None}
    ruled = control
    call = CallSite(5, "barrier", (), None, InFlight("ValueError", "x", None))
    facts = HangFacts(alive=(), gone=(), in_coll=(), ops=frozenset(), at_rendezvous=False, any_ledger=True,
                      blocked=(), divergence_kind="different-op", in_flight=((1, call),))
    for s in signatures.HANG_RULES:
        if s.id in ruled:
            assert s.rules_out(facts), s.id
            assert not s.rules_out(HangFacts(**{**facts.__dict__, "in_flight": ()})), s.id


def test_a_rank_still_in_its_loop_is_compared_at_every_frame_of_its_stack():
    """Rank 1 left its data loop and called barrier; rank 0 is still in the loop (DDP's collectives, no call
    record): `if __name__ == "__main__":` holds both ranks' outer frames, so it is no branch between them."""
    src = ("def step():\n    pass\n\n"                          # 1-2
           "def train(n):\n    for _ in range(n):\n        step()\n    barrier()\n\n"   # 4-7
           "if __name__ == '__main__':\n    train(3)\n")       # 9-10
    f = lambda func, line: Frame(func, "/x/t.py", line)   # noqa: E731
    init = CallSite(1, "init_process_group", (f("<module>", 10),), None)
    calls = {0: (init,), 1: (init, CallSite(2, "barrier", (f("train", 7), f("<module>", 10)), None))}
    stands = {0: (f("step", 2), f("train", 6), f("<module>", 10))}
    d = callsites.divergence(calls, stands, {"/x/t.py": src})
    assert d is not None and d.n == 2 and d.first[0] is None
    assert d.odd == () and d.branch is None
    # with only its innermost frame known, the __main__ guard would have looked like a branch
    assert callsites.divergence(calls, {0: stands[0][:1]}, {"/x/t.py": src}).branch is not None


@pytest.mark.timeout(150)
def test_a_folder_missing_when_the_rank_failed_and_made_later_is_a_race_not_a_missing_folder(run_lab):
    """folder-race: rank 1's torch.save fails ('Parent directory ... does not exist'), rank 0 makes the folder after
    it. The path is the hook's record of torch.save's own argument, and whether its folder existed then; at the
    verdict the folder exists: another rank made it later."""
    import shutil
    import tempfile
    r = run_lab(SCRIPT, args=["--how", "folder-race"])
    folder = Path(tempfile.gettempdir()) / f"ddplab_channels_{r.port}"
    try:
        assert r.status == "failed" and r.first_failure == 1, r.explain()
        (p,) = r.rank(1).error.paths
        assert (p.path, p.folder_then, p.folder_now) == (str(folder / "rank1.pt"), False, True)
        assert r.signature == "dir-created-on-rank0-only", r.explain()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        Path(str(folder) + ".failed").unlink(missing_ok=True)


@pytest.mark.timeout(150)
def test_a_folder_nobody_made_is_named_missing(run_lab):
    import tempfile
    r = run_lab(SCRIPT, args=["--how", "folder-missing"])
    folder = Path(tempfile.gettempdir()) / f"ddplab_channels_{r.port}"
    try:
        assert r.status == "failed" and r.first_failure == 1, r.explain()
        (p,) = r.rank(1).error.paths
        assert (p.path, p.folder_then, p.folder_now) == (str(folder / "rank1.pt"), False, False)
        assert r.signature == "checkpoint-dir-missing", r.explain()
    finally:
        Path(str(folder) + ".failed").unlink(missing_ok=True)


@pytest.mark.timeout(150)
def test_a_send_and_a_receive_with_different_tags_from_the_blocked_calls(run_lab):
    """p2p-tags: rank 0 blocks in send(dst=1, tag=1), rank 1 in recv(src=0, tag=2): the hook's live answer gives each
    blocked call's peer and tag."""
    r = run_lab(SCRIPT, args=["--how", "p2p-tags"])
    assert r.status == "hung" and r.signature == "p2p-tag-mismatch", r.explain()
    assert (r.rank(0).peer["op"], r.rank(0).peer["tag"], r.rank(1).peer["op"], r.rank(1).peer["tag"]) == (
        "send", 1, "recv", 2)
    assert "rank 0 sends to rank 1 with tag 1" in r.explain()


@pytest.mark.timeout(150)
def test_a_rank_polling_for_a_file_while_the_other_waits_in_a_barrier(run_lab):
    """file-poll: rank 0 loops on os.path.exists for a file rank 1 writes after a barrier: the hook's record of
    the missed looks (path, count, line) and rank 0's stack at that line; rank 1 waits in the barrier."""
    import tempfile
    r = run_lab(SCRIPT, args=["--how", "file-poll"])
    assert r.status == "hung" and r.signature == "file-handshake-deadlock", r.explain()
    (p,) = r.rank(0).polls
    assert p.path == str(Path(tempfile.gettempdir()) / f"ddplab_channels_{r.port}.done") and p.misses >= 3
    assert r.culprits == (0,) and r.fix_at is not None and r.fix_at.line == line_of("while not os.path.exists(done)")
    assert r.rank(1).polls == ()
