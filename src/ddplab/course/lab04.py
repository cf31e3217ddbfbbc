"""Lab 04 (padded variable-length sequences): the runs, summaries, plots, claim check and exercise
checkers that notebooks/04_padding.ipynb shows. Every number comes from a run made in the same
execution. Without 2 GPUs the DataParallel runs are an EMULATION of DataParallel's steps on CPU, and
everything shown from them says so."""
from __future__ import annotations

import statistics
from typing import Mapping

import ddplab
from ddplab.errors import DdplabError
from ddplab.course import answers, claims
from ddplab.course import contract
from ddplab.course.notebook import Check
from ddplab.result import RunResult

LAB = "04"
KNOBS = contract.declared(LAB)         # the script's knobs, read by ast (no torch)
DP_MODES = tuple(KNOBS["dp"]["choices"])
DP_VARIANTS = ("article-example1", "dp-broken", "dp-fixed", "pinned-layer")
EMULATION = ("an emulation of DataParallel on CPU (Tensor.chunk, a replica per chunk, torch.cat; no GPUs), "
             "not nn.DataParallel: it cannot show what DataParallel itself does")


def gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # pragma: no cover - torch missing
        return 0


def validate_dp(dp: str, replicas: int = 2) -> None:
    """Reject a DataParallel mode this machine cannot run, before any rank starts."""
    if dp not in DP_MODES:
        raise DdplabError(f"dp={dp!r} is not a DataParallel mode", hint=f"use one of: {', '.join(DP_MODES)}")
    if replicas not in KNOBS["replicas"]["choices"]:
        raise DdplabError(f"replicas={replicas!r} is not supported", hint="use replicas=2 (or 3, 4 with that many GPUs)")
    have = gpu_count()
    if dp == "real" and have < replicas:
        raise DdplabError(f"dp='real' needs {replicas} CUDA GPUs for nn.DataParallel, this machine has {have}",
                          hint="use dp='emulation' (or 'auto'), which runs DataParallel's steps on CPU")


def validate(**knobs) -> None:
    """Refuse a bad request before any rank starts: a DataParallel mode this machine cannot run,
    an unknown knob or a value the script's declaration refuses."""
    validate_dp(knobs.get("dp", KNOBS["dp"]["default"]), knobs.get("replicas", KNOBS["replicas"]["default"]))
    contract.validate_knobs(LAB, knobs, run_variant)


def run_variant(variant: str, **kw) -> RunResult:
    """One real run of labs/04_padding.py through ddplab.run (2 ranks)."""
    validate(**kw)
    args, kw = contract.script_args(LAB, kw)
    return ddplab.run(LAB, variant=variant, args=args, **kw)


# ---- DataParallel ------------------------------------------------------------------------------
def dp_label(r: RunResult) -> str:
    start = r.records_of("dp_start") or r.records_of("pinned_start")
    if not start:
        return "unknown"
    return "real nn.DataParallel" if start[0]["dp_mode"] == "real" else "emulation of DataParallel on CPU"


def dp_summary(r: RunResult) -> dict:
    """Per step: the batch's padded length, each chunk's longest sequence, what each replica returned."""
    shapes = [rec["shapes"] for rec in r.records_of("replica_outputs")]
    steps = []
    for i, b in enumerate(r.records_of("dp_batch")):
        done = [s for s in r.records_of("dp_step") if s["step"] == b["step"]]
        steps.append({"step": b["step"], "padded_len": b["padded_len"], "chunk_max_lengths": b["chunk_max_lengths"],
                      "replica_out_lengths": [s[1] for s in shapes[i]] if i < len(shapes) else None,
                      "gathered": done[0]["out_shape"] if done else None,
                      "max_abs_diff_vs_single": done[0]["max_abs_diff_vs_single"] if done else None})
    failed_at = next((s["step"] for s in steps if s["gathered"] is None), None)
    return {"label": dp_label(r), "status": r.status, "signature": r.signature, "steps": steps,
            "steps_done": sum(s["gathered"] is not None for s in steps), "failed_at_step": failed_at}


def print_dp(r: RunResult) -> None:
    """Only deterministic facts (nbval compares this output)."""
    s = dp_summary(r)
    print(f"[{s['label']}] {r.variant}: {r.status} {r.signature or ''}".rstrip())
    for st in s["steps"]:
        got = f"gathered {st['gathered']}" if st["gathered"] else "gather FAILED"
        print(f"  step {st['step']}: batch padded to {st['padded_len']}, chunk maxima {st['chunk_max_lengths']}, "
              f"replicas returned lengths {st['replica_out_lengths']}, {got}")


def plot_dp(broken: RunResult, fixed: RunResult):
    """Per step: the batch's padded length and the length each replica returned, broken vs fixed."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for ax, r in zip(axes, (broken, fixed)):
        s = dp_summary(r)
        for st in s["steps"]:
            ax.bar(st["step"] - 0.3, st["padded_len"], 0.2, color="#8c959f", label="batch padded length" if st["step"] == 0 else None)
            for k, n in enumerate(st["replica_out_lengths"] or []):
                ax.bar(st["step"] - 0.1 + 0.2 * k, n, 0.2, color=["#0969da", "#bf8700", "#2da44e", "#cf222e"][k % 4],
                       label=f"replica {k} output length" if st["step"] == 0 else None)
            if st["gathered"] is None:   # inside the axes, under its top (it collided with the title)
                ax.annotate("gather fails", (st["step"], st["padded_len"]), xytext=(0, 4), textcoords="offset points",
                            ha="center", va="bottom", color="#cf222e", fontsize=9)
        ax.set_title(f"{r.variant}: {r.status}")
        ax.set_xlabel("step")
        ax.set_xticks(range(len(s["steps"])))
        ax.set_ylim(top=max(st["padded_len"] for st in s["steps"]) * 1.25)   # room for the annotation
    axes[0].set_ylabel("time steps")
    # under both panels: inside, it covered step 0's bars
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=8, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(f"Lab 04, {dp_label(broken)}: output length per replica")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def pinned_summary(r: RunResult) -> dict:
    ok = {rec["how"]: rec["out_devices"] for rec in r.records_of("pinned_layer")}
    start = r.records_of("pinned_start")
    return {"label": start[0]["label"] if start else "unknown", "devices": start[0]["devices"] if start else [],
            "article_layer_ok": "article" in ok, "follow_ok": "follow" in ok, "pinned_ok": "pinned" in ok,
            "status": r.status, "signature": r.signature}


# ---- DDP ---------------------------------------------------------------------------------------
def ddp_summary(r: RunResult) -> dict:
    own = {rec["rank"]: rec["own_max_len"] for rec in r.records_of("ddp_eval_start")}
    ev = r.records_of("ddp_eval")
    return {"status": r.status, "signature": r.signature, "own_max_len": [own[k] for k in sorted(own)],
            "global_max_len": ev[0]["global_max_len"] if ev else None,
            "max_abs_diff_vs_single": max(e["max_abs_diff_vs_single"] for e in ev) if ev else None}


# ---- bucketing ---------------------------------------------------------------------------------
def bucketing_summary(r: RunResult) -> dict:
    """Per batching mode (rank 0's records; every rank records the same all-reduced numbers)."""
    recs = [x for x in r.records_of("batching") if x["rank"] == 0]
    out = {}
    for mode in ("random", "bucketed"):
        m = [x for x in recs if x["mode"] == mode]
        out[mode] = {"padding_fraction": statistics.median(x["padding_fraction"] for x in m),
                     "tokens_per_s": statistics.median(x["tokens_per_s"] for x in m),
                     "tokens_per_s_each": [x["tokens_per_s"] for x in m],
                     "masked_loss_init": m[0]["masked_loss_init"], "masked_loss_after": m[-1]["masked_loss_after"],
                     "batches_per_rank": m[0]["batches"], "real_tokens": m[0]["real_tokens"]}
    out["speedup"] = out["bucketed"]["tokens_per_s"] / out["random"]["tokens_per_s"]
    out["loss_init_rel_diff"] = abs(out["bucketed"]["masked_loss_init"] - out["random"]["masked_loss_init"]) / out["random"]["masked_loss_init"]
    return out


def print_bucketing(r: RunResult) -> None:
    s = bucketing_summary(r)
    print(f"{'batching':10s} {'padding':>8s} {'tokens/s':>10s} {'masked loss (init)':>19s} {'after 1 epoch':>14s}")
    for mode in ("random", "bucketed"):
        m = s[mode]
        print(f"{mode:10s} {m['padding_fraction']:8.1%} {m['tokens_per_s']:10,.0f} {m['masked_loss_init']:19.6f} "
              f"{m['masked_loss_after']:14.6f}")
    print(f"bucketed / random tokens/s: {s['speedup']:.2f}x (same number of batches per rank: "
          f"{s['random']['batches_per_rank']} and {s['bucketed']['batches_per_rank']})")


def plot_bucketing(r: RunResult):
    import matplotlib.pyplot as plt

    s = bucketing_summary(r)
    modes, colours = ("random", "bucketed"), ("#8c959f", "#0969da")
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2))
    a.bar(modes, [s[m]["tokens_per_s"] for m in modes], color=colours)
    for i, m in enumerate(modes):
        a.plot([i] * len(s[m]["tokens_per_s_each"]), s[m]["tokens_per_s_each"], "k.", label="each epoch" if i == 0 else None)
    a.set_ylabel("real tokens / s (median)")
    a.set_title("throughput")
    a.legend(fontsize=8)
    b.bar(modes, [100 * s[m]["padding_fraction"] for m in modes], color=colours)
    b.set_ylabel("% of token slots that are padding")
    b.set_title("padding waste")
    fig.suptitle(f"Lab 04: DDP on {r.nproc} CPU ranks (gloo), measured: bucketing {s['speedup']:.2f}x tokens/s")
    fig.tight_layout()
    return fig


# ---- claims and exercises ----------------------------------------------------------------------
def _real(r: RunResult) -> bool:
    start = r.records_of("dp_start") or r.records_of("pinned_start")
    return bool(start) and start[0]["dp_mode"] == "real"


def claim_inputs(runs: Mapping[str, RunResult]) -> claims.Inputs:
    """What these runs measured for the register's claims (ddplab.course.claim_register). Keys read (variant
    names): "article-example1", "dp-broken", "dp-fixed", "pinned-layer", "ddp-broken", "bucketing". A stand-in
    judges only itself: on the emulation every part about what DataParallel does (how it splits rows, what
    each replica holds, what fails) is a stand-in, whatever the emulation showed."""
    example1, dp_broken, dp_fixed = runs["article-example1"], runs["dp-broken"], runs["dp-fixed"]
    pinned, ddp_broken, bucketing = runs["pinned-layer"], runs["ddp-broken"], runs["bucketing"]
    e1, b, f, p = dp_summary(example1), dp_summary(dp_broken), dp_summary(dp_fixed), pinned_summary(pinned)

    def dp_part(holds: bool, *rs: RunResult) -> claims.Part:
        return claims.judged_on(None if all(_real(r) for r in rs) else EMULATION, holds)

    fail = next((s for s in b["steps"] if s["gathered"] is None), None)
    start = dp_fixed.records_of("dp_start")[0]
    split = dp_fixed.records_of("dp_batch")[0]["rows_per_replica"]
    rep = next(iter(dp_fixed.records_of("replicas")), {}).get("seen", [])
    e1_text = (f"[{e1['label']}] the article's Example 1: {e1['steps_done']} of {len(e1['steps'])} steps trained, "
               f"status {e1['status']}; each batch was padded to its longest sequence before the split, so every replica "
               f"returned the same length: {[s['replica_out_lengths'] for s in e1['steps']]}")
    lstm_text = (f"[{b['label']}] LSTM extension: failed at step {b['failed_at_step']} [{b['signature']}]: chunk maxima "
                 f"{fail['chunk_max_lengths']} gave replica lengths {fail['replica_out_lengths']}" if fail
                 else f"[{b['label']}] LSTM extension: no step failed ({b['status']})")
    d, bk = ddp_summary(ddp_broken), bucketing_summary(bucketing)
    return claims.Inputs(LAB, {
        "example1-error": claims.evidence(e1_text, raises=dp_part(example1.status == "failed", example1)),
        "lstm-more-evident": claims.evidence(
            f"{e1_text}; {lstm_text}", linear_runs=dp_part(example1.ok, example1, dp_broken),
            lstm_fails=dp_part(dp_broken.status == "failed", example1, dp_broken)),
        "model-parallelism": claims.evidence(
            f"[{f['label']}] per replica call of the first step (device, parameters held, rows): "
            f"{[(x['device'], x['params'], x['rows']) for x in rep]}; the model has {start['params']} parameters",
            data_split=dp_part(len(rep) > 1 and all(0 < x["rows"] < sum(split) for x in rep), dp_fixed),
            model_split=dp_part(any(x["params"] < start["params"] for x in rep), dp_fixed)),
        "custom-layer": claims.evidence(
            f"[{p['label']}] the article's layer (nn.Parameter weight) on {p['devices']}: "
            f"{'ran on every replica' if p['article_layer_ok'] else 'failed'}; a tensor created on a fixed device "
            f"in forward(): {'ran' if p['pinned_ok'] else 'failed'} [{p['signature']}]; created on x.device: "
            f"{'ran' if p['follow_ok'] else 'failed'}",
            article_layer_fails=dp_part(not p["article_layer_ok"], pinned)),
        "ddp-graceful": claims.evidence(
            f"DDP, 2 gloo processes: bucketing (padded variable-length batches, {bk['random']['batches_per_rank']} "
            f"steps per rank) ended {bucketing.status}; DataParallel's side, [{b['label']}] LSTM extension: "
            f"{dp_broken.status}. Not judged: the lab's own ragged all_gather of outputs padded "
            f"to each rank's longest sequence {d['own_max_len']} ended {ddp_broken.status} [{ddp_broken.signature}]",
            more_gracefully_than_dataparallel=dp_part(bucketing.ok and dp_broken.status == "failed", dp_broken)),
    })


def _failed_step(dp_broken: RunResult) -> list[int]:
    step = dp_summary(dp_broken)["failed_at_step"]
    return [step] if step is not None else []


@answers.exercise("failing-step", answers.Whole(0, 2, "a step number (0, 1 or 2)", label="failed"),
                  accepted=_failed_step, name="failing_step")
def check_failing_step(answer: int, dp_broken: RunResult) -> Check:
    """Exercise 1 (predicted before the run, from the batches' lengths): at which step (0, 1 or 2)
    does the LSTM extension under DataParallel fail?"""
    s = dp_summary(dp_broken)
    if answer in _failed_step(dp_broken):
        return Check(True, f"step {answer}: its chunks' longest sequences were "
                           f"{s['steps'][answer]['chunk_max_lengths']} ({s['label']})")
    return Check(False, f"not step {answer}: split each batch's lengths into 2 halves (rows 0-3, 4-7) and compare the "
                        "halves' longest sequences; the first step where they differ fails")


def _global_length(ddp_fixed: RunResult) -> list[int]:
    return [ddp_summary(ddp_fixed)["global_max_len"]]


@answers.exercise("global-length", answers.Whole(1, 10_000, "a length in time steps", label="long"),
                  accepted=_global_length, name="global_length")
def check_global_length(answer: int, ddp_fixed: RunResult) -> Check:
    """Exercise 2 (predicted before the run): to what length must every rank pad before all_gather?"""
    if answer in _global_length(ddp_fixed):
        return Check(True, f"{answer} = the longest of the ranks' own longest sequences "
                           f"{ddp_summary(ddp_fixed)['own_max_len']}")
    return Check(False, f"{answer} is not it: every rank needs the same shape, and no rank may cut a sequence; "
                        "rank r gets rows r, r+2, r+4, ... of EVAL_LENGTHS")


PADDING_TOLERANCE = 0.05


def _padding(bucketing: RunResult, tolerance: float = PADDING_TOLERANCE) -> list[answers.Interval]:
    got = bucketing_summary(bucketing)["random"]["padding_fraction"]
    return [answers.Interval(max(0.0, got - tolerance), min(1.0, got + tolerance))]


@answers.exercise("padding-fraction", answers.Number(0, 1, "a fraction from 0 to 1 (0.25 for a quarter)",
                                                     label="padding"),
                  accepted=_padding, name="padding_fraction")
def check_padding_fraction(answer: float, bucketing: RunResult, tolerance: float = PADDING_TOLERANCE) -> Check:
    """Exercise 3 (predicted before the numbers are shown): what fraction of the RANDOM batches' token
    slots is padding (0..1)? Within ``tolerance`` of the measured value. One prediction counts: a
    learner who tries 0.1, 0.2, ... is judged on the first."""
    got = bucketing_summary(bucketing)["random"]["padding_fraction"]
    if answer in _padding(bucketing, tolerance)[0]:
        return Check(True, f"measured {got:.1%} (you said {answer:.1%})")
    return Check(False, f"not within {tolerance:.0%} of the measured value: per batch, padding slots = rows x the "
                        "batch's longest length - the real tokens; with log-normal lengths (median about 20, tail "
                        "to 160), how long is the longest of 16?")


EXERCISES = answers.exercises(check_failing_step, check_global_length, check_padding_fraction)
