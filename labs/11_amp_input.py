"""Lab 11 - mixed precision and the input pipeline: torch.amp with accumulation, GradScaler under DDP,
and a slow DataLoader that looks like a hang.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/11_amp_input.py --variant amp
    ddplab run 11 --variant slow-loader      # the same, judged by progress: slow, not stuck

Notebook: notebooks/11_amp_input.ipynb; its runs and measurements: ddplab.course.lab11.

Article 001's Example 3 uses apex (`amp.initialize`, `amp.scale_loss`), deprecated for years. Here it is ported
to torch.amp: autocast in bfloat16 on the CPU (no loss scaling needed: bf16 has float32's exponent range) and
float16 with torch.amp.GradScaler on GPUs (the GPU path runs only where CUDA is present). Accumulation is done
right: loss / k, model.no_sync() on all but the last micro-batch, zero_grad() after the step (lab 08 runs the
article's loop as written).

Variants:
  amp                 k micro-batches per step under no_sync, two replicas stepping in turn: float32 and autocast
                      (bf16 CPU / fp16 + GradScaler GPU): loss, step time, saved activations and (GPU) peak memory.
  scaler-inf          GradScaler with DDP; at one step only rank 1's local gradient holds inf/NaN.
                      DDP's all-reduce spreads it to every rank, so every rank's scaler skips the step.
  scaler-inf-unsynced the same, but the whole accumulation loop sits inside no_sync(): no all-reduce,
                      so each rank's scaler decides alone (rank 1 skips, rank 0 steps; scales differ).
  slow-loader         rank 1's samples sit on slow storage (a sleep: an imitation) and are decoded on the CPU in
                      its DataLoader worker: rank 0 waits seconds in DDP's all-reduce each step. Looks like a
                      hang; ddplab sees the worker's CPU and calls it slow, not stuck.
  loader-sweep        num_workers, prefetch_factor and pin_memory measured on the same dataset.
"""
import contextlib
import time

import torch
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from ddplab.rank import lab, lab_loader
from ddplab.rank.lab_measure import checksum, precision, saved_bytes

LAB = {
    "title": "Mixed precision and the input pipeline: torch.amp, GradScaler under DDP, a slow DataLoader",
    "article": "001_159326f62e29f2b3.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "amp": {"expect": "ok", "signature": None,
                "about": "article 001's apex sample on torch.amp (bf16 CPU / fp16 + GradScaler GPU), accumulation under no_sync, step by step against float32"},
        "scaler-inf": {"expect": "ok", "signature": None,
                       "about": "only rank 1's local gradient holds inf: after DDP's all-reduce every rank's scaler skips the step"},
        "scaler-inf-unsynced": {"expect": "ok", "signature": None,
                                "about": "the loop inside no_sync(): no all-reduce, rank 1 skips alone, scales and weights diverge"},
        "slow-loader": {"expect": "ok", "signature": None,
                        "about": "rank 1's DataLoader is slow (storage latency + decoding): rank 0 waits seconds in all_reduce; slow, not stuck"},
        "loader-sweep": {"expect": "ok", "signature": None, "measured": "samples/s against the loader's settings",
                         "about": "num_workers, prefetch_factor, pin_memory: data wait and samples/s measured"},
    },
    "sizes": {"width": 512, "micro": 64, "k": 4, "steps": 6, "inf_step": 2,
              "slow_read_ms": 400, "slow_ms": 50, "fast_ms": 10, "slow_batch": 8, "slow_steps": 2,
              "sweep_batch": 16, "sweep_steps": 5, "sweep_rounds": 2, "sweep_decode_ms": 2, "sweep_read_ms": 6},
}
S = LAB["sizes"]


def make_model(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(256, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))


def micro_batch(rank: int, step: int, i: int, device):
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + i)     # the same data in every variant
    x = torch.randn(S["micro"], 256, generator=g)
    y = (x[:, :10] * 3).argmax(1)                                       # a learnable target
    return x.to(device), y.to(device)


class Replica:
    """One DDP model with its optimizer, autocast dtype and GradScaler (one per precision)."""

    def __init__(self, ctx, name: str):
        torch.manual_seed(0)                          # the same initial weights for every precision
        self.name, self.local_bad = name, False
        self.model = DDP(make_model(S["width"]).to(ctx.device),
                         device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.5)
        self.dtype, self.scaler = precision(ctx.device, name)
        self.model.register_comm_hook(None, self.comm_hook)

    def comm_hook(self, state, bucket):              # sees this rank's own gradient before the all-reduce
        self.local_bad |= not bool(torch.isfinite(bucket.buffer()).all())
        return default_hooks.allreduce_hook(None, bucket)

    def grads_bad(self) -> bool:
        return any(not bool(torch.isfinite(p.grad).all()) for p in self.model.parameters())


def train_step(ctx, rep: Replica, step: int, k: int, inject: bool, unsynced: bool) -> dict:
    """k micro-batches, one optimizer step: article 001's Example 3 on torch.amp, accumulation done right."""
    model, scaler = rep.model, rep.scaler
    rep.local_bad = False
    scale_before = scaler.get_scale() if scaler.is_enabled() else None
    before, losses, act = checksum(model), [], None
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    with lab.StepTimer() as t:
        for i in range(k):
            x, y = micro_batch(ctx.rank, step, i, ctx.device)
            if inject and ctx.rank == 1 and i == 0:
                x[0, 0] = float("inf")                 # only rank 1's local gradient will hold inf/NaN
            last = i == k - 1
            # FIX: no all-reduce on all but the last micro-batch (BROKEN in scaler-inf-unsynced: never one)
            with model.no_sync() if (not last or unsynced) else contextlib.nullcontext():
                def fwd_bwd():
                    with torch.autocast(ctx.device.type, dtype=rep.dtype or torch.float32, enabled=rep.dtype is not None):
                        loss = nn.functional.cross_entropy(model(x).float(), y) / k    # FIX: mean over k
                    scaler.scale(loss).backward()      # apex: `with amp.scale_loss(loss, optimizer) as s: s.backward()`
                    losses.append(loss.item())
                if act is None:
                    act = saved_bytes(fwd_bwd)
                else:
                    fwd_bwd()
            if not last or unsynced:                   # no all-reduce ran: p.grad is still this rank's own
                rep.local_bad |= rep.grads_bad()
        grads_bad = rep.grads_bad()                    # what the scaler is about to check
        scaler.step(rep.optimizer)                     # skipped when the (unscaled) gradients hold inf/NaN
        scaler.update()                                # ... and then the scale is halved
        rep.optimizer.zero_grad(set_to_none=True)      # FIX: zero only after the step
    after = checksum(model)
    return {"precision": rep.name, "step": step, "loss": sum(losses), "step_s": t.seconds, "act_bytes": act,
            "peak_mb": torch.cuda.max_memory_allocated(ctx.device) / 2**20 if ctx.device.type == "cuda" else None,
            "local_nonfinite": rep.local_bad, "grads_nonfinite": grads_bad, "stepped": after != before,
            "scale_before": scale_before, "scale_after": scaler.get_scale() if scaler.is_enabled() else None,
            "checksum": after}


def train(ctx, variant: str, steps: int, k: int) -> None:
    # amp: float32 and autocast replicas step in turn, so both are timed under the same load
    replicas = [Replica(ctx, "fp32"), Replica(ctx, "amp")] if variant == "amp" else [Replica(ctx, "scaler")]
    for rep in replicas:
        lab.record("start", precision=rep.name, device=str(ctx.device), dtype=str(rep.dtype or torch.float32),
                   scaler=rep.scaler.is_enabled(), k=k)
    for step in range(steps):
        for rep in replicas:
            lab.record("step", **train_step(ctx, rep, step, k, inject=variant.startswith("scaler") and step == S["inf_step"],
                                            unsynced=variant == "scaler-inf-unsynced"))


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


def slow_loader(ctx, workers: int) -> None:
    # BROKEN (by design of the data): rank 1's shard sits on slow storage (400 ms per sample) and
    # costs more to decode; rank 0's is fast. Rank 1 fetches for seconds; rank 0 waits for it.
    read, decode = (S["slow_read_ms"], S["slow_ms"]) if ctx.rank == 1 else (0, S["fast_ms"])
    data = lab_loader.Encoded(S["slow_batch"] * S["slow_steps"], decode, read)
    loader = DataLoader(data, batch_size=S["slow_batch"], num_workers=workers)
    model, optimizer = lab_loader.ddp_mlp(ctx)
    lab.log(f"loading: {read} ms read + {decode} ms decoding per sample, {workers} worker(s)")
    lab.record("loader", workers=workers, read_ms=read, decode_ms=decode,
               **epoch(ctx, model, optimizer, loader, S["slow_steps"]))


def main(variant: str, steps: int, k: int, workers: int) -> None:
    ctx = lab.setup()
    torch.set_num_threads(1)
    procedures = {"slow-loader": lambda: slow_loader(ctx, workers), "loader-sweep": lambda: lab_loader.loader_sweep(ctx, S, epoch)}
    procedures.get(variant, lambda: train(ctx, variant, steps, k))()   # amp, scaler-inf, scaler-inf-unsynced
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="amp", help="which version of the code to run")
    p.add_argument("--steps", type=int, choices=range(3, 101), metavar="3..100", default=S["steps"],
                   help="amp/scaler-*: optimizer steps")
    p.add_argument("--k", type=int, choices=range(1, 17), metavar="1..16", default=S["k"],
                   help="amp/scaler-*: micro-batches per optimizer step")
    p.add_argument("--workers", type=int, choices=range(0, 5), metavar="0..4", default=1,
                   help="slow-loader: DataLoader num_workers")
    a = p.parse_args()
    main(a.variant, a.steps, a.k, a.workers)
