"""Lab 10 (model code that is not DDP-safe): runs, measurements, figures, claim check, exercises.

The notebook calls only these. Every number comes from a real 2-rank run (``ddplab.run``) of this
execution: DDP's own error for an unused head and the step time of its two fixes; BatchNorm running
statistics across non-IID ranks; where each rank waits when rank 0 evaluates through the wrapper;
the largest parameter difference across ranks per step; what DDP's broadcast at construction equalises; the devices
article 002's custom layer meets under DataParallel (real only on 2+ GPUs, else an emulation).
"""
from __future__ import annotations

from typing import Mapping

import ddplab
from ddplab.origins import catalog
from ddplab.course import claims
from ddplab.errors import DdplabError
from ddplab.course import answers
from ddplab.course import contract
from ddplab.course.notebook import Check, P_LEVEL, sign_test_p

LAB = "10"
SAME = 1e-6          # ranks "agree" when no element differs by more than this (float64)
EMULATION = ("an emulation of DataParallel's replicate() on one CPU (the meta device stands in for GPU 1), "
             "not nn.DataParallel on GPUs")


def sizes() -> dict:
    """The sizes the lab script declares in its LAB dict (read without importing torch)."""
    return catalog.find_lab(LAB).extra["sizes"]


def validate(**knobs) -> None:
    """Refuse an unknown knob before any rank starts (lab 10's script has none of its own)."""
    contract.validate_knobs(LAB, knobs, run_variant)


def run_variant(variant: str, **kw) -> "ddplab.RunResult":
    """One real 2-rank run of lab 10 (extra keywords go to ddplab.run)."""
    validate(**kw)
    names = [v.name for v in catalog.find_lab(LAB).variants]
    if variant not in names:
        raise DdplabError(f"lab 10 has no variant {variant!r}", hint=f"use one of {', '.join(names)}")
    return ddplab.run(LAB, variant=variant, **kw)


def _need(r, event: str, variant: str) -> list[dict]:
    rows = r.records_of(event)
    if r.variant != variant or not rows:
        raise ValueError(f"pass the {variant} run (got {r.variant}, {r.status}, without {event!r} records)")
    return rows


# ------------------------------------------------------------------------------------------------
# Reading the measurements out of results
# ------------------------------------------------------------------------------------------------

def failing_step(r) -> dict[int, int]:
    """unused-params: rank -> the training iteration (1-based) it was in when it raised."""
    if r.variant != "unused-params":
        raise ValueError(f"pass the unused-params run (got {r.variant})")
    out = {}
    for rk in r.ranks:
        steps = [x["step"] for x in rk.records if x["event"] == "step_start"]
        if rk.error is not None and steps:
            out[rk.rank] = steps[-1]
    return out


def unused_cost(r) -> dict[str, dict]:
    """unused-fixed: config -> median ms per step (mean of the ranks' medians), whether the unused
    head got a gradient / changed, and the spread of the parameters across ranks."""
    out: dict[str, dict] = {}
    for x in _need(r, "unused_cost", "unused-fixed"):
        o = out.setdefault(x["config"], {"ms": [], "aux_got_grad": False, "aux_trained": False, "params_spread": 0.0})
        o["ms"].append(x["ms_per_step"])
        o["aux_got_grad"] |= x["aux_got_grad"]
        o["aux_trained"] |= x["aux_trained"]
        o["params_spread"] = max(o["params_spread"], x["params_spread"])
    for o in out.values():
        o["ms_per_step"] = sum(o["ms"]) / len(o["ms"])
    return out


REFERENCE = "all params used (reference)"


def slowdown(r) -> dict[str, float]:
    """Each fix's ms per step over the reference model's (which uses every parameter)."""
    c = unused_cost(r)
    return {k: v["ms_per_step"] / c[REFERENCE]["ms_per_step"] for k, v in c.items() if k != REFERENCE}


def slower_rounds(r, config: str = "find_unused_parameters=True") -> tuple[int, int]:
    """(rounds in which ``config``'s step was slower than the reference's, rounds): each round runs
    every config back to back, so a round is one paired comparison under the same machine load; a
    round's figure is the mean over ranks of each rank's median step in it."""
    by: dict[str, list[list[float]]] = {}
    for x in _need(r, "unused_cost", "unused-fixed"):
        by.setdefault(x["config"], []).append(x["round_ms"])
    mean = {k: [sum(col) / len(col) for col in zip(*v)] for k, v in by.items()}
    pairs = list(zip(mean[config], mean[REFERENCE]))
    return sum(a > b for a, b in pairs), len(pairs)


def slowdown_part(r, config: str = "find_unused_parameters=True") -> "claims.Part":
    """The one statistic that says whether ``config`` costs time here: the sign test over the rounds
    (``slower_rounds``), at ``P_LEVEL``. The claim table and the notebook's sentence both read it."""
    return claims.test(sign_test_p(*slower_rounds(r, config)))


def slowdown_reading(r, config: str = "find_unused_parameters=True") -> str:
    """The notebook's sentence about ``config``'s cost, made from ``slowdown_part`` (never a fixed word
    like 'noise': whether a ratio is noise is what the test says on this machine's rounds)."""
    k, n = slower_rounds(r, config)
    part, ratio = slowdown_part(r, config), slowdown(r)[config]
    head = f"{config}: {ratio:.2f} x the reference's ms per step, slower in {k} of {n} rounds (sign test p = {part.p:.3f})"
    if part.state == claims.HOLDS:
        return f"{head}: at level {part.level:g} more rounds slower than chance gives: a cost measured on this machine"
    return (f"{head}: at level {part.level:g} not distinguishable from the machine's own variation between rounds "
            "(not shown to cost time here; not shown to be free either)")


def _vec_spread(rows: list[list[float]]) -> float:
    return max(abs(a - b) for a, b in zip(rows[0], rows[1])) if len(rows) == 2 else \
        max(max(col) - min(col) for col in zip(*rows))


def _max_abs(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def bn_summary(r) -> dict[str, dict]:
    """batchnorm: per mode (sync, local, averaged): the running mean's and var's spread across ranks,
    each rank's max |error| against the global batch's statistics (what SyncBatchNorm computes), the
    spread of the same eval batch's output across ranks; and whether rank 0's statistics equal the
    ones of rank 0's own data alone."""
    stats = _need(r, "bn_stats", "batchnorm")
    refs = {x["rank"]: x for x in r.records_of("bn_reference")}
    g = refs[0]
    out = {}
    for mode in ("sync", "local", "averaged"):
        rows = sorted((x for x in stats if x["mode"] == mode), key=lambda x: x["rank"])
        out[mode] = {
            "mean_spread": _vec_spread([x["running_mean"] for x in rows]),
            "var_spread": _vec_spread([x["running_var"] for x in rows]),
            "mean_error": {x["rank"]: _max_abs(x["running_mean"], g["global_mean"]) for x in rows},
            "var_error": {x["rank"]: _max_abs(x["running_var"], g["global_var"]) for x in rows},
            "eval_spread": rows[0]["eval_spread"],
            "own_data": {x["rank"]: _max_abs(x["running_mean"], refs[x["rank"]]["own_mean"]) <= 1e-5 for x in rows},
        }
    return out


def syncbn(r) -> dict:
    """batchnorm: what SyncBatchNorm did here (rank 0's record): ok on GPUs, PyTorch's error on CPU."""
    rows = [x for x in _need(r, "syncbn", "batchnorm") if x["rank"] == 0]
    return rows[0]


def waits(r) -> dict[int, dict]:
    """A hung run: rank -> where it waited (kind, op, via, the user's line)."""
    out = {}
    for rk in r.ranks:
        w = rk.where
        out[rk.rank] = {"state": rk.state, "kind": w.kind if w else None, "op": w.op if w else None,
                        "via": w.via if w else None,
                        "line": f"{w.frame.func}:{w.frame.line}" if w is not None and w.frame is not None else None}
    return out


def eval_losses(r) -> dict[str, float]:
    """eval-fixed: how -> validation loss (rank 0's record of each way)."""
    return {x["how"]: x["loss"] for x in _need(r, "eval", "eval-fixed") if x["rank"] == 0}


def replicas(r) -> list[dict]:
    """module-forward: per optimizer step (0 = after construction), the largest difference of any
    parameter across ranks, through model.module (broken) and through the wrapper (fixed)."""
    rows = [x for x in _need(r, "replicas", "module-forward") if x["rank"] == 0]
    return [{"step": x["step"], "broken": x["broken_spread"], "fixed": x["fixed_spread"]}
            for x in sorted(rows, key=lambda x: x["step"])]


def first_diverged_step(r) -> int | None:
    return next((x["step"] for x in replicas(r) if x["broken"] > SAME), None)


def rank_init(r) -> dict[str, dict]:
    """rank-init: case -> spreads across ranks (rank 0's record; every rank computed the same spreads)."""
    return {x["case"]: {k: x[k] for k in ("params_before", "params_after_construction", "params_after_training",
                                          "proj_after_training", "outputs_after_training")}
            for x in _need(r, "rank_init", "rank-init") if x["rank"] == 0}


def dp_layers(r) -> dict[str, dict]:
    """dp-custom-layer: layer -> mode, the (input, weight) device of each replica, error if any."""
    return {x["layer"]: x for x in _need(r, "dp_layer", "dp-custom-layer")}


def dp_mode(r) -> str:
    return _need(r, "dp_start", "dp-custom-layer")[0]["dp_mode"]


# ------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------

def plot_consequences(r_cost, r_bn, r_module, r_init):
    """Four measured consequences side by side (every bar and point is from this execution's runs)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    ax = axes[0][0]
    c = unused_cost(r_cost)
    names = list(c)
    ax.bar(range(len(names)), [c[n]["ms_per_step"] for n in names], color=["#6e7781", "#bf8700", "#0969da"])
    ax.set_xticks(range(len(names)), [n.replace(" (reference)", "\n(reference)").replace("=True", "=True\n(unused head)")
                                      for n in names], fontsize=8)
    ax.set_ylabel("median ms per training step")
    ax.set_title("unused-fixed: step time, 2 gloo ranks, 1 thread each", fontsize=10)

    ax = axes[0][1]
    bn = bn_summary(r_bn)
    modes = list(bn)
    for i, (what, key) in enumerate((("running_mean", "mean_error"), ("running_var", "var_error"))):
        for j, rank in enumerate((0, 1)):
            ax.bar([m + (2 * i + j - 1.5) * 0.2 for m in range(len(modes))], [bn[m][key][rank] for m in modes], 0.2,
                   label=f"{what}, rank {rank}", color=("#0969da", "#54aeff", "#bf8700", "#f2cc60")[2 * i + j])
    ax.set_xticks(range(len(modes)), ["buffer sync\n(DDP default)", "no buffer sync", "averaged by hand\n(all_reduce)"], fontsize=8)
    ax.set_ylabel("max |stat - global batch's stat|")
    ax.set_title("batchnorm: running stats vs the global batch's\n(the global batch's = what SyncBatchNorm computes)",
                 fontsize=10)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.45)   # headroom: the legend sits above the tallest bars, not on them
    ax.legend(fontsize=7, loc="upper center", ncol=2)

    ax = axes[1][0]
    rows = replicas(r_module)
    floor = 1e-12
    ax.plot([x["step"] for x in rows], [max(x["broken"], floor) for x in rows], "-o", color="#cf222e",
            label="forward through model.module (broken)")
    ax.plot([x["step"] for x in rows], [max(x["fixed"], floor) for x in rows], "-s", color="#1a7f37",
            label="forward through the DDP wrapper")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step (0 = after DDP construction)")
    ax.set_ylabel("max |parameter rank 0 - rank 1|")
    ax.set_title(f"module-forward: replicas across ranks (bottom line: <= {floor:g}, equal)", fontsize=10)
    ax.legend(fontsize=8)

    ax = axes[1][1]
    ri = rank_init(r_init)
    cases = list(ri)
    keys = (("params_before", "params before DDP"), ("params_after_construction", "params after DDP()"),
            ("params_after_training", "params after training"), ("proj_after_training", "plain attribute / buffer"),
            ("outputs_after_training", "outputs on one batch"))
    for j, (k, label) in enumerate(keys):
        ax.bar([i + (j - 2) * 0.16 for i in range(len(cases))], [max(ri[cs][k], floor) for cs in cases], 0.16, label=label)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)), cases, fontsize=8)
    ax.set_ylabel("max |rank 0 - rank 1|")
    ax.set_title(f"rank-init: what differs across ranks (bottom: <= {floor:g}, equal)", fontsize=10)
    lo, hi = ax.get_ylim()
    ax.set_ylim(top=hi * (hi / lo) ** 0.45)   # log axis: headroom for the legend above the tallest bars
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    fig.suptitle("Measured in this execution (2 gloo ranks on CPU); nothing here is modelled", fontsize=11)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------
# Claim check and exercises
# ------------------------------------------------------------------------------------------------

def claim_inputs(runs: Mapping[str, "ddplab.RunResult"]) -> claims.Inputs:
    """What these runs measured for the register's claims (ddplab.course.claim_register); judged there. Keys
    read (variant names): "unused-params", "unused-fixed", "eval-rank0", "eval-fixed", "module-forward",
    "rank-init", "dp-custom-layer"."""
    r_unused, r_cost, r_eval, r_eval_fixed = runs["unused-params"], runs["unused-fixed"], runs["eval-rank0"], runs["eval-fixed"]
    r_module, r_init, r_dp = runs["module-forward"], runs["rank-init"], runs["dp-custom-layer"]
    w = waits(r_eval)
    deadlock = (r_eval.status == "hung" and all(x["kind"] == "collective" for x in w.values()))
    rows = replicas(r_module)
    diverged = r_module.status == "ok" and rows[-1]["broken"] > SAME
    sd = slowdown(r_cost)
    k, n = slower_rounds(r_cost)
    err = r_unused.cause
    runtime_error = (r_unused.status == "failed" and err is not None and err.type == "RuntimeError"
                     and r_unused.signature == "unused-parameters")
    ri = rank_init(r_init)
    seeded, reinit, fixed = ri["rank-seeded"], ri["reinit-after-wrap"], ri["fixed"]
    ok_init = r_init.status == "ok"
    layers = dp_layers(r_dp)
    art = layers["nn.Parameter (article)"]
    reps = ", ".join(f"{x['input']}/{x['weight']}" for x in art["replicas"])
    dp_measured = (f"{art['dp_mode']}: the article's layer in {len(art['replicas'])} replica(s), input/weight devices "
                   f"{reps}; error: {art['error'] or 'none'}")
    off_device = (claims.fact((not art["same_device"]) or art["error"] is not None) if dp_mode(r_dp) == "real"
                  else claims.stand_in(EMULATION))
    return claims.Inputs(LAB, {
        "manifestations": claims.evidence(
            f"eval-rank0: {r_eval.status} [{r_eval.signature}], rank 0 in {w[0]['op']} via {w[0]['via']}, rank 1 in "
            f"{w[1]['op']}; module-forward: {r_module.status}, max |parameter difference| across ranks after step {rows[-1]['step']}: "
            f"{rows[-1]['broken']:.2e} (through the wrapper: {rows[-1]['fixed']:.1e}); find_unused_parameters=True: "
            f"{sd['find_unused_parameters=True']:.2f} x the reference's ms per step, slower in {k} of {n} rounds "
            f"(sign test p = {sign_test_p(k, n):.3f}; static_graph=True: {sd['static_graph=True']:.2f} x); "
            f"unused-params: {r_unused.status}, "
            f"{err.type + ': ' + err.message.split('.')[0] if err else 'no error'}. rank-init ({r_init.status}): seeded by rank, parameter spread before DDP {seeded['params_before']:.2e}, "
            f"after construction {seeded['params_after_construction']:.1e}, after training "
            f"{seeded['params_after_training']:.1e}; plain tensor attribute after training "
            f"{seeded['proj_after_training']:.2e}; re-initialised after wrapping: parameters "
            f"{reinit['params_after_training']:.2e}; fixed (one seed, a buffer, init before wrapping): parameters "
            f"{fixed['params_after_training']:.1e}, outputs {fixed['outputs_after_training']:.1e}",
            deadlock=deadlock, states_apart_past_the_wrapper=diverged,
            states_apart_from_rank_init=ok_init and (seeded["proj_after_training"] > SAME
                                                     or reinit["params_after_training"] > SAME),
            slow_training=slowdown_part(r_cost), runtime_error=runtime_error),
        "custom-loop-deadlock": claims.evidence(
            f"eval-rank0: {r_eval.status} [{r_eval.signature}]: rank 0 at {w[0]['line']} in {w[0]['op']} "
            f"({w[0]['via']}), rank 1 at {w[1]['line']} in {w[1]['op']}; eval-fixed (model.module under no_grad): "
            f"{r_eval_fixed.status}",
            eval_on_rank0_deadlocks=deadlock and w[0]["via"] == "ddp-forward-buffers",
            eval_on_module_completes=r_eval_fixed.status == "ok"),
        "device-affinity": claims.evidence(dp_measured, weight_off_device=off_device),
    })


def _failing_iteration(r_unused) -> list[int]:
    steps = set(failing_step(r_unused).values())
    return sorted(steps) if len(steps) == 1 else []


@answers.exercise("unused-iteration", answers.Whole(1, 1000, "an iteration number (1, 2, 3, ...)", label="iteration"),
                  accepted=_failing_iteration, name="answer_iteration")
def check_unused_iteration(answer: int, r_unused) -> Check:
    """Exercise "unused-iteration" (predicted before the unused-params run): in which training iteration
    (1, 2, 3, ...) does DDP raise because the aux head got no gradient? Checked against every rank's
    last step_start record before its error."""
    if not failing_step(r_unused):
        return Check(False, "the run has no rank that raised; pass the unused-params run")
    if answer in _failing_iteration(r_unused):
        return Check(True, f"iteration {answer} on every rank: iteration 1 runs to the end; the reducer only "
                           f"finds out at the next forward that it never finished reducing")
    return Check(False, f"not iteration {answer}: read the error's first sentence ('... in the prior iteration') and "
                        "ask which forward call is the first that can notice the previous one never finished")


def _rank0_op(r_eval) -> list[str]:
    w = waits(r_eval)
    return [w[0]["op"]] if r_eval.status == "hung" and 0 in w and w[0]["op"] else []


@answers.exercise("eval-op", answers.collective(), accepted=_rank0_op, name="answer_eval_op")
def check_eval_op(answer: str, r_eval) -> Check:
    """Exercise "eval-op" (predicted before the eval-rank0 run): in which collective is rank 0 blocked
    (its torch.distributed name, e.g. "all_gather")? Checked against rank 0's where.op."""
    w = waits(r_eval)
    if not _rank0_op(r_eval):
        return Check(False, "pass the eval-rank0 run: it must be hung with rank 0 in a collective")
    if answer == w[0]["op"]:
        return Check(True, f"rank 0 waits in {w[0]['op']} (via {w[0]['via']}): DDP's forward broadcasts the "
                           f"BatchNorm buffers from rank 0, while rank 1 waits in {w[1]['op']}")
    if answer == w.get(1, {}).get("op"):
        return Check(False, f"{answer!r} is where rank 1 waits, not rank 0: rank 0 never reached that line. "
                            "What does DDP's forward do before it calls the module's forward?")
    return Check(False, f"not {answer!r}: look at rank 0's stack in the run's diagnosis: which DDP method sits "
                        "between model(x) and the collective, and what does it send?")


def _bn_source(r_bn) -> list[int]:
    own = bn_summary(r_bn)["sync"]["own_data"]
    return [k for k in (0, 1) if own.get(k)]


@answers.exercise("bn-source-rank", answers.Rank(2), accepted=_bn_source, name="answer_bn_rank")
def check_bn_source_rank(answer: int, r_bn) -> Check:
    """Exercise "bn-source-rank" (predicted before the batchnorm run): with DDP's buffer sync on (the
    default), the running_mean rank 0 ends with (the one a rank-0 checkpoint saves) reflects the data of
    which rank only? Checked by comparing it with each rank's own-data statistics."""
    if answer in _bn_source(r_bn):
        return Check(True, f"rank {answer}'s own data only: at every forward DDP overwrites the other ranks' buffers "
                           f"with rank {answer}'s, so nothing they saw reaches its statistics (measured: equal to a "
                           f"BatchNorm fed rank {answer}'s batches alone)")
    return Check(False, f"not rank {answer}: which way does DDP's buffer broadcast go, from which rank to which, and "
                        "when in the step does it happen?")


EXERCISES = answers.exercises(check_unused_iteration, check_eval_op, check_bn_source_rank)
