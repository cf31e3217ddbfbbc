"""The DDP tutorial's elastic_ddp.py (pytorch.org/tutorials/intermediate/ddp_tutorial) on a CPU
laptop: demo_basic picks its GPU as rank % torch.cuda.device_count(), and there are 0 GPUs.

    torchrun --nproc-per-node 2 tests/scripts/reasons/tutorial_elastic_ddp.py
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")
    device_id = rank % torch.cuda.device_count()          # BROKEN on a CPU machine: 0 GPUs
    model = ToyModel().to(device_id)
    ddp_model = DDP(model, device_ids=[device_id])
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    loss_fn(ddp_model(torch.randn(20, 10)), torch.randn(20, 5).to(device_id)).backward()
    optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic()
