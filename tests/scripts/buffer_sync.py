"""DDP's own collective inside forward: with broadcast_buffers=True (the default) every forward
broadcasts the module's buffers from rank 0. Rank 1 runs one extra step (uneven data), so it waits
in that broadcast while rank 0 has gone on to an all_reduce of its own.

    torchrun --nproc-per-node 2 tests/scripts/buffer_sync.py
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.register_buffer("seen", torch.zeros(1))     # a buffer DDP keeps in sync

    def forward(self, x):
        self.seen += len(x)
        return self.lin(x)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(Counted(), broadcast_buffers=True)
    for _ in range(3 + (1 if rank == 1 else 0)):       # rank 1 has one batch more
        model(torch.randn(8, 4)).sum().backward()
    total = torch.tensor([3.0])
    dist.all_reduce(total)                              # rank 0: the epoch's total
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
