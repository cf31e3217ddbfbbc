"""`--check`'s channels for jobs that end ok and train or evaluate wrong (issue 41, round h41): the DDP model's
train/eval modes at each forward with grad, compared across ranks; Module.load_state_dict(strict=False)'s
missing and unexpected keys; loaders iterated for evaluation (gradients off, no training forward), their
indices across ranks. Real 2-rank runs of tests/scripts/check/silent_eval.py, and the comparison on records:
right, wrong and adversarial cases (nothing is named where the premise fails)."""
from pathlib import Path

import pytest

import ddplab
from conftest import assert_nothing_left
from ddplab.engine.check import compare_records
from ddplab.facts import Finding
from ddplab.views.render_check import finding_sentence

SCRIPT = Path(__file__).resolve().parent / "scripts" / "check" / "silent_eval.py"
STREAM = Path(__file__).resolve().parent / "scripts" / "check" / "iterable_workers.py"


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode,found,ranks", [
    ("same", set(), None),
    ("frozen-bn", set(), None),
    ("eval-mode-rank0", {"mode-differs"}, (0,)),
    ("load-prefix", {"load-keys-missing"}, (0, 1)),
    ("eval-padding", {"eval-padding-repeats"}, (0, 1)),
    ("eval-rank0", {"eval-one-shard"}, (0,)),
])
def test_check_names_silent_training_and_evaluation_faults(mode, found, ranks, tmp_path):
    r = ddplab.run(SCRIPT, args=["--mode", mode], check=True, run_root=tmp_path, progress=None)
    assert r.status == "ok" and r.check.kinds() == found, r.explain()
    assert_nothing_left(str(tmp_path))
    if not found:
        return
    f = r.check.findings[0]
    assert f.ranks == ranks, finding_sentence(f)
    assert Finding.from_dict(f.to_dict()) == f
    if mode == "eval-mode-rank0":
        # eval() at the end of step 3 (4 steps taken), 8 forwards with grad of which 4 in eval mode
        assert (f.step, f.count, f.of, f.modules, f.modules_of) == (4, 4, 8, 6, 6)
        assert f.object == "Linear 0" and "train mode" in f.fix
    if mode == "load-prefix":
        assert (f.count, f.of, f.cause, f.prefix) == (6, 6, "key-prefix-in-checkpoint", "module.")
        assert '"module." prefix' in finding_sentence(f) and "consume_prefix_in_state_dict_if_present" in f.fix
    if mode == "eval-padding":
        assert (f.count, f.of, f.epoch) == (1, 51, 0) and "pads" in finding_sentence(f)
    if mode == "eval-rank0":
        assert (f.count, f.of) == (24, 48) and "alone" in finding_sentence(f)


# --- records ----------------------------------------------------------------------------------------

def _model(modes, forwards=8):
    return {"index": 0, "names": ["w"], "buffer_names": [], "sync_buffers": True, "forwards": forwards,
            "steps": forwards, "checkpoints": [], "unsynced_steps": [], "bypass_steps": [], "accum": [],
            "no_grad": {}, "final": None, "modes": [[at, at - 1, m] for at, m in modes]}


def _rank(models=(), loads=(), loaders=(), train_forwards=8):
    return {"every": 10, "process_group": True, "fsdp": [], "steps": 8, "unwrapped_steps": 0, "errors": [],
            "optimizers": [], "models": list(models), "module_loads": list(loads), "loaders": list(loaders),
            "train_forwards": train_forwards}


TRAIN = {"eval": 0, "of": 3, "names": []}
EVAL = {"eval": 3, "of": 3, "names": [["", "Net"], ["bn", "BatchNorm1d"], ["drop", "Dropout"]]}
BN_ONLY = {"eval": 1, "of": 3, "names": [["bn", "BatchNorm1d"]]}


def test_a_rank_left_in_eval_mode_is_named():
    recs = {0: _rank([_model([(1, TRAIN), (5, EVAL)])]), 1: _rank([_model([(1, TRAIN)])])}
    f = compare_records(recs).of_kind("mode-differs")[0]
    assert (f.ranks, f.step, f.count, f.of, f.object) == ((0,), 4, 4, 8, "BatchNorm1d bn")


def test_the_same_modes_on_every_rank_name_nothing():
    # eval mode everywhere (frozen BatchNorm on purpose), and modes changed alike on every rank
    assert compare_records({r: _rank([_model([(1, BN_ONLY)])]) for r in (0, 1)}).clean
    alike = [(1, TRAIN), (3, BN_ONLY), (5, TRAIN)]
    assert compare_records({r: _rank([_model(alike)]) for r in (0, 1)}).clean


def test_a_mode_change_after_the_forwards_every_rank_ran_is_not_compared():
    recs = {0: _rank([_model([(1, TRAIN), (8, EVAL)], forwards=8)]), 1: _rank([_model([(1, TRAIN)], forwards=7)])}
    assert compare_records(recs).clean


def _load(params=6, missing=6, unexpected=9, prefix="module.", on="checkpoint"):
    return {"type": "Sequential", "keys": 9, "params": params, "params_missing": missing, "missing": missing,
            "unexpected": unexpected, "first_missing": "0.weight", "first_unexpected": "module.0.weight",
            "steps": 8, "prefix": prefix, "prefix_on": on}


def test_a_load_that_matched_no_parameter_is_named_with_its_prefix():
    f = compare_records({0: _rank(loads=[_load()]), 1: _rank()}).of_kind("load-keys-missing")[0]
    assert (f.ranks, f.count, f.of, f.cause, f.prefix, f.unexpected) == ((0,), 6, 6, "key-prefix-in-checkpoint",
                                                                         "module.", 9)
    g = compare_records({0: _rank(loads=[_load(on="model")]), 1: _rank(loads=[_load(on="model")])}).findings
    assert [(x.ranks, x.cause) for x in g] == [((0, 1), "key-prefix-in-model")]
    assert "the model's keys carry" in finding_sentence(g[0]) and "model.module.load_state_dict" in g[0].fix


def test_partial_loads_whose_keys_all_matched_name_nothing():
    # an adapter or a backbone without its head: parameters missing, but every given key went somewhere
    assert compare_records({r: _rank(loads=[_load(missing=6, unexpected=0, prefix=None, on=None)])
                            for r in (0, 1)}).clean
    # most parameters loaded, a few keys left over (a renamed head)
    assert compare_records({r: _rank(loads=[_load(missing=2, unexpected=2, prefix=None, on=None)])
                            for r in (0, 1)}).clean


def _loader(n, indices, size=51, complete=True, grad=False, fwd=(8, 8), distributed=True, drop_last=False,
            num_replicas=2):
    return {"index": n, "dataset": "TensorDataset", "size": size, "length": size, "subset": False,
            "subset_digest": None, "sampler": "DistributedSampler", "distributed": distributed, "shuffle": False,
            "drop_last": drop_last, "num_replicas": num_replicas, "batch_size": 8, "loader_drop_last": False,
            "epochs": [{"sampler_epoch": 0, "indices": list(indices), "complete": complete, "truncated": False,
                        "forwards_start": fwd[0], "forwards_end": fwd[1], "grad": grad}]}


def test_an_evaluation_that_counts_the_samplers_padding_is_named():
    recs = {0: _rank(loaders=[_loader(0, range(0, 51, 2))]), 1: _rank(loaders=[_loader(0, [*range(1, 51, 2), 0])])}
    f = compare_records(recs).of_kind("eval-padding-repeats")[0]
    assert (f.ranks, f.count, f.of) == ((0, 1), 1, 51)


def test_no_padding_finding_where_its_premise_fails():
    even = {0: _rank(loaders=[_loader(0, range(0, 52, 2), size=52)]),
            1: _rank(loaders=[_loader(0, range(1, 52, 2), size=52)])}
    assert compare_records(even).clean                         # no padding: nothing repeated
    dropped = {0: _rank(loaders=[_loader(0, range(0, 50, 2), drop_last=True)]),
               1: _rank(loaders=[_loader(0, range(1, 50, 2), drop_last=True)])}
    assert compare_records(dropped).clean                      # drop_last: the sampler drops instead
    with_grad = {0: _rank(loaders=[_loader(0, range(0, 51, 2), grad=True)]),
                 1: _rank(loaders=[_loader(0, [*range(1, 51, 2), 0], grad=True)])}
    assert not compare_records(with_grad).of_kind("eval-padding-repeats")   # gradients on: not an evaluation
    untrained = {r: _rank(loaders=[_loader(0, ids)], train_forwards=0)
                 for r, ids in ((0, range(0, 51, 2)), (1, [*range(1, 51, 2), 0]))}
    assert compare_records(untrained).clean                    # no DDP training at all: no training to tell it from


def test_a_shard_evaluated_on_one_rank_alone_is_named():
    recs = {0: _rank(loaders=[_loader(0, range(0, 48, 2), size=48)]), 1: _rank()}
    f = compare_records(recs).of_kind("eval-one-shard")[0]
    assert (f.ranks, f.count, f.of) == ((0,), 24, 48)


def test_no_one_shard_finding_where_its_premise_fails():
    # rank 0 alone scores the whole split (no DistributedSampler: every sample): right
    whole = _loader(0, range(48), size=48, distributed=False, num_replicas=None)
    assert compare_records({0: _rank(loaders=[whole]), 1: _rank()}).clean
    # a look at the first batches only (the epoch did not end)
    assert compare_records({0: _rank(loaders=[_loader(0, range(0, 16, 2), size=48, complete=False)]),
                            1: _rank()}).clean
    # the other rank has a loader over the same data (iterated with gradients on): not alone
    other = _loader(0, range(1, 48, 2), size=48, grad=True)
    assert compare_records({0: _rank(loaders=[_loader(0, range(0, 48, 2), size=48)]),
                            1: _rank(loaders=[other])}).clean


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode,found", [("by-rank", {"worker-duplicates"}), ("by-worker", set())])
def test_check_names_iterable_workers_that_each_yield_everything(mode, found, tmp_path):
    r = ddplab.run(STREAM, args=["--mode", mode], check=True, run_root=tmp_path, progress=None)
    assert r.status == "ok" and r.check.kinds() == found, r.explain()
    assert_nothing_left(str(tmp_path))
    # the streamed data has no indices to compare: said, not judged
    assert [n.why for n in r.check.not_checked] == ["iterable-loader"]
    if found:
        f = r.check.findings[0]
        # 64 rows, 32 per rank, batches of 4: 8 batches per worker, each given by both workers
        assert (f.ranks, f.epoch, f.count, f.of) == ((0, 1), 0, 8, 16) and "get_worker_info" in f.fix
        assert "num_workers=2" in f.object and Finding.from_dict(f.to_dict()) == f


def _stream(sums, workers=2, complete=True, iterable=True):
    return {"index": 0, "dataset": "Stream", "size": None, "length": None, "subset": False, "subset_digest": None,
            "sampler": "_InfiniteConstantSampler", "distributed": False, "shuffle": False, "drop_last": False,
            "num_replicas": None, "batch_size": 4, "loader_drop_last": False, "iterable": iterable,
            "num_workers": workers, "epochs": [{"sampler_epoch": None, "indices": [], "complete": complete,
                                                "truncated": True, "forwards_start": 0, "forwards_end": len(sums),
                                                "grad": True, "batch_sums": list(sums)}]}


def test_workers_that_each_gave_every_batch_are_named_and_nothing_else_is():
    twice = [1, 1, 2, 2, 3, 3]
    f = compare_records({0: _rank(loaders=[_stream(twice)]), 1: _rank(loaders=[_stream(twice)])}).findings
    assert [(x.kind, x.ranks, x.count, x.of) for x in f] == [("worker-duplicates", (0, 1), 3, 6)]
    for ok in (_stream([1, 2, 3, 4]),                 # sharded by worker: every batch once
               _stream([5, 5, 5, 5]),                 # one constant batch: no data flowing to tell from
               _stream([1, 1, 2, 3]),                 # some repeats, not every batch once per worker
               _stream(twice, workers=1),             # one worker cannot repeat another
               _stream(twice, complete=False),        # an epoch cut short
               _stream(twice, iterable=False)):       # a map-style dataset: the sampler shares the indices out
        assert not compare_records({0: _rank(loaders=[ok]), 1: _rank(loaders=[ok])}).of_kind("worker-duplicates")
