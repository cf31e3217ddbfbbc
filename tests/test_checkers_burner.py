"""The checkers of labs 03, 04, 06 (smallest-timeout) and 07 (best-fix) judged against runs made with a
CPU burner beside them (issue 34: a right answer passes on a loaded machine too, the wrong ones still
fail). Their idle runs are tried in each lab's own test file (tests/test_lab03.py ...); here each
measurement runs once more, burning, and is shared by every checker that judges it (module scope).
The cases are the idle tests' own, so the two loads are judged alike."""
import pytest

import ddplab
from conftest import assert_nothing_left
from ddplab.course import lab03, lab04, lab06
from ddplab.course import lab07 as L

import exercise_cases
from burner import load


def _made(root, runs) -> None:
    for r in runs:
        assert r.leftover == (), f"{r.variant}: launcher reported leftovers: {r.leftover}"
    assert_nothing_left(str(root))


# ---- lab 03: the five shape variants, the three dtype variants, gather-ragged on 3 ranks ----------------

@pytest.fixture(scope="module")
def lab03_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab03-burner")
    with load("burner"):
        shapes = {v: lab03.run_variant(v, run_root=root / v, progress=None,
                                       **({"steps": 10} if v == "fixed-guard" else {}))
                  for v in lab03.SHAPES}
        dtypes = {v: lab03.run_variant(v, run_root=root / v, progress=None) for v in lab03.DTYPES}
        three = lab03.run_variant("gather-ragged", nproc=3, run_root=root / "three", progress=None)
    _made(root, [*shapes.values(), *dtypes.values(), three])
    return {"shapes": shapes, "dtypes": dtypes, "three": three}


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_lab03_check_failing_under_a_cpu_burner(lab03_runs):
    results = lab03_runs["shapes"]
    right = {"gather-ragged", "model-mismatch"}
    assert {v for v, r in results.items() if r.status == "failed"} == right, {v: r.status for v, r in results.items()}
    exercise_cases.check_all(
        lab03.check_failing, results, right=[right, ["model-mismatch", "gather-ragged"]],
        neighbour={"gather-ragged", "fixed-guard"},
        wrong=[set(), {"gather-ragged"}, right | {"article-example"}, set(lab03.SHAPES),
               {"gather"}, {"ragged", "model"}, "gather-ragged,model-mismatch", {1, 2}, {"": 1}])


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_lab03_check_silently_wrong_under_a_cpu_burner(lab03_runs):
    exercise_cases.check_all(
        lab03.check_silently_wrong, lab03_runs["dtypes"], right=[{"dtype-same-width"}, ["dtype-same-width"]],
        neighbour={"dtype-mismatch"},
        wrong=[set(), {"dtype-same-width", "dtype-mismatch"}, set(lab03.DTYPES), {"fixed-dtype"}, {"silent"}])


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_lab03_check_three_ranks_under_a_cpu_burner(lab03_runs):
    r = lab03_runs["three"]
    assert (r.status, r.signature) == ("ok", None)
    exercise_cases.check_all(lab03.check_three_ranks, right=["ok", " ok ", "OK"], neighbour="failed", shown=20,
                             wrong=["hung", "o", "okay", "k"], result=r)


# ---- lab 04: dp-broken (the emulation), ddp-fixed, bucketing ----------------------------------------

LAB04_ARGS = {"dp-broken": ["--dp", "emulation"], "ddp-fixed": [], "bucketing": ["--n-seqs", "256", "--reps", "1"]}


@pytest.fixture(scope="module")
def lab04_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab04-burner")
    with load("burner"):
        out = {v: ddplab.run("04", variant=v, args=a, run_root=root / v, progress=None) for v, a in LAB04_ARGS.items()}
    _made(root, out.values())
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_lab04_checkers_under_a_cpu_burner(lab04_runs):
    b, d, k = lab04_runs["dp-broken"], lab04_runs["ddp-fixed"], lab04_runs["bucketing"]
    exercise_cases.check_all(lab04.check_failing_step, b, right=1, neighbour=2, wrong=[0, -1, 3])
    exercise_cases.check_all(lab04.check_global_length, d, right=17, neighbour=18, shown=256, wrong=[12, 16, 0])
    s = lab04.bucketing_summary(k)
    got = s["random"]["padding_fraction"]
    exercise_cases.check_all(lab04.check_padding_fraction, k, right=[round(got, 2), got + 0.04], neighbour=got + 0.1,
                             shown=256, wrong=[s["bucketed"]["padding_fraction"], got - 0.1, 1 - got, 1.5, -0.1])


# ---- lab 06: the timeout sweep (rank 1 1.5 s late; timeouts 0.5 and 3 s) ------------------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_lab06_check_smallest_timeout_under_a_cpu_burner(tmp_path):
    with load("burner"):
        sweep = lab06.timeout_sweep(timeouts=(0.5, 3.0), delays=(1.5,), run_root=tmp_path, progress=None)
    assert_nothing_left(str(tmp_path))
    print("sweep under a burner:", [(p["timeout_s"], p["outcome"], p["seconds"]) for p in sweep.points])
    exercise_cases.check_all(lab06.check_smallest_timeout, sweep, right=[3.0, 3], neighbour=0.5, shown=1.5,
                             wrong=[2, 1800, 0, -3], delay_s=1.5)


# ---- lab 07: the fixes run (each fix against the baseline, 5 rounds) ---------------------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_lab07_check_best_fix_under_a_cpu_burner(tmp_path):
    with load("burner"):
        r = ddplab.run("07", variant="fixed", env=L.ONE_THREAD, run_root=tmp_path, progress=None,
                       args=["--width", "256", "--batch", "8", "--steps", "4", "--warmup", "1", "--accum-k", "4",
                             "--rounds", "5"])
    _made(tmp_path, [r])
    frows = L.fix_rows(L.summarize(r))
    print("speedups under a burner:", {x["fix"]: round(x["speedup"], 2) for x in frows})
    exercise_cases.check_best_fix(L, frows)      # the same cases as tests/test_lab07.py
