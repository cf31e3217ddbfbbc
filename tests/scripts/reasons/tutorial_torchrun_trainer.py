"""pytorch/examples distributed/ddp-tutorial-series/multigpu_torchrun.py, cut to its shape, on a CPU
laptop: ddp_setup falls back to the CPU and gloo, but the Trainer still moves the model to the
integer LOCAL_RANK ("Cannot access accelerator device when none is available").

    torchrun --nproc-per-node 2 tests/scripts/reasons/tutorial_torchrun_trainer.py
"""
import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_setup():
    rank = int(os.environ["LOCAL_RANK"])
    if torch.accelerator.is_available():
        device = torch.device(f"{torch.accelerator.current_accelerator()}:{rank}")
        torch.accelerator.set_device_index(rank)
    else:
        device = torch.device("cpu")
    backend = torch.distributed.get_default_backend_for_device(device)
    init_process_group(backend=backend)


class Trainer:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model.to(self.gpu_id)             # BROKEN on a CPU machine: an int is an accelerator index
        self.optimizer = optimizer
        self.model = DDP(self.model, device_ids=[self.gpu_id])

    def train(self, steps: int) -> None:
        for _ in range(steps):
            source, targets = torch.randn(8, 20), torch.randn(8, 1)
            self.optimizer.zero_grad()
            F.cross_entropy(self.model(source), targets).backward()
            self.optimizer.step()


def main():
    ddp_setup()
    model = torch.nn.Linear(20, 1)
    Trainer(model, torch.optim.SGD(model.parameters(), lr=1e-3)).train(2)
    destroy_process_group()


if __name__ == "__main__":
    main()
