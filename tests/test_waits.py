"""Who the others waited for, and whether it was busy, blocked or gone (ddplab.engine.waits): a real
collective timeout while the awaited rank computes, and synthetic hangs."""
import dataclasses
import sys
from pathlib import Path

import pytest

from ddplab.engine import waits

sys.path.insert(0, str(Path(__file__).parent))
import many_ranks  # noqa: E402

SCRIPTS = Path(__file__).parent / "scripts"


def test_a_hang_names_the_odd_rank_as_awaited_and_blocked():
    r = many_ranks.judged(64, 5)
    w = waits.waited_for(r)
    assert (w.waited, w.how, w.op, w.seq) == ((5,), "blocked", "all_reduce", 21)
    assert w.waiters == tuple(i for i in range(64) if i != 5)
    assert "Ranks 0-4,6-63 waited in all_reduce #21 for rank 5, which was blocked, in barrier #21" in r.diagnosis


def test_a_rank_that_had_exited_is_gone():
    r = many_ranks.judged(8, 3)
    ranks = tuple(dataclasses.replace(x, state="exited", exit_code=0, signal=None, where=None,
                                      ledger=x.ledger[:-1]) if x.rank == 3 else x for x in r.ranks)
    w = waits.waited_for(dataclasses.replace(r, ranks=ranks))
    assert (w.waited, w.how) == ((3,), "gone")


def test_a_rank_still_using_cpu_is_busy():
    r = many_ranks.judged(8, 3)
    ranks = tuple(dataclasses.replace(x, cpu_busy=0.9) if x.rank == 3 else x for x in r.ranks)
    assert waits.waited_for(dataclasses.replace(r, ranks=ranks)).how == "busy"


@pytest.mark.timeout(240)
def test_a_timeout_while_the_awaited_rank_computes_says_it_was_busy(run_lab):
    r = run_lab(SCRIPTS / "timeout_busy.py")
    # a 3 s timeout while the awaited rank was still computing: the collective timeout refined into its
    # cause (engine.classify.refine: a timeout shorter than torch's default, and the peer was busy)
    assert (r.status, r.signature, r.first_failure) == ("failed", "timeout-too-short", 0), r.explain()
    w = waits.waited_for(r)
    assert (w.waiters, w.waited, w.how, w.op, w.seq) == ((0,), (1,), "busy", "all_reduce", 2), r.explain()
    assert r.rank(1).cpu_busy > 0                   # what the supervisor measured, kept as a field
    assert "Rank 0 waited in all_reduce #2 for rank 1, which was busy: its CPU time was still growing" in r.diagnosis
    assert "it last printed 'rank 1: warm-up done'" in r.diagnosis
