"""A learner's script in which rank 1 raises and its interpreter takes long to exit (an exit handler
that waits, as a destructor waiting for a peer does), while rank 0 sleeps outside any collective.
The job has failed (rank 1's exception), whatever the stall window sees while rank 1 exits.

    torchrun --nproc-per-node 2 tests/scripts/slow_exit.py
"""
import atexit
import time

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()
    if rank == 1:
        atexit.register(time.sleep, 20)          # an exit that waits (no CPU) for longer than the stall window
        raise ConnectionError("rank 1 lost its data server")
    time.sleep(30)                               # rank 0: its own work, outside any collective


if __name__ == "__main__":
    main()
