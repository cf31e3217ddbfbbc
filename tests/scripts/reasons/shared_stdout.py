"""Two ranks that print to one stdout (torchrun's output redirected to one file, no --log-dir), then
hang: rank 0 prints last, rank 1 waits in a barrier rank 0 never reaches.

    torchrun --nproc-per-node 2 tests/scripts/reasons/shared_stdout.py > out.log 2>&1
"""
import time

import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:
        print("rank 1 reached the barrier", flush=True)
        dist.barrier()
    else:
        time.sleep(1)
        print("rank 0 sleeps forever", flush=True)
        time.sleep(600)


if __name__ == "__main__":
    main()
