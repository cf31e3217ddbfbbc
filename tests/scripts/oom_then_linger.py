"""Rank 1 runs out of memory; rank 0 loses its peer and exits first, so torchrun names rank 0.

Rank 1's allocation fails (CPU: "can't allocate memory"); on its way out it closes its process group
(rank 0, waiting in all_reduce, gets "Connection closed by peer" at once and exits) and then spends a
few seconds flushing its logs (a non-daemon thread), so torchrun sees rank 0's exit first.

    torchrun --nproc-per-node 2 tests/scripts/oom_then_linger.py
"""
import threading
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    if rank == 1:
        try:
            activations = torch.empty(2**44)          # 64 TiB of float32
            activations.zero_()
        finally:
            threading.Thread(target=time.sleep, args=(4,)).start()   # a slow log flush at exit
            dist.destroy_process_group()
    dist.all_reduce(torch.ones(4))


if __name__ == "__main__":
    main()
