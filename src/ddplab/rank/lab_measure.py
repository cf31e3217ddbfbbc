"""Measurements lab scripts share: a DDP comm hook that timestamps each bucket's all-reduce, the union
of those spans, this device's copy bandwidth and the all-reduce bus bandwidth. Imported by the lab
scripts only (it imports torch)."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ddplab.rank import lab


class CommTimer:
    """Wraps a DDP comm hook: the time each bucket's all-reduce was launched and when it finished."""

    def __init__(self, hook, wire_bytes_per_elem: int):
        self.hook, self.per_elem, self.spans, self.bytes = hook, wire_bytes_per_elem, [], 0
        # DDP refuses a hook *named* bf16_compress_hook on builds without NCCL; gloo itself all-reduces
        # bfloat16 fine (torch 2.13), so the wrapper's own name lets the bf16 hook run on CPU too.
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
        lab.record("allreduce", backend=ctx.backend, world_size=n, bytes=size, median_s=round(s, 7),
                   algbw=alg, busbw=alg * 2 * (n - 1) / n)   # busbw: nccl-tests' definition


def saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for backward while fn() runs (the activations AMP halves)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


def checksum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def precision(device, wanted: str):
    """(autocast dtype or None, GradScaler): bf16 on the CPU, fp16 + loss scaling on a GPU."""
    if wanted == "fp32":
        return None, torch.amp.GradScaler(device.type, enabled=False)
    if device.type == "cuda":
        return torch.float16, torch.amp.GradScaler("cuda")              # GPU path: fp16 needs loss scaling
    return torch.bfloat16, torch.amp.GradScaler("cpu", enabled=wanted == "scaler")   # CPU: bf16, no scaling needed
