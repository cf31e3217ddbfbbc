"""Lab 02 (out of memory, and the OOM that turns into a hang): runs, figures, claim check, exercises.

The notebook calls only these. Every number comes from a real run (``ddplab.run``) of this execution.
Memory is "MiB above the rank's baseline": on CPU the rank's peak RSS (VmHWM, reset per phase)
under an RLIMIT_DATA cap, on a GPU the CUDA allocator's ``max_memory_allocated`` under
``set_per_process_memory_fraction``.
"""
from __future__ import annotations

from typing import Mapping

import ddplab
from ddplab.origins import catalog
from ddplab.course import claims
from ddplab.errors import DdplabError
from ddplab.course import answers
from ddplab.course import contract
from ddplab.course.notebook import Check

LAB = LAB_ID = "02"
EXERCISE_MEM_LIMIT_MB = 24.0
DEFAULT_MEM_LIMIT_MB = contract.declared(LAB)["mem_limit_mb"]["default"]   # the script's, read by ast


def spec() -> dict:
    """The model sizes the lab script declares in its LAB dict (read without importing torch)."""
    return catalog.find_lab(LAB_ID).extra["model"]


def model_mb() -> float:
    """Parameters + gradients + SGD momentum of the lab's TokenMLP, float32, in MiB."""
    f, h = spec()["features"], spec()["hidden"]
    params = f * h + h + h * h + h + h + 1
    return params * 4 * 3 / 2**20


def validate(**knobs) -> None:
    """Reject knobs that cannot work, before any rank starts (one line, naming the fix): the lab's
    own checks (the cap against the model's size, accum against the batch), then the script's
    declaration (contract.validate_knobs)."""
    given = {k: knobs.get(k, s["default"]) for k, s in contract.declared(LAB).items()}
    batch, mem_limit_mb, accum = given["batch"], given["mem_limit_mb"], given["accum"]
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise DdplabError(f"batch must be a whole number of sequences, at least 1 (got {batch!r})",
                          hint="for example batch=16")
    try:
        mem_limit_mb = float(mem_limit_mb)
    except (TypeError, ValueError):
        raise DdplabError(f"mem_limit_mb must be a number of MiB, not {mem_limit_mb!r}",
                          hint="for example mem_limit_mb=48") from None
    need = model_mb()
    if mem_limit_mb < 0 or 0 < mem_limit_mb <= need:
        raise DdplabError(f"mem_limit_mb={mem_limit_mb:g} is too small for the model itself "
                          f"({need:.1f} MiB of parameters, gradients and SGD momentum)",
                          hint=f"use mem_limit_mb={DEFAULT_MEM_LIMIT_MB:g} (any value above "
                               f"{need:.1f}), or 0 for no cap")
    if isinstance(accum, int) and accum > batch:
        raise DdplabError(f"accum={accum!r} is not a number of micro-batches for a batch of {batch}",
                          hint="use 0 (find the largest micro-batch that fits) or 1, 2, 4, 8, 16 "
                               "(at most the batch)")
    contract.validate_knobs(LAB, knobs, run)


def run(variant: str, **kw) -> "ddplab.RunResult":
    """Validate the lab's knobs, then one real 2-rank run of lab 02 (extra keywords go to ddplab.run).
    A hang (skip-batch) is ended by ddplab's stall rule: no rank made progress for the stall window."""
    validate(**kw)
    args, kw = contract.script_args(LAB, kw)
    result = ddplab.run(LAB_ID, variant=variant, args=args, **kw)
    remove_cgroups(result)
    return result


def run_variant(variant: str, **kw) -> "ddplab.RunResult":
    """The workbook contract's name for ``run``."""
    return run(variant, **kw)


def remove_cgroups(result) -> list[str]:
    """oom-killer: the kernel killed the rank inside its cgroup, so nothing in the job removed the
    directory; remove it here (an empty cgroup directory is removed with rmdir). Returns what is left."""
    import os
    import time

    left = []
    for rec in result.records_of("cgroup"):
        for _ in range(50):                      # the killed process leaves the cgroup a moment after it dies
            try:
                os.rmdir(rec["path"])
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            left.append(rec["path"])
    return left


def cgroup_reason() -> str | None:
    """Why the kernel's OOM killer cannot be run here (one line), or None when a child memory cgroup
    can be made (cgroup v1 memory controller, or v2 with memory in the parent's subtree_control)."""
    import os

    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return "no /proc/self/cgroup: not Linux"
    v1 = next((l.split(":", 2)[2] for l in lines if l.split(":")[1] == "memory"), None)
    if v1 is not None and os.path.isdir("/sys/fs/cgroup/memory"):
        parent = "/sys/fs/cgroup/memory" + v1.rstrip("/")
    else:
        v2 = next((l.split(":", 2)[2] for l in lines if l.startswith("0::")), "/")
        parent = "/sys/fs/cgroup" + v2.rstrip("/")
        ctl = os.path.join(parent, "cgroup.subtree_control")
        if not os.path.exists(ctl) or "memory" not in open(ctl).read().split():
            return f"the memory controller is not enabled for child cgroups of {parent}"
    if not os.access(parent, os.W_OK):
        return f"no permission to make a cgroup under {parent} (run as root, or delegate the cgroup to you)"
    return None


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

GPU_STAND_IN = "no GPU memory here: "
KILLER_STAND_IN = GPU_STAND_IN + "the kernel's OOM killer on host memory (a cgroup limit) stands in for running out of GPU memory"
CAP_STAND_IN = GPU_STAND_IN + "an RLIMIT_DATA cap on host memory stands in for the GPU's memory"


def oom_killer_facts(r) -> dict:
    """The oom-killer run as fields: the killed rank(s), its limit, whether it left a Python error, whether
    any rank's log names memory, and what the peers got."""
    killed = [x.rank for x in r.ranks if x.signal == "SIGKILL"]
    cg = next(iter(r.records_of("cgroup")), {})
    logs = " ".join(l for x in r.ranks if x.rank in killed for l in (x.log_tail or "").lower().splitlines()
                    if '{"event": ' not in l)       # the rank's own lines, not the lab's records echoed
    peers = {x.rank: (x.error.type if x.error else None, _first(x.error.message) if x.error else None)
             for x in r.ranks if x.rank not in killed}
    steps = {s["step"] for s in r.records_of("step") if s["rank"] in killed}
    return {"killed": killed, "limit_mb": cg.get("limit_mb"), "cgroup_version": cg.get("version"),
            "killed_error": [x.error.type for x in r.ranks if x.rank in killed and x.error],
            "log_names_memory": any(w in logs for w in ("out of memory", "can't allocate", "memory")),
            "peers": peers, "killed_after_step": max(steps) if steps else None, "status": r.status,
            "signature": r.signature, "hung": r.status == "hung", "wall_s": r.wall_s}


def _first(text: str | None, n: int = 70) -> str:
    from ddplab.views.render import _first_line

    line = _first_line(text or "", 10_000)
    line = line.split("] ", 1)[-1] if line.startswith("[") else line   # drop gloo's source-file prefix
    return _first_line(line, n)


def silent_row(r_killer) -> claims.Evidence:
    """The resource-exhaustion claim's evidence from the oom-killer run (its parts stand-ins: host memory)."""
    if r_killer is None:
        reason = cgroup_reason() or "the oom-killer run was not made in this execution"
        return claims.evidence(f"not run: {reason}", hang=claims.not_measured(reason),
                               no_clear_message=claims.not_measured(reason))
    f = oom_killer_facts(r_killer)
    peers = "; ".join(f"rank {k}: {t}: {m}" if t else f"rank {k}: no error" for k, (t, m) in f["peers"].items())
    ended = [x.rank for x in r_killer.ranks if x.signal == "SIGTERM"]
    return claims.evidence(
        f"rank(s) {f['killed']} under a {f['limit_mb']:.1f} MiB cgroup v{f['cgroup_version']} limit: SIGKILL by the "
        f"kernel after step {f['killed_after_step']}, Python error: {f['killed_error'] or 'none'}, log names memory: "
        f"{'yes' if f['log_names_memory'] else 'no'}; the peer: {peers}; the job ended {f['status']} [{f['signature']}] "
        f"after {f['wall_s']:.1f} s" + (f" (torchrun sent SIGTERM to rank(s) {ended})" if ended else ""),
        hang=claims.stand_in(KILLER_STAND_IN), no_clear_message=claims.stand_in(KILLER_STAND_IN))


def claim_inputs(runs: Mapping[str, "ddplab.RunResult"]) -> claims.Inputs:
    """What these runs measured for the register's claims (ddplab.course.claim_register). Keys read: "skip-batch",
    "fixed-accumulate", "fixed-coordinated-skip", and "oom-killer": that run, absent or None where the
    machine cannot make a memory cgroup. Every memory limit here is host memory, a stand-in for the GPU's:
    the parts about GPU memory are judged by none of them."""
    r_skip, r_acc, r_coord = runs["skip-batch"], runs["fixed-accumulate"], runs["fixed-coordinated-skip"]
    r_killer = runs.get("oom-killer")
    waiting = [x for x in r_skip.ranks if x.where is not None and (x.where.op, x.where.via) == ("all_reduce", "ddp-backward")]
    skipped = sorted({s["rank"] for s in r_skip.records_of("skipped")})
    judged = (f"no rank made progress for {r_skip.stall.window_s:g} s" if r_skip.stall else f"after {r_skip.wall_s:.1f} s")
    m = memory_figures(r_acc)
    return claims.Inputs(LAB, {
        "oom-hangs-silently": silent_row(r_killer),
        "hang-in-gradient-aggregation": claims.evidence(
            f"skip-batch: rank(s) {skipped} caught the failed allocation and skipped; the job ended {r_skip.status} "
            f"[{r_skip.signature}] ({judged}); " + "; ".join(f"rank {x.rank}: {x.waits_in or x.state}" for x in r_skip.ranks),
            gpu_allocation_fails=claims.stand_in(CAP_STAND_IN),
            hang_in_gradient_all_reduce=r_skip.status == "hung" and bool(waiting)),
        "smaller-batch-fixes": claims.evidence(
            f"fixed-accumulate: {r_acc.status}, micro-batch {m['micro']} x {m['accum']} peaked at {m['accum_peak_mb']:.1f} MiB "
            f"under a {m['activation_cap_mb']:.1f} MiB activation cap; the full batch of {m['batch']} needs {m['full_peak_mb']:.1f} MiB "
            f"(measured with the cap lifted); gradient max |diff| from the full batch {m['max_abs_diff']:.1e}; "
            f"coordinated skip: {r_coord.status}",
            smaller_batch_fits=claims.stand_in(CAP_STAND_IN)),
    })


def _in_gradient_all_reduce(r_skip) -> list[int]:
    return [x.rank for x in r_skip.ranks
            if x.state == "hung" and x.where is not None and (x.where.op, x.where.via) == ("all_reduce", "ddp-backward")]


@answers.exercise("waiting-rank", answers.Rank(2), accepted=_in_gradient_all_reduce, name="waiting_rank")
def check_waiting_rank(answer: int, r_skip) -> Check:
    """Exercise 1 (predicted before the run): in skip-batch, which rank waits in DDP's gradient
    all-reduce when the job is judged hung?"""
    if answer in _in_gradient_all_reduce(r_skip):
        return Check(True, f"rank {answer} waits in {r_skip.rank(answer).waits_in} at {r_skip.rank(answer).user_frame}")
    return Check(False, f"rank {answer} is not in the gradient all-reduce: which rank skipped the batch, and what "
                        "does the OTHER rank's backward() do? Read r_skip.rank(n).where for each rank")


ACCUM_CHOICES = (1, 2, 4, 8, 16)


def smallest_accum(probe) -> int:
    """From a fixed-accumulate run with accum=0 (the probe): the fewest micro-batches per step whose
    micro-batch fits under that run's cap."""
    st = _start(probe)
    if probe.variant != "fixed-accumulate" or not probe.records_of("probe"):
        raise ValueError(f"{probe.variant} ({probe.status}) has no probe: pass a fixed-accumulate run with accum=0")
    return -(-st["batch"] // st["micro"])


READ_MB = 0.5   # check_accum: a peak this close to the cap's line reads as on it (both answers pass)


def plot_peaks(r) -> dict[int, float]:
    """The memory-vs-batch plot's points: micro-batch -> its peak above baseline on the rank that needed most."""
    peaks: dict[int, float] = {}
    for p in sweep(r):
        peaks[p["micro"]] = max(peaks.get(p["micro"], 0.0), p["peak_mb"])
    return dict(sorted(peaks.items()))


def fewest_on_plot(r, mem_limit_mb: float = EXERCISE_MEM_LIMIT_MB) -> list[int]:
    """The fewest micro-batches per step under ``mem_limit_mb`` as the plot of ``r`` shows it: the batch
    divided by the largest micro-batch whose peak stays under the cap's activation share (the cap minus
    the model). A point within READ_MB of the line can be read either way: both readings pass."""
    st = _start(r)
    if not sweep(r):
        raise ValueError(f"{r.variant} ({r.status}) has no probe records: pass the fixed-accumulate run plotted above")
    share = mem_limit_mb - st["model_mb"]
    under = [m for m, peak in plot_peaks(r).items() if peak <= share + READ_MB]
    clearly = [m for m, peak in plot_peaks(r).items() if peak <= share - READ_MB]
    return sorted({-(-st["batch"] // max(ms)) for ms in (under, clearly) if ms})


def _fewest(r_acc=None, mem_limit_mb: float = EXERCISE_MEM_LIMIT_MB, **kw) -> list[int]:
    return fewest_on_plot(r_acc, mem_limit_mb) if r_acc is not None else []


@answers.exercise("accum", answers.Whole(1, 16, "a number of micro-batches per step", label="accum",
                                         only=ACCUM_CHOICES), accepted=_fewest)
def check_accum(answer: int, r_acc=None, mem_limit_mb: float = EXERCISE_MEM_LIMIT_MB, **kw) -> Check:
    """Exercise 2: under a smaller cap (``mem_limit_mb``, 24 MiB), what is the FEWEST micro-batches per
    step (--accum) with which fixed-accumulate fits? Read off the memory-vs-batch plot of ``r_acc`` (the
    fixed-accumulate run above), and judged from that same plot's points: peak memory depends on the
    machine (allocator, torch build, threads), so the answer is this run's, not the instructor's. A
    wrong one is not told which way to go (no search by halving)."""
    if r_acc is None or not r_acc.ok or not sweep(r_acc):
        return Check(False, "pass the fixed-accumulate run the plot was drawn from: lab02.check_accum(answer, r_acc)")
    st = _start(r_acc)
    share, peaks = mem_limit_mb - st["model_mb"], plot_peaks(r_acc)
    if answer in fewest_on_plot(r_acc, mem_limit_mb):
        micro = -(-st["batch"] // answer)
        return Check(True, f"accum={answer}: on your plot micro-batches of {micro} peaked at {peaks.get(micro, 0):.1f} "
                           f"MiB, under the {share:.1f} MiB activation share of a {mem_limit_mb:g} MiB cap"
                           + (f"; micro-batches of {2 * micro} peaked at {peaks[2 * micro]:.1f} MiB"
                              if 2 * micro in peaks else ""))
    return Check(False, f"accum={answer} is not the fewest that fits under {mem_limit_mb:g} MiB: on the plot, take the "
                        "cap's activation share (the cap minus the model) and find the largest micro-batch whose peak "
                        "stays under it; accum is the batch divided by that micro-batch")


EXERCISES = answers.exercises(check_waiting_rank, check_accum)
