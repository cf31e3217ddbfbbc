"""The tests timing claims are judged by (ddplab.course.notebook): checked against brute force."""
import random
from itertools import combinations

import pytest

from ddplab.course.notebook import P_LEVEL, rank_sum_p, sign_test_p


def _brute_rank_sum_p(slower, than):
    both = sorted(slower + than)
    ranks = {}
    for i, v in enumerate(both, start=1):
        ranks.setdefault(v, []).append(i)
    avg = [sum(ranks[v]) / len(ranks[v]) for v in both]
    observed = sum(sum(ranks[v]) / len(ranks[v]) for v in slower)
    picks = list(combinations(range(len(both)), len(slower)))
    return sum(sum(avg[i] for i in p) >= observed - 1e-9 for p in picks) / len(picks)


def test_rank_sum_p_is_the_exact_one_sided_mann_whitney():
    assert rank_sum_p([10, 11, 12, 13], [1, 2, 3, 4]) == pytest.approx(1 / 70)   # the most extreme of C(8,4)
    assert rank_sum_p([1, 2, 3, 4], [10, 11, 12, 13]) == 1.0
    assert rank_sum_p([5, 5, 5], [5, 5, 5]) == 1.0                                # all tied: no evidence
    interleaved = rank_sum_p([1, 3, 5, 7, 9, 11, 13, 15], [2, 4, 6, 8, 10, 12, 14, 16])
    assert P_LEVEL < interleaved < 1.0
    # one slow outlier (a retransmission timeout) among otherwise equal steps is not "slower"
    assert rank_sum_p([5, 5, 5, 5, 5, 5, 5, 400], [5] * 8) > P_LEVEL
    assert rank_sum_p([], [1.0]) == 1.0 and rank_sum_p([1.0], []) == 1.0


@pytest.mark.parametrize("seed", range(12))
def test_rank_sum_p_agrees_with_enumeration_ties_included(seed):
    rng = random.Random(seed)
    n, m = rng.randint(1, 7), rng.randint(1, 7)
    pool = [rng.choice([1, 2, 2, 3, 5, 5, 5, 8]) + (rng.random() if seed % 3 == 0 else 0) for _ in range(n + m)]
    slower, than = pool[:n], pool[n:]
    assert rank_sum_p(slower, than) == pytest.approx(_brute_rank_sum_p(slower, than), abs=1e-12)


def test_rank_sum_p_of_long_runs_is_the_normal_approximation():
    from ddplab.course import notebook
    # 50 steps a run: exact; 200 steps a run (lab 09's largest): normal, close to exact where both apply
    a, b = [float(i) + 0.5 for i in range(50)], [float(i) for i in range(50)]
    exact = rank_sum_p(a, b)
    tied, base = [5.0] * 30 + [9.0] * 10, [5.0] * 40                          # 1600 pairs: counted exactly
    exact_tied = rank_sum_p(tied, base)
    assert 50 * 50 <= notebook.RANK_SUM_EXACT_PAIRS
    old, notebook.RANK_SUM_EXACT_PAIRS = notebook.RANK_SUM_EXACT_PAIRS, 0
    try:
        assert rank_sum_p(a, b) == pytest.approx(exact, abs=0.01)
        assert rank_sum_p(tied, base) == pytest.approx(exact_tied, abs=0.02) and exact_tied < 0.01
        assert rank_sum_p([5.0] * 60, [5.0] * 60) == 1.0                       # no spread: no evidence
    finally:
        notebook.RANK_SUM_EXACT_PAIRS = old
    assert rank_sum_p([1000.0 + i for i in range(200)], [float(i) for i in range(200)]) < 1e-30
    assert 0.3 < rank_sum_p([float(i) + 0.5 for i in range(200)], [float(i) for i in range(200)]) < 0.6


def test_sign_test_p():
    assert sign_test_p(12, 12) == pytest.approx(1 / 4096)
    assert sign_test_p(0, 12) == 1.0 and sign_test_p(0, 0) == 1.0
    assert sign_test_p(9, 12) > P_LEVEL                                            # 9 of 12 could be chance
    assert sign_test_p(10, 12) <= P_LEVEL
