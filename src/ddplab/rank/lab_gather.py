"""Gathering tensors whose shapes may differ across ranks: the guard (every rank's shape, from one
small all_gather) and the ragged gather (sizes, pad, gather, trim). Imported by lab scripts (03); it
imports torch, so the launcher never imports it."""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab

MAXDIM = 8   # the largest number of dimensions the guard describes


class ShapeMismatchError(RuntimeError):
    """The guard found different shapes on the ranks before a collective that needs equal ones."""


def shapes_of(t: torch.Tensor, world: int) -> list[tuple[int, ...]]:
    """Every rank's shape of ``t``: one all_gather of MAXDIM+1 integers (the guard)."""
    meta = torch.full((MAXDIM + 1,), -1, dtype=torch.int64, device=t.device)
    meta[0] = t.dim()
    meta[1:1 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    got = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(got, meta)
    return [tuple(m[1:1 + int(m[0])].tolist()) for m in got]


def pad_gather(t: torch.Tensor, shapes, world: int) -> list[torch.Tensor]:
    """Pad dim 0 to the largest rank's size, gather equal shapes, trim each back."""
    n = max(s[0] for s in shapes)
    padded = torch.zeros((n, *t.shape[1:]), dtype=t.dtype, device=t.device)
    padded[:t.shape[0]] = t
    got = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(got, padded)
    return [g[:s[0]] for g, s in zip(got, shapes)]


def mismatch_message(shapes, where: str) -> str:
    return ("tensors must have the same shape on every rank for all_gather: " +
            ", ".join(f"rank {r} has {list(s)}" for r, s in enumerate(shapes)) + f" ({where})")


def guard_cost(ctx, steps: int) -> None:
    """Lab 03 fixed-guard, per training step: the guard's time against the step's own time (forward, backward, DDP all-reduce)."""
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(ctx.device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64, device=ctx.device), torch.randint(0, 10, (64,), device=ctx.device)
    step_s, guard_s = [], []
    for i in range(steps + 3):                           # 3 warm-up steps
        with lab.StepTimer() as tg:
            shapes_of(x, ctx.world_size)                 # the guard on this step's batch
        with lab.StepTimer() as ts:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        if i >= 3:
            guard_s.append(tg.seconds)
            step_s.append(ts.seconds)
    g, s = statistics.median(guard_s) * 1e3, statistics.median(step_s) * 1e3
    lab.record("guard_cost", steps=steps, guard_ms=g, step_ms=s, overhead_pct=100 * g / s)
