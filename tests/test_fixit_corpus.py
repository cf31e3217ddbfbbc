"""Issue 42: fix-its graded by the invariants of the job, measured from real runs.

- The second set of wrong fixes (tests/fixit_corpus.py: attempts from real reports, none in an exercise's
  ``wrong_fixes``): each is rejected with a reason (a named wrong fix whose evidence holds, or the failed
  invariant with measured and expected values); every valid alternative passes in every layout. ``make
  test`` grades a sample (the two cases issue 42 names and a label that needs its evidence; the
  references of tests/test_fixit.py are its valid fixes, graded in every layout there);
  DDPLAB_FIXIT_FULL=1 grades all of them (benchmarks/fixit_invariants.py grades them all and reports
  the learner's wait).
- An attempt that never ends is ended at its limit (from its reference run) and called "does not finish";
  an interrupted one is described by its state at the interrupt.
- Feedback made from facts: the lab that teaches a failure is the catalog's; the torch-import question only
  when no rank imported torch; "died" only for a rank that died; lab 10's advice is not Join.
The sample's attempts run two at a time (the machine's two cores), graded once per module.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from conftest import assert_nothing_left
from fixit_corpus import CASES, REJECT, VALID

from ddplab.course import fixit
from ddplab.course.fixit import Edit, Outcome
from ddplab.course.fixit.exercise import Invariant
from ddplab.course.fixit.grader import REFERENCE_RUNS, reference
from ddplab.result import Stall, Status

FULL = os.environ.get("DDPLAB_FIXIT_FULL") == "1"
SAMPLE = ("07-reduce-then-broadcast", "06-local-rank-as-rank", "12-rank-dependent-epoch")
CHOSEN = CASES if FULL else tuple(c for c in CASES if c.id in SAMPLE)
WORKERS = 2


def grade_all(cases) -> dict:
    def one(case):
        return case.id, fixit.grade(case.exercise, case.attempt(), progress=None, count=False)
    with ThreadPoolExecutor(WORKERS) as pool:
        return dict(pool.map(one, cases))


@pytest.fixture(scope="module")
def graded(session_runs_dir):
    out = grade_all(CHOSEN)
    assert_nothing_left(str(session_runs_dir))
    return out


def test_the_corpus_is_data_from_real_reports():
    assert len([c for c in CASES if c.expect == REJECT]) >= 30 and len(VALID) >= 10
    listed = {(ex.id, w.write(ex.broken)) for ex in fixit.exercises() for w in ex.wrong_fixes}
    for c in CASES:
        src = c.attempt()
        compile(src, c.id, "exec")
        ex = fixit.get(c.exercise)
        assert src not in (ex.broken, ex.reference) and (c.exercise, src) not in listed, c.id
        assert "https://" in c.source or "issue 42" in c.source, c.id


def test_every_reference_was_measured_in_every_layout():
    """The limits and the collective budgets come from reference runs (REFERENCE_RUNS, written by
    `python -m ddplab.course.fixit.grader measure`; test_fixit's reference cases compare them with a
    new run)."""
    assert REFERENCE_RUNS.exists()
    for ex in fixit.exercises():
        for layout in ex.all_layouts:
            ref = reference(ex, layout)
            assert ref is not None and ref["issued"] >= 1 and set(ref["collectives"]) == \
                {str(r) for r in range(layout.world)}, (ex.id, layout)


@pytest.mark.multiprocess
@pytest.mark.timeout(900 if FULL else 480)
@pytest.mark.parametrize("case", CHOSEN, ids=lambda c: c.id)
def test_an_unlisted_attempt_is_judged_by_the_invariants(case, graded):
    g = graded[case.id]
    shown = str(g)
    if case.expect != REJECT:
        assert g.passed, shown
        assert len(g.runs) == len(fixit.get(case.exercise).layouts), shown     # it ran in every layout
        return
    assert not g.passed and shown.startswith("Not yet"), shown
    # a reason: a named wrong fix whose evidence held, or the failed invariant with both values
    assert g.wrong_fix is not None or (g.mismatch is not None and g.mismatch.kind in Invariant), shown
    if g.wrong_fix is None:
        assert g.mismatch.expected is not None and g.mismatch.got is not None, shown
        assert str(g.mismatch.kind) in shown, shown
    if case.invariant is not None:
        assert g.mismatch.kind == Invariant(case.invariant), shown


@pytest.mark.multiprocess
@pytest.mark.timeout(480)
def test_the_issues_two_passing_wrong_fixes_are_rejected_where_they_break(graded):
    """Lab 07: reduce then broadcast is two collectives a step where the task says one (the ledger counts
    them); lab 06: LOCAL_RANK as the global rank ends ok on one node and hangs on two."""
    g = graded["07-reduce-then-broadcast"]
    m = g.mismatch
    assert g.outcome is Outcome.COLLECTIVES and m.kind is Invariant.COLLECTIVES and m.layout is None
    assert m.got == {"broadcast": 5, "reduce": 5} and m.expected == {"all_reduce": 5}
    g = graded["06-local-rank-as-rank"]
    m = g.mismatch
    assert g.outcome is Outcome.NOT_OK and m.kind is Invariant.ENDS_OK
    assert m.layout is not None and m.layout.nodes == 2 and m.got["status"] == "hung"
    assert g.result.status == "ok" and len(g.runs) == 1       # ok on one node, then two agents
    assert "on 2 nodes" in str(g) and "RANK differs from LOCAL_RANK" in str(g)


@pytest.mark.multiprocess
@pytest.mark.timeout(480)
def test_a_wrong_fix_is_named_only_when_its_evidence_holds(graded):
    """A rank-dependent set_epoch keeps the DistributedSampler: the samples overlap, but the grade does not
    say 'drop-sampler'; the failed invariant (the samples each rank saw) is the reason."""
    g = graded["12-rank-dependent-epoch"]
    assert g.wrong_fix is None and g.mismatch.kind is Invariant.CHECK and "samples-overlap" in g.mismatch.got
    assert "drop-sampler" not in str(g)


# --- attempts that never end, interrupted attempts ------------------------------------------------

NEVER = Edit("    if mean.item() / d.world_size < 0.05:\n", "    if mean.item() / d.world_size < 0.0:\n")


@pytest.mark.multiprocess
@pytest.mark.timeout(480)
def test_an_attempt_that_never_ends_does_not_finish_within_its_limit(session_runs_dir):
    ex = fixit.get("01")
    attempt = Edit("for step in range(500):\n", "while True:                                       # until it is good\n") \
        .apply(NEVER.apply(ex.reference))
    g = fixit.grade("01", attempt, progress=None, count=False)
    ref = reference(ex, ex.all_layouts[0])["issued"]
    assert g.outcome is Outcome.NOT_FINISHED and g.result.status == "deadline", str(g)
    n = g.mismatch.got["collectives"]
    assert g.limit == 5 * ref and g.limit < n          # ended once past it (each rank's ledger read twice a second)
    assert g.mismatch.got["progressing"] is True
    shown = str(g)
    assert f"does not finish: still making progress after {n} collectives (the reference needs {ref})" in shown
    assert "hang" not in shown and "none can finish" not in shown
    assert_nothing_left(str(session_runs_dir))
    # the same run, as if the learner had interrupted it then: described by its state, not as a hang
    progressing = replace(g.result, status=Status.INTERRUPTED, signature="hang-different-collectives",
                          stopped=Stall(window_s=2.0, idle_s=0.1, since_s=30.0, last_seq=n))
    g2 = fixit.grading_of(ex, progressing)
    assert g2.outcome is Outcome.INTERRUPTED
    assert f"interrupted while still making progress, after {n} collectives; the reference needs {ref}" in str(g2)
    assert "hang" not in str(g2) and progressing.explain() not in str(g2)
    # and the run itself, as the cell shows it: no hang signature for ranks that were progressing
    first, second = progressing.explain().splitlines()[:2]
    assert "[hang" not in first and "nothing shows a hang" in second and "none can finish" not in progressing.explain()
    stalled = replace(progressing, stopped=Stall(window_s=2.0, idle_s=2.5, since_s=27.5, last_seq=n))
    assert "after no rank had made progress for 2.5 s (since 27.5 s after it started)" in str(
        fixit.grading_of(ex, stalled))


# --- feedback made from facts ----------------------------------------------------------------------

DATA = __import__("pathlib").Path(__file__).resolve().parent / "data"


def _loaded(name):
    from ddplab.result import RunResult
    return RunResult.load(DATA / name)


def test_the_lab_that_teaches_a_failure_is_the_one_whose_variant_shows_it():
    from ddplab.engine import signatures
    from ddplab.origins import catalog
    own: dict[str, str] = {}
    for lab in catalog.labs():
        for v in lab.variants:
            if v.signature:
                own.setdefault(v.signature, lab.number)
    for sid, sig in signatures.BY_ID.items():
        assert sig.lab == own.get(sid, ""), (sid, sig.lab, own.get(sid))
    r = _loaded("run_failed_size_abort")
    assert r.signature == "gloo-size-mismatch" and "Lab 03 teaches this failure." in r.explain()
    assert "Lab 01" not in r.explain()


def test_died_first_only_for_a_rank_that_died():
    from ddplab.defaults import RankState
    r = _loaded("run_failed_rank_exited")           # rank 1 exited 0 while rank 0 was in an all_reduce
    assert r.signature == "peer-lost" and r.rank(1).exit_code == 0
    shown = r.explain()
    assert "died" not in shown and "Rank 1 exited cleanly (exit code 0)" in shown
    killed = replace(r, ranks=tuple(replace(x, exit_code=None, signal="SIGKILL", state=RankState.EXITED)
                                    if x.rank == 1 else x for x in r.ranks))
    assert "Rank 1 died (SIGKILL)" in killed.explain() and "exited cleanly" not in killed.explain()


def test_the_advice_for_a_rank_that_exited_early_follows_its_ledger():
    """Lab 10: rank 0 called a broadcast rank 1 never called (a forward through the wrapper): Join, the
    advice for uneven data, crashed that job; the advice names the collectives that differ instead. Where
    one rank ran fewer of the same collectives (uneven data), the catalog's advice stands."""
    from ddplab.engine.ledger import Collective
    r = replace(_loaded("run_failed_rank_exited"), signature="rank-exited-early")

    def ledger(*ops):
        return tuple(Collective(i + 1, op, "gloo", ((1,),), ("Float",), True, "0", 0, None) for i, op in enumerate(ops))
    other = replace(r, ranks=(replace(r.rank(0), ledger=ledger("broadcast", "all_reduce", "broadcast", "all_reduce")),
                              replace(r.rank(1), ledger=ledger("broadcast", "all_reduce", "all_reduce"))))
    shown = other.explain()
    assert "use Join" not in shown and "called different collectives (broadcast: rank 0 2, rank 1 1" in shown
    uneven = replace(r, ranks=(replace(r.rank(0), ledger=ledger("broadcast", "all_reduce", "all_reduce")),
                               replace(r.rank(1), ledger=ledger("broadcast", "all_reduce"))))
    assert "use Join" in uneven.explain() and "different collectives" not in uneven.explain()


def test_the_torch_import_question_only_when_no_rank_imported_torch():
    from ddplab.engine.check import compare_records, not_ended
    from ddplab.views.render_check import check_lines
    r = _loaded("run_failed_rank_exited")        # its ranks issued collectives: torch was imported
    none = compare_records({})
    assert none.nothing == "no-records" and "did any rank import torch?" in check_lines(none)[0]
    assert not_ended(none, tuple(replace(x, ledger=(), stack=(), stack_source=None) for x in r.ranks)) == none
    hung = not_ended(none, r.ranks)
    assert hung.nothing == "not-ended" and "import torch?" not in check_lines(hung)[0]
    assert "imported torch but none reached its end" in check_lines(hung)[0]


def test_a_cell_runs_under_a_fixit_limit_from_its_reference():
    from ddplab.course import magic
    from ddplab.errors import DdplabError
    n = fixit.limit("01")
    assert n == 5 * reference(fixit.get("01"), fixit.get("01").all_layouts[0])["issued"]
    assert magic.parse(f"--nproc 2 --check --limit {n} --name fix01").limit == n
    for bad in ("--limit 0", "--limit x", "--limit"):
        with pytest.raises(DdplabError):
            magic.parse(bad)


def test_every_failed_invariant_is_shown_with_its_values():
    """The view of each kind of failed invariant (no run: the grade's fields), as the corpus makes them."""
    from ddplab.course.fixit.exercise import Layout, Mismatch
    from ddplab.course.fixit.grader import Grade, Level, text
    cases = [
        (Outcome.WRONG_RESULT, Mismatch("hard losses", [0.9, 0.95], [0.9], 1e-6), "expected [0.9, 0.95]"),
        (Outcome.WRONG_RESULT, Mismatch("steps", 34, 40, layout=Layout(3)), "on 3 ranks, "),
        (Outcome.CHECK, Mismatch("findings", [], ["samples-overlap"], invariant=Invariant.CHECK), "samples-overlap"),
        (Outcome.COLLECTIVES, Mismatch("collectives", {"all_reduce": 5}, {"reduce": 5, "broadcast": 5},
                                       invariant=Invariant.COLLECTIVES), "measured {'reduce': 5"),
        (Outcome.NOT_OK, Mismatch("status", "ok", {"status": "hung", "signature": None}, invariant=Invariant.ENDS_OK,
                                  layout=Layout(1, nodes=2)), "on 2 nodes of 1 rank"),
    ]
    for outcome, m, needle in cases:
        shown = text(Grade("03", outcome, 1, Level.EXPLAIN, mismatch=m))
        assert shown.startswith(f"Not yet [{m.kind}]") and needle in shown, shown
