"""Lab 08 (run the articles' own code): runs, figures, claim check, exercises.

The notebook calls only these. Every number comes from a real 2-rank run (``ddplab.run``) of this
execution: the gradient that ``optimizer.step()`` applied, compared on the same weights with the
full batch's and the last micro-batch's (computed on a plain copy of the model and averaged over
ranks by hand); the all-reduces counted by a DDP comm hook; each rank's sampler order per epoch.
"""
from __future__ import annotations

from typing import Mapping

import ddplab
from ddplab.origins import catalog
from ddplab.errors import DdplabError
from ddplab.course import answers, claims
from ddplab.course import contract
from ddplab.course.notebook import Check

LAB = "08"
TOL = 1e-5          # float32: the accumulated gradient must equal the full batch's to this (max abs)


def sizes() -> dict:
    """The sizes the lab script declares in its LAB dict (read without importing torch)."""
    return catalog.find_lab(LAB).extra["sizes"]


def validate(max_k: int | None = None, epochs: int | None = None, **knobs) -> None:
    """Reject knobs that cannot work, before any rank starts (one line, naming the fix)."""
    contract.check_knob_names(knobs, run_variant)
    ks = sizes()["ks"]
    if max_k is not None and (isinstance(max_k, bool) or max_k not in ks):
        raise DdplabError(f"max_k={max_k!r} is not one of the lab's micro-batch counts {ks}",
                          hint=f"use max_k={max(ks)} (or any of {ks})")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or not 2 <= epochs <= 8):
        raise DdplabError(f"epochs={epochs!r}: comparing orders needs 2 to 8 epochs",
                          hint=f"use epochs={sizes()['epochs']}")


def run_variant(variant: str, max_k: int | None = None, epochs: int | None = None, **kw) -> "ddplab.RunResult":
    """Validate the lab's knobs, then one real 2-rank run of lab 08 (extra keywords go to ddplab.run)."""
    validate(max_k, epochs)
    args = []
    if max_k is not None:
        args += ["--max-k", str(max_k)]
    if epochs is not None:
        args += ["--epochs", str(epochs)]
    return ddplab.run(LAB, variant=variant, args=args, **kw)


# ------------------------------------------------------------------------------------------------
# Reading the measurements out of results
# ------------------------------------------------------------------------------------------------

def accumulation(r, amp: str = "fp32") -> list[dict]:
    """Per k (rank 0; the gradients compared are all-reduced, so every rank has the same): the max
    abs difference of the applied gradient to the full batch's and to the last micro-batch's, the
    relative error to the full batch, and the all-reduces DDP ran for that optimizer step."""
    rows = [a for a in r.records_of("accum") if a["rank"] == 0 and a["amp"] == amp]
    if not rows:
        raise ValueError(f"{r.variant} ({r.status}) has no accumulation records: pass an accumulate-* run that finished")
    keep = ("k", "amp", "diff_full", "diff_last", "rel_err_full", "allreduces", "allreduces_saved")
    return [{k: a[k] for k in keep} for a in sorted(rows, key=lambda a: a["k"])]


def accumulation_summary(r_article, r_fixed) -> dict:
    """The lab's key numbers, float32 unless named bf16 (k > 1 only: with k = 1 both loops are the same)."""
    art, fix = accumulation(r_article), accumulation(r_fixed)
    fix16 = accumulation(r_fixed, "bf16")
    multi = lambda rows: [a for a in rows if a["k"] > 1]
    return {
        "ks": [a["k"] for a in art],
        "article_equals_last": all(a["diff_last"] <= TOL for a in art),
        "article_max_diff_last": max(a["diff_last"] for a in art),
        "article_min_rel_err_full": min(a["rel_err_full"] for a in multi(art)),
        "fixed_max_diff_full": max(a["diff_full"] for a in fix),
        "fixed_equals_full": all(a["diff_full"] <= TOL for a in fix),
        "fixed_bf16_max_rel_err": max(a["rel_err_full"] for a in fix16),
        "article_allreduces": {a["k"]: a["allreduces"] for a in art},
        "fixed_allreduces": {a["k"]: a["allreduces"] for a in fix},
        "fixed_saved": {a["k"]: a["allreduces_saved"] for a in fix},
    }


def orders(r) -> dict[int, list[list[int]]]:
    """rank -> the index order it visited, one list per epoch."""
    out: dict[int, list[list[int]]] = {}
    for e in sorted(r.records_of("epoch"), key=lambda e: (e["rank"], e["epoch"])):
        out.setdefault(e["rank"], []).append(e["order"])
    if not out:
        raise ValueError(f"{r.variant} ({r.status}) has no epoch records: pass a sampler-* run that finished")
    return out


def same_as_previous(r) -> dict[int, list[float]]:
    """rank -> for each epoch after the first, the fraction of positions that hold the same index
    as in the epoch before (1.0: the identical order)."""
    return {rank: [sum(a == b for a, b in zip(prev, cur)) / len(cur) for prev, cur in zip(o, o[1:])]
            for rank, o in orders(r).items()}


def order_repeats(r) -> bool:
    """True when every rank visits its indices in exactly the same order every epoch."""
    return all(all(ep == o[0] for ep in o) for o in orders(r).values())


def shards_cover_dataset(r) -> bool:
    """Every epoch the ranks' indices together are the whole dataset, each index once."""
    o = orders(r)
    n = sizes()["dataset"]
    return all(sorted(i for rank in o for i in o[rank][e]) == list(range(n)) for e in range(len(o[0])))


def error_line(r) -> str:
    """The line of the failing rank's log that the signature matched."""
    return (r.excerpt or "").strip().splitlines()[-1] if r.excerpt else ""


# ------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------

def plot_accumulation(r_article, r_fixed):
    """Relative error of the applied gradient against the full-batch gradient, over k."""
    import matplotlib.pyplot as plt

    floor = 1e-9
    fig, ax = plt.subplots(figsize=(7, 4))
    for r, name, color in ((r_article, "article (zero_grad every micro-batch)", "#cf222e"),
                           (r_fixed, "fixed (zero_grad after step, loss / k, no_sync)", "#2da44e")):
        for amp, style in (("fp32", "-o"), ("bf16", "--s")):
            rows = accumulation(r, amp)
            ax.plot([a["k"] for a in rows], [max(a["rel_err_full"], floor) for a in rows], style, color=color,
                    label=f"{name}, {amp}" + (" autocast" if amp == "bf16" else ""), alpha=0.85)
    ax.axhline(floor, color="grey", linewidth=0.5)
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches per optimizer step (k)")
    ax.set_ylabel("|g_applied - g_full batch| / |g_full batch|")
    ax.set_title("Measured: the gradient optimizer.step() applied vs the full-batch gradient\n"
                 f"(2 gloo ranks; values at the bottom line are <= {floor:g}, i.e. exact)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_epoch_orders(r_no, r_yes):
    """Fraction of positions holding the same index as in the previous epoch, per rank and epoch."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for r, name, color in ((r_no, "no set_epoch() (article)", "#cf222e"), (r_yes, "set_epoch(epoch) (fixed)", "#2da44e")):
        for rank, fr in same_as_previous(r).items():
            ax.plot(range(1, len(fr) + 1), fr, "-o" if rank == 0 else "--^", color=color, label=f"{name}, rank {rank}")
    ax.set_ylim(-0.05, 1.1)
    ax.set_xlabel("epoch")
    ax.set_ylabel("same index at the same\nposition as last epoch")
    ax.set_title("Measured: DistributedSampler(shuffle=True) order, epoch against epoch", fontsize=10)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------
# Claim check and exercises
# ------------------------------------------------------------------------------------------------

def _shares(r) -> tuple[bool, bool]:
    """(every epoch both ranks got as many indices, the ranks together visited each index once)."""
    o = orders(r)
    equal = all(len({len(o[rank][e]) for rank in o}) == 1 for e in range(len(o[0])))
    return equal, shards_cover_dataset(r)


def claim_inputs(runs: Mapping[str, "ddplab.RunResult"]) -> claims.Inputs:
    """What the five runs measured for the register's claims (ddplab.course.claim_register); judged there. Keys
    read (variant names): "accumulate-article", "accumulate-fixed", "sampler-no-set-epoch",
    "sampler-set-epoch", "no-master-env"."""
    r_article, r_fixed = runs["accumulate-article"], runs["accumulate-fixed"]
    r_no, r_yes, r_env = runs["sampler-no-set-epoch"], runs["sampler-set-epoch"], runs["no-master-env"]
    s = accumulation_summary(r_article, r_fixed)
    art = [a for a in accumulation(r_article) if a["k"] > 1]
    kmax = max(s["ks"])
    eq_no, cover_no = _shares(r_no)
    eq_yes, cover_yes = _shares(r_yes)
    env_given = r_env.cause.env if r_env.cause is not None else {}
    return claims.Inputs(LAB, {
        "accumulation": claims.evidence(
            f"{r_article.status}, no error; k = {', '.join(str(a['k']) for a in art)}: applied gradient vs the mean of "
            f"all k micro-batches: max |diff| {max(a['diff_full'] for a in art):.2e} (relative >= "
            f"{min(a['rel_err_full'] for a in art):.0%}); vs the last micro-batch's alone: max |diff| "
            f"{max(a['diff_last'] for a in art):.1e}; {s['article_allreduces'][kmax]} all-reduces per step at k = {kmax}. "
            f"Fixed loop: max |diff| {s['fixed_max_diff_full']:.1e} from the full batch, "
            f"{s['fixed_allreduces'][kmax]} all-reduce per step",
            accumulates=all(a["diff_full"] <= TOL for a in art)),
        "scale-loss": claims.evidence(
            f"apex is deprecated and not installed: the run uses torch.autocast(bfloat16) with no loss scaling; "
            f"the fixed loop is within {s['fixed_bf16_max_rel_err']:.1e} (relative) of the bf16 full-batch gradient",
            apex_scale_loss=claims.stand_in(
                "torch.autocast(dtype=torch.bfloat16), with no loss scaling, in place of apex amp.initialize / amp.scale_loss")),
        "sampler-balanced": claims.evidence(
            f"{sizes()['dataset']} indices, 2 ranks: equal shares every epoch: without set_epoch {eq_no}, with {eq_yes}; "
            f"each index visited once per epoch: {cover_no}, {cover_yes}",
            equal_shares=eq_no and eq_yes, covers_once=cover_no and cover_yes),
        "sampler-reset": claims.evidence(
            f"without set_epoch(): the same order every epoch on every rank: {order_repeats(r_no)}; with "
            f"set_epoch(epoch): {order_repeats(r_yes)}",
            repeats_without_reset=order_repeats(r_no), changes_with_reset=not order_repeats(r_yes)),
        "init-no-env": claims.evidence(
            f"the call with MASTER_ADDR={env_given.get('MASTER_ADDR')!r}, MASTER_PORT={env_given.get('MASTER_PORT')!r} "
            f"(torchrun started it; the script removed the two variables, as mp.spawn never sets them): "
            f"{r_env.status}" + (f" [{r_env.signature}]: {error_line(r_env)[:140]}" if r_env.status != "ok" else ""),
            joins=r_env.status == "ok" and bool(r_env.records_of("joined"))),
    })


def _saved(r_fixed, k: int = 4) -> list[int]:
    saved = {a["allreduces_saved"] for a in r_fixed.records_of("accum") if a["k"] == k and a["amp"] == "fp32"}
    return sorted(saved) if len(saved) == 1 else []


@answers.exercise("saved-allreduces", answers.Whole(0, 8, "a number of all-reduces per step", label="saved"),
                  accepted=_saved, name="predicted_saved")
def check_saved_allreduces(answer: int, r_fixed, k: int = 4) -> Check:
    """Exercise "saved-allreduces" (predicted before the fixed run): how many all-reduces per optimizer
    step does accumulate-fixed save at this k? Checked against the comm hook's count on every rank."""
    rows = [a for a in r_fixed.records_of("accum") if a["k"] == k and a["amp"] == "fp32"]
    if not rows:
        return Check(False, f"the run has no k={k}; run accumulate-fixed with max_k >= {k}")
    if answer in _saved(r_fixed, k):
        return Check(True, f"k={k}: DDP all-reduced {k - answer} time(s) per step instead of {k}, counted by the "
                           f"comm hook on {len(rows)} ranks")
    return Check(False, f"not {answer}: count the backward passes that run outside model.no_sync() in one "
                        "optimizer step; each of those is one all-reduce (the comm hook counts them)")


def _applied(r_article, k: int = 4) -> list[int]:
    rows = {a["k"]: a for a in accumulation(r_article)}
    return [k] if k in rows and rows[k]["diff_last"] <= TOL else []


@answers.exercise("applied-micro-batch", answers.Whole(1, 8, "a micro-batch number (1 to 4)", label="applied"),
                  accepted=_applied, name="predicted_micro_batch")
def check_applied_micro_batch(answer: int, r_article, k: int = 4) -> Check:
    """Exercise "applied-micro-batch" (predicted before the article's run): with k micro-batches, the
    gradient optimizer.step() applies is the gradient of which micro-batch (1..k)? Only the last one can
    be told apart from the rest by the run (it records the applied gradient against the last one's)."""
    rows = {a["k"]: a for a in accumulation(r_article)}
    if k not in rows:
        return Check(False, f"the run has no k={k}")
    if answer > k:
        return Check(False, f"with k={k} the micro-batches are 1 to {k}, not {answer}")
    if rows[k]["diff_last"] > TOL:
        return Check(False, f"in this run the applied gradient is not any single micro-batch's "
                            f"(max |diff| to the last {rows[k]['diff_last']:.1e}); it is not the article's loop")
    if answer == k:
        return Check(True, f"micro-batch {k}, the last: max |diff| {rows[k]['diff_last']:.1e}; "
                           f"the {k - 1} before it were zeroed by optimizer.zero_grad()")
    return Check(False, f"not micro-batch {answer}: look at what optimizer.zero_grad() does at the top of each "
                        "iteration, and which backward() ran last before optimizer.step()")


EXERCISES = answers.exercises(check_saved_allreduces, check_applied_micro_batch)
