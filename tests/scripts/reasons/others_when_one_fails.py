"""One rank fails while the others are busy elsewhere: where was each when torchrun ended it?
4 ranks: rank 0 raises; rank 1 waits in an all_reduce of a two-rank group with rank 2 (blocked in
gloo, C++), rank 2 sleeps, rank 3 computes in a Python loop.

    torchrun --nproc-per-node 4 tests/scripts/reasons/others_when_one_fails.py
"""
import time

import torch
import torch.distributed as dist


def busy_loop():
    x = 0
    while True:
        x += 1


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair = dist.new_group([1, 2])
    dist.barrier()
    if rank == 0:
        time.sleep(2)
        raise ValueError("rank 0's own mistake")
    if rank == 1:
        dist.all_reduce(torch.ones(1), group=pair)   # rank 2 never joins
    elif rank == 2:
        time.sleep(120)
    else:
        busy_loop()


if __name__ == "__main__":
    main()
