"""pytorch/examples distributed/minGPT-ddp's data set-up, cut to its shape: main.py splits the dataset
with torch.utils.data.random_split without a generator, on every rank, and the Trainer then gives
each rank its share of that split with a DistributedSampler. Each rank split differently, so the
sampler shares out a different train set on each rank: some samples twice, some never.

    torchrun --nproc-per-node 2 tests/scripts/reasons/mingpt_split.py [--seeded]     (ddplab run --check)
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, random_split
from torch.utils.data.distributed import DistributedSampler


def get_train_objs(seeded: bool, n: int = 64):
    dataset = TensorDataset(torch.randn(n, 8), torch.randn(n, 1))
    train_len = int(n * 0.75)
    if seeded:      # FIX: the same split on every rank
        train_set, test_set = random_split(dataset, [train_len, n - train_len], generator=torch.Generator().manual_seed(0))
    else:
        train_set, test_set = random_split(dataset, [train_len, n - train_len])   # BROKEN: unseeded, per rank
    return nn.Linear(8, 1), train_set, test_set


def main(seeded: bool):
    dist.init_process_group("gloo")
    model, train_set, _ = get_train_objs(seeded)
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(train_set, batch_size=4, shuffle=False, sampler=DistributedSampler(train_set))
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            (model(x) - y).pow(2).mean().backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seeded", action="store_true")
    main(p.parse_args().seeded)
