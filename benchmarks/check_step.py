"""One rank's side of benchmarks/check_overhead.py: lab 07's training step (its model, width 2048,
depth 4, per-rank batch 8, plain DDP, SGD), timed step by step. Records the median ms per step."""
import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab import lab

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
times = []
for step in range(a.warmup + a.steps):
    x = torch.randn(a.batch, a.width, generator=g)
    y = torch.tanh(x @ teacher)
    t0 = time.perf_counter()
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    if step >= a.warmup:
        times.append(time.perf_counter() - t0)
lab.record("steps", median_ms=1e3 * statistics.median(times), ms=[1e3 * t for t in times],
           params=sum(p.numel() for p in model.parameters()))
lab.teardown()
