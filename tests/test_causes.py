"""Known user mistakes named with their fix (ddplab.engine.causes): matched on what an error means
(exception type and key phrases) in messages captured from real runs, in the wordings other
torch versions used (as reported), and in real runs of a GPU script on this CPU-only torch."""
from pathlib import Path

import pytest

from ddplab.engine import causes, signatures
from test_signatures import EXPECTED

SCRIPTS = Path(__file__).parent / "scripts"
IDS = {c.id for c in causes.CAUSES}

# The same mistakes in other versions' words, as learners reported them (source in each row).
REPORTED = [
    ("AttributeError: 'module' object has no attribute '_cuda_setDevice'", "cuda-on-cpu-torch",
     "https://github.com/junyanz/pytorch-CycleGAN-and-pix2pix/issues/267"),
    ("ValueError: DistributedDataParallel device_ids and output_device arguments only work with single-device "
     "CUDA modules, but got device_ids 1", "ddp-device-ids-cpu", "https://github.com/pytorch/pytorch/issues/46821"),
    ("RuntimeError: Default process group has not been initialized, please make sure to call init_process_group.",
     "process-group-not-initialized", "https://github.com/megvii-model/YOLOF/issues/11"),
    ("RuntimeError: trying to initialize the default process group twice!", "process-group-initialized-twice",
     "https://github.com/NVIDIA/Megatron-LM/pull/521"),
    ("AssertionError: DistributedDataParallel is not needed when a module doesn't have any parameter that requires "
     "a gradient.", "ddp-no-trainable-parameters", "https://github.com/pytorch/pytorch/issues/45326"),
    ("ValueError: SyncBatchNorm expected input tensor to be on GPU", "syncbn-on-cpu",
     "https://github.com/open-mmlab/mmagic/issues/133"),
    ("train.py: error: unrecognized arguments: --local-rank=0", "launch-local-rank-arg",
     "https://github.com/XPixelGroup/BasicSR/issues/626"),
    ("ValueError: ProcessGroupGloo::gather: Incorrect output list size 1. Output list size should be 2, same as size "
     "of the process group.", "collective-list-size", "https://github.com/pytorch/pytorch/pull/27439"),
    ("RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the following "
     "reasons: 1) Use of a module parameter outside the `forward` function.", "ddp-parameter-ready-twice",
     "https://github.com/Lightning-AI/pytorch-lightning/issues/4033"),
]


def test_every_cause_has_a_captured_message_sources_and_a_fix():
    assert IDS <= set(EXPECTED.values()), IDS - set(EXPECTED.values())
    for c in causes.CAUSES:
        assert c.sources and all(u.startswith("https://") for u in c.sources), c.id
        assert len(c.explanation.splitlines()) == 2, c.id
    for name, sig in EXPECTED.items():
        if sig in IDS:
            head = (Path(__file__).parent / "data" / name).read_text().splitlines()[:2]
            # captured here; or, for a GPU-only message (NCCL) on this CPU machine, reported with its thread
            assert "torch 2.13" in head[0] or (name.startswith("reported_") and "https://github.com/" in head[1]), name


@pytest.mark.parametrize("text,expected,source", REPORTED)
def test_other_wordings_name_the_same_cause(text, expected, source):
    found = signatures.match_text(text)
    assert found is not None and found[0].id == expected, (source, found)


def test_a_phrase_under_another_exception_type_is_not_the_cause():
    # the meaning is the type and the phrases together: a log line quoting a phrase is not the error
    assert causes.CAUSES[0].search("print: _cuda_setDevice is missing") is None
    assert signatures.match_text("KeyError: 'device_ids'") [0].id == "python-exception"


def test_an_unknown_exception_names_no_lab():
    sig, line = signatures.match_text("ValueError: learning rate must be positive")
    assert sig.id == "python-exception" and sig.lab == "" and line == "ValueError: learning rate must be positive"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mistake,env,expected", [
    ("set-device", {}, "cuda-on-cpu-torch"),
    ("device-ids", {}, "ddp-device-ids-cpu"),
    ("local-rank-arg", {}, "launch-local-rank-arg"),
    ("none", {"GLOO_SOCKET_IFNAME": "^lo"}, "gloo-ifname-exclusion"),
])
def test_a_gpu_script_on_this_cpu_torch_gets_the_cause_and_its_fix(run_lab, mistake, env, expected):
    r = run_lab(SCRIPTS / "cpu_laptop.py", env={"MISTAKE": mistake, **env})
    assert (r.status, r.signature) == ("failed", expected), r.explain()
    text = r.explain()
    assert signatures.get(expected).explanation.splitlines()[1] in text
    assert ("Lab 01" not in text) and ("python exception" not in text.lower())


def test_the_cpu_route_runs(run_lab):
    r = run_lab(SCRIPTS / "cpu_laptop.py", env={"MISTAKE": "none"})
    assert r.status == "ok", r.explain()


# ---- readings whose premise the rank hook's records hold (issue 41, item 4), on the records of real runs --------
# tests/data/run_h41_<case>/: the run folders the fault suite's first-time operators left (benchmarks/faults,
# round h41, 2 ranks, torch 2.13 CPU), as the ranks and torchrun wrote them.

def judged(case: str, change=None):
    """classify.judge on a captured run's records (``change``: a function that edits the RunEvidence first)."""
    from ddplab.defaults import Ending
    from ddplab.engine import classify, evidence
    ev = evidence.read_run(Path(__file__).parent / "data" / f"run_h41_{case}")
    if change is not None:
        change(ev)
    w = evidence.Watch(ended_by=Ending.FINISHED, returncode=ev.torchrun["returncode"], world=2, stall_s=5.0,
                       wall_s=0.0, idle_s=0.0, since_s=0.0)
    return ev, classify.judge(evidence.Evidence(w, ev, {}, dict(ev.final_ledgers), {}))


def test_records_readings_are_tried_from_records_only():
    assert {c.id for c in causes.FROM_RECORDS}.isdisjoint(IDS)
    for c in causes.FROM_RECORDS + (causes.WORKER_EXCEPTION, causes.THREAD_EXCEPTION):
        assert c.premise is not None and c.sources and len(c.explanation.splitlines()) == 2, c.id


def test_get_rank_in_a_spawned_worker_is_not_call_init_first():
    """The Dataset calls dist.get_rank() in a DataLoader worker started with spawn: the rank had called
    init_process_group (its call records), the error was raised in the worker (the hook's nested record)."""
    from ddplab.engine import classify
    ev, v = judged("spawn_worker_get_rank")
    facts = classify.failure_facts(ev, v.first_failure)
    assert facts.initialised and facts.in_worker and not facts.own_process and facts.nested.worker == 0
    assert (v.status, v.signature) == ("failed", "process-group-in-worker")
    # the line to fix is the worker's own (the Dataset's __getitem__), not the rank's loop over the loader
    fa = classify.refine(v, {}).fix_at
    assert fa is not None and fa.func == "__getitem__" and fa.file.endswith("spawn-worker-get-rank.py")


def test_init_not_recorded_or_raised_in_the_rank_withholds_the_worker_reading():
    from dataclasses import replace
    from ddplab.engine import classify
    # raised in the rank's own process, after init_process_group: neither "in a worker" nor "call init first"
    ev, v = judged("spawn_worker_get_rank", lambda ev: ev.errors.update(
        {r: replace(e, nested=None) for r, e in ev.errors.items()}))
    assert v.signature not in ("process-group-in-worker", "process-group-not-initialized"), v.signature
    assert classify.failure_facts(ev, v.first_failure).own_process
    # in a worker, with no record of init_process_group: nothing shows the rank had a process group
    ev, v = judged("spawn_worker_get_rank", lambda ev: ev.calls.clear())
    assert v.signature not in ("process-group-in-worker", "process-group-not-initialized"), v.signature
    # the message alone (no records) says a worker raised it: "call init first" is not named from text either
    text = ev.errors[v.first_failure].type + ": " + ev.errors[v.first_failure].message
    assert signatures.match_text(text)[0].id != "process-group-not-initialized"


def test_a_worker_s_own_exception_is_named_as_raised_in_the_worker():
    ev, v = judged("worker_raises")
    assert (v.status, v.signature, v.first_failure) == ("failed", "dataloader-worker-exception", 1)
    n = ev.errors[1].nested
    assert n.worker is not None and n.type == "ValueError" and "is corrupt" in n.message
    from ddplab.engine import classify
    fa = classify.refine(v, {}).fix_at
    assert fa is not None and fa.func == "__getitem__"


def test_an_exception_raised_in_the_rank_itself_is_not_a_worker_s():
    from ddplab.engine.reasons import FailureFacts
    from ddplab.facts import Nested
    text = "ValueError: Caught ValueError in DataLoader worker process 0.\nValueError: record 3 is corrupt"
    worker = Nested("ValueError", "in DataLoader worker process 0", "record 3 is corrupt", ())
    assert signatures.match_text(text, FailureFacts(nested=worker))[0].id == "dataloader-worker-exception"
    # the hook's record says the rank's own process raised it: the words alone do not make it a worker's
    assert signatures.match_text(text, FailureFacts())[0].id == "python-exception"
    assert signatures.match_text("ValueError: record 3 is corrupt")[0].id == "python-exception"


def test_a_killed_worker_and_a_data_loader_timeout_from_their_runs():
    ev, v = judged("worker_killed")
    assert (v.status, v.signature, v.first_failure) == ("failed", "dataloader-worker-killed", 1)
    ev, v = judged("worker_timeout")
    assert (v.status, v.signature) == ("failed", "dataloader-timeout")
    # re-raised from another process, the same words are that process's, not the rank's wait for its workers
    from ddplab.engine.reasons import FailureFacts
    from ddplab.facts import Nested
    other = FailureFacts(nested=Nested("RuntimeError", "in DataLoader worker process 0", "", ()))
    for text, cause in (("RuntimeError: DataLoader timed out after 2 seconds", "dataloader-timeout"),
                        ("RuntimeError: DataLoader worker (pid(s) 10962) exited unexpectedly", "dataloader-worker-killed")):
        assert signatures.match_text(text)[0].id == cause
        assert signatures.match_text(text, other)[0].id != cause


def hung_judged(case: str):
    """classify.judge at the stall of a captured hung run: each hung rank's main-thread stack, threads and call
    records as result.json kept them (captured live at the verdict)."""
    import json
    from ddplab.defaults import Ending
    from ddplab.engine import classify, evidence
    from ddplab.facts import CallSite, Frame, Poll, ThreadStack
    d = Path(__file__).parent / "data" / f"run_h41_{case}"
    ev = evidence.read_run(d)
    live = {r["rank"]: evidence.LiveRank(
        r["rank"], r["pid"], frames=[Frame.from_dict(f) for f in r["stack"]], source=r["stack_source"],
        threads=tuple(ThreadStack.from_dict(t) for t in r.get("threads") or ()),
        calls=tuple(CallSite.from_dict(c) for c in r.get("calls") or ()),
        polls=tuple(Poll.from_dict(p) for p in r.get("polls") or ()),
        # the hook's live answer as result.json split it (the store dialled, a blocked send/recv's peer and tag)
        dialling=dict(r.get("dialling") or {}, **({"p2p": r["peer"]} if r.get("peer") else {})) or None)
        for r in json.loads((d / "result.json").read_text())["ranks"] if r["state"] == "hung"}
    w = evidence.Watch(ended_by=Ending.STALL, returncode=None, world=2, stall_s=5.0, wall_s=0.0, idle_s=5.1,
                       since_s=0.0)
    return ev, classify.judge(evidence.Evidence(w, ev, live, dict(ev.final_ledgers), {}))


def test_a_rank_kept_alive_at_exit_by_its_thread_or_its_child():
    """non-daemon-heartbeat: rank 0's main thread finished, threading's shutdown waits for 'heartbeat' (the hook's
    thread record); child-process-at-exit: rank 0's main thread is in multiprocessing's exit handler joining its
    child (its stack). Rank 1 exited 0 in both."""
    _, v = hung_judged("non_daemon")
    w = v.ranks[0].where
    assert (v.status, v.signature) == ("hung", "non-daemon-thread") and (w.kind, w.op) == ("thread", "heartbeat")
    assert w.frame.func == "heartbeat"
    _, v = hung_judged("child_process")
    assert (v.status, v.signature, v.ranks[0].where.kind) == ("hung", "child-process-at-exit", "child")
    assert v.ranks[0].where.call.func.endswith("join")


def test_a_rank_waiting_in_a_collective_rules_out_the_thread_and_the_child():
    """Kept alive at exit while another rank waits in a collective: the ranks' calls differ (or one waits for a
    peer), and what keeps the job from ending is not the thread or the child."""
    from dataclasses import replace
    from ddplab.engine import classify
    from ddplab.facts import Where
    for case, rule in (("non_daemon", "non-daemon-thread"), ("child_process", "child-process-at-exit")):
        _, v = hung_judged(case)
        facts = classify.hang_facts(v.ranks, None)
        sig = signatures.get(rule)
        assert sig.hang_rule(facts) and not sig.rules_out(facts)
        waiting = replace(v.ranks[1], state=v.ranks[0].state, where=Where("collective", "all_reduce", seq=7))
        ranks = (v.ranks[0], waiting)
        assert sig.rules_out(classify.hang_facts(ranks, None))
        assert classify.hang_signature(ranks, None) != rule
        # a main thread that is not at exit (its stack elsewhere) holds neither premise
        assert classify.joining_child_at_exit([f for f in v.ranks[0].stack if f.func != "_exit_function"]) is None


def test_sys_exit_on_one_rank_is_named_with_its_line():
    """sys-exit-rank0-check: rank 0 alone calls sys.exit(1) (the hook's SystemExit record, no traceback)."""
    from dataclasses import replace
    from ddplab.engine import classify
    ev, v = judged("sys_exit")
    assert (v.status, v.signature, v.first_failure) == ("failed", "sys-exit-one-rank", 0)
    assert classify.failure_facts(ev, 0).exit_code == "1"
    # every rank exited the same way: not one rank's exit
    ev, v = judged("sys_exit", lambda ev: ev.errors.update({1: replace(ev.errors[0], time=ev.errors[0].time + 1)}))
    assert v.signature != "sys-exit-one-rank"
    # a framework's exit after the script's exception (the hook records the exception, with ``exited``)
    ev, v = judged("sys_exit", lambda ev: ev.errors.update({0: replace(ev.errors[0], exited={"code": "1"})}))
    assert v.signature != "sys-exit-one-rank"
    # the message alone: an exit code with no record of who called it
    m = signatures.match_text("SystemExit: 1")
    assert m is None or m[0].id != "sys-exit-one-rank"


def test_an_exception_in_flight_at_the_collective_a_rank_failed_in():
    """collective-in-except-handler: rank 1's input check raises, its except block broadcasts the checkpoint path
    alone, and gloo aborts it there (SIGABRT: no error record). The hook wrote its call records at that call
    (rankN.calls.json): the ValueError in flight is the reading, not gloo's size mismatch."""
    from dataclasses import replace
    from ddplab.engine import classify
    ev, v = judged("except_collective")
    assert (v.status, v.signature, v.first_failure) == ("failed", "exception-in-collective", 1)
    c = classify.failure_facts(ev, 1, stack=v.ranks[1].stack).in_flight
    assert c.op == "broadcast_object_list" and c.exc.type == "ValueError" and c.exc.at.func == "_run_batch"
    # no exception in flight at that call: the message's own reading stands
    ev, v = judged("except_collective", lambda ev: ev.calls.update(
        {r: cs[:-1] + (replace(cs[-1], exc=None),) for r, cs in ev.calls.items()}))
    assert v.signature != "exception-in-collective"
    # in flight at an earlier call, not the one it failed in
    ev, v = judged("except_collective", lambda ev: ev.calls.update({1: ev.calls[1][:-1]}))
    assert v.signature != "exception-in-collective"


def test_the_child_a_rank_waits_for_at_exit_is_the_running_non_daemon_one_it_started():
    """The hook's record of each child the rank started (name, pid, daemon, the line that started it), read live:
    the rank's Where names the one still running that is not a daemon, at the line that started it."""
    import json
    from ddplab.engine import classify, evidence
    from ddplab.facts import ChildProcess, Frame
    d = Path(__file__).parent / "data" / "run_h41_child_process"
    r0 = next(r for r in json.loads((d / "result.json").read_text())["ranks"] if r["rank"] == 0)
    stack = [Frame.from_dict(f) for f in r0["stack"]]
    at = Frame("main", "/x/train.py", 99)
    worker = ChildProcess("pt_data_worker", 11, True, Frame("train", "/x/train.py", 60), alive=True)
    def where(*children):
        return classify.locate(evidence.LiveRank(0, r0["pid"], frames=stack, children=children))
    w = where(worker, ChildProcess("uploader", 12, False, at, alive=True))
    assert (w.kind, w.op, w.frame) == ("child", "uploader", at)
    # a daemon child, or one that has ended, is not what the exit waits for
    assert (where(worker, ChildProcess("uploader", 12, False, at, alive=False)).op, where(worker).frame) == (None, None)
    # the hook's own record of the run's child (rankN.children.json, written when it was started): its name, and
    # the line that started it
    rec = json.loads((d / "ranks" / "rank0.children.json").read_text())["children"]
    child = ChildProcess.from_dict(rec[-1])
    assert (child.name, child.daemon, child.started.func) == ("uploader", False, "main")
    assert child.started.file.endswith("child-process-at-exit.py")


def test_a_library_s_refusal_is_its_cause_only_where_that_library_function_raised_it():
    """weights-only-load and makedirs-race (captured: tests/data/real_weights_only_load.txt, real_makedirs_exists.txt)
    need the exception raised inside torch.load / os.makedirs (the innermost frame): the words alone, or raised
    elsewhere, name neither."""
    data = Path(__file__).parent / "data"
    for name, cause, words in (("real_weights_only_load.txt", "weights-only-load", "UnpicklingError: Weights only load failed."),
                               ("real_collective_non_tensor.txt", "collective-non-tensor-arg",
                                "TypeError: Invalid function argument. Expected parameter `tensor` of type torch.Tensor"),
                               ("real_makedirs_exists.txt", "makedirs-race", "FileExistsError: [Errno 17] File exists: '/tmp/x'")):
        from ddplab.engine.reasons import FailureFacts
        from ddplab.facts import Frame
        text = (data / name).read_text()
        assert signatures.match_text(text)[0].id == cause
        for facts in (None, FailureFacts(frames=(Frame("main", "/x/train.py", 95),))):
            # the words alone; the same message raised on the user's own line, not in the library
            for t in (words, text):
                m = signatures.match_text(t, facts) if facts is not None or t is words else None
                assert m is None or m[0].id != cause, (name, t[:40])


def test_an_in_place_change_of_a_leaf_raised_in_a_worker_is_not_the_rank_s():
    from ddplab.engine.reasons import FailureFacts
    from ddplab.facts import Nested
    text = (Path(__file__).parent / "data" / "real_inplace_on_leaf.txt").read_text()
    assert signatures.match_text(text)[0].id == "inplace-on-leaf"
    worker = FailureFacts(nested=Nested("RuntimeError", "in DataLoader worker process 0", "", ()))
    assert signatures.match_text(text, worker)[0].id != "inplace-on-leaf"


def test_new_group_on_some_ranks_from_the_ranks_call_records():
    """new-group-on-rank0: rank 0 makes a logger group under `if master_process:` and then the next group on every
    rank; their call records part at call #2 (rank 0's new_group at one line, rank 1's at the next), rank 0 waits in
    new_group, rank 1 in DDP's construction."""
    from dataclasses import replace
    from ddplab.engine import classify
    _, v = hung_judged("new_group")
    assert (v.status, v.signature) == ("hung", "new-group-on-some-ranks")
    # rank 0 is the culprit, at the new_group it alone made (the call to move out of `if master_process:`); the
    # script as the run had it is kept beside the records, read under the path the records name
    script = Path(__file__).parent / "data" / "run_h41_new_group" / "new-group-on-rank0.py"
    recorded = v.ranks[0].calls[1].frame.file
    r = classify.refine(v, {recorded: script.read_text()})
    assert r.culprits == (0,) and r.calls_diverged.branch.text == "if master_process:"
    assert r.fix_at.line == 72 and "dist.new_group(ranks=[0])" in r.fix_at.text
    # the same places on every rank (no parting at a new_group): the reading does not hold
    same = tuple(replace(r, calls=v.ranks[1].calls) for r in v.ranks)
    assert not classify.group_parted(same) and classify.hang_signature(same, None) != "new-group-on-some-ranks"
    # no rank waits in new_group
    moved = (replace(v.ranks[0], where=v.ranks[1].where), v.ranks[1])
    assert not classify.group_parted(moved)


def _folder_now(now):
    """A change for judged(): whether the folders of the files the ranks' exceptions are about exist at the verdict
    (read_run reads the file system when it is run: the captured paths are gone by now)."""
    from dataclasses import replace

    def change(ev):
        ev.errors.update({r: replace(e, paths=tuple(replace(p, folder_now=now) for p in e.paths))
                          for r, e in ev.errors.items()})
    return change


def test_a_checkpoint_folder_never_made_is_named_from_the_path_the_rank_recorded():
    """checkpoint-dir-missing: rank 0's torch.save into checkpoints/ ('Parent directory ... does not exist'); the
    hook recorded torch.save's own path argument and that its folder did not exist; rank 1 had failed too (its
    peer lost): no rank was still at work."""
    from ddplab.engine import classify
    ev, v = judged("checkpoint_dir_missing", _folder_now(False))
    (p,) = ev.errors[0].paths
    assert p.path.endswith("/checkpoints/last.pt") and p.folder_then is False
    assert (v.status, v.signature, v.first_failure) == ("failed", "checkpoint-dir-missing", 0)
    assert classify.failure_facts(ev, 0, ranks=v.ranks).peers_working == ()
    # the folder exists now: made after the rank failed, not never made
    _, v = judged("checkpoint_dir_missing", _folder_now(True))
    assert v.signature == "dir-created-on-rank0-only"


def test_a_folder_that_existed_when_the_rank_failed_or_no_path_recorded_names_neither():
    from dataclasses import replace
    for now in (False, True):
        def existed(ev, now=now):
            _folder_now(now)(ev)
            ev.errors.update({r: replace(e, paths=tuple(replace(p, folder_then=True) for p in e.paths))
                              for r, e in ev.errors.items()})
        _, v = judged("checkpoint_dir_missing", existed)
        assert v.signature not in ("checkpoint-dir-missing", "dir-created-on-rank0-only"), v.signature
    # a record without paths (an older hook), or the message alone: the text never names either
    ev, v = judged("checkpoint_dir_missing", lambda ev: ev.errors.update(
        {r: replace(e, paths=()) for r, e in ev.errors.items()}))
    assert v.signature not in ("checkpoint-dir-missing", "dir-created-on-rank0-only"), v.signature
    m = signatures.match_text(f"RuntimeError: {ev.errors[0].message}")
    assert m is None or m[0].id not in ("checkpoint-dir-missing", "dir-created-on-rank0-only")


def test_a_folder_one_rank_makes_later_is_not_named_missing_while_that_rank_was_at_work():
    """dir-made-by-rank0-only: rank 1 saved into the run's folder first and failed; rank 0, which makes it after a
    5 s sleep, was stopped by torchrun in that sleep (its SIGTERM dump): the folder is missing at the verdict, and
    a peer still at work in its own code rules out 'never made' (it may have been about to make it)."""
    from ddplab.engine import classify
    ev, v = judged("dir_rank0_only", _folder_now(False))
    assert (v.status, v.first_failure) == ("failed", 1)
    facts = classify.failure_facts(ev, 1, ranks=v.ranks)
    assert facts.peers_working == (0,) and facts.folder_missing_then
    assert v.signature not in ("checkpoint-dir-missing", "dir-created-on-rank0-only"), v.signature
    # had rank 0 made it before it was stopped, the folder would exist now: the race is named
    _, v = judged("dir_rank0_only", _folder_now(True))
    assert v.signature == "dir-created-on-rank0-only"


def test_a_send_and_the_receive_waiting_for_it_with_different_tags():
    """p2p-grad-tag-mismatch: rank 1 (the last stage) sends its gradient back with the activation's tag (3) while
    rank 0 waits to receive it with tag 103: the hook's live answer of each blocked call (op, peer, tag)."""
    from dataclasses import replace
    from ddplab.engine import classify
    _, v = hung_judged("p2p_tags")
    assert (v.status, v.signature) == ("hung", "p2p-tag-mismatch")
    assert classify.tag_mismatch(tuple(r for r in v.ranks if r.where.kind == "p2p")) == ((1, 0, 3, 103),)
    # the same tag on both sides (a peer that is late, not mismatched), a tag not known, or a receive from
    # another rank: not named
    for peer in ({"op": "recv", "peer": 1, "tag": 3}, {"op": "recv", "peer": 1, "tag": None},
                 {"op": "recv", "peer": 5, "tag": 103}):
        ranks = (replace(v.ranks[0], peer=peer), v.ranks[1])
        assert classify.hang_signature(ranks, None) != "p2p-tag-mismatch", peer
    # both ranks sending (an ordering deadlock) is not a tag mismatch
    ranks = (replace(v.ranks[0], peer={"op": "send", "peer": 1, "tag": 103},
                     where=replace(v.ranks[0].where, op="send")), v.ranks[1])
    assert classify.hang_signature(ranks, None) == "hang-p2p-ordering"


def test_an_exception_raised_in_a_future_s_worker_thread_and_shown_at_result():
    """async-save-unpicklable: rank 0 saves its checkpoint with ThreadPoolExecutor.submit(torch.save, ...); the
    pickling error is raised in the worker thread and re-raised at future.result() (the frames of both)."""
    from dataclasses import replace
    from ddplab.engine import classify
    ev, v = judged("async_save")
    assert (v.status, v.signature, v.first_failure) == ("failed", "error-in-background-thread", 0)
    assert classify.failure_facts(ev, 0).through_future
    # the same error raised in the rank's own thread (no worker's run in its frames): not named
    ev, v = judged("async_save", lambda ev: ev.errors.update({0: replace(ev.errors[0], frames=tuple(
        f for f in ev.errors[0].frames if "concurrent/futures" not in f.file))}))
    assert v.signature != "error-in-background-thread", v.signature


def test_a_full_state_dict_gathered_to_rank_0_only_and_loaded_on_every_rank():
    """fsdp-rank0-only-state-load: rank 1 loads FSDP's full state dict (rank0_only=True), empty there: the hook's
    value of `state` on the failing line is OrderedDict(), its last call record an all_gather made by FSDP."""
    from dataclasses import replace
    from ddplab.engine import classify
    ev, v = judged("fsdp_rank0_only")
    assert (v.status, v.signature, v.first_failure) == ("failed", "rank0-only-state-dict", 1)
    f = classify.failure_facts(ev, 1)
    assert f.empty_argument and f.last_call_by_fsdp and f.rank == 1
    # a non-empty state (keys that do not match): another mistake
    ev, v = judged("fsdp_rank0_only", lambda ev: ev.errors.update(
        {1: replace(ev.errors[1], values={"state": "OrderedDict({'weight': tensor(...)})"})}))
    assert v.signature != "rank0-only-state-dict"
    # no record of FSDP's gather before it: nothing shows whose state dict it was
    ev, v = judged("fsdp_rank0_only", lambda ev: ev.calls.clear())
    assert v.signature != "rank0-only-state-dict"
    # rank 0 failed the same way (empty everywhere): not gathered to rank 0 only
    ev, v = judged("fsdp_rank0_only", lambda ev: ev.errors.update(
        {0: replace(ev.errors[1], time=ev.errors[1].time + 1)}))
    assert v.first_failure == 1 and v.signature != "rank0-only-state-dict", v.signature


def test_a_rank_polling_for_a_file_its_peer_writes_after_the_barrier_it_waits_in():
    """wait-for-file-after-barrier: rank 0 loops on os.path.exists for rank 1's score file (the hook's poll
    record: path, missed looks, the generator's and main's frames) while rank 1 waits in the barrier rank 0 has
    not reached."""
    from dataclasses import replace
    from ddplab.engine import classify
    _, v = hung_judged("file_poll")
    assert (v.status, v.signature) == ("hung", "file-handshake-deadlock")
    ((rank, p),) = classify.polling(tuple(v.ranks), tuple(r for r in v.ranks if r.where.kind == "collective"))
    assert rank == 0 and p.path.endswith(".score1") and p.misses >= classify.POLL_MISSES
    assert classify.looked_from(p).func == "main"
    polls, r0, r1 = v.ranks[0].polls, v.ranks[0], v.ranks[1]
    # fewer looks than a poll, a look made from another function, or the other rank not in a collective: not named
    for ranks in ((replace(r0, polls=(replace(polls[0], misses=2),)), r1),
                  (replace(r0, polls=(replace(polls[0], user=tuple(replace(f, func="helper") for f in polls[0].user)),)), r1),
                  (r0, replace(r1, where=replace(r0.where)))):
        assert classify.hang_signature(ranks, None) != "file-handshake-deadlock"
