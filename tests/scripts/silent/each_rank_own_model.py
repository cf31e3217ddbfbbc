"""The model is wrapped in DDP only on the GPU path (mapbox/robosat#77; kohya-ss/sd-scripts#924): on a CPU
machine every rank trains its own copy on its own shard, and nothing averages the gradients. It ends ok.

    torchrun --nproc-per-node 2 tests/scripts/silent/each_rank_own_model.py
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
if torch.cuda.is_available():      # BROKEN: on the CPU the model is never wrapped
    model = DDP(model.cuda())
x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
data = TensorDataset(x, x.sum(1, keepdim=True))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=8, sampler=sampler)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
dist.destroy_process_group()
