"""After huggingface/accelerate#3256 (https://github.com/huggingface/accelerate/issues/3256): the
optimizer is built from the model's parameters before the FSDP wrap, which replaces them with its own
flat parameters; backward fills the wrapper's gradients and the optimizer's tensors never get one, so
every step changes nothing and the loss does not move. Expected from `ddplab run --check`:
steps-without-gradients."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

dist.init_process_group("gloo")
torch.manual_seed(0)
g = torch.Generator().manual_seed(dist.get_rank())
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)       # the bug: before the wrap
model = FSDP(model, device_id=torch.device("cpu"))
for step in range(10):
    x = torch.randn(16, 16, generator=g)
    loss = F.cross_entropy(model(x), (x.sum(1) > 0).long())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
