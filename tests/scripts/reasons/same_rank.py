"""Every process asks init_process_group for rank 0: the script reads its rank from a SLURM variable
that this launch does not set (modelled on reports of scripts moved from SLURM to torchrun). The
rendezvous waits for a rank 1 that nobody asked for. `--world-size 3`: every rank asks for its own
rank, but for a world of 3 that torchrun's 2 processes cannot fill. `--timeout-s 3`: the same
rendezvous gives up after 3 s (DistStoreError), which is not a rank that never came either.

    torchrun --nproc-per-node 2 tests/scripts/reasons/same_rank.py [--world-size 3] [--timeout-s 3]
"""
import argparse
import datetime
import os

import torch
import torch.distributed as dist


def main(world_size: int | None, timeout_s: float) -> None:
    if world_size is None:
        rank = int(os.environ.get("SLURM_PROCID", 0))        # BROKEN: not set under torchrun: every process is 0
        world_size = int(os.environ["WORLD_SIZE"])
    else:
        rank = int(os.environ["RANK"])                         # BROKEN: world_size is not the job's
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--timeout-s", type=float, default=120.0)
    a = p.parse_args()
    main(a.world_size, a.timeout_s)
