"""After facebookresearch/detr#297 (https://github.com/facebookresearch/detr/issues/297) and the
nanoGPT pattern it breaks: batches drawn at random with torch.randint after torch.manual_seed(seed)
with no offset by the rank, so every rank draws the same batches and the ranks do the work of one.
Expected from `ddplab run --check`: same-inputs."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="gloo")
torch.manual_seed(1337)                                   # the bug: no `+ dist.get_rank()`
data = torch.randn(4096, 8, generator=torch.Generator().manual_seed(0))
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(40):
    ix = torch.randint(len(data), (16,))                  # the same indices on every rank
    loss = model(data[ix]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
