"""Lab 02 (out of memory, and the OOM that turns into a hang): runs, figures, claim check, exercises.

The notebook calls only these. Every number comes from a real run (``ddplab.run``) of this execution.
Memory is "MiB above the rank's baseline": on CPU the rank's peak RSS (VmHWM, reset per phase)
under an RLIMIT_DATA cap, on a GPU the CUDA allocator's ``max_memory_allocated`` under
``set_per_process_memory_fraction``.
"""
from __future__ import annotations

import ddplab
from ddplab import catalog
from ddplab.errors import DdplabError
from ddplab.notebook import Check, Claim, ClaimCheck

LAB_ID = "02"
DEFAULT_MEM_LIMIT_MB = 48.0


def spec() -> dict:
    """The model sizes the lab script declares in its LAB dict (read without importing torch)."""
    return catalog.find_lab(LAB_ID).extra["model"]


def model_mb() -> float:
    """Parameters + gradients + SGD momentum of the lab's TokenMLP, float32, in MiB."""
    f, h = spec()["features"], spec()["hidden"]
    params = f * h + h + h * h + h + h + 1
    return params * 4 * 3 / 2**20


def validate(mem_limit_mb: float = DEFAULT_MEM_LIMIT_MB, batch: int | None = None, accum: int = 0) -> None:
    """Reject knobs that cannot work, before any rank starts (one line, naming the fix)."""
    batch = spec()["batch"] if batch is None else batch
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise DdplabError(f"batch must be a whole number of sequences, at least 1 (got {batch!r})", hint="for example batch=16")
    try:
        mem_limit_mb = float(mem_limit_mb)
    except (TypeError, ValueError):
        raise DdplabError(f"mem_limit_mb must be a number of MiB, not {mem_limit_mb!r}", hint="for example mem_limit_mb=48") from None
    need = model_mb()
    if mem_limit_mb < 0 or 0 < mem_limit_mb <= need:
        raise DdplabError(f"mem_limit_mb={mem_limit_mb:g} is too small for the model itself "
                          f"({need:.1f} MiB of parameters, gradients and SGD momentum)",
                          hint=f"use mem_limit_mb={DEFAULT_MEM_LIMIT_MB:g} (any value above {need:.1f}), or 0 for no cap")
    if accum not in (0, 1, 2, 4, 8, 16) or accum > batch:
        raise DdplabError(f"accum={accum!r} is not a number of micro-batches for a batch of {batch}",
                          hint="use 0 (find the largest micro-batch that fits) or 1, 2, 4, 8, 16 (at most the batch)")


def run(variant: str, mem_limit_mb: float = DEFAULT_MEM_LIMIT_MB, batch: int | None = None, accum: int = 0,
        **kw) -> "ddplab.RunResult":
    """Validate the lab's knobs, then one real 2-rank run of lab 02 (extra keywords go to ddplab.run).
    A hang (skip-batch) is ended by ddplab's stall rule: no rank made progress for the stall window."""
    validate(mem_limit_mb, batch, accum)
    args = ["--mem-limit-mb", f"{float(mem_limit_mb):g}", "--accum", str(accum)]
    if batch is not None:
        args += ["--batch", str(batch)]
    return ddplab.run(LAB_ID, variant=variant, args=args, **kw)


# ------------------------------------------------------------------------------------------------
# Reading the measurements out of results
# ------------------------------------------------------------------------------------------------

def _start(r) -> dict:
    return next(iter(r.records_of("start")), {})


def sweep(r) -> list[dict]:
    """fixed-accumulate's probe: per rank, micro-batch -> peak MiB above baseline, and whether it fit."""
    return sorted(({"rank": p["rank"], "micro": p["micro"], "length": p["length"], "peak_mb": p["peak_mb"],
                    "fits": p["fits"]} for p in r.records_of("probe")), key=lambda d: (d["rank"], d["micro"]))


def memory_figures(r) -> dict:
    """From one fixed-accumulate run: the long step's peak with accumulation against the full batch's
    peak measured in the same process (the gradient check runs the full batch with the cap lifted)."""
    checks = r.records_of("grad_check")
    if not checks:
        raise ValueError(f"{r.variant} ({r.status}) has no gradient check: pass a fixed-accumulate run that finished")
    long_step = spec()["long_step"]
    worst = max(checks, key=lambda c: c["full_batch_peak_mb"])
    step = next(s for s in r.records_of("step") if s["rank"] == worst["rank"] and s["step"] == long_step)
    st = _start(r)
    cap = st["mem_limit_mb"] - st["model_mb"] if st.get("mem_limit_mb") else None
    return {"rank": worst["rank"], "batch": st["batch"], "micro": st["micro"], "accum": -(-st["batch"] // st["micro"]),
            "full_peak_mb": worst["full_batch_peak_mb"], "accum_peak_mb": step["peak_mb"],
            "reduction": round(worst["full_batch_peak_mb"] / max(step["peak_mb"], 0.1), 2),
            "activation_cap_mb": cap, "max_abs_diff": max(c["max_abs_diff"] for c in checks)}


def time_to_failure(r) -> float:
    """Wall seconds from start until ddplab knew the outcome (a failure, or the stall verdict of a hang)."""
    return r.wall_s


def seconds_after_long_step(r) -> float | None:
    """Seconds from the last rank entering the long step (its last record before it) to the job's end:
    the failure itself, without the start-up (imports, rendezvous) that dominates the wall time."""
    import os
    from pathlib import Path

    last = r.ranks[-1].records
    steps = [x["t"] for x in last if x.get("event") in ("start", "step") and x.get("step", -1) < spec()["long_step"]]
    if not steps:
        return None
    end = os.path.getmtime(Path(r.run_dir) / "command.json") + r.wall_s
    return round(end - max(steps), 2)


# ------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------

def plot_memory_vs_batch(r):
    """Peak memory per rank against micro-batch size at the longest length, with the cap drawn in."""
    import matplotlib.pyplot as plt

    rows = sweep(r)
    st = _start(r)
    fig, ax = plt.subplots(figsize=(7, 4))
    for rank, marker in zip(sorted({d["rank"] for d in rows}), "os^v"):
        mine = [d for d in rows if d["rank"] == rank]
        ax.plot([d["micro"] for d in mine], [d["peak_mb"] for d in mine], marker=marker, linestyle="-",
                label=f"rank {rank}", alpha=0.8)
        bad = [d for d in mine if not d["fits"]]
        ax.scatter([d["micro"] for d in bad], [d["peak_mb"] for d in bad], s=140, facecolors="none",
                   edgecolors="#cf222e", zorder=3, label=None if rank else "failed under the cap (peak measured with it lifted)")
    if st.get("mem_limit_mb"):
        cap = st["mem_limit_mb"] - st["model_mb"]
        ax.axhline(cap, color="#cf222e", linestyle="--",
                   label=f"cap: {st['mem_limit_mb']:g} MiB minus the model's {st['model_mb']:.1f} MiB")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"sequences per micro-batch (padded to {rows[0]['length'] if rows else '?'} tokens)")
    ax.set_ylabel("peak memory above baseline (MiB)")
    ax.set_title(f"Measured peak memory per rank against batch size ({st.get('cap', '')}, {st.get('device', '')})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_full_vs_accumulate(r):
    """The long step's peak: the full batch (what `oom` tries) against fixed-accumulate's micro-batches."""
    import matplotlib.pyplot as plt

    m = memory_figures(r)
    fig, ax = plt.subplots(figsize=(7, 3))
    labels = [f"full batch of {m['batch']}\n(oom's step, cap lifted)", f"{m['accum']} x {m['micro']}\n(fixed-accumulate)"]
    vals = [m["full_peak_mb"], m["accum_peak_mb"]]
    ax.barh([0, 1], vals, color=["#cf222e", "#2da44e"])
    for i, v in enumerate(vals):
        ax.text(v, i, f"  {v:.1f} MiB", va="center")
    if m["activation_cap_mb"]:
        ax.axvline(m["activation_cap_mb"], color="#cf222e", linestyle="--", label="cap (activations' share)")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks([0, 1], labels)
    ax.invert_yaxis()
    ax.set_xlim(right=max(vals) * 1.35)
    ax.set_xlabel(f"peak memory above baseline on rank {m['rank']} (MiB), same effective batch")
    ax.set_title(f"Same effective batch, {m['reduction']:.1f}x less peak memory (measured)")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------
# Claim check and exercises
# ------------------------------------------------------------------------------------------------

def claim_check(r_oom, r_skip, r_acc, r_coord) -> ClaimCheck:
    m = memory_figures(r_acc)
    waits = "; ".join(f"rank {x.rank}: {x.waits_in or x.state}" for x in r_skip.ranks)
    judged = (f"judged hung once no rank made progress for {r_skip.stall.window_s:g} s, {r_skip.wall_s:.1f} s after launch"
              if r_skip.stall else f"after {r_skip.wall_s:.1f} s")
    return ClaimCheck([
        Claim("A batch size too large for memory \"will cause an out-of-memory error, which may manifest as an apparent hang\"",
              "000, Example 1 commentary",
              f"plain OOM: {r_oom.status} [{r_oom.signature}] after {r_oom.wall_s:.1f} s, the error text in the failing rank's log; "
              f"catching it on one rank only: {r_skip.status} [{r_skip.signature}], {judged} ({waits})",
              "partly" if r_oom.status == "failed" and r_skip.status == "hung" else "wrong"),
        Claim("Out of memory \"can cause processes to hang, often without clear error messages\"",
              "000, 1. Clear Explanation, Resource Exhaustion",
              f"{r_oom.signature}: " + (f"{r_oom.cause.type} on rank {r_oom.first_failure}: "
                                        f"{r_oom.cause.message.split('] ')[-1][:120]}" if r_oom.cause else "no exception recorded"),
              "wrong" if r_oom.signature in ("cpu-oom", "cuda-oom") else "holds"),
        Claim("\"The solution involves reducing the batch size or increasing the GPU memory available\"",
              "000, Example 1 commentary",
              f"micro-batch {m['micro']} x {m['accum']} accumulated under no_sync(): {m['reduction']:.1f}x less peak memory, "
              f"gradient max |diff| {m['max_abs_diff']:.1e} from the full batch; coordinated skip: {r_coord.status}",
              "partly" if r_acc.ok and m["max_abs_diff"] <= 1e-5 else "wrong"),
    ])


def check_waiting_rank(answer, r_skip) -> Check:
    """Exercise 1: in skip-batch, which rank waits in DDP's all-reduce when the job is judged hung?"""
    waiting = [x.rank for x in r_skip.ranks
               if x.state == "hung" and x.where is not None and (x.where.op, x.where.via) == ("all_reduce", "ddp-backward")]
    if answer is None:
        return Check(False, "set `answer` to a rank number, then run the cell again")
    if waiting and answer == waiting[0]:
        return Check(True, f"rank {answer} waits in {r_skip.rank(answer).waits_in} at {r_skip.rank(answer).user_frame}")
    return Check(False, f"rank {answer} is not the one in the all-reduce; read r_skip.rank(n).where.op for each rank")


def check_accum(answer, mem_limit_mb: float = 24.0, **kw) -> Check:
    """Exercise 2: which --accum lets fixed-accumulate fit under a smaller cap? Checked by a real run."""
    if answer is None:
        return Check(False, f"set `answer` to 1, 2, 4, 8 or 16 micro-batches per step for mem_limit_mb={mem_limit_mb:g}")
    try:
        r = run("fixed-accumulate", mem_limit_mb=mem_limit_mb, accum=answer, **kw)
    except DdplabError as e:
        return Check(False, str(e))
    if not r.ok:
        return Check(False, f"accum={answer}: the run {r.status} [{r.signature}]; each micro-batch is still too big")
    m = memory_figures(r)
    return Check(True, f"accum={answer}: ok, peak {m['accum_peak_mb']:.1f} MiB under a {m['activation_cap_mb']:.1f} MiB "
                       f"activation cap, gradient max |diff| {m['max_abs_diff']:.1e}")
