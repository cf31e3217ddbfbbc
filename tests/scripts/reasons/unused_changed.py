"""DDP whose forward stops using a layer partway through training (a branch on the step, as in
curriculum or warm-up code): the layer's parameters got gradients for the first steps, then none.
`--from-start` uses the branch from step 0: parameters that never take part.

    torchrun --nproc-per-node 2 tests/scripts/reasons/unused_changed.py [--from-start]
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.aux = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x, use_aux: bool):
        h = self.body(x)
        if use_aux:
            h = h + self.aux(h)
        return self.head(h)


def main(switch_at: int) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        use_aux = step < switch_at            # BROKEN: aux stops taking part after the warm-up
        loss = model(torch.randn(4, 8), use_aux).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--from-start", action="store_true")
    main(0 if p.parse_args().from_start else 3)
