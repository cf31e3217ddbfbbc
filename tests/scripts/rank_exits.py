"""Rank 1 finishes its loop and exits cleanly (exit 0) while rank 0 waits in one more all_reduce.

Under gloo a rank that exits closes its sockets and the waiting peer fails at once ("Connection
closed by peer"): run it plainly to see that. With --helper, rank 1 first forks a helper process
that outlives it holding its sockets (as a background uploader forked from a training script
would), so rank 0 waits for ever instead: a hang with one rank gone. The helper ends when rank 0 is gone.

    torchrun --nproc-per-node 2 tests/scripts/rank_exits.py [--helper]
"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def helper_until_gone(pid: int) -> None:
    end = time.time() + 300
    while time.time() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    os._exit(0)


def main(helper: bool) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pids = [None, None]
    dist.all_gather_object(pids, os.getpid())
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    if rank == 1:
        if helper and os.fork() == 0:
            helper_until_gone(pids[0])
        time.sleep(1)
        print("rank 1: done, exiting", flush=True)
        return
    dist.all_reduce(torch.ones(4))        # rank 0 thinks there is one more step


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--helper", action="store_true")
    main(p.parse_args().helper)
