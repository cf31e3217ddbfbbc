"""Lab 07 - scaling overhead, measured: sweeps over ``ddplab.run``, tables, plots, claim check,
exercise checkers. Every number comes from a run made by the caller in this execution; the one
exception, the DataParallel traffic model, is fed with measured numbers and says "model" wherever
it is shown.

Timing decomposition of one step (per rank, from the lab's DDP communication hook):
  step       = compute + exposed communication
  exposed    = time backward still waited for the all-reduce after its last bucket was launched
  overlap    = all-reduce time that ran while backward was still computing (hidden)
  comm       = union of the buckets' all-reduce intervals (= overlap + exposed, roughly)
  comm frac  = exposed / step: the share of the step that communication costs
"""
from __future__ import annotations

import html
import os
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

import ddplab
from ddplab.errors import DdplabError
from ddplab.course import answers, claims
from ddplab.rank import lab_args
from ddplab.course import contract
from ddplab.course.notebook import GAIN, Check, P_LEVEL, sign_test_p

LAB = "07"
KNOBS = contract.declared(LAB)          # the script's knobs, read by ast (no torch)
FIXES = tuple(KNOBS["fix"]["choices"])
FIX_LABELS = {"none": "baseline", "batch": "batch x k", "accumulate": "no_sync, every k steps",
              "bucket": "bucket_cap_mb", "static": "grad-as-bucket-view + static_graph",
              "fp16": "fp16 compress hook", "bf16": "bf16 compress hook"}


def cores() -> int:
    return os.cpu_count() or 1


def oversubscribed(nproc: int) -> bool:
    return nproc > cores()


# ----------------------------------------------------------------------------------------------
# input checks (before any rank starts)
# ----------------------------------------------------------------------------------------------

def check_knobs(widths=(1024,), batches=(8,), nproc: int = 2, steps: int = 4, fixes=()) -> None:
    """The sizes and fixes against the script's declaration (LAB["knobs"]), and the world sizes
    lab 07 sweeps."""
    if nproc not in (1, 2, 4, 8):
        raise DdplabError(f"nproc={nproc!r} is not swept by lab 07", hint="use nproc 1, 2 or 4 (4 is oversubscribed on 2 cores)")
    for name, value in (("width", widths), ("batch", batches), ("steps", steps), ("fix", fixes)):
        if name == "fix" and not value:
            continue
        try:
            lab_args.coerce(name, KNOBS[name], value)
        except ValueError as e:
            raise DdplabError(f"lab 07: {e}", hint=KNOBS[name]["help"]) from None


# One rank = one core (like one rank = one GPU), whatever the world size: otherwise 1 rank would get
# every core's threads and the world-size comparison would measure thread counts, not ranks.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def _env(kw: dict) -> dict:
    kw["env"] = {**ONE_THREAD, **(kw.get("env") or {})}
    return kw


def _argv(**knobs) -> list[str]:
    """The script's command line for these knobs (its names: width, batch, fix, ...)."""
    return lab_args.argv(KNOBS, knobs)


# ----------------------------------------------------------------------------------------------
# runs (no deadline: a run that computes is slow, not stuck, however long it takes on a busy machine;
# a real hang is found by ddplab's stall rule; extra keywords, deadline_s included, go to ddplab.run)
# ----------------------------------------------------------------------------------------------

def validate(widths=(1024,), batches=(8,), nproc: int = 2, steps: int = 4, fixes=(), **knobs) -> None:
    """Refuse a bad request before any rank starts: an unknown knob, or sizes the lab cannot run."""
    contract.validate_knobs(LAB, knobs, run_variant, run_grid, run_fixes, run_link, run_dataparallel)
    check_knobs(widths, batches, nproc, steps, fixes)


def run_variant(variant: str, **kw) -> ddplab.RunResult:
    """One real run of a lab 07 variant with the lab's small defaults (one thread per rank)."""
    validate(**kw)
    return {"broken": run_grid, "fixed": run_fixes, "link": run_link, "dataparallel": run_dataparallel}[variant](**kw)


def run_grid(widths=(256, 1024), batches=(8, 256), nproc: int = 2, steps: int = 4, warmup: int = 1,
             profile: bool = False, rounds: int = 1, **kw) -> ddplab.RunResult:
    """Plain DDP ('broken') over every width x per-rank batch, one torchrun job."""
    check_knobs(widths, batches, nproc, steps)
    args = _argv(width=widths, batch=batches, steps=steps, warmup=warmup, rounds=rounds, profile=profile)
    return ddplab.run(LAB, variant="broken", nproc=nproc, args=args, **_env(kw))


def run_fixes(width: int = 1024, batch: int = 8, fixes=FIXES, nproc: int = 2, steps: int = 4, accum_k: int = 4,
              bucket_cap_mb: float = 100.0, rounds: int = 1, warmup: int = 1, **kw) -> ddplab.RunResult:
    """The baseline, then each fix, one after another in one job (ratios within one run)."""
    check_knobs((width,), (batch,), nproc, steps, fixes)
    args = _argv(width=[width], batch=[batch], steps=steps, fix=fixes, accum_k=accum_k,
                 bucket_cap_mb=bucket_cap_mb, rounds=rounds, warmup=warmup)
    return ddplab.run(LAB, variant="fixed", nproc=nproc, args=args, **_env(kw))


def run_link(sizes=None, nproc: int = 2, reps: int = 5, **kw) -> ddplab.RunResult:
    sizes = sizes or [4 ** k for k in range(5, 13)]       # 1 KiB .. 16 MiB
    check_knobs(nproc=nproc)
    return ddplab.run(LAB, variant="link", nproc=nproc,
                      args=_argv(sizes=sizes, reps=reps), **_env(kw))


def run_dataparallel(width: int = 1024, batch: int = 64, steps: int = 4, **kw):
    check_knobs((width,), (batch,), 1, steps)
    return ddplab.run(LAB, variant="dataparallel", nproc=1,
                      args=_argv(width=[width], batch=[batch], steps=steps), **kw)


def gpu_count() -> int:
    """CUDA GPUs visible to this kernel (imports torch only here)."""
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # pragma: no cover
        return 0


# ----------------------------------------------------------------------------------------------
# summaries
# ----------------------------------------------------------------------------------------------

def summarize(result) -> list[dict]:
    """One row per configuration: medians over steps, the slowest rank's step time."""
    if not result.ok:
        raise DdplabError(f"the run ended {result.status} ({result.signature})", hint="look at result.explain()")
    world = result.nproc
    per = defaultdict(lambda: defaultdict(list))
    order = []
    for s in result.records_of("step"):
        if s["config"] not in order:
            order.append(s["config"])
        per[s["config"]][s["rank"]].append(s)
    logs = {(d["config"], d["rank"]): d for d in result.records_of("ddp_logging")}
    profs = {(d["config"], d["rank"]): d for d in result.records_of("profile")}
    rows = []
    for cfg in order:
        ranks = per[cfg]
        med = {r: {k: statistics.median(s[k] for s in steps) for k in
                   ("step_s", "fwd_s", "bwd_s", "comm_s", "exposed_s", "overlap_s", "compute_s")}
               for r, steps in ranks.items()}
        mean = lambda k: statistics.fmean(m[k] for m in med.values())  # noqa: E731
        # each round (the configurations run in turn: A B C A B C) on its own: the slowest rank's median step
        by_round = {r: _rounds(steps) for r, steps in ranks.items()}
        n_rounds = min(len(v) for v in by_round.values())
        round_step = [max(statistics.median(s["step_s"] for s in v[k]) for v in by_round.values())
                      for k in range(n_rounds)]
        first = next(iter(ranks.values()))[0]
        step_s = max(m["step_s"] for m in med.values())
        ddp_comm = [logs[(cfg, r)]["avg_backward_comm_time"] for r in ranks if (cfg, r) in logs]
        prof = [profs[(cfg, r)]["allreduce_s_per_step"] for r in ranks if (cfg, r) in profs]
        rows.append({
            "config": cfg, "fix": first["fix"], "world": world, "width": first["width"], "batch": first["batch"],
            "micro": first["micro"], "params": first["params"], "step_s": step_s, "fwd_s": mean("fwd_s"),
            "bwd_s": mean("bwd_s"), "compute_s": mean("compute_s"), "exposed_s": mean("exposed_s"),
            "overlap_s": mean("overlap_s"), "comm_s": mean("comm_s"),
            "comm_frac": mean("exposed_s") / step_s, "samples_per_s": first["samples"] / step_s,
            "round_samples_per_s": [first["samples"] / t for t in round_step],
            "wire_MB": first["wire_bytes"] / 2**20, "samples": first["samples"], "buckets": first["buckets"],
            "ddp_logging_comm_s": statistics.fmean(ddp_comm) / 1e9 if ddp_comm else None,
            "profiler_comm_s": statistics.fmean(prof) if prof else None,
            "losses": [s["loss"] for s in ranks[0][:len({x["step"] for x in ranks[0]})]] if 0 in ranks else [],
            "oversubscribed": oversubscribed(world),
        })
    return rows


def _rounds(steps: list[dict]) -> list[list[dict]]:
    """One rank's step records of one configuration, split into rounds (its step index restarts at 0)."""
    out: list[list[dict]] = []
    for s in steps:
        if s["step"] == 0 or not out:
            out.append([])
        out[-1].append(s)
    return out


def threads_per_rank(result) -> dict[int, int]:
    """rank -> torch.get_num_threads() as the rank recorded it at start."""
    return {rec["rank"]: rec["threads"] for rec in result.records_of("start")}


def threads_sentence(results) -> str:
    """What the runs used, from their records: ranks, threads per rank, of how many cores."""
    parts = []
    for r in sorted(results, key=lambda r: r.nproc):
        t = threads_per_rank(r)
        used = sum(t.values())
        parts.append(f"{r.nproc} rank{'s' if r.nproc != 1 else ''} x {sorted(set(t.values()))} thread(s) = {used} of "
                     f"{cores()} cores busy" + (" (oversubscribed)" if used > cores() else ""))
    return "; ".join(parts) + " (threads per rank as each rank recorded them)"


def link_rows(result) -> tuple[list[dict], float]:
    rows = [r for r in result.records_of("allreduce") if r["rank"] == 0]
    copy = statistics.fmean(r["bytes_per_s"] for r in result.records_of("copy_bandwidth"))
    return rows, copy


@dataclass
class Table:
    """A small table that renders as HTML in Jupyter and as text elsewhere (no pandas needed)."""
    columns: list[str]
    rows: list[list]
    title: str = ""

    def _fmt(self, v) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return "" if v is None else str(v)

    def __repr__(self) -> str:
        cells = [self.columns] + [[self._fmt(v) for v in r] for r in self.rows]
        w = [max(len(c[i]) for c in cells) for i in range(len(self.columns))]
        lines = ["  ".join(c[i].rjust(w[i]) for i in range(len(w))) for c in cells]
        return (self.title + "\n" if self.title else "") + "\n".join(lines)

    def _repr_html_(self) -> str:
        e = html.escape
        head = "".join(f"<th>{e(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{e(self._fmt(v))}</td>" for v in r) + "</tr>" for r in self.rows)
        cap = f"<caption>{e(self.title)}</caption>" if self.title else ""
        return f"<table>{cap}<tr>{head}</tr>{body}</table>"


def step_table(rows, title="Measured per configuration (median step, slowest rank)") -> Table:
    cols = ["config", "world", "params", "batch", "step ms", "compute ms", "exposed comm ms", "hidden comm ms",
            "comm fraction", "samples/s", "DDP-logging comm ms", "profiler comm ms"]
    out = []
    for r in rows:
        world = f"{r['world']}" + (" (oversubscribed)" if r["oversubscribed"] else "")
        out.append([r["config"], world, r["params"], r["batch"] * r["micro"], 1e3 * r["step_s"], 1e3 * r["compute_s"],
                    1e3 * r["exposed_s"], 1e3 * r["overlap_s"], r["comm_frac"], r["samples_per_s"],
                    None if r["ddp_logging_comm_s"] is None else 1e3 * r["ddp_logging_comm_s"],
                    None if r["profiler_comm_s"] is None else 1e3 * r["profiler_comm_s"]])
    if all(r[-1] is None for r in out):   # torch.profiler ran only with profile=True (it slows the steps it times)
        cols, out = cols[:-1], [r[:-1] for r in out]
    return Table(cols, out, title)


def corner(rows) -> dict:
    """The grid's extremes: the large-model/small-batch corner against the small-model/large-batch one."""
    big = max(r["params"] for r in rows)
    small = min(r["params"] for r in rows)
    lmsb = min((r for r in rows if r["params"] == big), key=lambda r: r["batch"])
    smlb = max((r for r in rows if r["params"] == small), key=lambda r: r["batch"])
    top = max(rows, key=lambda r: r["comm_frac"])
    return {"large_model_small_batch": lmsb, "small_model_large_batch": smlb, "highest_comm_frac": top}


def fix_rows(rows) -> list[dict]:
    """Each fix against the baseline of the same run: samples/s gain, comm fraction, bytes, loss gap."""
    base = next(r for r in rows if r["fix"] == "none")
    out = []
    for r in rows:
        gap = None
        if r["losses"] and base["losses"] and r["fix"] in ("fp16", "bf16", "static", "bucket"):
            gap = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], base["losses"]))
        out.append({**r, "label": FIX_LABELS[r["fix"]], "speedup": r["samples_per_s"] / base["samples_per_s"],
                    "round_speedups": [a / b for a, b in zip(r["round_samples_per_s"], base["round_samples_per_s"])],
                    "bytes_ratio": (r["wire_MB"] / r["samples"]) / (base["wire_MB"] / base["samples"]),
                    "loss_gap": gap})
    return out


def fix_table(frows) -> Table:
    cols = ["fix", "step ms", "comm fraction", "samples/s", "x baseline", "bytes sent per sample vs baseline",
            "max loss gap vs baseline"]
    return Table(cols, [[r["label"], 1e3 * r["step_s"], r["comm_frac"], r["samples_per_s"], r["speedup"],
                         r["bytes_ratio"], r["loss_gap"]] for r in frows],
                 "Fixes, each against the baseline of the same run (measured)")


def best_fix(frows) -> dict:
    return max((r for r in frows if r["fix"] != "none"), key=lambda r: r["speedup"])


def scaling_rows(by_world: dict[int, list[dict]], config: str) -> list[dict]:
    """samples/s per world size for one configuration, with the ideal line (world x samples/s at 1)."""
    one = next(r for r in by_world[min(by_world)] if r["config"] == config)
    base = one["samples_per_s"] / one["world"]
    out = []
    for w in sorted(by_world):
        r = next(x for x in by_world[w] if x["config"] == config)
        out.append({"world": w, "config": config, "samples_per_s": r["samples_per_s"], "ideal": base * w,
                    "speedup": r["samples_per_s"] / base, "efficiency": r["samples_per_s"] / (base * w),
                    "comm_frac": r["comm_frac"], "oversubscribed": oversubscribed(w)})
    return out


# ----------------------------------------------------------------------------------------------
# DataParallel traffic: a MODEL fed with measured numbers (real DataParallel needs GPUs)
# ----------------------------------------------------------------------------------------------

def dp_model(params: int, batch: int, width: int, copy_bw: float, compute_s_per_sample: float,
             gpus=(2, 4, 8), bytes_per=4) -> list[dict]:
    """Per-step time of DataParallel vs DDP on G devices, as a MODEL (not a measurement).

    DataParallel, every step, through device 0: replicate the parameters to G-1 devices, scatter
    the inputs, gather the outputs, reduce G-1 gradient copies back: ~2(G-1)P + (G-1)/G(I+O) bytes,
    none of it overlapped. DDP: a ring all-reduce moves 2(G-1)/G P bytes per device, in parallel.
    Link = this machine's measured copy bandwidth; compute = measured seconds per sample, split G ways.
    """
    P = params * bytes_per
    IO = 2 * batch * width * bytes_per
    one = compute_s_per_sample * batch
    out = []
    for g in gpus:
        compute = one / g
        dp_bytes = 2 * (g - 1) * P + (g - 1) / g * IO
        ddp_bytes = 2 * (g - 1) / g * P
        dp_t, ddp_t = compute + dp_bytes / copy_bw, compute + ddp_bytes / copy_bw
        out.append({"gpus": g, "compute_s": compute, "dp_bytes": dp_bytes, "ddp_bytes": ddp_bytes,
                    "dp_step_s": dp_t, "ddp_step_s": ddp_t, "dp_speedup": one / dp_t, "ddp_speedup": one / ddp_t,
                    "kind": "model"})
    return out


def dp_table(mrows) -> Table:
    return Table(["GPUs", "DP MB through device 0", "DDP MB per device", "DP step ms", "DDP step ms (no overlap)",
                  "DP speed-up", "DDP speed-up"],
                 [[r["gpus"], r["dp_bytes"] / 2**20, r["ddp_bytes"] / 2**20, 1e3 * r["dp_step_s"],
                   1e3 * r["ddp_step_s"], r["dp_speedup"], r["ddp_speedup"]] for r in mrows],
                 "MODEL, not a measurement: DataParallel vs DDP traffic fed with this machine's measured "
                 "copy bandwidth and compute per sample")


def dp_measured(result) -> Table:
    """Real DataParallel / bare / 1-rank DDP step times from the 'dataparallel' variant."""
    by = defaultdict(list)
    for s in result.records_of("dp_step"):
        by[s["kind"]].append(s["step_s"])
    bare = statistics.median(by["bare"])
    gpus = result.records_of("copy_bandwidth")[0].get("gpus", 0)
    rows = [[k, gpus, 1e3 * statistics.median(v), statistics.median(v) / bare] for k, v in by.items()]
    return Table(["module", "GPUs visible", "step ms (measured)", "x bare module"], rows,
                 "Measured: bare module, 1-rank DDP" + (", nn.DataParallel" if "dataparallel" in by else
                                                         " (no GPU: DataParallel is a pass-through on CPU, not run)"))


# ----------------------------------------------------------------------------------------------
# plots
# ----------------------------------------------------------------------------------------------

def plot_breakdown(rows, title="Where the step goes (measured, per configuration)"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.45 * len(rows)))
    for i, r in enumerate(rows):
        comp = max(0.0, r["compute_s"] - r["overlap_s"]) * 1e3
        ov, ex = r["overlap_s"] * 1e3, r["exposed_s"] * 1e3
        ax.barh(i, comp, color="#0969da", label="compute (no comm under it)" if i == 0 else None)
        ax.barh(i, ov, left=comp, color="#8ec5ff", hatch="//", label="compute with all-reduce hidden under it" if i == 0 else None)
        ax.barh(i, ex, left=comp + ov, color="#cf222e", label="exposed communication" if i == 0 else None)
        ax.text(comp + ov + ex, i, f"  {100 * r['comm_frac']:.0f}% comm", va="center", fontsize=8)
    labels = [f"{r['config']} (w={r['world']}{', oversub.' if r['oversubscribed'] else ''})" for r in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (median, mean over ranks)")
    ax.set_title(title)
    # under the axes: inside, it covered the longest bars
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="lower center", ncol=3, frameon=False)
    ax.set_xlim(right=ax.get_xlim()[1] * 1.2)
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight(), 1, 1))
    return fig


def plot_fixes(frows, title="Samples per second, each fix against the baseline of the same run (measured)"):
    """What the fixes are ranked by: samples/s (all ranks together), with the x-baseline factor."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.8 + 0.45 * len(frows)))
    best = best_fix(frows)["fix"] if any(r["fix"] != "none" for r in frows) else None
    for i, r in enumerate(frows):
        colour = "#8c959f" if r["fix"] == "none" else "#1a7f37" if r["fix"] == best else "#0969da"
        ax.barh(i, r["samples_per_s"], color=colour)
        ax.text(r["samples_per_s"], i, f"  {r['samples_per_s']:,.0f}/s = {r['speedup']:.2f}x, "
                                       f"comm {100 * r['comm_frac']:.0f}% of the step", va="center", fontsize=8)
    ax.set_yticks(range(len(frows)), [r["label"] for r in frows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("samples per second, all ranks (measured: samples per step / slowest rank's median step)")
    ax.set_xlim(right=max(r["samples_per_s"] for r in frows) * 1.6)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_scaling(srows_by_config: dict[str, list[dict]], title="Samples/s against world size (measured)"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for cfg, srows in srows_by_config.items():
        ws = [r["world"] for r in srows]
        line, = ax.plot(ws, [r["samples_per_s"] for r in srows], "o-", label=f"{cfg} measured")
        ax.plot(ws, [r["ideal"] for r in srows], "--", color=line.get_color(), alpha=0.6, label=f"{cfg} ideal")
        for r in srows:
            if r["oversubscribed"]:
                ax.annotate("oversubscribed\n(> cores)", (r["world"], r["samples_per_s"]), fontsize=7,
                            textcoords="offset points", xytext=(4, -18))
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("samples / s")
    ax.set_xticks(sorted({r["world"] for s in srows_by_config.values() for r in s}))
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_link(rows, copy_bw, title="All-reduce bus bandwidth (measured) against message size"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot([r["bytes"] for r in rows], [r["busbw"] / 1e9 for r in rows], "o-",
            label=f"{rows[0]['backend']} all-reduce, {rows[0]['world_size']} ranks")
    ax.axhline(copy_bw / 1e9, color="#cf222e", ls="--", label="memory-copy bandwidth (measured): upper bound")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_loss(frows, title="Loss per step, rank 0 (measured): compression keeps it close?"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    for r in frows:
        if r["fix"] in ("none", "fp16", "bf16"):
            ax.plot(r["losses"], "o-" if r["fix"] == "none" else ".--", label=r["label"])
    ax.set_xlabel("measured step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# claim check and exercises
# ----------------------------------------------------------------------------------------------



def _gains(r: dict) -> tuple[int, int, float]:
    """(rounds in which this fix's samples/s beat the baseline's of the same round by more than GAIN,
    rounds, the sign test's p-value)."""
    k, n = sum(x > GAIN for x in r["round_speedups"]), len(r["round_speedups"])
    return k, n, sign_test_p(k, n)


def claim_inputs(runs: Mapping[str, "ddplab.RunResult"]) -> claims.Inputs:
    """What these runs measured for the register's claims (ddplab.course.claim_register); judged there. Keys read:
    "grid" (summarize() of the broken run), "scaling-rows" (scaling_rows() of one config), "fix-rows"
    (fix_rows()), "link-rows" and "copy-bw" (link_rows()'s two), "model-rows" (dp_model()), and
    "dataparallel": that variant's run, absent or None when there was none (real nn.DataParallel needs
    GPUs). Compression is shown but supplies no part: on loopback fewer bytes cost memory copies, not a
    link (lab 09 judges it)."""
    grid, srows, frows, mrows = runs["grid"], runs["scaling-rows"], runs["fix-rows"], runs["model-rows"]
    link, copy_bw, dp = runs["link-rows"], runs["copy-bw"], runs.get("dataparallel")
    c = corner(grid)
    lm, sm = c["large_model_small_batch"], c["small_model_large_batch"]
    big = max(link, key=lambda r: r["bytes"])
    slowest = max(grid, key=lambda r: r["step_s"])
    two = next((r for r in srows if r["world"] == 2), srows[-1])
    m4 = next((m for m in mrows if m["gpus"] == 4), mrows[-1])
    by = {r["fix"]: r for r in frows}
    fewer = [by[f] for f in ("batch", "accumulate") if f in by]
    smaller = [by[f] for f in ("fp16", "bf16") if f in by]
    dp_steps = defaultdict(list)
    for s in (dp.records_of("dp_step") if dp is not None else []):
        dp_steps[s["kind"]].append(s["step_s"])
    gpus = max((s["gpus"] for s in (dp.records_of("dp_step") if dp is not None else [])), default=0)
    real_dp = gpus >= 2 and bool(dp_steps.get("dataparallel"))
    dp_text = (f"measured on {gpus} GPUs: DataParallel {1e3 * statistics.median(dp_steps['dataparallel']):.1f} ms per step, "
               f"bare module {1e3 * statistics.median(dp_steps['bare']):.1f} ms" if real_dp else
               f"no DataParallel run on 2+ GPUs here ({gpu_count()} GPU(s)). Measured instead, DDP on CPU: "
               f"{lm['params']:,} params, batch {lm['batch']}: exposed communication {100 * lm['comm_frac']:.0f}% of the "
               f"step; {sm['params']:,} params, batch {sm['batch']}: {100 * sm['comm_frac']:.0f}%")
    gains = {r["label"]: _gains(r) for r in fewer + smaller}
    fewer_p = min([gains[r["label"]][2] for r in fewer] or [1.0])
    return claims.Inputs(LAB, {
        "frequent-allreduce": claims.evidence(
            "; ".join(f"{r['label']}: {r['speedup']:.2f}x samples/s ({r['bytes_ratio']:.2f}x bytes per sample), "
                      f"over {GAIN:g}x in {gains[r['label']][0]} of {gains[r['label']][1]} rounds "
                      f"(p = {gains[r['label']][2]:.3f})" for r in fewer + smaller)
            + f"; baseline: {by['none']['samples_per_s']:,.0f} samples/s, communication {100 * by['none']['comm_frac']:.0f}% "
              f"of the step; the compression hooks on loopback are shown, not judged (no network here)",
            fewer_allreduces_faster=claims.test(min(1.0, fewer_p * max(1, len(fewer))))),
        "dp-transfer-dominates": claims.evidence(
            dp_text,
            no_speed_benefit=claims.fact(statistics.median(dp_steps["dataparallel"]) >= statistics.median(dp_steps["bare"]))
            if real_dp else claims.stand_in("DDP ranks on CPU, not nn.DataParallel on GPUs")),
        "dp-scaling": claims.evidence(
            f"DDP measured at 2 ranks on {cores()} CPU cores: {two['speedup']:.2f}x the 1-rank samples/s "
            f"({100 * two['efficiency']:.0f}% of ideal). MODEL, not measured: at 4 GPUs DataParallel {m4['dp_speedup']:.2f}x "
            f"vs DDP {m4['ddp_speedup']:.2f}x, fed with this machine's copy bandwidth",
            scales_worse_than_ddp=claims.stand_in(
                "a traffic model fed with measured CPU numbers; DataParallel was not run at several GPU counts")),
        "gloo-congested": claims.evidence(
            f"gloo on loopback (no network, no congestion): {big['busbw'] / 1e9:.2f} GB/s bus bandwidth at "
            f"{big['bytes'] / 2**20:.0f} MiB ({100 * big['busbw'] / copy_bw:.0f}% of memory-copy {copy_bw / 1e9:.1f} GB/s); "
            f"slowest step here {1e3 * slowest['step_s']:.0f} ms (shown, not judged: loopback is no network)"),
    })


FIX_ANSWERS = ("none",) + FIXES
WITHIN_BEST = 0.95   # check_best_fix: a fix with at least this share of the best's speedup counts (the noise)


def _best_fixes(frows) -> list[str]:
    best = best_fix(frows)
    return [r["fix"] for r in frows if r["fix"] in FIXES and (r["fix"] == best["fix"] or r["speedup"] >= WITHIN_BEST * best["speedup"])]


@answers.exercise("best-fix", answers.Choice(FIXES, labels=FIX_LABELS), accepted=_best_fixes,
                  name="predicted_best_fix")
def check_best_fix(answer: str, frows) -> Check:
    """Exercise "best-fix" (predicted before the fixes run): which fix raised samples/s the most in this
    execution's run? A fix within 5% of the best counts (the machine's noise is about that)."""
    best = best_fix(frows)
    got = next((r for r in frows if r["fix"] == answer), None)
    if got is None:
        return Check(False, f"{answer} was not run in this execution's fixes run")
    if answer in _best_fixes(frows):
        return Check(True, f"{FIX_LABELS[answer]}: {got['speedup']:.2f}x the baseline's samples/s (best measured: "
                           f"{best['label']}, {best['speedup']:.2f}x)")
    return Check(False, f"{FIX_LABELS[answer]} gave {got['speedup']:.2f}x the baseline's samples/s; another fix gave more. "
                        "Which fix changes how many samples each all-reduce pays for, and which only how it is sent?")


BATCH_CHOICES = tuple(2 ** k for k in range(3, 13))   # 8 .. 4096
SWEEP_FIRST = 1024   # check_batch_for_fraction: one job sweeps 8 .. min(answer, this); a second, the rest if needed
_SWEEPS: dict = {}   # (width, batches, nproc) -> the sweep this kernel ran: a re-run cell is judged on the same one


def fraction_sweep(width: int, batches, nproc: int = 2, **kw) -> ddplab.RunResult:
    """Plain DDP at ``width`` over ``batches`` in one job (3 steps each), run once per kernel."""
    key = (width, tuple(batches), nproc)
    if key not in _SWEEPS:
        _SWEEPS[key] = run_grid((width,), tuple(batches), nproc=nproc, steps=3, **kw)
    return _SWEEPS[key]


def _fraction_rows(results, width: int) -> dict[int, dict]:
    return {r["batch"]: r for res in results for r in summarize(res) if r["width"] == width}


def smallest_under(rows: dict[int, dict], target: float) -> int | None:
    """The smallest batch of one sweep whose exposed communication is under ``target``; None where the
    sweep has none, or starts under it (a smaller batch might be too), or skips a power of two."""
    sizes = sorted(rows)
    if not sizes or any(b not in rows for b in BATCH_CHOICES if sizes[0] <= b <= sizes[-1]):
        return None
    under = [b for b in sizes if rows[b]["comm_frac"] < target]
    return under[0] if under and (under[0] != sizes[0] or sizes[0] == BATCH_CHOICES[0]) else None


def _batch_answers(width: int = 2048, target: float = 0.25, nproc: int = 2, result=None, **kw) -> list[int]:
    if result is None:
        return []
    best = smallest_under(_fraction_rows([result], width), target)
    return [best] if best is not None else []


@answers.exercise("batch-for-fraction", answers.Whole(8, 4096, "a per-rank batch size, a power of two from 8 to 4096",
                                                      label="batch", only=BATCH_CHOICES), name="predicted_batch",
                  runs_answer=True, accepted=_batch_answers)
def check_batch_for_fraction(answer: int, width: int = 2048, target: float = 0.25, nproc: int = 2, result=None,
                             **kw) -> Check:
    """Exercise "batch-for-fraction": the SMALLEST power-of-two per-rank batch at which exposed
    communication is under ``target`` of the step for a model of this width. The checker runs one sweep,
    every batch from 8 up to yours (and past 1024 only when nothing up to 1024 was under), and judges
    yours on it: yours under the target and every smaller one not. Exposed communication moves with
    the machine's load, so no fixed answer is right everywhere; within one sweep exactly one batch is
    (or reads ``result``, a grid run at this width from 8 up)."""
    if result is not None:
        rows = _fraction_rows([result], width)
    else:
        runs = [fraction_sweep(width, [b for b in BATCH_CHOICES if b <= min(answer, SWEEP_FIRST)], nproc, **kw)]
        rows = _fraction_rows(runs, width)
        if answer > SWEEP_FIRST and all(r["comm_frac"] >= target for r in rows.values()):
            runs.append(fraction_sweep(width, [b for b in BATCH_CHOICES if SWEEP_FIRST < b <= answer], nproc, **kw))
            rows = _fraction_rows(runs, width)
    r = rows.get(answer)
    if r is None or (r["comm_frac"] < target and smallest_under(rows, target) is None):
        return Check(False, f"the sweep at width {width} does not hold every batch from {BATCH_CHOICES[0]} up to "
                            f"{answer}: pass a grid run that does, or none (the checker runs one)")
    said = f"batch {answer}: communication {100 * r['comm_frac']:.0f}% of a {1e3 * r['step_s']:.0f} ms step"
    if r["comm_frac"] >= target:
        return Check(False, f"{said}, not under {100 * target:.0f}% (this sweep); compute grows with the batch, "
                            "the bytes all-reduced do not")
    if smallest_under(rows, target) != answer:
        return Check(False, f"{said}, under {100 * target:.0f}%, but so is a smaller batch in the same sweep: the "
                            "exercise asks for the smallest")
    half = rows.get(answer // 2)
    return Check(True, f"{said}, under {100 * target:.0f}%"
                 + (f"; batch {answer // 2} was not ({100 * half['comm_frac']:.0f}%), nor any smaller one" if half else
                    f"; {answer} is the smallest batch offered") + " (one sweep, measured just now)")


EXERCISES = answers.exercises(check_best_fix, check_batch_for_fraction)


def keypoints(runs: Mapping[str, object]) -> "KeyPoints":
    """The notebook's key points from its runs (issue 42: nothing typed from a stored run). Keys read: "grid"
    (summarize() of the broken run), "scaling" (scaling_rows() per config), "fix-rows" (fix_rows()) and
    "dataparallel" (that variant's run, or None). A fix counts as faster by the claim rule (more than GAIN
    in a sign test over the rounds at P_LEVEL); one ratio is worded by ``notebook.compared``."""
    from ddplab.course.notebook import KeyPoints, SAME, compared
    grid, scaling, frows, dp = runs["grid"], runs["scaling"], runs["fix-rows"], runs.get("dataparallel")
    c = corner(grid)
    lm, top = c["large_model_small_batch"], c["highest_comm_frac"]
    small = min(grid, key=lambda r: (r["params"], r["batch"]))

    def pct(r):
        return f"{100 * r['comm_frac']:.0f}%"
    share = (f"the {lm['params'] / 1e6:.1f} M-parameter model at a batch of {lm['batch']} spent {pct(lm)} of its step "
             f"in exposed communication; the largest share was {top['config']}'s ({pct(top)})")
    if top is small and top is not lm:
        share += ", the smallest model at the smallest batch: a small all-reduce is latency-bound"
    elif top is not small:
        share += f" (the smallest model at the smallest batch, {small['config']}: {pct(small)})"
    by = {r["fix"]: r for r in frows}
    best = best_fix(frows)
    held = {r["fix"]: claims.test(_gains(r)[2]).state == claims.HOLDS for r in frows if r["fix"] != "none"}
    faster = [by[f]["label"] for f in FIXES if held.get(f)]
    fixes = (f"Each fix was measured against the baseline of the same round: `{best['label']}` raised samples per "
             f"second the most ({best['speedup']:.2f}x); faster than the baseline by more than {GAIN:g}x in a sign "
             f"test over the rounds: {', '.join(f'`{x}`' for x in faster) if faster else 'none'}")
    packed = [by[f] for f in ("fp16", "bf16") if f in by]
    if packed:
        fixes += ("; compression (" + ", ".join(r["fix"] for r in packed) + ") sent "
                  + " and ".join(f"{r['bytes_ratio']:.2f}x" for r in packed) + " the bytes per sample at "
                  + " and ".join(f"{r['speedup']:.2f}x" for r in packed) + " the samples per second"
                  + (" (on loopback fewer bytes cost memory copies, not a link)" if not any(held.get(r["fix"]) for r in packed)
                     else ""))
    lines = []
    for cfg, srows in scaling.items():
        two = next((s for s in srows if s["world"] == 2), None)
        if two is None:
            continue
        word = compared(two["speedup"])
        batch = next(r["batch"] for r in grid if r["config"] == cfg) if any(r["config"] == cfg for r in grid) else "?"
        lines.append(f"at a batch of {batch} two ranks were {word} {'as' if word == SAME else 'than'} one rank "
                     f"({two['speedup']:.2f}x its samples per second)")
    scale = "; ".join(lines) + ": scaling needs enough compute per step to hide the all-reduce" if lines else \
        "scaling was not measured at two ranks here"
    real_dp = dp is not None and any(s.get("gpus", 0) >= 2 for s in dp.records_of("dp_step"))
    return KeyPoints((
        "DDP all-reduces every gradient once per step (the parameter count x 4 bytes, whatever the batch) while "
        "compute grows with the batch: the share of the step spent waiting for communication falls as the "
        "per-rank batch grows.",
        f"In this run {share}.",
        fixes + ".",
        scale[0].upper() + scale[1:] + ".",
        "DataParallel ran for real on this machine's GPUs (its table above)." if real_dp else
        "Without GPUs the DataParallel table is a model fed with this machine's measurements, labelled so, and "
        "the DataParallel claims read \"not tested here\".",
    ))
