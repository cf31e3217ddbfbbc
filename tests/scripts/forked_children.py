"""A learner's script whose ranks fork children (DataLoader workers, a multiprocessing.Process that
exits with an error code) and then keep training: the children inherit ddplab's rank hook, and
nothing they do at exit may end the rank or stand in for its records.

    torchrun --nproc-per-node 2 tests/scripts/forked_children.py
"""
import multiprocessing as mp
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset


def child_fails() -> None:
    sys.exit(3)                     # the child's own error, not the rank's


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    p = mp.get_context("fork").Process(target=child_fails)
    p.start()
    p.join()
    loader = DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4, num_workers=2,
                        multiprocessing_context="fork")
    for _ in range(2):              # two epochs: each starts and ends its two workers
        for (x,) in loader:
            dist.all_reduce(x)
    dist.barrier()                  # the rank's worker server is still serving after its children left
    print(f"rank {rank} done; child exit code {p.exitcode}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
