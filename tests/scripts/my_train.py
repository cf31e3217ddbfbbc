"""A learner's own DDP script, knowing nothing of ddplab: `ddplab run tests/scripts/my_train.py -- --mode hang`.

    torchrun --nproc-per-node 2 tests/scripts/my_train.py --mode ok
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main(mode: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(4, 1))
    steps = 3 + (2 if (mode == "hang" and rank == 1) else 0)   # rank 1 runs two extra steps
    for _ in range(steps):
        model(torch.randn(8, 4)).sum().backward()
    if mode == "crash" and rank == 1:
        raise ValueError("rank 1 found a corrupt batch")
    if mode == "sleep":
        time.sleep(60)
    if mode == "busy":             # slow, not stuck: computes for $BUSY_S seconds (default 8)
        until = time.time() + float(os.environ.get("BUSY_S", 8))
        while time.time() < until:
            torch.randn(128, 128) @ torch.randn(128, 128)
    dist.barrier()
    print(f"rank {rank} finished {steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ok", "hang", "crash", "sleep", "busy"], default="ok", help="what the job does")
    main(p.parse_args().mode)
