"""`--check`'s optimizer channel (issue 41): each rank's optimizer settings when they change, its state's loads
and checksum, compared across ranks. Real 2-rank runs of tests/scripts/check/optimizer_settings.py (a scheduler
stepped on rank 0 alone, rwth-i6/returnn#1493; a resume on rank 0 alone, vllm-project/speculators#926), and the
comparison on records: right, wrong and adversarial cases (the checker is not named where its premise fails)."""
from pathlib import Path

import pytest

import ddplab
from conftest import assert_nothing_left
from ddplab.engine.check import compare_records
from ddplab.facts import Finding
from ddplab.views.render_check import finding_sentence

SCRIPT = Path(__file__).resolve().parent / "scripts" / "check" / "optimizer_settings.py"
OWN_MODEL = Path(__file__).resolve().parent / "scripts" / "check" / "own_model_in_function.py"


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode,found,ranks", [
    ("same", set(), None),
    ("scheduler-rank0", {"hyperparameter-differs"}, (0,)),
    ("resume-rank0", {"optimizer-state-differs"}, (0,)),
    ("momentum-rank0", {"optimizer-state-differs"}, (0,)),
    ("resume-all", set(), None),
])
def test_check_names_optimizers_that_differ_across_ranks(mode, found, ranks, tmp_path):
    r = ddplab.run(SCRIPT, args=["--mode", mode], check=True, run_root=tmp_path, progress=None)
    assert r.status == "ok" and r.check.kinds() == found, r.explain()
    assert_nothing_left(str(tmp_path))
    if found:
        f = r.check.findings[0]
        assert f.ranks == ranks, finding_sentence(f)
        # the replicas parted because the optimizers did: replicas-differ's fix (steps through the wrapper,
        # weights loaded before it) does not apply, so it is not named beside
        assert "replicas-differ" not in r.check.kinds()
    if mode == "scheduler-rank0":
        f = r.check.findings[0]
        assert f.step == 2 and f.object.endswith("lr") and dict(f.values) == {0: 0.05, 1: 0.1}
        assert "rank 0: 0.05; rank 1: 0.1" in finding_sentence(f) and "scheduler" in f.fix
    if mode == "resume-rank0":
        f = r.check.findings[0]
        assert f.step == 0 and f.loaded == (0,) and dict(f.values) == {0: 0.01, 1: 0.1}
        assert "rank 0 alone loaded" in finding_sentence(f) and "every rank" in f.fix
    if mode == "momentum-rank0":
        assert r.check.findings[0].object.startswith("state of SGD") and r.check.findings[0].values is None


# --- records ----------------------------------------------------------------------------------------

def _opt(hp, steps=6, loads=(), sums=((0, None),), index=0, type_="SGD", sizes=(2,), models=(0,), truncated=False):
    return {"index": index, "type": type_, "sizes": list(sizes), "models": list(models), "steps": steps,
            "hp": [[at, groups] for at, groups in hp], "loads": list(loads),
            "state_sums": [list(s) for s in sums], "truncated": truncated}


def _rank(*optimizers):
    return {"every": 10, "process_group": True, "fsdp": [], "steps": 6, "unwrapped_steps": 0, "errors": [],
            "models": [], "loaders": [], "optimizers": list(optimizers)}


LR = lambda v: [{"lr": v, "momentum": 0.9}]


def test_a_setting_changed_on_one_rank_is_named_with_each_ranks_value():
    recs = {0: _rank(_opt([(0, LR(0.1)), (3, LR(0.05))])), 1: _rank(_opt([(0, LR(0.1))]))}
    f = compare_records(recs).of_kind("hyperparameter-differs")[0]
    assert (f.ranks, f.step, f.values, f.loaded) == ((0,), 3, ((0, 0.05), (1, 0.1)), None)
    assert Finding.from_dict(f.to_dict()) == f


def test_equal_settings_changed_alike_name_nothing():
    same = [(0, LR(0.1)), (3, LR(0.05))]
    assert compare_records({0: _rank(_opt(same)), 1: _rank(_opt(same))}).clean


def test_a_change_after_the_steps_every_rank_took_is_not_compared():
    # rank 0 decayed its lr at its 6th step, when rank 1 had ended after 5: nothing to compare at that step
    recs = {0: _rank(_opt([(0, LR(0.1)), (5, LR(0.05))], steps=6)), 1: _rank(_opt([(0, LR(0.1))], steps=5))}
    assert compare_records(recs).clean


def test_a_state_loaded_on_every_rank_is_not_named_even_where_checksums_differ():
    # ZeroRedundancyOptimizer and FSDP keep a shard of the state per rank: the sums differ by design
    recs = {r: _rank(_opt([(0, LR(0.1))], loads=(0,), sums=((0, 100 + r),))) for r in (0, 1)}
    assert compare_records(recs).clean


def test_a_state_loaded_on_one_rank_is_named_by_its_checksum():
    recs = {0: _rank(_opt([(0, LR(0.1))], loads=(0,), sums=((0, 7),))), 1: _rank(_opt([(0, LR(0.1))], sums=((0, None),)))}
    f = compare_records(recs).of_kind("optimizer-state-differs")[0]
    assert f.loaded == (0,) and f.values is None and "state of SGD" in finding_sentence(f)


def test_an_optimizer_one_rank_alone_made_is_matched_with_nothing():
    # rank 0 builds and steps a throwaway optimizer (writing a checkpoint) before the real one
    throwaway = _opt([(0, LR(0.5))], steps=1, models=())
    recs = {0: _rank(throwaway, _opt([(0, LR(0.1))], index=1)), 1: _rank(_opt([(0, LR(0.1))]))}
    assert compare_records(recs).clean


def test_replicas_that_parted_before_the_optimizers_did_are_still_named():
    names = ["w"]
    model = lambda p: {"index": 0, "names": names, "buffer_names": [], "sync_buffers": True, "forwards": 6,
                       "steps": 6, "checkpoints": [{"kind": "forward", "fwd": 1, "step": 1, "params": [p]}],
                       "unsynced_steps": [], "bypass_steps": [], "accum": [], "no_grad": {}, "final": None}
    recs = {0: {**_rank(_opt([(0, LR(0.1)), (3, LR(0.05))])), "models": [model(1)]},
            1: {**_rank(_opt([(0, LR(0.1))])), "models": [model(2)]}}
    kinds = compare_records(recs).kinds()
    assert kinds == {"replicas-differ", "hyperparameter-differs"}    # step 1 < step 3: another cause first


# --- no wrapper: each rank's own model, seen from its optimizer's parameters -------------------------

def _own(first, last, steps=6, p2p=False):
    o = _opt([(0, LR(0.1))], steps=steps, models=())
    o["param_sums"] = [[0, first], [steps, last]]
    return {**_rank(o), "p2p": p2p}


def test_ranks_that_each_trained_their_own_model_are_named():
    rep = compare_records({0: _own(5, 50), 1: _own(5, 51)})
    f = rep.of_kind("model-not-wrapped")[0]
    assert f.ranks == (0, 1) and f.step == 6 and rep.own_models == 1 and not rep.not_checked
    assert "a model of its own" in finding_sentence(f) and "DistributedDataParallel" in f.fix


def test_parameters_kept_equal_by_hand_name_nothing_and_say_what_was_compared():
    rep = compare_records({0: _own(5, 50), 1: _own(5, 50)})
    assert rep.clean and rep.own_models == 1 and not rep.not_checked


def test_no_finding_where_its_premise_fails():
    # a pipeline's stages send point to point: their parameters differ by design
    assert compare_records({0: _own(5, 50, p2p=True), 1: _own(5, 51, p2p=True)}).clean
    # no call records at hand: whether the ranks sent point to point is unknown, so nothing is compared
    rep = compare_records({0: _own(5, 50, p2p=None), 1: _own(5, 51, p2p=None)})
    assert rep.clean and [n.why for n in rep.not_checked] == ["no-ddp-model"]
    # different from the first step (each rank its own seed): not shown to be one model trained apart
    assert not compare_records({0: _own(5, 50), 1: _own(6, 51)}).findings
    # the ranks ended at different steps: not the same point of training
    assert compare_records({0: _own(5, 50, steps=6), 1: _own(5, 51, steps=5)}).clean


def test_parameters_apart_from_the_first_step_are_shown_not_named():
    rep = compare_records({0: _own(5, 50), 1: _own(6, 51)})
    assert not rep.findings and [n.why for n in rep.not_checked] == ["own-models-apart"]
    from ddplab.views.render_check import not_checked_sentence
    assert "differed across ranks from its first step" in not_checked_sentence(rep.not_checked[0])


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode,found", [("own", {"model-not-wrapped"}), ("averaged", set())])
def test_a_model_freed_before_the_end_is_compared_at_its_last_step(mode, found, tmp_path):
    """imagenet main.py on a CPU (issue 43's run with --seed 0): the model and its optimizer live in a function
    that returns before the job ends, and no process group is destroyed; the optimizer's last checksum is
    taken as it is freed, so each rank's own model is still seen (before: only the first step's was kept)."""
    r = ddplab.run(OWN_MODEL, args=["--mode", mode], check=True, run_root=tmp_path, progress=None)
    assert r.status == "ok" and r.check.kinds() == found, r.explain()
    if found:
        f = r.check.findings[0]
        assert f.ranks == (0, 1) and f.step == 4, f
    assert_nothing_left(str(tmp_path))
