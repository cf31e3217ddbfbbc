"""PyTorch's own collective timeout fires while the rank the others wait for is busy computing:
rank 1 spins (pure Python) long past the process group's 3 s timeout; rank 0 waits in all_reduce.

    torchrun --nproc-per-node 2 tests/scripts/timeout_busy.py
"""
import datetime
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    print(f"rank {rank}: warm-up done", flush=True)
    if rank == 1:
        end = time.monotonic() + 60
        n = 0
        while time.monotonic() < end:       # a long computation on one rank only
            n += 1
    dist.all_reduce(torch.ones(4))


if __name__ == "__main__":
    main()
