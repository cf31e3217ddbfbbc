"""A DDP job that streams its data from an IterableDataset read by 2 DataLoader workers.

    torchrun --nproc-per-node 2 tests/scripts/check/iterable_workers.py --mode by-rank

--mode by-rank: sharded by rank only, so each worker yields the rank's whole share: every batch twice per epoch
(BROKEN, pytorch/pytorch#30599). by-worker: sharded by rank and by worker (get_worker_info), right.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Stream(IterableDataset):
    def __init__(self, n, rank, world, by_worker):
        g = torch.Generator().manual_seed(0)
        self.data = torch.rand(n, 9, generator=g)
        self.rank, self.world, self.by_worker = rank, world, by_worker

    def __iter__(self):
        start, step = self.rank, self.world
        info = get_worker_info()
        if self.by_worker and info is not None:
            start, step = self.rank * info.num_workers + info.id, self.world * info.num_workers
        return ((row[:8], row[8:]) for row in self.data[start::step])


def main(mode: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Stream(64, rank, world, mode == "by-worker"), batch_size=4, num_workers=2)
    steps = 0
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            steps += 1
        # the ranks may take different numbers of steps only where the shares differ: here they are equal
    print(f"[rank{rank}] {steps} steps", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="by-worker", choices=["by-rank", "by-worker"])
    main(p.parse_args().mode)
