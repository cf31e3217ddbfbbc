"""Lab 07 - scaling overhead, measured: where a DDP step's time goes, and what each fix buys.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/07_scaling.py --variant broken --width 2048 --batch 8
    ddplab run 07 --variant fixed -- --fix batch,accumulate,fp16

Article 002 says DataParallel with "a large model, and a small batch size" spends its time moving parameters
and gradients, and scales poorly past 2-3 GPUs. DDP moves less (one all-reduce of the gradients, overlapped
with backward), but the same corner still hurts it: the bytes to all-reduce grow with the parameter count, the
compute with parameters x batch. Per step and per rank this script measures forward, backward compute, the
gradient all-reduce (a DDP communication hook timestamps each bucket's launch and completion), how much of it
ran hidden under backward, and cross-checks with DDP's own logging data and, with --profile, torch.profiler.

Variants:
  broken        plain DDP, large model and small batch (lists sweep the grid: --width 256,2048 --batch 8,64)
  fixed         the same baseline, then each fix in --fix, one after another in one job
  link          all-reduce bus bandwidth against message size, next to this machine's copy bandwidth
  dataparallel  nn.DataParallel against the bare module and 1-rank DDP (real on GPUs; on CPU only
                the bare module, DDP and the copy bandwidth that feed the workbook's traffic *model*)
"""
import contextlib
import itertools
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab
from ddplab.rank.lab_measure import CommTimer, allreduce_bandwidth, busy, copy_bandwidth

LAB = {
    "title": "Scaling overhead, measured: where a DDP step's time goes",
    "article": "002_3b7eff0f44992b59.txt",
    "nproc": 2,
    "min_nproc": 1,
    "variants": {
        # "measured": its verdicts compare times, so under make workbook it runs with the machine alone
        "broken": {"expect": "ok", "signature": None, "measured": "step times against world size",
                   "about": "large model, small per-rank batch: the gradient all-reduce dominates the step"},
        "fixed": {"expect": "ok", "signature": None, "measured": "each fix's samples/s against the baseline's",
                  "about": "baseline, then each fix (bigger batch, no_sync accumulation, bucket_cap_mb, static graph, fp16/bf16 hook)"},
        "link": {"expect": "ok", "signature": None, "measured": "all-reduce bandwidth against message size",
                 "about": "all-reduce bus bandwidth against message size, with the memory-copy bandwidth as upper bound"},
        "dataparallel": {"expect": "ok", "signature": None, "measured": "step times with and without DataParallel",
                         "about": "nn.DataParallel vs bare module vs 1-rank DDP (real on GPUs; copy bandwidth on CPU)"},
    },
}
FIXES = ("batch", "accumulate", "bucket", "static", "fp16", "bf16")


def make_model(width: int, depth: int) -> nn.Module:
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())][:-1])


def train(ctx, fix, width, depth, batch, steps, warmup, accum_k, bucket_mb, profile, name):
    device, sync = ctx.device, (lambda: torch.cuda.synchronize(ctx.device) if ctx.device.type == "cuda" else None)
    torch.manual_seed(0)
    module = make_model(width, depth).to(device)
    # ---- the baseline and its fixes, in one place ----------------------------------------------
    kw, hook, per_elem = {}, default_hooks.allreduce_hook, 4       # BROKEN: plain DDP, small batch
    if fix == "batch":
        batch = batch * accum_k                  # FIX: more samples per all-reduce (same bytes sent)
    if fix == "bucket":
        kw["bucket_cap_mb"] = bucket_mb          # FIX: fewer, larger messages (default 25 MB)
    if fix == "static":
        kw.update(gradient_as_bucket_view=True, static_graph=True)  # FIX: no grad->bucket copy
    if fix == "fp16":
        hook, per_elem = default_hooks.fp16_compress_hook, 2         # FIX: half the bytes on the wire
    if fix == "bf16":
        hook, per_elem = default_hooks.bf16_compress_hook, 2
    micro = accum_k if fix == "accumulate" else 1  # FIX: all-reduce once every k micro-batches
    # ---------------------------------------------------------------------------------------------
    model = DDP(module, device_ids=[device.index] if device.type == "cuda" else None, **kw)
    timer = CommTimer(hook, per_elem)
    model.register_comm_hook(None, timer)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + ctx.rank)
    teacher = torch.randn(width, width, generator=g) / width ** 0.5
    n_params = sum(p.numel() for p in module.parameters())
    prof = None
    for step in range(warmup + steps):
        if profile and step == warmup:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        timer.spans.clear()
        timer.bytes = 0
        fwd = bwd = last_launch = 0.0
        sync()
        t_start = time.perf_counter()
        opt.zero_grad(set_to_none=not kw.get("gradient_as_bucket_view"))
        for m in range(micro):
            x = torch.randn(batch, width, generator=g).to(device)
            y = torch.tanh(x @ teacher).to(device)
            with (model.no_sync() if m < micro - 1 else contextlib.nullcontext()):   # no_sync: grads stay local
                t0 = time.perf_counter()
                loss = nn.functional.mse_loss(model(x), y)
                sync()
                t1 = time.perf_counter()
                loss.backward()    # DDP launches one all-reduce per bucket as its gradients are ready
                sync()
                t2 = time.perf_counter()
            fwd, bwd = fwd + t1 - t0, bwd + t2 - t1
        t3 = time.perf_counter()
        opt.step()
        sync()
        t_end = time.perf_counter()
        comm = busy(timer.spans)
        last_launch = max((a for a, _ in timer.spans), default=t2)
        exposed = max(0.0, t2 - last_launch)          # backward waited for the all-reduce after compute ended
        overlap = busy(timer.spans, hi=last_launch)   # all-reduce that ran while backward still computed
        step_s = t_end - t_start
        if step >= warmup:
            lab.record("step", config=name, fix=fix, width=width, depth=depth, batch=batch, micro=micro,
                       params=n_params, step=step - warmup, step_s=round(step_s, 6), fwd_s=round(fwd, 6),
                       bwd_s=round(bwd, 6), opt_s=round(t_end - t3, 6), comm_s=round(comm, 6),
                       exposed_s=round(exposed, 6), overlap_s=round(overlap, 6),
                       compute_s=round(step_s - exposed, 6), buckets=len(timer.spans),
                       wire_bytes=timer.bytes, samples=batch * micro * ctx.world_size,
                       loss=loss.item())
    if prof is not None:
        prof.__exit__(None, None, None)
        comm_us = sum(e.cpu_time_total for e in prof.key_averages() if "all_reduce" in e.key or "allreduce" in e.key)
        lab.record("profile", config=name, steps=steps, allreduce_s_per_step=round(comm_us / 1e6 / steps, 6))
    d = model._get_ddp_logging_data()   # DDP's own sampled timings (ns), first 10 iterations and every 100th
    lab.record("ddp_logging", config=name, **{k: d.get(k) for k in (
        "avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time",
        "avg_backward_compute_comm_overlap_time", "bucket_sizes", "comm_hook")})


def dataparallel(ctx, width, depth, batch, steps):
    ngpu = torch.cuda.device_count()
    lab.record("copy_bandwidth", device=str(ctx.device), bytes_per_s=copy_bandwidth(ctx.device), gpus=ngpu)
    torch.manual_seed(0)
    module = make_model(width, depth).to(ctx.device)
    kinds = {"bare": module,
             "ddp": DDP(module, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)}
    if ngpu >= 1:
        kinds["dataparallel"] = nn.DataParallel(module)   # all visible GPUs (one: its own overhead)
    n_params = sum(p.numel() for p in module.parameters())
    for kind, m in kinds.items():
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        x = torch.randn(batch, width, device=ctx.device)
        for step in range(2 + steps):
            with lab.StepTimer(ctx.device) as t:
                opt.zero_grad()
                m(x).square().mean().backward()
                opt.step()
            if step >= 2:
                lab.record("dp_step", kind=kind, gpus=ngpu, width=width, depth=depth, batch=batch,
                           params=n_params, step_s=round(t.seconds, 6))


def main(variant: str, *, width=(2048,), depth: int = 4, batch=(8,), steps: int = 6, rounds: int = 1,
         warmup: int = 2, fix=FIXES, accum_k: int = 4, bucket_cap_mb: float = 100.0, profile: bool = False,
         sizes: str = ",".join(str(4 ** k) for k in range(5, 14)), reps: int = 5) -> None:
    ctx = lab.setup()
    lab.record("start", variant=variant, world_size=ctx.world_size, backend=ctx.backend,
               device=str(ctx.device), threads=torch.get_num_threads())
    if variant == "link":
        allreduce_bandwidth(ctx, [int(s) for s in sizes.split(",")], reps)
    elif variant == "dataparallel":
        dataparallel(ctx, width[0], depth, batch[0], steps)
    else:
        fixes = ["none"] + (list(fix) if variant == "fixed" else [])
        # rounds interleave the configurations (A B C A B C): drift hits all alike
        for _, w, b, f in itertools.product(range(rounds), width, batch, fixes):
            train(ctx, f, w, depth, b, steps, warmup, accum_k, bucket_cap_mb, profile, f"w{w}-b{b}-{f}")
    dist.barrier()
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    import argparse

    from ddplab.rank.lab_args import ints, one_of

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="broken", help="what to measure")
    p.add_argument("--width", type=ints, default=[2048], help="hidden width(s), comma-separated (params ~ depth*width^2)")
    p.add_argument("--depth", type=int, default=4, choices=range(1, 17), metavar="1..16", help="number of Linear layers")
    p.add_argument("--batch", type=ints, default=[8], help="per-rank batch size(s), comma-separated")
    p.add_argument("--steps", type=int, default=6, choices=range(1, 201), metavar="1..200", help="measured steps per configuration")
    p.add_argument("--rounds", type=int, default=1, choices=range(1, 11), metavar="1..10",
                   help="repeat every configuration this many times, interleaved")
    p.add_argument("--warmup", type=int, default=2, choices=range(0, 21), metavar="0..20", help="unmeasured steps first")
    p.add_argument("--fix", type=one_of(FIXES), default=list(FIXES), help=f"fixes for --variant fixed, comma-separated, from {','.join(FIXES)}")
    p.add_argument("--accum-k", type=int, default=4, choices=range(2, 33), metavar="2..32",
                   help="micro-batches per all-reduce (accumulate) and batch multiplier (batch)")
    p.add_argument("--bucket-cap-mb", type=float, default=100.0, help="bucket_cap_mb for the bucket fix (DDP default: 25)")
    p.add_argument("--profile", action="store_true", help="also time the all-reduce with torch.profiler")
    p.add_argument("--sizes", default=",".join(str(4 ** k) for k in range(5, 14)), help="link: message sizes in bytes")
    p.add_argument("--reps", type=int, default=5, choices=range(1, 101), metavar="1..100", help="link: repetitions per size")
    a = vars(p.parse_args())
    main(a.pop("variant"), **a)
