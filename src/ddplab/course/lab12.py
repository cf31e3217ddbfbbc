"""Lab 12 (ok but wrong): everything the notebook calls.

Every run is a real 2-rank job with ``check=True`` (``ddplab run --check``): the ranks record their
own replicas, gradients and data, and ``result.check`` holds what the comparison found. Every number
shown comes from those runs in this execution; the curves are each rank's own validation records.
"""
from __future__ import annotations

from typing import Mapping

import ddplab
from ddplab.origins import catalog
from ddplab.facts import CHECK_KINDS as KINDS
from ddplab.errors import DdplabError
from ddplab.course import answers, claims
from ddplab.course import contract
from ddplab.course.notebook import Check

LAB = "12"


def _lab():
    return catalog.find_lab(LAB)


def broken_variants() -> dict[str, str]:
    """Each broken variant and the finding --check must report for it (the lab's LAB dict)."""
    return dict(_lab().extra["findings"])


def pairs() -> list[tuple[str, str]]:
    """(broken, fixed) variant names, in the lab's order."""
    return [(v, f"{v}-fixed") for v in broken_variants()]


def run_variant(variant: str, check: bool = True, nproc: int | None = None, **kw) -> ddplab.RunResult:
    """One real run of lab 12, checked (``check=False``: the same run without the rank hook's check);
    ``epochs`` and ``seed``: the script's knobs."""
    _lab().variant(variant)      # a DdplabError naming the variants
    validate(**kw)
    args, kw = contract.script_args(LAB, kw)
    return ddplab.run(LAB, variant=variant, nproc=nproc, check=check, args=args, **kw)


def run_all(**kw) -> dict[str, ddplab.RunResult]:
    """Every variant, broken and fixed, once."""
    return {v: run_variant(v, **kw) for pair in pairs() for v in pair}


# ----------------------------------------------------------------------------------------------
# Reading the runs
# ----------------------------------------------------------------------------------------------

def curves(result) -> dict[int, list[dict]]:
    """Each rank's validation records (step, val_loss, val_acc) of its own replica, in step order."""
    out: dict[int, list[dict]] = {}
    for rec in sorted(result.records_of("eval"), key=lambda r: (r["rank"], r["step"])):
        out.setdefault(rec["rank"], []).append({k: rec[k] for k in ("step", "val_loss", "val_acc")})
    return out


def final(result) -> dict:
    """The last validation of each rank, and how far apart the ranks' replicas ended."""
    last = {r: c[-1] for r, c in curves(result).items()}
    if not last:
        raise DdplabError(f"no validation records in this run ({result.headline()})", hint="pass a lab 12 result")
    losses = [v["val_loss"] for v in last.values()]
    return {"val_loss": last[0]["val_loss"], "val_acc": last[0]["val_acc"], "spread": max(losses) - min(losses),
            "replicas_identical": len({d["params_sha256"] for d in result.records_of("done")}) == 1}


def summary(runs: dict) -> list[dict]:
    """One row per run: what --check found against what the lab says it must find."""
    want = broken_variants()
    rows = []
    for v, r in runs.items():
        rows.append({"variant": v, "status": r.status, "expected": want.get(v),
                     "found": sorted(r.check.kinds()) if r.check else None,
                     "right": r.check is not None and (want[v] in r.check.kinds() if v in want else r.check.clean)})
    return rows


# ----------------------------------------------------------------------------------------------
# Figure and claim check
# ----------------------------------------------------------------------------------------------

def harm(result, kind: str) -> int:
    """How much of the lab's finding ``kind`` --check reported for this run: the findings' own counts
    (steps, samples, tensors), or one per finding that has no count; 0 when it found none."""
    found = result.check.of_kind(kind) if result.check else []
    return sum(f.count if f.count is not None else 1 for f in found)


def _mean_final(result) -> float:
    ends = [c[-1]["val_loss"] for c in curves(result).values()]
    return sum(ends) / len(ends)


def loss_effect(runs: dict) -> list[dict]:
    """Per pair: each run's final validation loss averaged over its ranks, and whether the fix ended
    lower. On this small task the loss is not where most of these mistakes show (see notebook 12)."""
    rows = []
    for broken, fixed in (p for p in pairs() if all(v in runs for v in p)):
        b, f = (_mean_final(runs[v]) for v in (broken, fixed))
        rows.append({"pair": broken, "broken": b, "fixed": f, "fix_lower": f < b})
    return rows


def plot(runs: dict):
    """Top: validation loss against steps, each rank's own replica, broken (red) and fixed (blue), the
    same seed and data; where the ranks' replicas differ, their lines part. Bottom: the harm each fix
    removes, as --check measured it in these runs (the lab's finding for the pair: steps, samples or
    tensors), broken against fixed."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    ps = [p for p in pairs() if all(v in runs for v in p)]
    want = broken_variants()
    fig, axes = plt.subplots(2, len(ps), figsize=(3.3 * len(ps), 5.8), squeeze=False,
                             gridspec_kw={"height_ratios": [1.6, 1]})
    for ax, (broken, fixed) in zip(axes[0], ps):
        for variant, colour in ((broken, "#cf222e"), (fixed, "#0969da")):
            for rank, c in curves(runs[variant]).items():
                ax.plot([p["step"] for p in c], [p["val_loss"] for p in c], color=colour,
                        linestyle="-" if rank == 0 else "--")
        ax.set_title(broken, fontsize=10)
        ax.set_xlabel("optimizer steps", fontsize=8)
    for ax, (broken, fixed) in zip(axes[1], ps):
        kind = want[broken]
        vals = [harm(runs[broken], kind), harm(runs[fixed], kind)]
        bars = ax.bar([0, 1], vals, color=["#cf222e", "#0969da"])
        ax.bar_label(bars, labels=[str(v) for v in vals], fontsize=8)
        ax.set_xticks([0, 1], ["broken", "fixed"], fontsize=8)
        ax.set_ylim(0, max(vals + [1]) * 1.3)
        ax.set_title(f"--check: {kind}", fontsize=9)
    axes[0][0].set_ylabel("validation loss\n(each rank's replica)", fontsize=9)
    axes[1][0].set_ylabel("found by --check\n(steps, samples, tensors)", fontsize=9)
    handles = [Line2D([], [], color=c, ls=ls, label=f"{name}, rank {r}")
               for name, c in (("broken", "#cf222e"), ("fixed", "#0969da")) for r, ls in ((0, "-"), (1, "--"))]
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=4, frameon=False)   # under the panels, off the data
    fig.suptitle("Measured in this execution: what each mistake did to the loss (top) and what --check found (bottom)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def claim_inputs(runs: Mapping[str, "ddplab.RunResult"]) -> claims.Inputs:
    """What the runs measured for the register's claims (ddplab.course.claim_register); judged there."""
    rs, rsf, bn = runs["rank-split"], runs["rank-split-fixed"], runs["bn-unsynced"]
    ne, nef = runs["no-set-epoch"], runs["no-set-epoch-fixed"]
    ns, nsf = runs["step-in-no-sync"], runs["step-in-no-sync-fixed"]
    b, f = final(rs), final(rsf)
    over = rs.check.of_kind("samples-overlap")
    never = rs.check.of_kind("samples-dropped")
    unsynced = ns.check.of_kind("step-in-no-sync")
    apart = {"replicas-differ", "buffers-differ"}
    fb = final(bn)
    return claims.Inputs(LAB, {
        "uneven-data": claims.evidence(
            f"rank-split, epoch 0: {over[0].count if over else 0} samples on both ranks, "
            f"{never[0].count if never else 0} on none; replicas different: "
            f"{'yes' if apart & rs.check.kinds() else 'no (DDP averaged every gradient)'}; final validation "
            f"loss {b['val_loss']:.4f} against {f['val_loss']:.4f} with DistributedSampler (one seed: shown, not judged). "
            f"bn-unsynced (each rank its own source, buffer sync off): --check {_kinds(bn)}; the ranks' final "
            f"validation losses {fb['spread']:.2f} apart",
            replicas_diverge=bool(apart & (rs.check.kinds() | bn.check.kinds()))),
        "sampler-reset": claims.evidence(
            f"--check without set_epoch: {_kinds(ne)}; with it: {_kinds(nef)}",
            check_finds_same_order="same-order" in ne.check.kinds(),
            check_clean_with_reset="same-order" not in nef.check.kinds()),
        "accumulation-misuse": claims.evidence(
            f"step inside no_sync(): {unsynced[0].count if unsynced else 0} of {unsynced[0].of if unsynced else '?'} steps "
            f"on unaveraged gradients, replicas {'differ' if 'replicas-differ' in ns.check.kinds() else 'equal'}; "
            f"fixed: {_kinds(nsf)}",
            unexpected_updates={"step-in-no-sync", "replicas-differ"} <= ns.check.kinds() and nsf.check.clean),
    })


def _kinds(r) -> str:
    return ", ".join(sorted(r.check.kinds())) or "nothing found"


# ----------------------------------------------------------------------------------------------
# Exercises
# ----------------------------------------------------------------------------------------------

def _bn_kinds(result: ddplab.RunResult) -> list[str]:
    """The finding --check reported for bn-unsynced, when it reported exactly one kind."""
    kinds = result.check.kinds() if result.check else set()
    return sorted(kinds) if len(kinds) == 1 else []


@answers.exercise("bn-finding", answers.Choice(tuple(KINDS)), accepted=_bn_kinds, name="bn_answer")
def check_bn_finding(answer: str, result: ddplab.RunResult) -> Check:
    """Exercise 1 (predicted before the runs): which finding does --check report for bn-unsynced?
    ``result``: the bn-unsynced run of this execution."""
    if answer in _bn_kinds(result):
        fd = result.check.findings[0]
        return Check(True, f"measured: only {fd.kind} ({fd.object} first); the parameters stayed equal")
    return Check(False, "not what the run found: the optimizer steps averaged gradients on both ranks; ask what "
                        "BatchNorm keeps besides weights, and who updates it when DDP's buffer sync is off")


def _bypass(result: ddplab.RunResult) -> list[int]:
    """The one rank --check found stepping with no forward through DDP (module-update)."""
    found = result.check.of_kind("update-outside-ddp") if result.check else []
    return list(found[0].ranks) if found and len(found[0].ranks) == 1 else []


@answers.exercise("bypass-rank", answers.Rank(2), accepted=_bypass, name="bypass_answer")
def check_bypass_rank(answer: int, result: ddplab.RunResult) -> Check:
    """Exercise 2 (predicted from the script, before the runs): in module-update, which rank takes optimizer
    steps with no forward through DDP? ``result``: the module-update run of this execution."""
    if answer in _bypass(result):
        found = result.check.of_kind("update-outside-ddp")[0]
        return Check(True, f"rank {answer} took {found.count} steps through model.module (first at step "
                           f"{found.step}); its replica drifted from the others")
    return Check(False, "not that rank: read the lines marked # BROKEN in labs/12_silent.py again: which rank's "
                        "forward goes to model.module instead of the DDP wrapper?")


def validate(**knobs) -> None:
    """Refuse an unknown knob or a value the script's declaration refuses, before any rank starts."""
    contract.validate_knobs(LAB, knobs, run_variant)


EXERCISES = answers.exercises(check_bn_finding, check_bypass_rank)
