"""After open-mmlab/mmdetection#2539 "Why not broadcast buffers?"
(https://github.com/open-mmlab/mmdetection/issues/2539): DDP(..., broadcast_buffers=False) "makes BN
buffers different on each GPU"; each rank evaluates (and may save) a different model. Expected from
`ddplab run --check`: buffers-differ, parameters equal."""
import inspect

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                          torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 2))
off = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else "broadcast_buffers"
model = DDP(net, **{off: False})
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
for step in range(25):
    x = torch.randn(4, 3, 12, 12, generator=g)
    y = torch.randint(0, 2, (4,), generator=g)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
dist.destroy_process_group()
