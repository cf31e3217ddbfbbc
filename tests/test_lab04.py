"""Lab 04 (padded variable-length sequences): every variant for real on 2 gloo ranks (the DataParallel
variants as the labelled CPU emulation here, real nn.DataParallel where 2 GPUs exist), the fixed
outputs against one process, bucketing's measured padding, the captured messages, and bad input."""
from pathlib import Path

import pytest

from conftest import requires_gpus
from ddplab.origins import catalog
from ddplab.course import claims
from ddplab.engine import signatures
from ddplab.errors import DdplabError
from ddplab.course import lab04

import exercise_cases
import notebook_check
from notebook_check import test_notebook_executes_once_and_its_checked_cells_match  # noqa: F401
from fixit_check import test_the_notebooks_unfixed_attempt_is_graded_not_yet  # noqa: F401

DATA = Path(__file__).parent / "data"
# the DataParallel variants as the emulation: with fewer than 2 GPUs that is the lab's (and the notebook's)
# dp="auto", so the notebook's runs serve; each test asserts which one ran, from the run's own records
DP = "emulation" if lab04.gpu_count() >= 2 else "auto"


def expected(variant):
    v = catalog.find_lab("04").variant(variant)
    return v.expect, v.signature


# the lab's notebook, executed once here; its runs serve the fixture below
notebook = notebook_check.notebook_fixture("04")


@pytest.fixture(scope="module")
def runs(notebook, tmp_path_factory):
    """One real run per variant (DataParallel variants as the emulation, bucketing small: the notebook's
    quick n_seqs and reps), made on first use and shared by the variant tests, the claim check and the
    exercise checkers: the notebook's own where it ran the same (loaded from its result.json), else
    started here."""
    made = notebook_check.Runs(notebook, tmp_path_factory.mktemp("lab04"), lab04.run_variant)

    def get(variant):
        if variant in lab04.DP_VARIANTS:
            return made(variant, dp=DP)
        return made(variant, **({"n_seqs": 256, "reps": 1} if variant == "bucketing" else {}))
    return get


def run04(run_lab, variant, **kw):
    args = []
    if variant in lab04.DP_VARIANTS:
        args = ["--dp", kw.pop("dp", "emulation")]
    elif variant == "bucketing":
        args = ["--n-seqs", "256", "--reps", "1"]
    return run_lab("04", variant=variant, args=args, **kw)


@pytest.mark.parametrize("name, sig_id", [
    ("lab04_dp_gather_sizes.txt", "tensor-size-mismatch"),
    ("lab04_pinned_meta_device.txt", "device-mismatch"),
])
def test_captured_messages_match_their_signature(name, sig_id):
    sig, line = signatures.match_text((DATA / name).read_text())
    assert sig.id == sig_id, line


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_dp_broken_emulation_fails_at_the_first_step_whose_chunks_differ(runs):
    r = runs("dp-broken")
    assert (r.status, r.signature) == expected("dp-broken") == ("failed", "tensor-size-mismatch")
    s = lab04.dp_summary(r)
    assert s["label"] == "emulation of DataParallel on CPU"
    assert s["steps_done"] == 1 and s["failed_at_step"] == 1       # it starts, trains a step, then crashes
    st = s["steps"][1]
    assert st["chunk_max_lengths"] == [12, 7] and st["replica_out_lengths"] == [12, 7]
    # DataParallel is one process: rank 0 fails in the emulation's gather; rank 1 only loses its peer.
    assert r.first_failure == 0 and r.cause.type == "RuntimeError"
    assert r.cause.frame.file.endswith("labs/04_padding.py") and r.cause.frame.func == "_data_parallel"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_dp_fixed_emulation_equals_one_process(runs):
    r = runs("dp-fixed")
    assert (r.status, r.signature) == expected("dp-fixed") == ("ok", None)
    s = lab04.dp_summary(r)
    assert s["steps_done"] == 3
    for st in s["steps"]:
        assert st["replica_out_lengths"] == [st["padded_len"]] * 2
        assert st["gathered"] == [8, st["padded_len"], 1]
        assert st["max_abs_diff_vs_single"] < 1e-6


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_pinned_layer_emulation_fails_only_for_the_pinned_tensor(runs):
    r = runs("pinned-layer")
    assert (r.status, r.signature) == expected("pinned-layer") == ("failed", "device-mismatch")
    p = lab04.pinned_summary(r)
    assert p["devices"] == ["cpu", "meta"]
    assert p["article_layer_ok"] and p["follow_ok"] and not p["pinned_ok"]
    assert r.first_failure == 0 and r.cause.type == "RuntimeError" and r.cause.frame.func == "forward"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_ddp_broken_all_gather_of_own_lengths_aborts(runs):
    r = runs("ddp-broken")
    assert (r.status, r.signature) == expected("ddp-broken") == ("failed", "gloo-size-mismatch")
    assert lab04.ddp_summary(r)["own_max_len"] == [12, 17]
    assert not r.records_of("done")
    # Rank 0 (longest 12) receives rank 1's longer rows into a smaller slot: gloo aborts it.
    assert r.first_failure == 0 and r.rank(0).signal == "SIGABRT" and r.cause is None


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_ddp_fixed_pads_to_global_max_and_equals_one_process(runs):
    r = runs("ddp-fixed")
    assert (r.status, r.signature) == expected("ddp-fixed") == ("ok", None)
    d = lab04.ddp_summary(r)
    assert d["own_max_len"] == [12, 17] and d["global_max_len"] == 17
    assert d["max_abs_diff_vs_single"] < 1e-6
    assert all(e["gathered_rows"] == 16 for e in r.records_of("ddp_eval"))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_bucketing_cuts_padding_keeps_batches_and_loss(runs):
    r = runs("bucketing")
    assert (r.status, r.signature) == expected("bucketing") == ("ok", None)
    s = lab04.bucketing_summary(r)
    rnd, bkt = s["random"], s["bucketed"]
    assert rnd["batches_per_rank"] == bkt["batches_per_rank"] > 0   # distributed-safe: same step count
    assert rnd["real_tokens"] == bkt["real_tokens"]                  # the same data, batched differently
    assert bkt["padding_fraction"] < rnd["padding_fraction"] / 2
    assert s["loss_init_rel_diff"] < 1e-6                            # masked loss does not see the padding
    assert rnd["tokens_per_s"] > 0 and bkt["tokens_per_s"] > 0
    assert len(r.records_of("done")) == 2


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_article_example1_as_written_trains_under_the_emulation(runs):
    """The article's own Example 1 (nn.Linear on pad_sequence batches): the batch is padded before the
    split, so every replica returns the same length and every step trains."""
    r = runs("article-example1")
    assert (r.status, r.signature) == expected("article-example1") == ("ok", None)
    s = lab04.dp_summary(r)
    assert s["label"] == "emulation of DataParallel on CPU" and s["steps_done"] == 2
    assert [st["padded_len"] for st in s["steps"]] == [40, 35]
    for st in s["steps"]:
        assert st["replica_out_lengths"] == [st["padded_len"]] * 2 and st["gathered"] == [4, st["padded_len"], 20]
        assert st["max_abs_diff_vs_single"] < 1e-6


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_claim_check_on_the_emulation_tests_no_dataparallel_claim(runs):
    c = claims.check(lab04.claim_inputs({v: runs(v) for v in ("article-example1", "dp-broken", "dp-fixed",
                                                              "pinned-layer", "ddp-broken", "bucketing")}), others={})
    v = c.verdicts()
    dp_rows = ("example1-error", "lstm-more-evident", "custom-layer")
    assert all(v[k] == "not tested here" for k in dp_rows), v          # an emulation judges no DataParallel claim
    # a stand-in judges only itself: what the emulation's replicas hold says nothing of nn.DataParallel's
    assert v["model-parallelism"] == "not tested here", c.row("model-parallelism").measured
    assert c.row("model-parallelism").parts["data_split"].state == "stand-in"
    assert v["ddp-graceful"] == "not tested here"      # DataParallel's side of the comparison ran on the emulation
    assert set(c.row("ddp-graceful").parts) == {"more_gracefully_than_dataparallel", "because_processes",
                                                "how often: ‘generally’"}   # not ddp-broken's gather
    assert "ran on every replica" in c.row("custom-layer").measured["04"]    # what the emulation did is still shown
    assert all("emulation" in c.row(k).measured["04"] for k in dp_rows + ("model-parallelism",))


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_exercise_checkers_right_wrong_and_adversarial(runs):
    b, d, k = runs("dp-broken"), runs("ddp-fixed"), runs("bucketing")
    exercise_cases.check_all(lab04.check_failing_step, b, right=1, neighbour=2, wrong=[0, -1, 3])
    assert "step 1:" not in lab04.check_failing_step._verdict(2, b).message
    # 12: rank 0's own longest; 256: the parameters cell's n_seqs
    exercise_cases.check_all(lab04.check_global_length, d, right=17, neighbour=18, shown=256, wrong=[12, 16, 0])
    assert "17 =" not in lab04.check_global_length._verdict(16, d).message
    s = lab04.bucketing_summary(k)
    got = s["random"]["padding_fraction"]
    exercise_cases.check_all(lab04.check_padding_fraction, k, right=[round(got, 2), got + 0.04], neighbour=got + 0.1,
                             shown=256, wrong=[s["bucketed"]["padding_fraction"], got - 0.1, 1 - got, 1.5, -0.1])
    assert f"{got:.1%}" not in lab04.check_padding_fraction._verdict(got + 0.1, k).message


def test_padding_fraction_counts_the_first_prediction_only(tmp_path, monkeypatch):
    """A sweep (0.1, 0.2, ... until one passes) is judged on its first answer, new runs or not."""
    from ddplab.course import answers

    monkeypatch.setenv("DDPLAB_RUNS_DIR", str(tmp_path))
    judged = []

    def judge(v, run):
        judged.append(v)
        return answers.Check(abs(v - 0.65) <= 0.05, "x")
    judge.__module__ = lab04.__name__
    ex = answers.Exercise("sweep", answers.Number(0, 1), judge)
    assert ex(None, object()).message.startswith("set `answer`")      # an empty answer commits nothing
    results = [ex(v, object()) for v in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)]   # a new run each time
    assert not any(c.passed for c in results)
    assert set(judged) == {0.1}
    assert "first" in results[-1].message


def test_dp_modes_rejected_before_any_rank_starts():
    with pytest.raises(DdplabError, match="not a DataParallel mode"):
        lab04.run_variant("dp-broken", dp="threads")
    with pytest.raises(DdplabError, match="replicas"):
        lab04.run_variant("dp-broken", replicas=5)
    if lab04.gpu_count() < 2:
        with pytest.raises(DdplabError, match="needs 2 CUDA GPUs") as e:
            lab04.run_variant("dp-fixed", dp="real")
        assert "emulation" in e.value.hint


@requires_gpus(2)
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["dp-broken", "dp-fixed", "pinned-layer"])
def test_real_data_parallel(run_lab, variant):
    r = run04(run_lab, variant, dp="real")
    assert (r.status, r.signature) == expected(variant)
    start = r.records_of("dp_start") or r.records_of("pinned_start")
    assert start[0]["dp_mode"] == "real"


@requires_gpus(2)
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["dp-broken", "dp-fixed"])
def test_emulation_agrees_with_real_data_parallel(run_lab, variant):
    emu, real = run04(run_lab, variant, dp="emulation"), run04(run_lab, variant, dp="real")
    assert (emu.status, emu.signature) == (real.status, real.signature)
    e, g = lab04.dp_summary(emu), lab04.dp_summary(real)
    assert e["failed_at_step"] == g["failed_at_step"] and e["steps_done"] == g["steps_done"]
    for a, b in zip(e["steps"], g["steps"]):
        assert a["gathered"] == b["gathered"]
    for a, b in zip(emu.records_of("dp_step"), real.records_of("dp_step")):
        assert abs(a["loss"] - b["loss"]) < 1e-4
