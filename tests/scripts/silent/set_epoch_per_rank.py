"""After yangkky/distributed_tutorial#5 "Call set_epoch on DistributedSampler"
(https://github.com/yangkky/distributed_tutorial/issues/5): "it is very important to set the epoch to
the same value in each worker, otherwise there is a chance that some data points will be visited
multiple times, and others none at all". Here each rank's epoch counter is offset by its rank.
Expected from `ddplab run --check`: samples-overlap and samples-dropped."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
sampler = DistributedSampler(data, shuffle=True)
loader = DataLoader(data, batch_size=8, sampler=sampler)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    sampler.set_epoch(epoch + rank)                    # the bug: not the same epoch on every rank
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
dist.destroy_process_group()
