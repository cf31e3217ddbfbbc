"""The DDP tutorial's first example (pytorch.org/tutorials/intermediate/ddp_tutorial: setup() with
MASTER_ADDR localhost and MASTER_PORT 12355, mp.spawn(demo_basic, nprocs=world_size)) started
under torchrun: every torchrun worker spawns its own world of ranks, which all look for one store.

    torchrun --nproc-per-node 2 tests/scripts/reasons/tutorial_spawn_under_torchrun.py
"""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ.get("TUTORIAL_PORT", "12355")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.", flush=True)
    setup(rank, world_size)
    model = DDP(nn.Linear(10, 5))
    model(torch.randn(20, 10)).sum().backward()
    dist.destroy_process_group()


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)   # BROKEN under torchrun


if __name__ == "__main__":
    run_demo(demo_basic, 2)
