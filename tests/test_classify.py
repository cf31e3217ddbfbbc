"""Classification (ddplab.engine.classify) on evidence captured from real runs: pure, no processes.

tests/data/run_<case>/ is a run directory as the ranks and torchrun left it (tests/data/capture_runs.py).
For a hang, the live evidence at the verdict is rebuilt from what was captured then: each hung rank's
main-thread stack (kept in result.json) and its flight-recorder dump (ranks/rankN.fr_trace.json).
"""
import json
from dataclasses import replace
from pathlib import Path

from ddplab.engine import classify, evidence, ledger, signatures
from ddplab.result import RankResult
from ddplab.facts import Frame, Where

DATA = Path(__file__).parent / "data"


def verdict(world, ended_by, returncode, ev, live, ledgers):
    """classify.judge on the evidence of a run ddplab started, ended as ``ended_by``."""
    watch = evidence.Watch(ended_by=ended_by, returncode=returncode, world=world, stall_s=3.0, wall_s=0.0,
                           idle_s=0.0, since_s=0.0)
    return classify.judge(evidence.Evidence(watch, ev, live, dict(ledgers), {}))


def run_dir(case: str) -> Path:
    return DATA / f"run_{case}"


def failed(case: str):
    ev = evidence.read_run(run_dir(case))
    return ev, verdict(2, None, ev.torchrun["returncode"], ev, {}, ev.final_ledgers)


def hung(case: str):
    """The verdict at the stall, from the live evidence captured then."""
    d = run_dir(case)
    ev = evidence.read_run(d)
    saved = json.loads((d / "result.json").read_text())
    live = {}
    for r in saved["ranks"]:
        if r["state"] != "hung":
            continue
        fr = d / "ranks" / f"rank{r['rank']}.fr_trace.json"
        live[r["rank"]] = evidence.LiveRank(
            r["rank"], r["pid"], frames=[Frame.from_dict(f) for f in r["stack"]], source=r["stack_source"],
            ledger=ledger.parse(json.loads(fr.read_text())) if fr.exists() else ())
    return ev, verdict(2, "stall", None, ev, live, ev.final_ledgers)


# --- failed runs --------------------------------------------------------------------------------------

def test_the_first_failure_is_the_rank_with_the_error_not_torchruns_root_cause():
    # Rank 1 ran out of memory and closed its group; rank 0 lost its peer and exited first, so
    # torchrun's root cause is rank 0. The verdict names rank 1 and its own exception.
    ev, v = failed("oom_root_cause_is_the_peer")
    assert ev.torchrun["torchrun_root_cause"] == 0
    assert (v.status, v.signature, v.first_failure) == ("failed", "cpu-oom", 1)
    assert classify.first_failure(ev, v.ranks) == 1
    r0, r1 = v.ranks
    assert r1.error.type == "RuntimeError" and "can't allocate memory" in r1.error.message
    assert r1.error.frame.file.endswith("tests/scripts/oom_then_linger.py") and r1.consequence is False
    assert r0.consequence is True and r0.exit_code == 1
    assert r1.signal == "SIGTERM" and r1.exit_code is None      # torchrun ended it while it lingered
    # here rank 0's record is even the earlier one (rank 1's excepthook ran after its `finally`):
    # a lost peer is a consequence whatever its time
    assert ev.errors[0].time < ev.errors[1].time


def test_a_rank_aborted_by_gloo_is_the_first_failure_over_its_peers_consequence():
    ev, v = failed("failed_size_abort")
    assert 1 not in ev.errors and 1 in ev.fatal                  # no exception record: a fatal signal
    assert (v.status, v.signature, v.first_failure) == ("failed", "gloo-size-mismatch", 1)
    assert v.ranks[1].signal == "SIGABRT" and v.ranks[1].stack_source == "faulthandler (fatal signal)"
    assert v.ranks[0].consequence is True


def test_a_peer_torchrun_ended_before_its_own_error_is_still_a_consequence():
    # the same capture, as under load: torchrun's SIGTERM reached rank 0 before gloo's "connection closed"
    ev, _ = failed("failed_size_abort")
    ev.errors.pop(0, None)
    ev.exits[0] = {**ev.exits.get(0, {}), "exitcode": -15, "signal": "SIGTERM"}
    v = verdict(2, None, 1, ev, {}, ev.final_ledgers)
    assert v.first_failure == 1 and v.ranks[0].consequence is True
    ev.fatal.clear()                                  # nobody else failed: a SIGTERM alone proves nothing
    v = verdict(2, None, 1, ev, {}, ev.final_ledgers)
    assert v.ranks[0].consequence is False


def test_a_rank_that_exited_cleanly_leaves_its_ledger_for_the_comparison():
    ev, v = failed("failed_rank_exited")
    assert 1 in ev.clean_exit and 1 in ev.final_ledgers and 1 not in ev.errors
    assert v.status == "failed" and v.ranks[1].exit_code == 0 and v.ranks[0].consequence is True
    assert v.divergence.kind == "shorter-ledger" and v.divergence.ops == {0: "all_reduce", 1: None}


# --- hangs ----------------------------------------------------------------------------------------------

def test_different_collectives():
    _, v = hung("hang_different_op")
    assert (v.status, v.signature) == ("hung", "hang-different-collectives")
    r0, r1 = v.ranks
    assert (r0.where.op, r0.where.seq) == ("barrier", v.divergence.seq)
    assert (r1.where.op, r1.where.via, r1.where.seq) == ("all_reduce", "ddp-backward", v.divergence.seq)
    assert r0.where.frame.func == r1.where.frame.func == "main" and r0.where.frame.line != r1.where.frame.line


def test_ddps_buffer_broadcast_inside_forward():
    _, v = hung("hang_buffer_sync")
    assert v.signature == "hang-different-collectives"
    assert (v.ranks[1].where.op, v.ranks[1].where.via) == ("broadcast", "ddp-forward-buffers")
    assert v.ranks[0].where.via is None


def test_different_sizes():
    _, v = hung("hang_different_sizes")
    assert v.signature == "hang-different-sizes"
    assert v.divergence.kind == "different-sizes" and v.divergence.sizes == {0: ((1,),), 1: ((3,),)}


def test_a_rank_that_exited_while_its_peer_waits():
    ev, v = hung("hang_rank_exited")
    assert v.signature == "hang-rank-exited"
    assert (v.ranks[1].state, v.ranks[1].exit_code) == ("exited", 0)
    assert v.ranks[1].ledger == ev.final_ledgers[1]
    assert v.divergence.kind == "shorter-ledger" and v.divergence.ops == {0: "all_reduce", 1: None}


def test_a_rank_that_exited_after_issuing_the_collective_its_peer_waits_in_is_not_blamed():
    # lab 09's lossy link at stress: rank 1 finished its last all-reduce and exited while its bytes
    # were still being resent; rank 0 waited for them. rank 1 did not leave instead of taking part.
    _, v = hung("hang_rank_exited")
    r0, r1 = v.ranks
    waited = ledger.pending(r0.ledger)
    assert waited is not None and all(c.seq != waited.seq for c in r1.ledger)     # as captured: never issued
    took_part = r1.ledger + (replace(waited, completed=True),)
    ranks = (r0, replace(r1, ledger=took_part))
    div = ledger.divergence({r.rank: r.ledger for r in ranks})
    assert classify.hang_signature(ranks, div) == "hang-same-collective"           # cause not identified
    assert "hang-same-collective" in signatures.UNIDENTIFIED
    # the same rank with another op at that number did not take part in the wait
    other = replace(waited, op="broadcast", completed=True)
    assert classify.hang_signature((r0, replace(r1, ledger=r1.ledger + (other,))), None) == "hang-rank-exited"


def test_an_interrupt_with_live_ranks_gets_a_hang_signature_and_status_interrupted():
    d = run_dir("hang_different_op")
    ev = evidence.read_run(d)
    _, at_stall = hung("hang_different_op")
    live = {r.rank: evidence.LiveRank(r.rank, r.pid, frames=list(r.stack), ledger=r.ledger) for r in at_stall.ranks}
    v = verdict(2, "interrupt", None, ev, live, {})
    assert (v.status, v.signature) == ("interrupted", "hang-different-collectives")
    assert {r.state for r in v.ranks} == {"running"}
    v = verdict(2, "deadline", None, ev, live, {})
    assert (v.status, v.signature) == ("deadline", "deadline-exceeded")


# --- hang_signature on its own --------------------------------------------------------------------------

def _rank(n, state="hung", kind=None, op=None, seq=None, ledger_=()):
    return RankResult(rank=n, pid=100 + n, state=state, exit_code=0 if state == "exited" else None, signal=None,
                      where=Where(kind, op, seq=seq) if kind else None, ledger=ledger_)


def test_hang_signature_rules():
    entry = ledger.parse(json.loads((run_dir("hang_different_op") / "ranks" / "rank0.fr_trace.json").read_text()))
    hs = classify.hang_signature
    assert hs((_rank(0, "not-started"), _rank(1, "not-started")), None) == "no-rank-started"
    assert hs((_rank(0, kind="rendezvous", op="init_process_group"),
               _rank(1, kind="rendezvous", op="init_process_group")), None) == "hang-rendezvous"
    assert hs((_rank(0, kind="collective", op="barrier", seq=3, ledger_=entry),
               _rank(1, kind="collective", op="barrier", seq=3, ledger_=entry)), None) == "hang-same-collective"
    assert hs((_rank(0, kind="collective", op="barrier", seq=3, ledger_=entry),
               _rank(1, kind="collective", op="all_reduce", seq=3, ledger_=entry)), None) == "hang-different-collectives"
    assert hs((_rank(0, kind="collective", op="all_reduce", seq=2, ledger_=entry),
               _rank(1, kind="sleep", op="sleep", ledger_=entry)), None) == "hang-rank-elsewhere"
    assert hs((_rank(0, kind="collective", op="all_reduce", seq=2, ledger_=entry),
               _rank(1, "exited")), None) == "hang-rank-exited"
    assert hs((_rank(0, kind="sleep", op="sleep"), _rank(1, kind="compute")), None) == "stalled-outside-collectives"


def test_stall_facts_name_the_last_collective_every_rank_finished():
    _, v = hung("hang_different_op")
    s = classify.stall_facts(3.0, 3.04, 8.26, v.ranks, None)
    assert (s.window_s, s.idle_s, s.since_s, s.last_seq) == (3.0, 3.0, 8.3, v.divergence.seq - 1)


# --- the hang rules are catalog entries -----------------------------------------------------------------

from ddplab.facts import CallSite, InFlight, Poll  # noqa: E402


def _examples():
    """One example per hang rule: captured runs where there is one, else the ranks' facts."""
    entry = ledger.parse(json.loads((run_dir("hang_different_op") / "ranks" / "rank0.fr_trace.json").read_text()))
    coll = dict(kind="collective", op="barrier", seq=3, ledger_=entry)
    blocked = RankResult(rank=1, pid=101, state="hung", exit_code=None, signal=None,
                         where=Where("rendezvous", "init_process_group"),
                         connections=({"laddr": "10.213.0.3:40000", "raddr": "10.213.0.2:29500", "status": "SYN_SENT"},))
    _, sizes = hung("hang_different_sizes")
    _, exited = hung("hang_rank_exited")
    _, different = hung("hang_different_op")
    return {
        "no-rank-started": ((_rank(0, "not-started"),), None),
        "hang-data-port-blocked": ((_rank(0, **coll), blocked), None),
        "hang-rendezvous": ((_rank(0, kind="rendezvous", op="init_process_group"),), None),
        "hang-rank-exited": (exited.ranks, exited.divergence),
        "hang-rank-elsewhere": ((_rank(0, **coll), _rank(1, kind="sleep", op="sleep")), None),
        "hang-different-sizes": (sizes.ranks, sizes.divergence),
        "hang-different-collectives": (different.ranks, different.divergence),
        "hang-same-collective": ((_rank(0, **coll), _rank(1, **coll)), None),
        "stalled-outside-collectives": ((_rank(0, kind="sleep", op="sleep"),), None),
        # both ranks in a blocking send to each other (the rank hook names each one's peer)
        "hang-p2p-ordering": ((replace(_rank(0, kind="p2p", op="send"), peer={"op": "send", "peer": 1}),
                               replace(_rank(1, kind="p2p", op="send"), peer={"op": "send", "peer": 0})), None),
        # rank 0 receives from rank 1, which sleeps
        "hang-p2p": ((replace(_rank(0, kind="p2p", op="recv"), peer={"op": "recv", "peer": 1}),
                      _rank(1, kind="sleep", op="sleep")), None),
        "rendezvous-ranks-conflict": tuple([tuple(replace(_rank(n, kind="rendezvous", op="init_process_group"),
                                                          asked={"rank": 0, "world_size": 2, "env": {"RANK": str(n)}})
                                                  for n in (0, 1)), None]),
        # rank 1 called its barrier while an exception was in flight (the rank hook's call record)
        "hang-collective-while-handling": ((_rank(0, kind="collective", op="all_reduce", seq=4, ledger_=entry),
                                            replace(_rank(1, **coll), calls=(CallSite(
                                                6, "barrier", (), None, InFlight("ValueError", "bad batch", None)),))),
                                           None),
        "spawn-under-torchrun": ((replace(_rank(0, kind="socket", op="select"), stack=(
            Frame("join", "/venv/site-packages/torch/multiprocessing/spawn.py", 160),)),), None),
        # rank 0's main thread finished; a non-daemon thread (the hook's record) or a child it joins at exit keeps
        # it alive; rank 1 exited (issue 41: tests/test_causes.py reads both from real runs)
        "non-daemon-thread": ((_rank(0, kind="thread", op="heartbeat"), _rank(1, "exited")), None),
        "child-process-at-exit": ((_rank(0, kind="child"), _rank(1, "exited")), None),
        # rank 0's second call is a new_group from another line than rank 1's: the call records part there
        "new-group-on-some-ranks": tuple([tuple(replace(
            _rank(n, kind="rendezvous", op="new_group") if n == 0 else _rank(n, **coll),
            calls=(CallSite(1, "init_process_group", (Frame("<module>", "/x/t.py", 5),), None),
                   CallSite(2, "new_group", (Frame("<module>", "/x/t.py", 8 + n),), None)))
            for n in (0, 1)), None]),
        # rank 0 blocked sending to rank 1 with tag 1 while rank 1 is blocked receiving from rank 0 with tag 2
        "p2p-tag-mismatch": ((replace(_rank(0, kind="p2p", op="send"), peer={"op": "send", "peer": 1, "tag": 1}),
                              replace(_rank(1, kind="p2p", op="recv"), peer={"op": "recv", "peer": 0, "tag": 2})),
                             None),
        # both ranks blocked in broadcast #2, whose own call records (the same call number) name roots 0 and 1
        "collective-root-differs": tuple([tuple(replace(
            _rank(n, kind="collective", op="broadcast", seq=2),
            calls=(CallSite.from_dict({"n": 4, "op": "broadcast", "user": [["/x/t.py", 9, "main"]], "lib": None,
                                       "args": {"tensor": [[4], "float32", "cpu"], "src": n}}),))
            for n in (0, 1)), None]),
        # both ranks blocked in all_reduce at call 4 of their records, rank 0's in a group of ranks [0, 1] made with
        # new_group (its collective #1), rank 1's in the default group (its #2)
        "collective-group-differs": tuple([tuple(replace(
            _rank(n, kind="collective", op="all_reduce", seq=1 + n),
            calls=(CallSite.from_dict({"n": 4, "op": "all_reduce", "user": [["/x/t.py", 9, "main"]], "lib": None,
                                       "args": {"tensor": [[4], "float32", "cpu"], "op": "SUM",
                                                **({"group": [0, 1]} if n == 0 else {})}}),))
            for n in (0, 1)), None]),
        # rank 0 stands in the function that missed /x/ready 5 times (the hook's record); rank 1 waits in a barrier
        "file-handshake-deadlock": ((replace(_rank(0, kind="sleep", op="sleep"),
                                             stack=(Frame("wait_for", "/x/t.py", 12),),
                                             polls=(Poll("/x/ready", 5, (Frame("wait_for", "/x/t.py", 11),)),)),
                                     _rank(1, **coll)), None),
    }


def test_every_hang_rule_has_an_example_and_gives_its_own_signature():
    examples = _examples()
    assert set(examples) == {s.id for s in signatures.HANG_RULES}
    for sig_id, (ranks, div) in examples.items():
        assert classify.hang_signature(ranks, div) == sig_id


def test_a_new_hang_signature_is_one_catalog_entry(monkeypatch):
    """No code changes in classify: an entry with a rule and a precedence is tried in its turn."""
    new = signatures.Signature("hang-everyone-sleeps", "Every rank sleeps", (), "x\ny", "05",
                               hang_rule=lambda f: all(r.where is not None and r.where.kind == "sleep" for r in f.alive),
                               precedence=85)
    monkeypatch.setattr(signatures, "HANG_RULES", tuple(sorted(signatures.HANG_RULES + (new,), key=lambda s: s.precedence)))
    assert classify.hang_signature((_rank(0, kind="sleep", op="sleep"), _rank(1, kind="sleep", op="sleep")),
                                   None) == "hang-everyone-sleeps"
    assert classify.hang_signature((_rank(0, kind="sleep", op="sleep"), _rank(1, kind="compute")),
                                   None) == "stalled-outside-collectives"
