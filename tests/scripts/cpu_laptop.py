"""A training script written for GPUs, run as-is on a CPU-only laptop (2 ranks, gloo): the mistake
named by $MISTAKE is the one the learner meets first.

    MISTAKE=set-device torchrun --nproc-per-node 2 tests/scripts/cpu_laptop.py
    MISTAKE=device-ids       torch.cuda.set_device removed; DDP(model, device_ids=[rank]) on a CPU module
    MISTAKE=local-rank-arg   argparse requires --local_rank (written for torch.distributed.launch)
    MISTAKE=none             the CPU route: gloo, no set_device, device_ids=None
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main(mistake: str) -> None:
    if mistake == "local-rank-arg":
        p = argparse.ArgumentParser()
        p.add_argument("--local_rank", type=int, required=True)    # BROKEN: torchrun sets LOCAL_RANK in the env
        p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mistake == "set-device":
        torch.cuda.set_device(rank)                                   # BROKEN: this torch has no CUDA
    model = nn.Linear(4, 1)
    ddp = DDP(model, device_ids=[rank] if mistake == "device-ids" else None)   # FIX: device_ids=None on CPU
    ddp(torch.randn(2, 4)).sum().backward()
    print(f"rank {rank}: step done", flush=True)


if __name__ == "__main__":
    main(os.environ.get("MISTAKE", "none"))
