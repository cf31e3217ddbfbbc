"""A checkpoint saved from a model whose layers were renamed: load_state_dict's error lists the
missing and unexpected keys on the lines after its first (modelled on real reports).

    torchrun --nproc-per-node 2 tests/scripts/reasons/load_state_dict.py
"""
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn


class Old(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)


class New(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(4, 8)      # renamed from encoder
        self.head = nn.Linear(8, 2)


def restore(model: nn.Module, path: str) -> None:
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state)             # BROKEN: the checkpoint's keys are the old names


def main() -> None:
    dist.init_process_group("gloo")
    path = os.path.join(tempfile.gettempdir(), f"ddplab-ckpt-{os.getpid()}.pt")
    torch.save(Old().state_dict(), path)
    try:
        restore(New(), path)
    finally:
        os.unlink(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
