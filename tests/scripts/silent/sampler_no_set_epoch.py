"""After pytorch/pytorch#31771 "DistributedSampler can't shuffle the dataset"
(https://github.com/pytorch/pytorch/issues/31771): DistributedSampler(shuffle=True), no set_epoch,
so every epoch yields the same order. Here with a small model trained under DDP (gloo, CPU).
Expected from `ddplab run --check`: same-order."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class RandomDataset(Dataset):
    def __init__(self):
        self.data = torch.rand(22, 8)
        self.name = torch.arange(1, 23)

    def __getitem__(self, idx):
        return self.name[idx], self.data[idx]

    def __len__(self):
        return len(self.data)


dist.init_process_group(backend="gloo")
torch.manual_seed(5)
dataset = RandomDataset()
sampler = DistributedSampler(dataset, shuffle=True)
dataloader = DataLoader(dataset, batch_size=5, drop_last=True, sampler=sampler)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for i, (names, data) in enumerate(dataloader, 0):
        opt.zero_grad()
        model(data).pow(2).mean().backward()
        opt.step()
dist.destroy_process_group()
