"""Lab 07 - scaling overhead, measured: where a DDP step's time goes, and what each fix buys.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/07_scaling.py --variant broken --width 2048 --batch 8
    ddplab run 07 --variant fixed -- --fix batch,accumulate,fp16

Article 002 says DataParallel with "a large model, and a small batch size" spends its time moving
parameters and gradients, and scales poorly past 2-3 GPUs. DDP moves less (one all-reduce of the
gradients, overlapped with backward), but the same corner still hurts it: the bytes to all-reduce
grow with the parameter count, the compute with parameters x batch. Per step and per rank this
script measures forward, backward compute, the gradient all-reduce (a DDP communication hook
timestamps each bucket's launch and completion), how much of it ran hidden under backward, and
cross-checks with DDP's own logging data and, with --profile, torch.profiler.

Variants:
  broken        plain DDP, large model and small batch (lists sweep the grid: --width 256,2048
                --batch 8,64)
  fixed         the same baseline, then each fix in --fix, one after another in one job
  link          all-reduce bus bandwidth against message size, next to this machine's copy
                bandwidth
  dataparallel  nn.DataParallel against the bare module and 1-rank DDP (real on GPUs; on CPU only
                the bare module, DDP and the copy bandwidth that feed the workbook's traffic
                *model*)
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

LAB = {
    "title": "Scaling overhead, measured: where a DDP step's time goes",
    "article": "002_3b7eff0f44992b59.txt",
    "nproc": 2, "min_nproc": 1,
    # "measured": its verdicts compare times, so under make workbook it runs with the machine alone
    "variants": {
        "broken": {
            "expect": "ok", "signature": None, "measured": "step times against world size",
            "about": "large model, small per-rank batch: the gradient all-reduce dominates the "
                     "step",
        },
        "fixed": {
            "expect": "ok", "signature": None,
            "measured": "each fix's samples/s against the baseline's",
            "about": "baseline, then each fix (bigger batch, no_sync accumulation, "
                     "bucket_cap_mb, static graph, fp16/bf16 hook)",
        },
        "link": {
            "expect": "ok", "signature": None,
            "measured": "all-reduce bandwidth against message size",
            "about": "all-reduce bus bandwidth against message size, with the memory-copy "
                     "bandwidth as upper bound",
        },
        "dataparallel": {
            "expect": "ok", "signature": None,
            "measured": "step times with and without DataParallel",
            "about": "nn.DataParallel vs bare module vs 1-rank DDP (real on GPUs; copy bandwidth "
                     "on CPU)",
        },
    },
    "knobs": {
        "width": {
            "type": "ints", "default": [2048], "range": [16, 4096],
            "help": "hidden width(s), comma-separated (params ~ depth*width^2)",
        },
        "depth": {
            "type": "int", "default": 4, "range": [1, 16], "help": "number of Linear layers",
        },
        "batch": {
            "type": "ints", "default": [8], "range": [1, 4096],
            "help": "per-rank batch size(s), comma-separated",
        },
        "steps": {
            "type": "int", "default": 6, "range": [1, 200],
            "help": "measured steps per configuration",
        },
        "rounds": {
            "type": "int", "default": 1, "range": [1, 10],
            "help": "repeat every configuration this many times, interleaved",
        },
        "warmup": {
            "type": "int", "default": 2, "range": [0, 20], "help": "unmeasured steps first",
        },
        "fix": {
            "type": "strs", "default": ["batch", "accumulate", "bucket", "static", "fp16", "bf16"],
            "choices": ["batch", "accumulate", "bucket", "static", "fp16", "bf16"],
            "help": "fixes for --variant fixed, comma-separated",
        },
        "accum_k": {
            "type": "int", "default": 4, "range": [2, 32],
            "help": "micro-batches per all-reduce (accumulate) and batch multiplier (batch)",
        },
        "bucket_cap_mb": {
            "type": "float", "default": 100.0, "range": [0.01, 10000],
            "help": "bucket_cap_mb for the bucket fix (DDP default: 25)",
        },
        "profile": {
            "type": "bool", "default": False,
            "help": "also time the all-reduce with torch.profiler",
        },
        "sizes": {
            "type": "ints", "range": [1, 1073741824],
            "default": [1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864],
            "help": "link: message sizes in bytes",
        },
        "reps": {
            "type": "int", "default": 5, "range": [1, 100], "help": "link: repetitions per size",
        },
    },
}
FIXES = tuple(LAB["knobs"]["fix"]["choices"])


# ---- timing the gradient all-reduce, and the bandwidths it is bounded by ----

class CommTimer:
    """Wraps a DDP comm hook: the time each bucket's all-reduce was launched and when it
    finished."""

    def __init__(self, hook, wire_bytes_per_elem: int):
        self.hook, self.per_elem, self.spans, self.bytes = hook, wire_bytes_per_elem, [], 0
        # DDP refuses a hook *named* bf16_compress_hook on builds without NCCL; gloo itself
        # all-reduces bfloat16 fine (torch 2.13), so the wrapper's own name lets the bf16 hook run
        # on CPU too.
        self.__name__ = self.__qualname__ = "timed_" + hook.__name__

    def __call__(self, state, bucket):
        t0 = time.perf_counter()
        self.bytes += bucket.buffer().numel() * self.per_elem
        fut = self.hook(state, bucket)

        def done(f):
            self.spans.append((t0, time.perf_counter()))
            return f.value()
        return fut.then(done)


def busy(spans, lo=float("-inf"), hi=float("inf")) -> float:
    """Length of the union of the intervals, clipped to [lo, hi]."""
    total, end = 0.0, lo
    for a, b in sorted(spans):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total, end = total + b - a, b
    return total


def copy_bandwidth(device, nbytes=64 << 20, reps=5) -> float:
    """Bytes per second that one tensor copy moves on this device (best of reps)."""
    src = torch.empty(nbytes // 4, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        with lab.StepTimer(device) as t:
            dst.copy_(src)
        best = min(best, t.seconds)
    return nbytes / best


def allreduce_bandwidth(ctx, sizes, reps) -> None:
    """Records this device's copy bandwidth, then per message size the median all-reduce time, its
    algorithm bandwidth and its bus bandwidth (nccl-tests' definition)."""
    lab.record("copy_bandwidth", device=str(ctx.device), bytes_per_s=copy_bandwidth(ctx.device))
    n = ctx.world_size
    for size in sizes:
        t = torch.ones(size // 4, device=ctx.device)
        dist.all_reduce(t)  # warm-up: connections, buffers
        times = []
        for _ in range(reps):
            dist.barrier()
            with lab.StepTimer(ctx.device) as tm:
                dist.all_reduce(t)
            times.append(tm.seconds)
        s = sorted(times)[len(times) // 2]
        alg = size / s
        lab.record("allreduce", backend=ctx.backend, world_size=n, bytes=size,
                   median_s=round(s, 7),
                   algbw=alg, busbw=alg * 2 * (n - 1) / n)   # busbw: nccl-tests' definition


def make_model(width: int, depth: int) -> nn.Module:
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width),
                                                             nn.ReLU())][:-1])


def train(ctx, fix, width, depth, batch, steps, warmup, accum_k, bucket_mb, profile, name):
    device = ctx.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    module = make_model(width, depth).to(device)
    # ---- the baseline and its fixes, in one place ----------------------------------------------
    kw, hook, per_elem = {}, default_hooks.allreduce_hook, 4       # BROKEN: plain DDP, small batch
    if fix == "batch":
        batch = batch * accum_k  # FIX: more samples per all-reduce (same bytes sent)
    if fix == "bucket":
        kw["bucket_cap_mb"] = bucket_mb          # FIX: fewer, larger messages (default 25 MB)
    if fix == "static":
        kw.update(gradient_as_bucket_view=True, static_graph=True)  # FIX: no grad->bucket copy
    if fix == "fp16":
        hook, per_elem = default_hooks.fp16_compress_hook, 2  # FIX: half the bytes on the wire
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
            # no_sync: grads stay local
            with (model.no_sync() if m < micro - 1 else contextlib.nullcontext()):
                t0 = time.perf_counter()
                loss = nn.functional.mse_loss(model(x), y)
                sync()
                t1 = time.perf_counter()
                # DDP launches one all-reduce per bucket as its gradients are ready
                loss.backward()
                sync()
                t2 = time.perf_counter()
            fwd, bwd = fwd + t1 - t0, bwd + t2 - t1
        t3 = time.perf_counter()
        opt.step()
        sync()
        t_end = time.perf_counter()
        comm = busy(timer.spans)
        last_launch = max((a for a, _ in timer.spans), default=t2)
        # backward waited for the all-reduce after compute ended
        exposed = max(0.0, t2 - last_launch)
        # all-reduce that ran while backward still computed
        overlap = busy(timer.spans, hi=last_launch)
        step_s = t_end - t_start
        if step >= warmup:
            lab.record("step", config=name, fix=fix, width=width, depth=depth, batch=batch,
                       micro=micro,
                       params=n_params, step=step - warmup, step_s=round(step_s, 6),
                       fwd_s=round(fwd, 6),
                       bwd_s=round(bwd, 6), opt_s=round(t_end - t3, 6), comm_s=round(comm, 6),
                       exposed_s=round(exposed, 6), overlap_s=round(overlap, 6),
                       compute_s=round(step_s - exposed, 6), buckets=len(timer.spans),
                       wire_bytes=timer.bytes, samples=batch * micro * ctx.world_size,
                       loss=loss.item())
    if prof is not None:
        prof.__exit__(None, None, None)
        comm_us = sum(e.cpu_time_total for e in prof.key_averages()
                      if "all_reduce" in e.key or "allreduce" in e.key)
        lab.record("profile", config=name, steps=steps,
                   allreduce_s_per_step=round(comm_us / 1e6 / steps, 6))
    # DDP's own sampled timings (ns), first 10 iterations and every 100th
    d = model._get_ddp_logging_data()
    lab.record("ddp_logging", config=name, **{k: d.get(k) for k in (
        "avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time",
        "avg_backward_compute_comm_overlap_time", "bucket_sizes", "comm_hook")})


def dataparallel(ctx, width, depth, batch, steps):
    ngpu = torch.cuda.device_count()
    lab.record("copy_bandwidth", device=str(ctx.device), bytes_per_s=copy_bandwidth(ctx.device),
               gpus=ngpu)
    torch.manual_seed(0)
    module = make_model(width, depth).to(ctx.device)
    kinds = {"bare": module,
             "ddp": DDP(module,
                        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)}
    if ngpu >= 1:
        # all visible GPUs (one: its own overhead)
        kinds["dataparallel"] = nn.DataParallel(module)
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


def grid(ctx, variant, k) -> None:
    """broken: plain DDP over every width x batch; fixed: the baseline, then each fix."""
    fixes = ["none"] + (list(k["fix"]) if variant == "fixed" else [])
    # rounds interleave the configurations (A B C A B C): drift hits all alike
    for _, w, b, f in itertools.product(range(k["rounds"]), k["width"], k["batch"], fixes):
        train(ctx, f, w, k["depth"], b, k["steps"], k["warmup"], k["accum_k"], k["bucket_cap_mb"],
              k["profile"], f"w{w}-b{b}-{f}")


PROCEDURES = {
    "broken": grid, "fixed": grid,
    "link": lambda ctx, variant, k: allreduce_bandwidth(ctx, k["sizes"], k["reps"]),
    "dataparallel": lambda ctx, variant, k: dataparallel(ctx, k["width"][0], k["depth"],
                                                         k["batch"][0], k["steps"]),
}


def main(variant: str, *, width: list[int], depth: int, batch: list[int], steps: int, rounds: int,
         warmup: int, fix: list[str], accum_k: int, bucket_cap_mb: float, profile: bool,
         sizes: list[int], reps: int) -> None:
    ctx = lab.setup()
    lab.record("start", variant=variant, world_size=ctx.world_size, backend=ctx.backend,
               device=str(ctx.device), threads=torch.get_num_threads())
    PROCEDURES[variant](ctx, variant, dict(width=width, depth=depth, batch=batch, steps=steps,
                                           rounds=rounds, warmup=warmup, fix=fix, accum_k=accum_k,
                                           bucket_cap_mb=bucket_cap_mb, profile=profile,
                                           sizes=sizes, reps=reps))
    dist.barrier()
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    from ddplab.rank import lab_args

    variant, knobs = lab_args.parse(LAB, __doc__)
    main(variant, **knobs)
