"""Lab 04 (padded variable-length sequences): the runs, summaries, plots, claim check and exercise
checkers that notebooks/04_padding.ipynb shows. Every number comes from a run made in the same
execution. Without 2 GPUs the DataParallel runs are an EMULATION of DataParallel's steps on CPU, and
everything shown from them says so."""
from __future__ import annotations

import statistics

import ddplab
from ddplab.errors import DdplabError
from ddplab.notebook import Check, Claim, ClaimCheck
from ddplab.result import RunResult

LAB = "04"
ARTICLE = "002_3b7eff0f44992b59.txt"
DP_MODES = ("auto", "emulation", "real")
DP_VARIANTS = ("dp-broken", "dp-fixed", "pinned-layer")


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
    if replicas not in (2, 3, 4):
        raise DdplabError(f"replicas={replicas!r} is not supported", hint="use replicas=2 (or 3, 4 with that many GPUs)")
    have = gpu_count()
    if dp == "real" and have < replicas:
        raise DdplabError(f"dp='real' needs {replicas} CUDA GPUs for nn.DataParallel, this machine has {have}",
                          hint="use dp='emulation' (or 'auto'), which runs DataParallel's steps on CPU")


def run_variant(variant: str, dp: str = "auto", replicas: int = 2, n_seqs: int = 512, reps: int = 2,
                **kw) -> RunResult:
    """One real run of labs/04_padding.py through ddplab.run (2 ranks)."""
    args = []
    if variant in DP_VARIANTS:
        validate_dp(dp, replicas)
        args = ["--dp", dp, "--replicas", str(replicas)]
    elif variant == "bucketing":
        args = ["--n-seqs", str(n_seqs), "--reps", str(reps)]
    return ddplab.run(LAB, variant=variant, args=args + list(kw.pop("args", [])), **kw)


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
            if st["gathered"] is None:
                ax.text(st["step"], st["padded_len"] + 0.5, "gather\nfails", ha="center", color="#cf222e")
        ax.set_title(f"{r.variant}: {r.status}")
        ax.set_xlabel("step")
        ax.set_xticks(range(len(s["steps"])))
    axes[0].set_ylabel("time steps")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle(f"Lab 04, {dp_label(broken)}: output length per replica")
    fig.tight_layout()
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
def claim_check(dp_broken: RunResult, dp_fixed: RunResult, pinned: RunResult, ddp_fixed: RunResult) -> ClaimCheck:
    b, f, p, d = dp_summary(dp_broken), dp_summary(dp_fixed), pinned_summary(pinned), ddp_summary(ddp_fixed)
    start = dp_fixed.records_of("dp_start")[0]
    split = dp_fixed.records_of("dp_batch")[0]["rows_per_replica"]
    fail = next((s for s in b["steps"] if s["gathered"] is None), None)
    return ClaimCheck([
        Claim("DataParallel keeps the parameters in the main process and uses copies on the workers, "
              "'making it a form of *model parallelism*'", f"{ARTICLE[:3]}, introduction",
              f"{f['label']}: each batch of {sum(split)} rows was split {split} "
              f"across {start['replicas']} replicas, each holding all {start['params']} parameters: the data is split, the model is not",
              "wrong"),
        Claim("the collate_fn's pad_sequence padding 'is not accounted for by DataParallel, that expects a completely "
              "consistent tensor'", f"{ARTICLE[:3]}, Example 1",
              (f"{b['label']}: the collate padded step {fail['step']} to {fail['padded_len']}; the chunks' longest sequences were "
               f"{fail['chunk_max_lengths']}, so pad_packed_sequence returned lengths {fail['replica_out_lengths']} and gather failed "
               f"[{b['signature']}]; with total_length= every replica returned {f['steps'][fail['step']]['replica_out_lengths']}")
              if fail else f"{b['label']}: no step failed in this run",
              "partly"),
        Claim("training 'is not starting' with nn.DataParallel", f"{ARTICLE[:3]}, title",
              f"{b['label']}: {b['steps_done']} step(s) trained, then the run ended with status '{b['status']}' "
              f"(an exception naming the sizes) at step {b['failed_at_step']}, in {dp_broken.wall_s:.0f} s: it starts, then crashes "
              "on the first batch whose chunks differ in longest length",
              "wrong"),
        Claim("the custom layer with a manually defined weight 'is not guaranteed to transfer to the worker devices'",
              f"{ARTICLE[:3]}, Example 3",
              f"{p['label']}: the article's layer (nn.Parameter) ran on {p['devices']}: {p['article_layer_ok']}; a tensor created "
              f"on a fixed device in forward(): {'ran' if p['pinned_ok'] else 'failed'} [{p['signature']}]; created on x.device: "
              f"{'ran' if p['follow_ok'] else 'failed'}",
              "partly"),
        Claim("(lab) DDP: pad to the global maximum before all_gather, trim after: the same outputs as one process",
              "this lab", f"ranks' own longest {d['own_max_len']}, padded to {d['global_max_len']}, max |difference| vs one process "
              f"{d['max_abs_diff_vs_single']:.1e}", "holds" if (d["max_abs_diff_vs_single"] or 1) < 1e-5 else "wrong"),
    ])


def check_failing_step(answer, dp_broken: RunResult) -> Check:
    """Exercise 1: at which step (0, 1 or 2) does the broken DataParallel run fail?"""
    s = dp_summary(dp_broken)
    if answer is None:
        return Check(False, "set `answer` to the step number (0, 1 or 2), from the chunk maxima printed above")
    if answer == s["failed_at_step"]:
        return Check(True, f"step {answer}: its chunks' longest sequences were "
                           f"{s['steps'][answer]['chunk_max_lengths']} ({s['label']})")
    return Check(False, f"step {answer} is not it: look for the first step whose chunk maxima differ")


def check_global_length(answer, ddp_fixed: RunResult) -> Check:
    """Exercise 2: to what length must every rank pad before all_gather?"""
    d = ddp_summary(ddp_fixed)
    if answer is None:
        return Check(False, "set `answer` to the length every rank pads to (an integer)")
    if answer == d["global_max_len"]:
        return Check(True, f"{answer} = max of the ranks' own longest sequences {d['own_max_len']}")
    return Check(False, f"{answer} is not it: every rank needs the same shape, and no rank may cut a sequence")


def check_padding_fraction(answer, bucketing: RunResult, tolerance: float = 0.05) -> Check:
    """Exercise 3: what fraction of the random batches' token slots is padding (0..1)?"""
    got = bucketing_summary(bucketing)["random"]["padding_fraction"]
    if answer is None:
        return Check(False, "set `answer` to a fraction between 0 and 1")
    if abs(float(answer) - got) <= tolerance:
        return Check(True, f"measured {got:.1%} (you said {float(answer):.1%})")
    return Check(False, f"not within {tolerance:.0%} of the measured value: count pad slots / all slots per batch")
