"""Lab 10: model code that is not DDP-safe, run for real on 2 gloo ranks: an unused head (DDP's error,
find_unused_parameters vs static_graph), BatchNorm buffers across non-IID ranks, evaluation on rank 0
through the DDP wrapper (hung) and its fix, training through model.module, rank-dependent init, and
article 002's custom layer under DataParallel (an emulation without 2 GPUs)."""

import pytest
from conftest import assert_nothing_left, gpu_count, job_processes, requires_gpus

from ddplab import DdplabError
from ddplab.course import claims
from ddplab.course import lab10

import exercise_cases
import notebook_check
from burner import LOADS, judged_runs
from notebook_check import test_notebook_executes_once_and_its_checked_cells_match  # noqa: F401
from fixit_check import test_the_notebooks_unfixed_attempt_is_graded_not_yet  # noqa: F401

VARIANTS = ("unused-params", "unused-fixed", "batchnorm", "eval-rank0", "eval-fixed", "module-forward",
            "rank-init", "dp-custom-layer")


def test_an_unknown_variant_is_rejected_before_any_rank_starts(tmp_path):
    with pytest.raises(DdplabError) as e:
        lab10.run_variant("eval-rank1", run_root=tmp_path)
    assert "eval-rank1" in str(e.value) and "\n" not in str(e.value) and "eval-rank0" in e.value.hint
    assert not any(tmp_path.iterdir()), "a run directory was made: ranks started"
    assert not job_processes(str(tmp_path)), "a rank was started"


# the lab's notebook, executed once here; its runs serve the fixtures below
notebook = notebook_check.notebook_fixture("10")


@pytest.fixture(scope="module")
def runs(notebook, tmp_path_factory):
    """One real 2-rank run of each variant, shared by the assertions and the exercise checkers below:
    the notebook's own where it made it (loaded from its result.json), else started here."""
    root = tmp_path_factory.mktemp("lab10")
    out = {}
    for v in VARIANTS:
        r = notebook.run_of(v) or lab10.run_variant(v, run_root=root, progress=None)
        assert r.leftover == (), f"{v}: launcher reported leftovers: {r.leftover}"
        out[v] = r
    assert_nothing_left(str(root))
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_every_variant_ends_as_the_catalog_says(runs):
    from ddplab.origins import catalog
    for v in catalog.find_lab("10").variants:
        r = runs[v.name]
        assert (r.status, r.signature) == (v.expect, v.signature), v.name


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_an_unused_head_fails_at_the_second_iteration_with_ddps_own_error(runs):
    r = runs["unused-params"]
    assert r.cause.type == "RuntimeError"
    assert r.cause.message.startswith("Expected to have finished reduction in the prior iteration")
    assert lab10.failing_step(r) == {0: 2, 1: 2}


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_both_fixes_train_and_leave_the_unused_head_untouched(runs):
    c = lab10.unused_cost(runs["unused-fixed"])
    assert set(c) == {lab10.REFERENCE, "find_unused_parameters=True", "static_graph=True"}
    assert c[lab10.REFERENCE]["aux_got_grad"] and c[lab10.REFERENCE]["aux_trained"]
    for name in ("find_unused_parameters=True", "static_graph=True"):
        assert not c[name]["aux_got_grad"] and not c[name]["aux_trained"]
    for o in c.values():
        assert o["params_spread"] == 0.0 and o["ms_per_step"] > 0 and len(o["ms"]) == 2
    assert set(lab10.slowdown(runs["unused-fixed"])) == {"find_unused_parameters=True", "static_graph=True"}


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_batchnorm_statistics_across_non_iid_ranks(runs):
    bn = lab10.bn_summary(runs["batchnorm"])
    shift = lab10.sizes()["rank_shift"]
    # buffer sync (DDP's default): rank 0's statistics are rank 0's data alone, far from the global batch's
    assert bn["sync"]["own_data"][0] and bn["sync"]["mean_error"][0] > shift / 4
    # no sync: each rank keeps its own data's statistics, so the ranks disagree and evaluate differently
    assert bn["local"]["own_data"] == {0: True, 1: True}
    assert bn["local"]["mean_spread"] > shift / 2 and bn["local"]["eval_spread"] > 1e-3
    # averaged by hand: equal across ranks, the mean exact, the variance misses the spread between ranks
    assert bn["averaged"]["mean_spread"] == 0 and bn["averaged"]["eval_spread"] == 0
    assert max(bn["averaged"]["mean_error"].values()) < 1e-5
    assert min(bn["averaged"]["var_error"].values()) > shift ** 2 / 8
    s = lab10.syncbn(runs["batchnorm"])
    # the ranks run on CUDA only where every rank has a GPU (ddplab.rank.lab.setup); which way it went is asserted
    assert (s["device"] == "cpu") is (gpu_count() < 2), s
    if s["device"] == "cpu":
        assert (s["ok"], s["error_type"]) == (False, "ValueError") and "GPU" in s["error"]
    else:
        assert s["ok"], s


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_evaluation_on_rank_0_through_the_wrapper_hangs_in_ddps_buffer_broadcast(runs):
    r = runs["eval-rank0"]
    w = lab10.waits(r)
    assert (w[0]["kind"], w[0]["op"], w[0]["via"]) == ("collective", "broadcast", "ddp-forward-buffers")
    assert (w[1]["kind"], w[1]["op"]) == ("collective", "all_reduce")
    assert r.rank(0).where.frame.func == "eval_rank0" and r.rank(1).where.frame.func == "eval_rank0"
    assert r.divergence.kind == "different-op" and r.divergence.ops == {0: "broadcast", 1: "all_reduce"}
    assert [x["rank"] for x in r.records_of("eval_start")] == [0] and not r.records_of("eval")


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_evaluating_model_module_completes_and_both_ways_agree(runs):
    e = lab10.eval_losses(runs["eval-fixed"])
    assert set(e) == {"rank 0 alone, model.module", "sharded on every rank, all_reduce"}
    a, b = e.values()
    assert abs(a - b) < 1e-5 * abs(a)     # the same weights and BatchNorm statistics: the same loss either way


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_training_through_model_module_lets_the_replicas_diverge(runs):
    rows = lab10.replicas(runs["module-forward"])
    assert [x["step"] for x in rows] == list(range(lab10.sizes()["steps"] + 1))
    assert rows[0]["broken"] == 0 and all(x["broken"] > lab10.SAME for x in rows[1:])
    assert all(x["fixed"] == 0 for x in rows)
    assert lab10.first_diverged_step(runs["module-forward"]) == 1


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_ddps_construction_broadcast_fixes_parameters_not_attributes_nor_reinit_after_wrap(runs):
    ri = lab10.rank_init(runs["rank-init"])
    s, re_, fx = ri["rank-seeded"], ri["reinit-after-wrap"], ri["fixed"]
    assert s["params_before"] > 0 and s["params_after_construction"] == 0 and s["params_after_training"] == 0
    assert s["proj_after_training"] > 0 and s["outputs_after_training"] > 0
    assert re_["params_after_construction"] == 0 and re_["params_after_training"] > 0 and re_["proj_after_training"] == 0
    assert all(v == 0 for v in fx.values())


@pytest.mark.skipif(gpu_count() >= 2, reason="real DataParallel runs here: test_custom_layer_under_real_dataparallel")
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_custom_layer_replicas_emulated_and_labelled(runs):
    r = runs["dp-custom-layer"]
    layers = lab10.dp_layers(r)
    art, plain = layers["nn.Parameter (article)"], layers["plain tensor attribute"]
    assert lab10.dp_mode(r) == "emulation"             # fewer than 2 GPUs: the emulation ran, and nothing else
    assert "EMULATION" in r.records_of("dp_start")[0]["label"]
    assert art["replicas"] == [{"input": "cpu", "weight": "cpu"}, {"input": "meta", "weight": "meta"}]
    assert art["same_device"] and not plain["same_device"]
    assert plain["replicas"][1] == {"input": "meta", "weight": "cpu"}


@requires_gpus(2)
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_custom_layer_under_real_dataparallel(runs):
    r = runs["dp-custom-layer"]
    layers = lab10.dp_layers(r)
    assert lab10.dp_mode(r) == "real"
    art = layers["nn.Parameter (article)"]
    assert art["error"] is None and art["same_device"] and art["max_abs_diff_vs_one_device"] < 1e-3
    assert art["grad_device"] == "cuda:0"
    assert layers["plain tensor attribute"]["error"] is not None


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_claim_check_is_computed_from_the_runs(runs):
    cc = claims.check(lab10.claim_inputs(runs), others={})
    assert list(cc.verdicts()) == [c.key for c in claims.for_lab("10")]
    man = {k: p.state for k, p in cc.row("manifestations").parts.items()}
    assert {man[k] for k in ("deadlock", "states_apart_past_the_wrapper", "states_apart_from_rank_init",
                             "runtime_error")} == {"holds"}
    assert man["how often: ‘typically’"] == "not measured"         # a frequency word: claims.judge adds it
    k, n = lab10.slower_rounds(runs["unused-fixed"])
    assert n == lab10.catalog.find_lab(lab10.LAB).extra["sizes"]["cost_rounds"] and 0 <= k <= n
    slow_holds = lab10.sign_test_p(k, n) <= claims.P_LEVEL
    assert man["slow_training"] == ("holds" if slow_holds else "not established")
    assert cc.verdicts()["manifestations"] == ("partly" if slow_holds else "not established")
    assert "parameter spread before DDP" in cc.row("manifestations").measured["10"]
    dead = cc.row("custom-loop-deadlock").parts
    assert dead["eval_on_rank0_deadlocks"].state == dead["eval_on_module_completes"].state == "holds"
    mode = lab10.dp_mode(runs["dp-custom-layer"])
    assert mode == ("real" if gpu_count() >= 2 else "emulation")     # which branch below runs
    if mode == "emulation":
        assert cc.verdicts()["device-affinity"] == "not tested here"
        assert cc.row("device-affinity").parts["weight_off_device"].state == "stand-in"
    for r in cc.rows:
        assert r.claim.quote in repr(cc)


# --- exercise checkers: right, wrong and adversarial answers against the real runs ---------------------

JUDGED = ("unused-params", "eval-rank0", "batchnorm")     # the runs the three checkers judge


@pytest.fixture(scope="module", params=LOADS)
def judged(request, tmp_path_factory):
    """The runs the exercise checkers judge: the notebook's (idle: no new run), and again with a CPU burner
    beside them (issue 34: a right answer passes on a loaded machine too)."""
    return judged_runs(request, tmp_path_factory, lab10.run_variant, JUDGED, "lab10")


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_check_unused_iteration(judged):
    # 8: the iterations the question names
    exercise_cases.check_all(lab10.check_unused_iteration, judged["unused-params"], right=2, neighbour=3,
                             shown=8, wrong=[1, 0])
    for wrong in (1, 3):
        assert "2" not in lab10.check_unused_iteration._verdict(wrong, judged["unused-params"]).message


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_check_eval_op(judged):
    r = judged["eval-rank0"]
    # all_reduce: where the OTHER rank waits
    exercise_cases.check_all(lab10.check_eval_op, r, right=["broadcast", "dist.broadcast", " Broadcast ", "broadcast()"],
                             neighbour="all_reduce", shown="64",
                             wrong=["broad", "cast", "b", "all_gather", "barrier", "reduce", b"broadcast"])
    for wrong in ("all_reduce", "broad", "all_gather", 1):
        assert "broadcast" not in lab10.check_eval_op._verdict(wrong, r).message.lower()


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_check_bn_source_rank(judged):
    exercise_cases.check_all(lab10.check_bn_source_rank, judged["batchnorm"], right=0, neighbour=-1,
                             other_rank=1, shown=32, wrong=[2])   # 32: the rows per rank the set-up cell prints


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_checkers_refuse_the_wrong_run(runs):
    assert not lab10.check_eval_op("broadcast", runs["eval-fixed"]).passed
    with pytest.raises(ValueError):
        lab10.check_unused_iteration(2, runs["unused-fixed"])
    with pytest.raises(ValueError):
        lab10.check_bn_source_rank(0, runs["module-forward"])


def test_sign_test_p():
    assert lab10.sign_test_p(12, 12) == 1 / 4096
    assert lab10.sign_test_p(0, 12) == 1.0
    assert abs(lab10.sign_test_p(10, 12) - 79 / 4096) < 1e-12       # 10 of 12 rounds: p = 0.019
    assert lab10.sign_test_p(9, 12) > lab10.P_LEVEL               # 9 of 12 could be chance
    assert lab10.sign_test_p(0, 0) == 1.0


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_consequences_figure_is_the_runs_measurements(runs):
    """Lab 10's four panels: the step times, the batchnorm errors and the replica differences are the
    runs' own; the two legends sit above the tallest bars (headroom), not on them."""
    import matplotlib.pyplot as plt

    rs = runs
    fig = lab10.plot_consequences(rs["unused-fixed"], rs["batchnorm"], rs["module-forward"], rs["rank-init"])
    cost = lab10.unused_cost(rs["unused-fixed"])
    assert [p.get_height() for p in fig.axes[0].patches] == [c["ms_per_step"] for c in cost.values()]
    bn = lab10.bn_summary(rs["batchnorm"])
    want = sorted(bn[m][k][rank] for k in ("mean_error", "var_error") for rank in (0, 1) for m in bn)
    assert sorted(p.get_height() for p in fig.axes[1].patches) == want
    for ax in (fig.axes[1], fig.axes[3]):
        top = max(p.get_y() + p.get_height() for p in ax.patches)
        assert ax.get_ylim()[1] > top * 1.4      # the legend's room above the data
    plt.close(fig)
