"""Lab 03 (mismatched shapes across ranks): every variant for real on 2 gloo ranks, the captured
messages against the signature catalog, and bad input rejected before any rank starts."""
from pathlib import Path

import pytest

from ddplab import catalog, signatures
from ddplab.errors import DdplabError
from ddplab.workbook import lab03

DATA = Path(__file__).parent / "data"
DETAIL = lab03.DETAIL_ENV


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
def test_article_example_finishes_but_weights_ranks_equally(run_lab):
    r = run_lab("03", variant="article-example")
    assert (r.status, r.signature) == expected("article-example") == ("ok", None)
    g = lab03.grad_check(r)
    assert g["rows"] == [10, 20]
    assert g["rel_err_naive"] > 0.05           # 10 rows weigh like 20: measurably wrong
    assert g["rel_err_weighted"] < 1e-5        # weighting the loss by rows gives the 30-row gradient
    assert len(r.records_of("done")) == 2


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_gather_ragged_aborts_in_gloo(run_lab):
    r = run_lab("03", variant="gather-ragged")
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
def test_gather_ragged_with_detail_names_the_shapes(run_lab):
    r = run_lab("03", variant="gather-ragged", env=DETAIL)
    assert (r.status, r.signature) == ("failed", "collective-mismatch")
    rep = lab03.detail_report(r)
    assert rep["op"] == "ALLGATHER" and rep["sequence_number"] == 2   # the third gather: the last batch
    assert rep["shapes"] == {0: [7, 4], 1: [6, 4]} or rep["shapes"] == {1: [6, 4], 0: [7, 4]}


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_model_mismatch_refused_by_ddp(run_lab):
    r = run_lab("03", variant="model-mismatch")
    assert (r.status, r.signature) == expected("model-mismatch") == ("failed", "ddp-model-mismatch")
    assert sorted(x["weight_shape"][0] for x in r.records_of("built")) == [4, 5]
    # DDP compares every rank's parameter shapes with rank 0's: rank 1 raises, rank 0 only loses its peer.
    assert r.first_failure == 1 and r.cause.type == "RuntimeError"
    assert r.cause.frame.file.endswith("labs/03_shapes.py")


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_fixed_pad_gather_equals_single_process(run_lab):
    r = run_lab("03", variant="fixed-pad-gather")
    assert (r.status, r.signature) == expected("fixed-pad-gather") == ("ok", None)
    c = lab03.compare(r)
    assert c["equal"] and c["rows"] == 45 and c["max_abs_diff"] <= 1e-6


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_fixed_guard_names_shapes_pads_and_costs_little(run_lab):
    r = run_lab("03", variant="fixed-guard", args=["--steps", "10"])
    assert (r.status, r.signature) == expected("fixed-guard") == ("ok", None)
    assert lab03.compare(r)["equal"]
    caught = lab03.guard_caught(r)
    assert caught["shapes"] == [[7, 4], [6, 4]] and caught["batch"] == 2
    cost = lab03.guard_cost(r)
    assert cost["steps"] == 10 and 0 < cost["guard_ms"] and 0 < cost["step_ms"]


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_fixed_guard_raise_fails_with_a_clear_message(run_lab):
    r = run_lab("03", variant="fixed-guard", args=["--on-mismatch", "raise"])
    assert (r.status, r.signature) == ("failed", "tensor-size-mismatch")
    assert r.first_failure in (0, 1) and r.cause.type == "ShapeMismatchError"   # every rank's guard raises
    assert "rank 0 has [7, 4], rank 1 has [6, 4]" in r.cause.message
    assert lab03.guard_caught(r)["ms"] < 5000


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


def test_exercise_checkers_without_an_answer_say_not_yet():
    assert not lab03.check_failing(None, {}).passed
    assert not lab03.check_three_ranks(None).passed
    assert not lab03.check_three_ranks("maybe").passed
