"""Lab 03 (mismatched shapes across ranks): every variant for real on 2 gloo ranks, the captured
messages against the signature catalog, and bad input rejected before any rank starts."""
from pathlib import Path

import pytest

from ddplab.origins import catalog
from ddplab.course import claims
from ddplab.engine import signatures
from ddplab.errors import DdplabError
from ddplab.course import lab03

import exercise_cases
import notebook_check
from notebook_check import test_notebook_executes_once_and_its_checked_cells_match  # noqa: F401
from fixit_check import test_the_notebooks_unfixed_attempt_is_graded_not_yet  # noqa: F401

DATA = Path(__file__).parent / "data"
DETAIL = lab03.DETAIL_ENV
GUARD_STEPS = 20     # the notebook's own (quick) guard_steps: its fixed-guard run serves the tests below

# the lab's notebook, executed once here; one real run per variant, made on first use and shared by the
# variant tests and the exercise checkers: the notebook's own where it ran the same (loaded from its
# result.json), else started here
notebook = notebook_check.notebook_fixture("03")
runs = notebook_check.runs_fixture("03", lab03.run_variant)


def expected(variant):
    v = catalog.find_lab("03").variant(variant)
    return v.expect, v.signature


@pytest.mark.parametrize("name, sig_id", [
    ("lab03_gather_ragged.txt", "gloo-size-mismatch"),
    ("lab03_gather_ragged_detail.txt", "collective-mismatch"),
    ("lab03_model_mismatch.txt", "ddp-model-mismatch"),
])
def test_captured_messages_match_their_signature(name, sig_id):
    sig, line = signatures.match_text((DATA / name).read_text())
    assert sig.id == sig_id, line


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_article_example_finishes_but_weights_ranks_equally(runs):
    r = runs("article-example")
    assert (r.status, r.signature) == expected("article-example") == ("ok", None)
    g = lab03.grad_check(r)
    assert g["rows"] == [10, 20]
    assert g["rel_err_naive"] > 0.05           # 10 rows weigh like 20: measurably wrong
    assert g["rel_err_weighted"] < 1e-5        # weighting the loss by rows gives the 30-row gradient
    assert len(r.records_of("done")) == 2


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_gather_ragged_aborts_in_gloo(runs):
    r = runs("gather-ragged")
    assert (r.status, r.signature) == expected("gather-ragged") == ("failed", "gloo-size-mismatch")
    rep = lab03.gloo_report(r)
    # Rank 1 (6 rows) receives rank 0's 7 rows into a 6-row slot: gloo's size check aborts it, always.
    assert rep and rep["received_bytes"] > rep["expected_bytes"] and rep["aborted_ranks"] == [1]
    assert r.first_failure == 1 and r.rank(1).signal == "SIGABRT" and r.stall is None
    assert not [x for x in r.records_of("done") + r.records_of("compare") if x["rank"] == 1]
    # Rank 0 receives 6 rows into a 7-row slot: no error. Whether it reaches the comparison before
    # torchrun stops it is a race; when it does, its gathered predictions are silently wrong.
    assert all(not c["equal"] and c["rows"] != 45 for c in rep["got_past_gather"].values())


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_gather_ragged_with_detail_names_the_shapes(runs):
    r = runs("gather-ragged", env=DETAIL)
    assert (r.status, r.signature) == ("failed", "collective-mismatch")
    rep = lab03.detail_report(r)
    assert rep["op"] == "ALLGATHER" and rep["sequence_number"] == 2   # the third gather: the last batch
    assert rep["shapes"] == {0: [7, 4], 1: [6, 4]} or rep["shapes"] == {1: [6, 4], 0: [7, 4]}


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_model_mismatch_refused_by_ddp(runs):
    r = runs("model-mismatch")
    assert (r.status, r.signature) == expected("model-mismatch") == ("failed", "ddp-model-mismatch")
    assert sorted(x["weight_shape"][0] for x in r.records_of("built")) == [4, 5]
    # DDP compares every rank's parameter shapes with rank 0's: rank 1 raises, rank 0 only loses its peer.
    assert r.first_failure == 1 and r.cause.type == "RuntimeError"
    assert r.cause.frame.file.endswith("labs/03_shapes.py")


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_fixed_pad_gather_equals_single_process(runs):
    r = runs("fixed-pad-gather")
    assert (r.status, r.signature) == expected("fixed-pad-gather") == ("ok", None)
    c = lab03.compare(r)
    assert c["equal"] and c["rows"] == 45 and c["max_abs_diff"] <= 1e-6


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_fixed_guard_names_shapes_pads_and_measures_its_cost(runs):
    r = runs("fixed-guard", steps=GUARD_STEPS)
    assert (r.status, r.signature) == expected("fixed-guard") == ("ok", None)
    assert lab03.compare(r)["equal"]
    caught = lab03.guard_caught(r)
    assert caught["shapes"] == [[7, 4], [6, 4]] and caught["batch"] == 2
    cost = lab03.guard_cost(r)
    assert cost["steps"] == GUARD_STEPS and 0 < cost["guard_ms"] and 0 < cost["step_ms"]


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_dtype_mismatch_aborts_in_gloo_on_the_rank_whose_buffer_is_smaller(runs):
    r = runs("dtype-mismatch")
    assert (r.status, r.signature) == expected("dtype-mismatch") == ("failed", "gloo-size-mismatch")
    rep = lab03.dtype_report(r)
    assert {k: (v["dtype"], v["bytes"]) for k, v in rep["ranks"].items()} == {0: ("float32", 4), 1: ("float64", 8)}
    assert rep["aborted_ranks"] == [0]                   # 4-byte slots, 8-byte elements arriving
    m = lab03.gloo_report(r)
    assert m["received_bytes"] == 2 * m["expected_bytes"]


def test_dtype_silent_ends_ok_with_wrong_sums_on_every_rank_and_the_cast_fixes_them(runs):
    silent, fixed = lab03.dtype_report(runs("dtype-same-width")), lab03.dtype_report(runs("fixed-dtype"))
    assert (silent["status"], fixed["status"]) == (expected("dtype-same-width")[0], expected("fixed-dtype")[0]) \
        == ("ok", "ok")
    assert {v["bytes"] for v in silent["ranks"].values()} == {8} and len({v["dtype"] for v in silent["ranks"].values()}) == 2
    assert [v["equal"] for v in silent["ranks"].values()] == [False, False] and silent["aborted_ranks"] == []
    assert [v["equal"] for v in fixed["ranks"].values()] == [True, True]
    assert {v["dtype"] for v in fixed["ranks"].values()} == {"float32"}


def test_fixed_guard_raise_fails_with_a_clear_message(runs):
    r = runs("fixed-guard", on_mismatch="raise")
    assert (r.status, r.signature) == ("failed", "tensor-size-mismatch")
    assert r.first_failure in (0, 1) and r.cause.type == "ShapeMismatchError"   # every rank's guard raises
    assert "rank 0 has [7, 4], rank 1 has [6, 4]" in r.cause.message
    # every rank's guard found the mismatch at the same batch, before the collective; the job ended on
    # the guard's error, not on the stall rule
    caught = r.records_of("guard_caught")
    assert sorted(x["rank"] for x in caught) == [0, 1] and len({x["batch"] for x in caught}) == 1
    assert r.stall is None


@pytest.mark.parametrize("kw, words", [
    (dict(variant="article-example", detail=True), "SIGSEGV"),
    (dict(variant="model-mismatch", detail=True), "SIGSEGV"),
    (dict(variant="gather-ragged", on_mismatch="raise"), "fixed-guard"),
    (dict(variant="fixed-guard", on_mismatch="crash"), "'pad' or 'raise'"),
    (dict(variant="fixed-guard", steps=0), "steps"),
    (dict(variant="ragged"), "no variant"),
])
def test_bad_requests_are_refused_before_any_rank_starts(kw, words, tmp_path):
    with pytest.raises(DdplabError) as e:
        lab03.run_variant(**kw, run_root=tmp_path)
    assert words in str(e.value) and e.value.hint
    assert not any(tmp_path.iterdir())


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_check_silently_wrong_right_wrong_and_adversarial(runs):
    results = {v: runs(v) for v in lab03.DTYPES}
    exercise_cases.check_all(
        lab03.check_silently_wrong, results, right=[{"dtype-same-width"}, ["dtype-same-width"]],
        neighbour={"dtype-mismatch"},
        wrong=[set(), {"dtype-same-width", "dtype-mismatch"}, set(lab03.DTYPES), {"fixed-dtype"}, {"silent"}])


def test_exercise_checkers_without_an_answer_say_not_yet():
    assert not lab03.check_silently_wrong(None, {}).passed
    assert not lab03.check_failing(None, {}).passed
    assert not lab03.check_three_ranks(None).passed
    assert not lab03.check_three_ranks("maybe").passed


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_check_failing_right_wrong_and_adversarial(runs):
    results = {v: runs(v, steps=GUARD_STEPS) if v == "fixed-guard" else runs(v) for v in lab03.SHAPES}
    right = {"gather-ragged", "model-mismatch"}
    assert {v for v, r in results.items() if r.status == "failed"} == right
    exercise_cases.check_all(
        lab03.check_failing, results, right=[right, ["model-mismatch", "gather-ragged"]],
        neighbour={"gather-ragged", "fixed-guard"},            # what the guard's raise run shows: not its default
        wrong=[set(), {"gather-ragged"}, right | {"article-example"}, set(lab03.SHAPES),
               {"gather"}, {"ragged", "model"}, "gather-ragged,model-mismatch", {1, 2}, {"": 1}])
    c = lab03.check_failing._verdict({"gather-ragged"}, results)
    assert "model-mismatch" not in c.message


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_check_three_ranks_against_a_real_three_rank_run(runs):
    r = runs("gather-ragged", nproc=3)
    assert (r.status, r.signature) == ("ok", None)                      # 15/15/15 rows: equal batches
    assert sorted(x["rows"] for x in r.records_of("start")) == [15, 15, 15]
    exercise_cases.check_all(lab03.check_three_ranks, right=["ok", " ok ", "OK"], neighbour="failed", shown=20,
                             wrong=["hung", "o", "okay", "k"], result=r)
    assert "ended ok" not in lab03.check_three_ranks._verdict("hung", result=r).message


def test_claim_verdicts_follow_the_parts():
    def verdict(key, **parts):
        return claims.judge_alone(key, "03", claims.evidence("m", **parts)).verdict

    assert verdict("example3-hang", incorrect_results=True, hang=False) == "wrong"    # DDP finishes: no hang
    assert verdict("example3-hang", incorrect_results=True, hang=True) == "holds"
    assert verdict("mismatch-errors-hang", errors=True, hang=False) == "partly"
    assert verdict("mismatch-errors-hang", errors=False, hang=False) == "not established"   # 'can': not refuted
    assert verdict("cryptic-errors", cryptic=True) == "holds"
