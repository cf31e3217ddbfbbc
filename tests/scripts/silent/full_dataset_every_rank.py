"""After "Does DDP send full dataset to each GPU?" (https://discuss.pytorch.org/t/does-ddp-send-full-dataset-to-each-gpu/186862):
"You would usually use a DistributedSampler which splits the indices based on the number of ranks to
avoid using the same data." Here the training DataLoader has shuffle=True and no DistributedSampler,
the same seed on every rank: each rank trains on the whole dataset, in the same order. Validation runs
on every rank under no_grad (not a training loader, so not counted). Expected from
`ddplab run --check`: samples-overlap (every sample on both ranks)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, random_split

dist.init_process_group(backend="gloo")
torch.manual_seed(0)
full = TensorDataset(torch.randn(100, 4), torch.randint(0, 3, (100,)))
train, val = random_split(full, [70, 30], generator=torch.Generator().manual_seed(0))
train_loader = DataLoader(train, batch_size=10, shuffle=True)
val_loader = DataLoader(val, batch_size=10)
model = DDP(torch.nn.Linear(4, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in train_loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        val_loss = sum(torch.nn.functional.cross_entropy(model(x), y).item() for x, y in val_loader)
dist.destroy_process_group()
