"""Lab 12 and `ddplab run --check`, on real 2-rank gloo jobs: each broken variant reported with its
finding, each fix clean, the same job bit for bit with and without the check, learner scripts after
real reports of silent divergence, and the cases --check cannot see ("not checked", "nothing to check")."""
from pathlib import Path

import pytest

from ddplab.views.render_check import finding_sentence
from conftest import assert_nothing_left

import ddplab
from ddplab import DdplabError
from ddplab.engine.check import KINDS, CheckReport, Finding, compare_records
from ddplab.cli import main as cli_main
from ddplab.result import RunResult
from ddplab.course import lab12

import exercise_cases
import notebook_check
from burner import LOADS, judged_runs
from notebook_check import test_notebook_executes_once_and_its_checked_cells_match  # noqa: F401
from fixit_check import test_the_notebooks_unfixed_attempt_is_graded_not_yet  # noqa: F401

SCRIPTS = Path(__file__).resolve().parent / "scripts"
# each script after a real report, and the findings --check must give for it (all of them, no more)
SILENT = {
    "sampler_no_set_epoch.py": {"same-order"},      # its DataLoader's drop_last leaves 1 row per rank: by design
    "accumulate_off_by_one.py": {"step-in-no-sync", "replicas-differ"},
    "bn_broadcast_buffers_false.py": {"buffers-differ"},
    "set_epoch_per_rank.py": {"samples-overlap", "samples-dropped"},
    "full_dataset_every_rank.py": {"samples-overlap"},   # its inputs are the same too: one finding, the loader's
    "same_seed_random_batches.py": {"same-inputs"},       # no loader: the inputs DDP's forward got
    "optimizer_before_fsdp_wrap.py": {"steps-without-gradients"},   # FSDP: replicas not compared, steps are
    "each_rank_own_model.py": {"model-not-wrapped"},     # no wrapper: the optimizer's parameters compared
}


# the lab's notebook, executed once here; its runs serve the fixtures below
notebook = notebook_check.notebook_fixture("12")


@pytest.fixture(scope="module")
def runs(notebook, tmp_path_factory):
    """One real checked run of every lab 12 variant: the notebook's own where it made it (loaded
    from its result.json), else started here."""
    root = tmp_path_factory.mktemp("lab12")
    out = {v: notebook.run_of(v, check=True) or lab12.run_variant(v, run_root=root, progress=None)
           for pair in lab12.pairs() for v in pair}
    assert all(r.leftover == () for r in out.values())
    assert_nothing_left(str(root))
    return out


def test_an_unknown_variant_is_rejected_before_any_rank_starts(tmp_path):
    with pytest.raises(DdplabError) as e:
        lab12.run_variant("no-set-epochs", run_root=tmp_path)
    assert "no-set-epoch" in e.value.hint
    assert not any(tmp_path.iterdir())


@pytest.mark.multiprocess
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("variant", list(lab12.broken_variants()))
def test_each_broken_variant_ends_ok_and_check_names_its_finding(runs, variant):
    r = runs[variant]
    want = lab12.broken_variants()[variant]
    assert r.status == "ok" and r.check is not None and r.check.nothing is None
    assert want in r.check.kinds(), (variant, r.check.kinds())
    f = r.check.of_kind(want)[0]
    assert f.ranks and f.object and f.fix
    assert "ok, but" in r.explain() and f.fix in r.explain()      # the terminal view shows it
    assert "ok, but" in r._repr_html_()


@pytest.mark.multiprocess
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("variant", [f for _, f in lab12.pairs()])
def test_each_fix_is_reported_clean(runs, variant):
    r = runs[variant]
    assert r.status == "ok" and r.check.clean, (variant, r.check.findings)
    assert r.check.models == 1 and r.check.checksums >= 2 and r.check.loader_epochs >= 1
    assert lab12.final(r)["replicas_identical"]


@pytest.mark.multiprocess
@pytest.mark.timeout(1200)
def test_findings_name_rank_step_and_object(runs):
    mu = runs["module-update"].check
    bypass = mu.of_kind("update-outside-ddp")[0]
    assert bypass.ranks == (0,) and bypass.step is not None and bypass.count >= 1
    drift = mu.of_kind("replicas-differ")[0]
    assert drift.ranks == (1,) and drift.object.startswith(("body.", "head.")) and drift.since_equal is not None
    bn = runs["bn-unsynced"].check
    assert bn.kinds() == {"buffers-differ"} and "running_" in bn.findings[0].object
    ns = runs["step-in-no-sync"].check.of_kind("step-in-no-sync")[0]
    assert ns.ranks == (0, 1) and ns.count == ns.of          # every step of the run
    rs = runs["rank-split"].check
    over, never = rs.of_kind("samples-overlap")[0], rs.of_kind("samples-dropped")[0]
    assert over.epoch == 0 and 0 < over.count < over.of == 512 and 0 < never.count < 512
    so = runs["no-set-epoch"].check.of_kind("same-order")[0]
    assert so.ranks == (0, 1) and so.epoch == 1 and so.count == so.of - 1


@pytest.mark.multiprocess
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("variant", ["rank-split", "step-in-no-sync-fixed", "module-update"])
def test_check_changes_nothing_the_job_computes(runs, variant, tmp_path):
    """The same variant without --check: every rank's final parameters and buffers (sha256 of their
    bytes) and every validation number are the same, bit for bit."""
    plain = lab12.run_variant(variant, check=False, run_root=tmp_path, progress=None)
    checked = runs[variant]
    assert plain.check is None and plain.status == "ok"
    sha = lambda r: {d["rank"]: d["sha256"] for d in r.records_of("done")}
    assert sha(plain) == sha(checked) and len(sha(plain)) == 2
    assert lab12.curves(plain) == lab12.curves(checked)
    assert not (Path(plain.run_dir) / "ranks" / "rank0.check.json").exists()


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize("script", sorted(SILENT))
def test_learner_scripts_after_real_reports(script, tmp_path):
    r = ddplab.run(SCRIPTS / "silent" / script, check=True, run_root=tmp_path, progress=None)
    assert r.status == "ok", r.explain()
    assert r.check.kinds() == SILENT[script], r.explain()
    assert_nothing_left(str(tmp_path))


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_no_process_group_gives_the_run_and_one_line(tmp_path, capsys):
    code = cli_main(["run", str(SCRIPTS / "check" / "no_process_group.py"), "--check", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("nothing to check: no process group") == 1 and ": ok " in out


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("script,why", [("fsdp.py", "fsdp")])
def test_what_check_cannot_see_is_said(script, why, tmp_path):
    r = ddplab.run(SCRIPTS / "check" / script, check=True, run_root=tmp_path, progress=None)
    assert r.status == "ok" and r.check.nothing is None and not r.check.findings
    assert [n.why for n in r.check.not_checked] == [why]
    assert "not checked: " in r.explain()


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_a_model_no_wrapper_holds_is_compared_by_its_optimizer(tmp_path):
    # gradients averaged by hand: no DDP model, but the optimizer's parameters are compared, and equal
    r = ddplab.run(SCRIPTS / "check" / "hand_averaged.py", check=True, run_root=tmp_path, progress=None)
    assert r.status == "ok" and r.check.clean and r.check.own_models == 1 and not r.check.not_checked, r.explain()
    assert "the parameters of 1 optimizer(s) compared" in r.explain()


# --- the comparison itself, on records as the rank hook writes them ------------------------------

def _rank(**over):
    base = {"every": 10, "process_group": True, "fsdp": [], "steps": 4, "unwrapped_steps": 0, "errors": [],
            "models": [], "loaders": []}
    return {**base, **over}


def _loader(indices_per_epoch, **over):
    rec = {"index": 0, "dataset": "TensorDataset", "size": 10, "length": 10, "subset": False, "subset_digest": None,
           "sampler": "DistributedSampler", "distributed": True, "shuffle": True, "drop_last": False,
           "num_replicas": 2, "batch_size": 5, "loader_drop_last": False,
           "epochs": [{"sampler_epoch": e, "indices": ix, "complete": True, "truncated": False,
                       "forwards_start": 0, "forwards_end": 1} for e, ix in enumerate(indices_per_epoch)]}
    return {**rec, **over}


def test_distributed_sampler_padding_is_not_an_overlap():
    # 9 samples on 2 ranks: DistributedSampler pads rank 1 with sample 0 again (by design)
    recs = {0: _rank(loaders=[_loader([[0, 2, 4, 6, 8]], size=9, length=9)]),
            1: _rank(loaders=[_loader([[1, 3, 5, 7, 0]], size=9, length=9)])}
    assert compare_records(recs).findings == ()
    recs[1]["loaders"][0]["epochs"][0]["indices"] = [1, 3, 5, 0, 2]      # two repeats: one more than padding
    assert compare_records(recs).kinds() == {"samples-overlap", "samples-dropped"}


def test_validation_loaders_are_not_training_data():
    ep = {"forwards_start": 3, "forwards_end": 3}      # no DDP forward with grad while it was iterated
    recs = {r: _rank(loaders=[_loader([list(range(10))])]) for r in (0, 1)}
    for r in recs.values():
        r["loaders"][0]["epochs"][0].update(ep)
    rep = compare_records(recs)
    assert rep.findings == () and rep.loader_epochs == 0


def test_no_records_and_no_process_group():
    assert compare_records({}).nothing == "no-records"
    assert compare_records({0: _rank(process_group=False), 1: _rank(process_group=False)}).nothing == "no-process-group"


def test_report_survives_result_json(tmp_path):
    rep = CheckReport(10, (Finding("same-order", (0, 1), "DataLoader over X[4]", epoch=1, count=2, of=3),), (), None,
                      (0, 1), 1, 3, 3)
    assert CheckReport.from_dict(rep.to_dict()) == rep
    assert set(f.kind for f in rep.findings) <= set(KINDS)
    r = RunResult("x", None, 2, "ok", None, None, (), 1.0, str(tmp_path), (), check=rep)
    r.save()
    assert RunResult.load(tmp_path).check == rep


# --- claims and exercises -------------------------------------------------------------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(1200)
def test_claim_rows_are_computed_from_the_runs(runs):
    from ddplab.course import claims
    inputs = lab12.claim_inputs(runs)
    assert set(inputs.rows) == {c.key for c in claims.for_lab("12") if "12" in c.parts}
    v = {k: claims.judge_alone(k, "12", e).verdict for k, e in inputs.rows.items()}
    # lab 12's own parts of sampler-reset hold; with lab 08's not measured the row alone is "partly"
    assert all(p.state == "holds" for p in inputs.rows["sampler-reset"].parts.values())
    assert v["accumulation-misuse"] == "partly"            # data corruption is not examined
    # DDP averages every gradient: rank-split leaves the replicas equal, but bn-unsynced's ranks, each reading its
    # own source, end with different buffers: 'can cause ... divergence' is shown; lab 03's part is not run here
    assert inputs.rows["uneven-data"].parts["replicas_diverge"].state == "holds" and v["uneven-data"] == "partly"


JUDGED = ("bn-unsynced", "module-update")     # the runs the two checkers judge


@pytest.fixture(scope="module", params=LOADS)
def judged(request, tmp_path_factory):
    """The runs the exercise checkers judge: the notebook's (idle: no new run), and again with a CPU burner
    beside them (issue 34: a right answer passes on a loaded machine too)."""
    return judged_runs(request, tmp_path_factory, lab12.run_variant, JUDGED, "lab12")


@pytest.mark.multiprocess
@pytest.mark.timeout(1200)
def test_check_bn_finding(judged):
    r = judged["bn-unsynced"]
    right = lab12.check_bn_finding.accepted(r)
    assert right == ["buffers-differ"]                 # what this run found, and only that
    exercise_cases.check_all(lab12.check_bn_finding, r,
                             right=["buffers-differ", " buffers-differ ", "BUFFERS-DIFFER", "buffers_differ"],
                             neighbour="replicas-differ", shown="samples-overlap",
                             wrong=["same-order", "buffers", "buffers-differs"])
    # no answer in the hint
    assert "buffers-differ" not in lab12.check_bn_finding._verdict("replicas-differ", r).message


@pytest.mark.multiprocess
@pytest.mark.timeout(1200)
def test_check_bypass_rank(judged):
    r = judged["module-update"]
    right = lab12.check_bypass_rank.accepted(r)
    assert right == [0]                                # the script's # BROKEN line: rank 0 steps through .module
    exercise_cases.check_all(lab12.check_bypass_rank, r, right=0, neighbour=-1, other_rank=1, shown=2,
                             wrong=[2, "0", 0.5])


@pytest.mark.multiprocess
@pytest.mark.timeout(1200)
def test_checkers_refuse_the_fixed_runs(runs):
    assert not lab12.check_bn_finding._verdict("buffers-differ", runs["bn-unsynced-fixed"]).passed   # the other run
    assert not lab12.check_bypass_rank._verdict(0, runs["module-update-fixed"]).passed


def _model(**over):
    m = {"index": 0, "names": ["w", "b"], "buffer_names": [], "sync_buffers": True, "forwards": 4, "steps": 2,
         "checkpoints": [{"kind": "construct", "fwd": 0, "step": 0, "params": [1, 2], "buffers": []}],
         "unsynced_steps": [], "bypass_steps": [], "accum": [2, 2], "no_grad": {}, "final": None}
    return {**m, **over}


def test_unequal_accumulation_and_a_gradient_missing_on_one_rank():
    recs = {0: _rank(models=[_model()]), 1: _rank(models=[_model(accum=[2, 3], no_grad={"b": [1, 1]})])}
    rep = compare_records(recs)
    acc, miss = rep.of_kind("unequal-accumulation")[0], rep.of_kind("grad-missing")[0]
    assert acc.ranks == (1,) and acc.step == 1 and acc.count == 1
    assert miss.ranks == (1,) and miss.object == "b" and miss.step == 1
    recs[0]["models"][0]["no_grad"] = {"b": [1, 1]}        # unused on every rank alike: not a divergence
    assert "grad-missing" not in compare_records(recs).kinds()


def test_replicas_first_differing_step_and_tensor():
    cp = lambda fwd, step, params: {"kind": "forward", "fwd": fwd, "step": step, "params": params, "buffers": []}
    base = [cp(1, 0, [1, 2]), cp(11, 10, [3, 4]), cp(21, 20, [5, 6])]
    other = [cp(1, 0, [1, 2]), cp(11, 10, [3, 4]), cp(21, 20, [5, 7])]
    rep = compare_records({0: _rank(models=[_model(checkpoints=base)]), 1: _rank(models=[_model(checkpoints=other)])})
    f = rep.of_kind("replicas-differ")[0]
    assert (f.ranks, f.step, f.since_equal, f.object, f.count, f.of) == ((1,), 20, 10, "b", 1, 2)


def test_steps_without_gradients_only_when_no_step_of_any_rank_had_one():
    recs = {r: _rank(steps=5, gradless_steps=5) for r in (0, 1)}
    f = compare_records(recs).of_kind("steps-without-gradients")[0]
    assert (f.ranks, f.count, f.of) == ((0, 1), 5, 5) and "nothing trained" in finding_sentence(f)
    recs[1]["gradless_steps"] = 4            # one step of one rank had a gradient: something trained
    assert "steps-without-gradients" not in compare_records(recs).kinds()
    none = {r: _rank(steps=0, gradless_steps=0) for r in (0, 1)}     # no step at all: nothing to say
    assert "steps-without-gradients" not in compare_records(none).kinds()


def test_final_buffers_are_compared_only_where_ddp_never_syncs_them():
    fin = lambda bufs: {"kind": "final", "fwd": 8, "step": 8, "params": [1, 2], "buffers": bufs}
    recs = {0: _rank(models=[_model(sync_buffers=False, buffer_names=["bn.running_mean"], final=fin([3]))]),
            1: _rank(models=[_model(sync_buffers=False, buffer_names=["bn.running_mean"], final=fin([4]))])}
    f = compare_records(recs).of_kind("buffers-differ")[0]
    assert (f.ranks, f.object, f.step) == ((1,), "bn.running_mean", 8)
    # with the sync on, the last forward leaves each rank's buffers its own by design: nothing to name
    for r in recs.values():
        r["models"][0]["sync_buffers"] = True
    assert compare_records(recs).findings == ()
    # sync off and the same stats on every rank (the same data): nothing either
    for r in recs.values():
        r["models"][0].update(sync_buffers=False, final=fin([3]))
    assert compare_records(recs).findings == ()


def test_same_inputs_only_when_every_rank_got_the_same_changing_batches():
    cp = lambda fwd, inputs: {"kind": "forward", "fwd": fwd, "step": fwd // 10, "params": [1], "buffers": [],
                              "inputs": inputs}
    same = [cp(1, [5, 6]), cp(11, [7, 8]), cp(21, [9, 1])]
    recs = {r: _rank(models=[_model(checkpoints=list(same))]) for r in (0, 1)}
    f = compare_records(recs).of_kind("same-inputs")[0]
    assert (f.ranks, f.step, f.count, f.of) == ((0, 1), 0, 3, 3)
    assert "bit-identical inputs" in finding_sentence(f) and "seed" in f.fix
    # right: one checked forward where rank 1's batch differs is enough to name nothing
    recs[1]["models"][0]["checkpoints"][2] = cp(21, [9, 2])
    assert "same-inputs" not in compare_records(recs).kinds()
    # adversarial: one fixed tensor fed to every rank at every step (a constant stand-in, not a stream)
    fixed = {r: _rank(models=[_model(checkpoints=[cp(1, [5]), cp(11, [5]), cp(21, [5])])]) for r in (0, 1)}
    assert compare_records(fixed).findings == ()
    # one checked forward is too little to say
    one = {r: _rank(models=[_model(checkpoints=[cp(1, [5, 6])])]) for r in (0, 1)}
    assert compare_records(one).findings == ()


def _wrap(s, sync=False, written=False):
    return {"index": 0, "sum": s, "sync_module_states": sync, "written_before_training": written}


def test_init_differs_only_when_fsdp_sharded_unequal_weights_and_trained_from_them():
    recs = {0: _rank(fsdp=["FullyShardedDataParallel"], fsdp_wraps=[_wrap(11)]),
            1: _rank(fsdp=["FullyShardedDataParallel"], fsdp_wraps=[_wrap(12)])}
    f = compare_records(recs).of_kind("init-differs")[0]
    assert (f.ranks, f.object) == ((1,), "FSDP-wrapped model #0")
    assert "different initial weights" in finding_sentence(f) and "same seed" in f.fix
    same = {r: _rank(fsdp_wraps=[_wrap(11)]) for r in (0, 1)}                     # right: equal weights
    assert "init-differs" not in compare_records(same).kinds()
    synced = {0: _rank(fsdp_wraps=[_wrap(11, sync=True)]), 1: _rank(fsdp_wraps=[_wrap(12, sync=True)])}
    assert "init-differs" not in compare_records(synced).kinds()                  # rank 0's weights sent out
    loaded = {0: _rank(fsdp_wraps=[_wrap(11, written=True)]), 1: _rank(fsdp_wraps=[_wrap(12, written=True)])}
    assert "init-differs" not in compare_records(loaded).kinds()                  # a checkpoint loaded over them
    untrained = {0: _rank(fsdp_wraps=[_wrap(11, written=None)]), 1: _rank(fsdp_wraps=[_wrap(12, written=None)])}
    assert "init-differs" not in compare_records(untrained).kinds()               # never trained from them
    unknown = {0: _rank(fsdp_wraps=[_wrap(None)]), 1: _rank(fsdp_wraps=[_wrap(12)])}
    assert "init-differs" not in compare_records(unknown).kinds()                 # a checksum that failed
    assert "init-differs" not in compare_records({0: _rank(fsdp_wraps=[_wrap(11)]), 1: _rank()}).kinds()


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode,found", [("same-seed", set()), ("seed-per-rank", {"init-differs"}),
                                        ("loaded", set()), ("no-set-epoch", {"same-order"})])
def test_check_on_fsdp_names_unequal_weights_and_the_same_order(mode, found, tmp_path):
    # FSDP1 shards what each rank built (pytorch/pytorch#75870); its forwards count as training for the
    # loaders as DDP's do (the FSDP tutorial's missing set_epoch, yangkky/distributed_tutorial#5)
    r = ddplab.run(SCRIPTS / "check" / "fsdp_init.py", args=["--mode", mode], check=True, run_root=tmp_path,
                   progress=None)
    assert r.status == "ok" and r.check.kinds() == found, r.explain()
    assert [n.why for n in r.check.not_checked] == ["fsdp"]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_figure_shows_each_runs_curves_and_what_check_found(runs):
    """Lab 12's figure: the top panel's lines are the ranks' own validation records, the bottom panel's
    bars what --check counted for the pair's finding: the broken run's harm against the fix's none."""
    import matplotlib.pyplot as plt

    runs = {v: runs[v] for v in ("bn-unsynced", "bn-unsynced-fixed")}
    fig = lab12.plot(runs)
    top, bottom = fig.axes[0], fig.axes[1]
    lines = [list(line.get_ydata()) for line in top.get_lines()]
    assert lines == [[p["val_loss"] for p in c] for v in runs for c in lab12.curves(runs[v]).values()]
    heights = [p.get_height() for p in bottom.patches]
    assert heights == [lab12.harm(runs[v], "buffers-differ") for v in runs]
    assert heights[0] > 0 and heights[1] == 0
    plt.close(fig)
