"""Lab 11 (mixed precision and the input pipeline): runs, figures, claim check, exercises.

The notebook calls only these. Every number comes from a real 2-rank run (``ddplab.run``) of this
execution: per optimizer step each rank records its loss, step time, the bytes autograd saved for
backward, whether its own (local) gradient held inf/NaN before DDP's all-reduce, whether the
gradient the scaler saw did, whether the step changed the weights, the scale before and after, and a
checksum of its weights; the loader variants record the time each rank waited for its DataLoader
and the time it spent in the rest of the step (forward, backward with DDP's all-reduce, step).
"""
from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Mapping

import ddplab
from ddplab.origins import catalog
from ddplab.course import claims
from ddplab.course.claim_register import FASTER, LOSS_RTOL  # the claim's thresholds, stated once in the register
from ddplab.origins import job as job_mod
from ddplab.errors import DdplabError
from ddplab.course import answers
from ddplab.course import contract
from ddplab.course.notebook import Check
from ddplab.result import RunResult

LAB = "11"


def sizes() -> dict:
    return catalog.find_lab(LAB).extra["sizes"]


def stall_s() -> float:
    return catalog.find_lab(LAB).stall_s


def validate(steps: int | None = None, **knobs) -> None:
    """Reject a knob that cannot work before any rank starts (one line, naming the fix): the
    lab's own wording for steps, then the script's declaration (contract.validate_knobs)."""
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or not sizes()["inf_step"] + 1 <= steps <= 100):
        raise DdplabError(f"steps={steps!r}: the lab needs {sizes()['inf_step'] + 1} to 100 optimizer steps "
                          f"(the scaler variants put the inf at step {sizes()['inf_step']})",
                          hint=f"use steps={sizes()['steps']}")
    contract.validate_knobs(LAB, {**knobs, "steps": steps}, run_variant)


def run_variant(variant: str, **kw) -> RunResult:
    """One real 2-rank run of lab 11 (``steps``: optimizer steps of the fp32/amp/scaler-* variants,
    ``k``, ``workers``: the script's knobs; other keywords go to ddplab.run)."""
    validate(**kw)
    args, kw = contract.script_args(LAB, kw)
    return ddplab.run(LAB, variant=variant, args=args, **kw)


def stop_while_waiting(wait_s: float = 1.5, **kw) -> RunResult:
    """slow-loader, stopped the way a learner would stop it: as soon as one rank has waited
    ``wait_s`` in a training step's all-reduce (the moment it "looks hung"; a wait in DDP's
    construction, while a slower rank is still starting, does not count), a KeyboardInterrupt, as
    from Ctrl-C or Jupyter's stop button. ddplab ends the job, reads every rank's stack and returns
    the result."""
    # a training step's waits: DDP's gradient all_reduce, and from the second step on the broadcast
    # DDP rebuilds its buckets with (CI at 73b7555, loaded: step 1's all_reduce wait stayed under
    # wait_s and step 2's wait was that broadcast). A broadcast counts only after an all_reduce was
    # seen, at a later sequence number: the broadcasts before it are DDP's construction.
    first_all_reduce: list[int] = []

    def progress(snap):
        waits = [row for row in snap.ranks if row["state"] == "waiting"]
        seen = [row["seq"] for row in waits if row["op"] == "all_reduce"]
        if seen and not first_all_reduce:
            first_all_reduce.append(min(seen))
        if any(row["idle_s"] >= wait_s and (row["op"] == "all_reduce" or (
                row["op"] in DDP_STEP_OPS and first_all_reduce and row["seq"] > first_all_reduce[0]))
               for row in waits):
            raise KeyboardInterrupt
    root = Path(kw.pop("run_root", None) or job_mod.runs_root())
    before = set(root.glob("**/result.json"))
    try:
        return ddplab.run(LAB, variant="slow-loader", progress=progress, run_root=root, **kw)
    except KeyboardInterrupt:
        made = sorted(set(root.glob("**/result.json")) - before, key=os.path.getmtime)
        if not made:
            raise
        return RunResult.load(made[-1])


# ------------------------------------------------------------------------------------------------
# Reading the measurements out of results
# ------------------------------------------------------------------------------------------------

def steps(r: RunResult, rank: int = 0, precision: str | None = None) -> list[dict]:
    """One rank's step records, in order (``precision``: "fp32" or "amp" in an amp run)."""
    rows = sorted((s for s in r.records_of("step") if s["rank"] == rank
                   and (precision is None or s["precision"] == precision)), key=lambda s: s["step"])
    if not rows:
        raise ValueError(f"{r.variant} ({r.status}) has no step records: pass an amp or scaler-* run that finished")
    return rows


def start(r: RunResult, precision: str) -> dict:
    return next(s for s in r.records_of("start") if s["rank"] == 0 and s["precision"] == precision)


def amp_summary(ramp: RunResult) -> dict:
    """float32 against autocast in one amp run, rank 0; the two replicas stepped in turn, so their
    times were taken under the same load (the first step is a warm-up)."""
    a, b = steps(ramp, 0, "fp32"), steps(ramp, 0, "amp")
    rel = [abs(y["loss"] - x["loss"]) / abs(x["loss"]) for x, y in zip(a, b)]
    t32, tamp = (statistics.median(s["step_s"] for s in rows[1:]) for rows in (a, b))
    gpu = on_gpu(ramp)
    return {"dtype": start(ramp, "amp")["dtype"].replace("torch.", ""), "device": start(ramp, "amp")["device"],
            "scaler": start(ramp, "amp")["scaler"], "steps": len(a),
            "max_rel_loss_diff": max(rel), "loss_fp32": [s["loss"] for s in a], "loss_amp": [s["loss"] for s in b],
            "step_ms_fp32": 1e3 * t32, "step_ms_amp": 1e3 * tamp, "speedup": t32 / tamp,
            "act_mb_fp32": a[0]["act_bytes"] / 2**20, "act_mb_amp": b[0]["act_bytes"] / 2**20,
            "peak_mb_fp32": max(s["peak_mb"] for s in a) if gpu else None,
            "peak_mb_amp": max(s["peak_mb"] for s in b) if gpu else None}


def on_gpu(r: RunResult) -> bool:
    return any(s["device"].startswith("cuda") for s in r.records_of("start"))


def same_update_as_unscaled(r_sync: RunResult, ramp: RunResult) -> bool:
    """Before the inf step, the scaler run's weights (scaled loss, unscaled gradient) equal the amp
    run's autocast replica's, bit for bit, on every rank. On the CPU that replica has no scaler, so
    this compares scaled with unscaled; on a GPU both scale (fp16), so it only shows the run repeats."""
    k = sizes()["inf_step"]
    return all([s["checksum"] for s in steps(r_sync, rank)[:k]] == [s["checksum"] for s in steps(ramp, rank, "amp")[:k]]
               for rank in (0, 1))


def scaler_at_inf(r: RunResult) -> dict[int, dict]:
    """rank -> its record of the step where rank 1's local gradient held inf/NaN."""
    k = sizes()["inf_step"]
    return {rank: next(s for s in steps(r, rank) if s["step"] == k) for rank in (0, 1)}


def skipped_ranks(r: RunResult) -> list[int]:
    return sorted(rank for rank, s in scaler_at_inf(r).items() if not s["stepped"])


def weights_agree(r: RunResult) -> list[bool]:
    """Per step: do the ranks' weight checksums agree after the step?"""
    return [a["checksum"] == b["checksum"] for a, b in zip(steps(r, 0), steps(r, 1))]


def scales(r: RunResult) -> dict[int, list[float]]:
    return {rank: [s["scale_after"] for s in steps(r, rank)] for rank in (0, 1)}


def loader(r: RunResult) -> dict[int, dict]:
    """rank -> its slow-loader record: seconds waiting for the DataLoader, in the rest of the step."""
    rows = {x["rank"]: x for x in r.records_of("loader")}
    if len(rows) < 2:
        raise ValueError(f"{r.variant} ({r.status}) has no loader records: pass a slow-loader run that finished")
    return rows


def waiting_share(r: RunResult) -> dict[int, float]:
    """rank -> share of its wall time spent waiting: rank 1 for its DataLoader, rank 0 in the rest of
    the step, which is its wait in DDP's all-reduce (its own compute is milliseconds)."""
    rows = loader(r)
    return {0: rows[0]["compute_s"] / rows[0]["wall_s"], 1: rows[1]["data_wait_s"] / rows[1]["wall_s"]}


def sweep(r: RunResult) -> list[dict]:
    """One row per DataLoader setting: samples/s per rank (median over both ranks and every round,
    with the lowest and highest as the spread) and the share of time spent in next(loader)."""
    rows = r.records_of("sweep")
    if not rows:
        raise ValueError(f"{r.variant} ({r.status}) has no sweep records: pass a loader-sweep run that finished")
    out = []
    for key in dict.fromkeys((x["workers"], x["prefetch"], x["pin_memory"]) for x in rows):
        every = [x for x in rows if (x["workers"], x["prefetch"], x["pin_memory"]) == key]
        rate = [x["samples_per_s"] for x in every]
        out.append({"workers": key[0], "prefetch": key[1], "pin_memory": key[2],
                    "samples_per_s": statistics.median(rate), "low": min(rate), "high": max(rate),
                    "wait_share": statistics.median(x["data_wait_s"] / x["wall_s"] for x in every),
                    "pinned": any(x["pinned"] for x in every), "measurements": len(every),
                    "warnings": sorted({w for x in every for w in x["warnings"]})})
    return out


def sweep_label(row: dict) -> str:
    return (f"workers={row['workers']}" + (f", prefetch={row['prefetch']}" if row["prefetch"] else "")
            + (", pin_memory" if row["pin_memory"] else ""))


# ------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------

def plot_amp(ramp: RunResult):
    import matplotlib.pyplot as plt

    s = amp_summary(ramp)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    a1.plot(s["loss_fp32"], "-o", label="float32")
    a1.plot(s["loss_amp"], "--s", label=f"autocast {s['dtype']}")
    a1.set_xlabel(f"optimizer step ({sizes()['k']} micro-batches each)")
    a1.set_ylabel("loss (rank 0)")
    a1.set_title(f"Measured: loss, max relative difference {s['max_rel_loss_diff']:.1e}", fontsize=10)
    a1.legend(fontsize=8)
    names = ["step time (ms)", "saved activations\nper micro-batch (MiB)"]
    pairs = [(s["step_ms_fp32"], s["step_ms_amp"]), (s["act_mb_fp32"], s["act_mb_amp"])]
    if s["peak_mb_fp32"] is not None:
        names.append("peak GPU memory (MiB)")
        pairs.append((s["peak_mb_fp32"], s["peak_mb_amp"]))
    for i, (x, y) in enumerate(pairs):
        a2.bar(i - 0.2, 1.0, 0.4, color="#0969da", label="float32 = 1" if i == 0 else None)
        a2.bar(i + 0.2, y / x, 0.4, color="#bf8700", label=f"autocast {s['dtype']}" if i == 0 else None)
        a2.text(i - 0.2, 1.0, f"{x:.1f}", ha="center", va="bottom", fontsize=8)
        a2.text(i + 0.2, y / x, f"{y:.1f}", ha="center", va="bottom", fontsize=8)
    a2.set_xticks(range(len(names)), names, fontsize=8)
    a2.set_ylim(0, 1.35 * max(1.0, max(y / x for x, y in pairs)))
    a2.set_ylabel("autocast / float32")
    a2.set_title(f"Measured on {s['device']} (2 gloo ranks); time: median of steps 2-{s['steps']}", fontsize=10)
    a2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_scaler(r_sync: RunResult, r_unsynced: RunResult):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    k = sizes()["inf_step"]
    for ax, r, name in ((axes[0], r_sync, "scaler-inf (no_sync, last micro-batch synced)"),
                        (axes[1], r_unsynced, "scaler-inf-unsynced (never synced)")):
        for rank, marker in ((0, "-o"), (1, "--^")):
            ax.plot(scales(r)[rank], marker, label=f"rank {rank} scale after step")
        for st, ok in enumerate(weights_agree(r)):
            ax.text(st, 2 ** 17.3, "=" if ok else "≠", ha="center", color="#1a7f37" if ok else "#cf222e")
        ax.axvline(k, color="#cf222e", alpha=0.3, linewidth=6, label="rank 1's local gradient holds inf/NaN")
        ax.set_yscale("log", base=2)
        ax.set_ylim(2 ** 14, 2 ** 18)
        ax.set_xlabel("optimizer step")
        ax.set_title(f"Measured: {name}\n= / ≠ : ranks' weights equal after the step", fontsize=9)
        ax.legend(fontsize=7, loc="lower left")
    axes[0].set_ylabel("GradScaler scale")
    fig.tight_layout()
    return fig


def plot_loader(r_slow: RunResult):
    import matplotlib.pyplot as plt

    rows = loader(r_slow)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for rank in (0, 1):
        x = rows[rank]
        ax.barh(rank, x["data_wait_s"], color="#bf8700", label="waiting for its DataLoader" if rank == 0 else None)
        ax.barh(rank, x["compute_s"], left=x["data_wait_s"], color="#0969da",
                label="forward + backward (DDP all-reduce) + step" if rank == 0 else None)
    for rank, longest in ((0, rows[0]["max_compute_s"]), (1, rows[1]["max_data_wait_s"])):
        ax.plot([0, longest], [rank + 0.32] * 2, color="black", marker="|",
                label="its longest single wait (one step)" if rank == 0 else None)
    ax.axvline(stall_s(), color="grey", linestyle=":", label=f"ddplab's stall window ({stall_s():.0f} s)")
    ax.set_yticks([0, 1], [f"rank {r}\n({rows[r]['read_ms']} ms read + {rows[r]['decode_ms']} ms decode\nper sample)"
                           for r in (0, 1)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (measured, wall time)")
    ax.set_title("Measured: where each rank's time went in slow-loader", fontsize=10)
    # under the axes: inside, it covered rank 1's bar
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.5 / fig.get_figheight(), 1, 1))
    return fig


def plot_sweep(r_sweep: RunResult):
    import matplotlib.pyplot as plt

    rows = sweep(r_sweep)
    fig, ax = plt.subplots(figsize=(8, 3.4))
    mid = [x["samples_per_s"] for x in rows]
    ax.bar(range(len(rows)), mid, color="#0969da")
    ax.errorbar(range(len(rows)), mid, yerr=[[m - x["low"] for m, x in zip(mid, rows)],
                                            [x["high"] - m for m, x in zip(mid, rows)]],
                fmt="none", ecolor="black", capsize=4, label="lowest and highest measurement")
    for i, x in enumerate(rows):
        ax.text(i, x["high"], f"{x['samples_per_s']:.0f}\n{x['wait_share']:.0%} wait", ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), [sweep_label(x).replace(", ", "\n") for x in rows], fontsize=8)
    ax.set_ylabel("samples/s per rank (measured)")
    ax.set_ylim(top=max(x["high"] for x in rows) * 1.35)
    ax.set_title(f"Measured: DataLoader settings, 2 ranks on this machine ({rows[0]['measurements']} measurements "
                 "each: both ranks, every round)\nstorage latency is a sleep (an imitation); decoding is real CPU "
                 "work", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------
# Claim check and exercises
# ------------------------------------------------------------------------------------------------

CPU_AMP = ("torch.amp bf16 on this machine's CPU, not fp16 on a GPU: mixed precision's speed comes from the GPU's "
           "tensor cores, so a CPU run does not test this claim")
CPU_SCALER = ("torch.amp.GradScaler under bf16 autocast on the CPU, in place of apex amp.scale_loss on fp16: bf16 needs no "
              "loss scaling, so nothing here shows scaling handled appropriately")


def claim_inputs(runs: Mapping[str, RunResult]) -> claims.Inputs:
    """What these runs measured for the register's claims (ddplab.course.claim_register); judged there. Keys
    read (variant names): "amp", "scaler-inf", "slow-loader"."""
    ramp, r_sync, r_slow = runs["amp"], runs["scaler-inf"], runs["slow-loader"]
    s = amp_summary(ramp)
    gpu = on_gpu(ramp)
    mem = (f"; peak GPU memory {s['peak_mb_amp']:.0f} vs {s['peak_mb_fp32']:.0f} MiB" if gpu else "")
    cpu_amp = claims.stand_in(CPU_AMP)
    rows = {"amp-performance": claims.evidence(
        f"{s['device']}, autocast {s['dtype']}, GradScaler {'on' if s['scaler'] else 'off'}: "
        f"{s['step_ms_amp']:.0f} ms per step vs {s['step_ms_fp32']:.0f} ms float32 ({s['speedup']:.2f}x); saved "
        f"activations {s['act_mb_amp']:.2f} vs {s['act_mb_fp32']:.2f} MiB per micro-batch{mem}; loss within "
        f"{s['max_rel_loss_diff']:.1e} (relative) over {s['steps']} steps",
        faster=s["speedup"] >= FASTER if gpu else cpu_amp,
        less_memory=s["act_mb_amp"] < s["act_mb_fp32"] and s["peak_mb_amp"] < s["peak_mb_fp32"] if gpu else cpu_amp,
        same_loss=s["max_rel_loss_diff"] <= LOSS_RTOL if gpu else cpu_amp)}
    at, sc = scaler_at_inf(r_sync), scales(r_sync)
    same = same_update_as_unscaled(r_sync, ramp)
    compared = ("the amp run's autocast replica's, which also scales on a GPU (so this part shows only that the "
                "run repeats)" if on_gpu(r_sync) else "the unscaled run's (the amp run's autocast replica)")
    scaler = None if on_gpu(r_sync) else claims.stand_in(CPU_SCALER)
    rows["scale-loss"] = claims.evidence(
        f"before step {sizes()['inf_step']} the weights equal {compared} bit for bit: {same}; at step "
        f"{sizes()['inf_step']} the local gradient is non-finite on rank(s) "
        f"{[k for k, v in at.items() if v['local_nonfinite']]}, after DDP's all-reduce on "
        f"{[k for k, v in at.items() if v['grads_nonfinite']]}; the step is skipped on {skipped_ranks(r_sync)}; "
        f"scale {at[0]['scale_before']:.0f} -> {at[0]['scale_after']:.0f} (rank 0), {at[1]['scale_before']:.0f} -> "
        f"{at[1]['scale_after']:.0f} (rank 1); weights equal across ranks after every step: "
        f"{all(weights_agree(r_sync))} (GradScaler on {'a GPU, fp16' if on_gpu(r_sync) else 'the CPU with bf16 autocast'})",
        same_update=scaler or same, skipped_everywhere=scaler or skipped_ranks(r_sync) == [0, 1],
        scales_agree=scaler or sc[0] == sc[1], weights_agree=scaler or all(weights_agree(r_sync)))
    ld, share = loader(r_slow), waiting_share(r_slow)
    longest = max(ld[0]["max_compute_s"], ld[1]["max_data_wait_s"])
    rows["illusion-of-hang"] = claims.evidence(
        f"{r_slow.status}; rank 1 waited {share[1]:.0%} of its time for its DataLoader, rank 0 {share[0]:.0%} in "
        f"its step (DDP's all-reduce, waiting for rank 1); longest single wait {longest:.1f} s against ddplab's "
        f"{stall_s():.0f} s stall window",
        mostly_waiting=min(share.values()) > 0.5, looks_hung=longest > stall_s(), not_hung=r_slow.status == "ok")
    return claims.Inputs(LAB, rows)


def _skipped(r_sync: RunResult) -> list[tuple[int, ...]]:
    return [tuple(skipped_ranks(r_sync))]


@answers.exercise("skipped-ranks", answers.Ranks(2), accepted=_skipped, name="predicted_skipped_ranks")
def check_skipped_ranks(answer: tuple[int, ...], r_sync: RunResult) -> Check:
    """Exercise 1: at the step where only rank 1's local gradient holds inf/NaN, on which ranks does
    scaler.step() skip the update? A list of rank numbers, e.g. [1] or [0, 1]."""
    truth = skipped_ranks(r_sync)
    if list(answer) == truth:
        return Check(True, f"skipped on {truth}: after DDP's all-reduce the gradient of rank(s) {truth} held the NaN, "
                           f"and each scaler checks the gradient it holds (scales after the step: "
                           f"{[round(x['scale_after']) for x in scaler_at_inf(r_sync).values()]})")
    return Check(False, f"not {list(answer)}: the scaler checks the gradient DDP has all-reduced, not the rank's own; "
                        "what does an all-reduce of inf and a finite number give?")


SCALE_CHANGES = ("kept", "halved", "doubled")


def _change(before: float, after: float) -> str:
    return "kept" if after == before else "halved" if after == before / 2 else "doubled" if after == 2 * before else "other"


def _rank0_change(r_unsynced: RunResult) -> list[str]:
    x = scaler_at_inf(r_unsynced)[0]
    return [c for c in [_change(x["scale_before"], x["scale_after"])] if c in SCALE_CHANGES]


@answers.exercise("unsynced-scale", answers.Choice(SCALE_CHANGES), accepted=_rank0_change,
                  name="predicted_rank0_scale")
def check_unsynced_scale(answer: str, r_unsynced: RunResult) -> Check:
    """Exercise 2: in scaler-inf-unsynced, does rank 0's GradScaler scale stay ("kept"), halve ("halved")
    or double ("doubled") at the inf step? Checked against rank 0's recorded scale before and after."""
    x = scaler_at_inf(r_unsynced)[0]
    if answer in _rank0_change(r_unsynced):
        return Check(True, f"{answer}: rank 0's scale {x['scale_before']:.0f} -> {x['scale_after']:.0f}; rank 0 "
                           f"{'stepped' if x['stepped'] else 'skipped'}: no all-reduce brought rank 1's NaN into its "
                           "gradient")
    return Check(False, f"not {answer}: which gradient does rank 0's scaler check, and did any all-reduce "
                        "bring rank 1's NaN into it?")


# DDP's collectives in a step, where rank 0 waits for the slow rank: backward's gradient all_reduce or
# the next forward's buffer broadcast. Which one the stop catches is a race (seen in CI under load).
DDP_STEP_OPS = ("all_reduce", "broadcast")


def _waits(r_stopped: RunResult) -> list[tuple[str, int]]:
    """Where rank 0 waits when the stop lands, and for which rank: either of DDP's step collectives
    (a race), beside the one this run caught."""
    w0 = r_stopped.rank(0).where
    slow = [r.rank for r in r_stopped.ranks if r.where is not None and r.where.kind == "dataloader" and r.rank != 0]
    if w0 is None or not w0.in_collective or not slow:
        return []
    return sorted({(op, r) for op in {*DDP_STEP_OPS, w0.op} for r in slow})


@answers.exercise("where-rank0-waits", answers.Pair(answers.collective(), answers.Rank(2),
                                                    what='a pair like ("barrier", 0)'),
                  accepted=_waits, name="predicted_wait")
def check_where_rank0_waits(answer: tuple[str, int], r_stopped: RunResult) -> Check:
    """Exercise 3: slow-loader stopped while it looked hung: rank 0 is blocked in which collective,
    and waiting for which rank? A pair: ("collective name", rank)."""
    w0 = r_stopped.rank(0).where
    if not _waits(r_stopped):
        return Check(False, "this stopped run did not catch rank 0 in a collective while another rank was in its "
                            "DataLoader: run the stop cell again")
    op, rank = answer
    if answer in _waits(r_stopped):
        caught = f"this run caught rank 0 in {w0.op}" + (f" ({w0.via})" if w0.via else "")
        return Check(True, f"({op!r}, {rank}): {caught}, waiting for rank {rank}, whose stack is in its DataLoader: "
                           "slow, not stuck")
    return Check(False, f"not {answer!r}: read each rank's `where` in the stopped run: what is rank 0 "
                        "blocked in, and which rank is somewhere else?")


EXERCISES = answers.exercises(check_skipped_ranks, check_unsynced_scale, check_where_rank0_waits)
