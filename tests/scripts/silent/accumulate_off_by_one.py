"""After modelscope/FunASR#3472 "fix(train): align DDP no_sync with gradient accumulation"
(https://github.com/modelscope/FunASR/pull/3472): the trainer entered no_sync() when
`batch_idx % accum_grad != 0`, so the first micro-batch synchronised and the micro-batch before each
optimizer step did not: the step used rank-local gradients. Expected from `ddplab run --check`:
step-in-no-sync (and replicas that drift apart)."""
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
accum_grad = 4
g = torch.Generator().manual_seed(100 + rank)          # each rank its own data
for batch_idx in range(32):
    x = torch.randn(8, 8, generator=g)
    sync = contextlib.nullcontext() if batch_idx % accum_grad == 0 else model.no_sync()   # the bug
    with sync:
        (model(x).pow(2).mean() / accum_grad).backward()
    if (batch_idx + 1) % accum_grad == 0:
        opt.step()
        opt.zero_grad()
dist.destroy_process_group()
