"""The last rank enters a barrier while every other rank enters an all_reduce: a hang at any size.

    torchrun --nproc-per-node 8 tests/scripts/hang_n.py
"""
import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(20):
        dist.all_reduce(torch.ones(1000))
    print(f"rank {rank}: 20 steps done", flush=True)
    if rank == world - 1:
        dist.barrier()                      # the last rank alone
    else:
        dist.all_reduce(torch.ones(1000))   # every other rank


if __name__ == "__main__":
    main()
