"""Lab 11 - mixed precision and the input pipeline: torch.amp with accumulation, GradScaler under DDP,
and a slow DataLoader that looks like a hang.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/11_amp_input.py --variant amp
    ddplab run 11 --variant slow-loader      # the same, judged by progress: slow, not stuck

Notebook: notebooks/11_amp_input.ipynb; its runs and measurements: ddplab.workbook.lab11.

Article 001's Example 3 uses apex (`amp.initialize`, `amp.scale_loss`), deprecated for years. Here it
is ported to torch.amp: autocast in bfloat16 on the CPU (no loss scaling needed: bf16 has float32's
exponent range) and float16 with torch.amp.GradScaler on GPUs (the GPU path runs only where CUDA is
present). Accumulation is done right: loss / k, model.no_sync() on all but the last micro-batch,
zero_grad() after the step (lab 08 runs the article's loop as written).

Variants:
  fp32                the reference: float32, k micro-batches per step under no_sync.
  amp                 the same loop under autocast (bf16 CPU / fp16 + GradScaler GPU): loss, step
                      time, activation memory and peak memory, against fp32.
  scaler-inf          GradScaler with DDP; at one step only rank 1's local gradient holds inf/NaN.
                      DDP's all-reduce spreads it to every rank, so every rank's scaler skips the step.
  scaler-inf-unsynced the same, but the whole accumulation loop sits inside no_sync(): no all-reduce,
                      so each rank's scaler decides alone (rank 1 skips, rank 0 steps; scales differ).
  slow-loader         rank 1's samples cost far more to decode (CPU, in a DataLoader worker): rank 0
                      waits seconds in DDP's all-reduce each step. Looks like a hang; it is slow.
  loader-sweep        num_workers, prefetch_factor and pin_memory measured on the same dataset.
"""
import contextlib
import statistics
import time
import warnings
import zlib

import torch
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from ddplab import lab

LAB = {
    "title": "Mixed precision and the input pipeline: torch.amp, GradScaler under DDP, a slow DataLoader",
    "article": "001_159326f62e29f2b3.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "fp32": {"expect": "ok", "signature": None,
                 "about": "float32 reference: k micro-batches per step under no_sync"},
        "amp": {"expect": "ok", "signature": None,
                "about": "article 001's apex sample on torch.amp (bf16 CPU / fp16 + GradScaler GPU), accumulation under no_sync"},
        "scaler-inf": {"expect": "ok", "signature": None,
                       "about": "only rank 1's local gradient holds inf: after DDP's all-reduce every rank's scaler skips the step"},
        "scaler-inf-unsynced": {"expect": "ok", "signature": None,
                                "about": "the loop inside no_sync(): no all-reduce, rank 1 skips alone, scales and weights diverge"},
        "slow-loader": {"expect": "ok", "signature": None,
                        "about": "rank 1's DataLoader is slow: rank 0 waits seconds in all_reduce; slow, not stuck"},
        "loader-sweep": {"expect": "ok", "signature": None,
                         "about": "num_workers, prefetch_factor, pin_memory: data wait and samples/s measured"},
    },
    "sizes": {"width": 1024, "micro": 64, "k": 4, "steps": 6, "inf_step": 2,
              "slow_ms": 450, "fast_ms": 10, "slow_batch": 8, "slow_steps": 2,
              "sweep_batch": 16, "sweep_steps": 8, "sweep_decode_ms": 2, "sweep_read_ms": 6},
}
S = LAB["sizes"]


def make_model(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(256, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))


def micro_batch(rank: int, step: int, i: int, device):
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + i)     # the same data in every variant
    x = torch.randn(S["micro"], 256, generator=g)
    y = (x[:, :10] * 3).argmax(1)                                       # a learnable target
    return x.to(device), y.to(device)


def precision(device, wanted: str):
    """(autocast dtype or None, GradScaler): bf16 on the CPU, fp16 + loss scaling on a GPU."""
    if wanted == "fp32":
        return None, torch.amp.GradScaler(device.type, enabled=False)
    if device.type == "cuda":
        return torch.float16, torch.amp.GradScaler("cuda")              # GPU path: fp16 needs loss scaling
    return torch.bfloat16, torch.amp.GradScaler("cpu", enabled=wanted == "scaler")   # CPU: bf16, no scaling needed


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


def train(ctx, variant: str, steps: int, k: int) -> None:
    torch.manual_seed(0)
    model = DDP(make_model(S["width"]).to(ctx.device), device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler_demo = variant.startswith("scaler")
    dtype, scaler = precision(ctx.device, "fp32" if variant == "fp32" else "scaler" if scaler_demo else "amp")
    local_bad = [False]

    def comm_hook(state, bucket):                  # sees this rank's own gradient before the all-reduce
        local_bad[0] |= not bool(torch.isfinite(bucket.buffer()).all())
        return default_hooks.allreduce_hook(None, bucket)

    model.register_comm_hook(None, comm_hook)
    lab.record("start", device=str(ctx.device), dtype=str(dtype or torch.float32), scaler=scaler.is_enabled(), k=k)
    for step in range(steps):
        local_bad[0] = False
        scale_before = scaler.get_scale() if scaler.is_enabled() else None
        before = checksum(model)
        losses, act = [], None
        with lab.StepTimer() as t:
            for i in range(k):
                x, y = micro_batch(ctx.rank, step, i, ctx.device)
                if scaler_demo and step == S["inf_step"] and ctx.rank == 1 and i == 0:
                    x[0, 0] = float("inf")             # only rank 1's local gradient will hold inf/NaN
                last = i == k - 1
                unsynced = variant == "scaler-inf-unsynced"
                # FIX: no all-reduce on all but the last micro-batch (BROKEN in scaler-inf-unsynced: never one)
                with model.no_sync() if (not last or unsynced) else contextlib.nullcontext():
                    def fwd_bwd():
                        with torch.autocast(ctx.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                            loss = nn.functional.cross_entropy(model(x).float(), y) / k    # FIX: mean over k
                        scaler.scale(loss).backward()  # apex: `with amp.scale_loss(loss, optimizer) as s: s.backward()`
                        return loss
                    if act is None:
                        act = saved_bytes(lambda: losses.append(fwd_bwd()))
                    else:
                        losses.append(fwd_bwd())
                if not last or unsynced:
                    local_bad[0] |= any(not bool(torch.isfinite(p.grad).all()) for p in model.parameters())
            grads_bad = any(not bool(torch.isfinite(p.grad).all()) for p in model.parameters())
            scaler.step(optimizer)                     # skipped when the (unscaled) gradients hold inf/NaN
            scaler.update()                            # ... and the scale is halved
            optimizer.zero_grad(set_to_none=True)      # FIX: zero only after the step
        after = checksum(model)
        lab.record("step", step=step, loss=float(sum(l.item() for l in losses)), step_s=t.seconds,
                   act_bytes=act, local_nonfinite=local_bad[0], grads_nonfinite=grads_bad,
                   stepped=after != before, scale_before=scale_before,
                   scale_after=scaler.get_scale() if scaler.is_enabled() else None, checksum=after)
    lab.record("memory", peak_mb=lab.peak_memory_mb(ctx.device), kind="cuda max_memory_allocated"
               if ctx.device.type == "cuda" else "peak RSS (ru_maxrss) of the rank")


class Encoded(Dataset):
    """Samples stored compressed: __getitem__ 'reads' (read_ms, a sleep standing in for storage
    latency) and 'decodes' (zlib, on the CPU, until decode_ms of CPU time are spent)."""

    def __init__(self, n: int, decode_ms: float, read_ms: float = 0.0):
        self.n, self.decode_s, self.read_s = n, decode_ms / 1000, read_ms / 1000
        self.blob = zlib.compress(bytes(range(256)) * 4096)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.read_s:
            time.sleep(self.read_s)                    # storage latency (an imitation: a sleep)
        t0 = time.thread_time()
        while time.thread_time() - t0 < self.decode_s:
            raw = zlib.decompress(self.blob)           # the decode: real CPU work in this process
        x = torch.frombuffer(bytearray(raw[:256 * 4]), dtype=torch.uint8)[:256].float() / 255 + i % 7
        return x, i % 10


def epoch(ctx, model, optimizer, loader, steps: int) -> dict:
    """Run up to `steps` batches; time spent waiting for the loader vs the rest of the step."""
    waits, steps_s = [], []
    it = iter(loader)
    t_all = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = next(it)                                # where a rank waits for its data
        t1 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x.to(ctx.device, non_blocking=True)), y.to(ctx.device))
        loss.backward()                                # DDP's all-reduce: a fast rank waits here for a slow one
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        waits.append(t1 - t0)
        steps_s.append(time.perf_counter() - t1)
    return {"wall_s": time.perf_counter() - t_all, "data_wait_s": sum(waits), "compute_s": sum(steps_s),
            "max_data_wait_s": max(waits), "max_compute_s": max(steps_s), "steps": steps}


def small_model(ctx):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(ctx.device),
                device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def slow_loader(ctx, workers: int) -> None:
    # BROKEN (by design of the data): rank 1's shard costs 45x more to decode per sample
    cost = S["slow_ms"] if ctx.rank == 1 else S["fast_ms"]
    data = Encoded(S["slow_batch"] * S["slow_steps"], cost)
    loader = DataLoader(data, batch_size=S["slow_batch"], num_workers=workers)
    model, optimizer = small_model(ctx)
    lab.log(f"loading: {cost} ms of decoding per sample, {workers} worker(s)")
    lab.record("loader", workers=workers, decode_ms=cost, **epoch(ctx, model, optimizer, loader, S["slow_steps"]))


SWEEP = [  # (num_workers, prefetch_factor, pin_memory)
    (0, None, False), (1, 2, False), (2, 1, False), (2, 2, False), (2, 4, False), (2, 2, True)]


def loader_sweep(ctx) -> None:
    model, optimizer = small_model(ctx)
    batch, steps = S["sweep_batch"], S["sweep_steps"]
    data = Encoded(batch * steps, S["sweep_decode_ms"], S["sweep_read_ms"])
    for workers, prefetch, pin in SWEEP:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = DataLoader(data, batch_size=batch, num_workers=workers, prefetch_factor=prefetch,
                                pin_memory=pin, persistent_workers=False)
            m = epoch(ctx, model, optimizer, loader, steps)
        first = next(iter(DataLoader(data, batch_size=2, pin_memory=pin)))[0] if pin else None
        lab.record("sweep", workers=workers, prefetch=prefetch, pin_memory=pin, batch=batch,
                   samples_per_s=batch * steps / m["wall_s"], pinned=bool(first.is_pinned()) if pin else False,
                   warnings=sorted({str(w.message) for w in caught if "pin" in str(w.message)}), **m)


def main(variant: str, steps: int, k: int, workers: int) -> None:
    ctx = lab.setup()
    torch.set_num_threads(1)
    if variant in ("fp32", "amp", "scaler-inf", "scaler-inf-unsynced"):
        train(ctx, variant, steps, k)
    elif variant == "slow-loader":
        slow_loader(ctx, workers)
    else:
        loader_sweep(ctx)
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="amp", help="which version of the code to run")
    p.add_argument("--steps", type=int, choices=range(3, 101), metavar="3..100", default=S["steps"],
                   help="fp32/amp/scaler-*: optimizer steps")
    p.add_argument("--k", type=int, choices=range(1, 17), metavar="1..16", default=S["k"],
                   help="fp32/amp/scaler-*: micro-batches per optimizer step")
    p.add_argument("--workers", type=int, choices=range(0, 5), metavar="0..4", default=1,
                   help="slow-loader: DataLoader num_workers")
    a = p.parse_args()
    main(a.variant, a.steps, a.k, a.workers)
