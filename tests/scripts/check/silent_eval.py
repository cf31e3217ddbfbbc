"""A DDP job that ends ok and trains or evaluates wrong in ways no error shows: a model left in eval mode on
one rank, a checkpoint loaded with strict=False under other names, an evaluation whose DistributedSampler
padding counts samples twice, an evaluation of one rank's shard alone.

    torchrun --nproc-per-node 2 tests/scripts/check/silent_eval.py --mode eval-mode-rank0

--mode same: right (train mode restored after every evaluation; every rank evaluates its share of a split that
divides by the world size and reduces sums and counts; a strict=False load of a checkpoint without the head,
whose keys all match). frozen-bn: every rank trains with BatchNorm in eval mode (right: the same everywhere).
eval-mode-rank0: rank 0 checks the model in eval mode and never restores train mode (BROKEN,
ermongroup/ncsn#2). load-prefix: the DDP wrapper's state dict ("module." keys) loaded with strict=False into
the bare model (BROKEN, pytorch/examples#1029). eval-padding: a DistributedSampler over 51 samples on 2 ranks
(BROKEN, pytorch/pytorch#25162). eval-rank0: rank 0 alone iterates a DistributedSampler's share
(BROKEN, zifuwan/Sigma#41).
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))


def evaluate(module, n, rank, world, alone=False):
    g = torch.Generator().manual_seed(1)
    val = TensorDataset(torch.rand(n, 8, generator=g), torch.rand(n, 1, generator=g))
    loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))
    module.eval()
    sums = torch.zeros(2)
    with torch.no_grad():
        for x, y in loader:
            sums += torch.tensor([nn.functional.mse_loss(module(x), y, reduction="sum").item(), len(y)])
    module.train()
    if not alone:
        dist.all_reduce(sums)
    return (sums[0] / sums[1]).item()


def main(mode: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(make())
    if mode == "frozen-bn":
        model.module[1].eval()       # every rank: BatchNorm's running statistics, on purpose
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(10 + rank)
    for step in range(8):
        x, y = torch.rand(16, 8, generator=g), torch.rand(16, 1, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step == 3:
            if mode == "eval-mode-rank0" and rank == 0:
                model.module.eval()              # BROKEN: never back in train mode
                with torch.no_grad():
                    model.module(torch.rand(4, 8))
            elif mode not in ("frozen-bn", "eval-mode-rank0", "eval-rank0"):
                evaluate(model.module, 48, rank, world)
    if mode == "eval-padding":
        print(f"[rank{rank}] val mse {evaluate(model.module, 51, rank, world):.4f}", flush=True)   # BROKEN
    elif mode == "eval-rank0":
        if rank == 0:
            print(f"[rank0] val mse {evaluate(model.module, 48, rank, world, alone=True):.4f}", flush=True)  # BROKEN
    else:
        print(f"[rank{rank}] val mse {evaluate(model.module, 48, rank, world):.4f}", flush=True)
    scorer = make()
    if mode == "load-prefix":
        state = model.state_dict()                                   # BROKEN: "module." keys
    else:
        state = {k: v for k, v in model.module.state_dict().items() if not k.startswith("4.")}  # no head
    scorer.load_state_dict(state, strict=False)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="same",
                   choices=["same", "frozen-bn", "eval-mode-rank0", "load-prefix", "eval-padding", "eval-rank0"])
    main(p.parse_args().mode)
