"""Gathering tensors whose shapes may differ across ranks: the guard (every rank's shape, from one
small all_gather) and the ragged gather (sizes, pad, gather, trim). Imported by lab scripts (03); it
imports torch, so the launcher never imports it."""
from __future__ import annotations

import torch
import torch.distributed as dist

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
