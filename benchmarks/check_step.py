"""One rank's side of benchmarks/check_overhead.py: lab 07's training step (its model, width 2048,
depth 4, per-rank batch 8, plain DDP, SGD), timed step by step, and after each step the checksum
--check takes every N forwards (all parameters and buffers), timed on its own. Records the medians."""
import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddplab
from ddplab.rank import lab

spec = importlib.util.spec_from_file_location("lab07", Path(__file__).resolve().parents[1] / "labs" / "07_scaling.py")
lab07 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab07)

p = argparse.ArgumentParser()
p.add_argument("--width", type=int, default=2048)
p.add_argument("--depth", type=int, default=4)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--warmup", type=int, default=3)
a = p.parse_args()
ctx = lab.setup()
torch.manual_seed(0)
model = DDP(lab07.make_model(a.width, a.depth))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(100 + ctx.rank)
teacher = torch.randn(a.width, a.width, generator=g) / a.width ** 0.5
# --check's checksum itself (the rank hook's own function), timed right after each step in the same
# process: the pair sees the same load, which a ratio of two whole runs on a shared machine does not
sys.path.insert(0, str(Path(ddplab.__file__).resolve().parent / "_rankhook"))
from ddplab_rankcheck import _sums  # noqa: E402

tensors = list(model.module.parameters()) + list(model.module.buffers())
# Under --check (its checksum interval set too long to fire): every other step runs with the rank
# hook's per-step wrappers taken off (DDP.forward's original, the global optimizer pre-hook removed),
# so the steps with and without them alternate in one process, under the same load.
from torch.optim import optimizer as optim_mod  # noqa: E402

hooked = "ddplab_rankcheck" in sys.modules and hasattr(DDP.forward, "__wrapped__")
wrapped_forward = DDP.forward
pre_hooks = dict(optim_mod._global_optimizer_pre_hooks)


def hooks(on: bool) -> None:
    DDP.forward = wrapped_forward if on else wrapped_forward.__wrapped__
    optim_mod._global_optimizer_pre_hooks.clear()
    if on:
        optim_mod._global_optimizer_pre_hooks.update(pre_hooks)


times, sums, bare = [], [], []
for step in range(a.warmup + 2 * a.steps if hooked else a.warmup + a.steps):
    off = hooked and step % 2 == 1
    if hooked:
        hooks(not off)
    x = torch.randn(a.batch, a.width, generator=g)
    y = torch.tanh(x @ teacher)
    t0 = time.perf_counter()
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    t1 = time.perf_counter()
    _sums(torch, tensors)
    t2 = time.perf_counter()
    if step >= a.warmup:
        (bare if off else times).append(t1 - t0)
        sums.append(t2 - t1)
if hooked:
    hooks(True)
lab.record("steps", median_ms=1e3 * statistics.median(times), checksum_ms=1e3 * statistics.median(sums),
           bare_ms=1e3 * statistics.median(bare) if bare else None,
           ms=[1e3 * t for t in times], params=sum(p.numel() for p in model.parameters()))
lab.teardown()
