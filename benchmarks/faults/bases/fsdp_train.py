"""Base program: FullyShardedDataParallel (torch.distributed.fsdp, FSDP1 API) training a small MLP on
CPU/gloo, in the shape of pytorch/examples distributed/FSDP (DistributedSampler, FSDP wrap with a
CPU device, a full state dict gathered for rank 0's checkpoint). Works on torch 2.13 CPU.
The `# @site:` comments mark where mutation operators apply (removed from the mutants)."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo")  # @site:init
    rank = dist.get_rank()
    torch.manual_seed(0)  # @site:seed
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    sampler = DistributedSampler(data, shuffle=True, seed=0)  # @site:sampler
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
    model = FSDP(model, device_id=torch.device("cpu"))  # @site:wrap
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # @site:optimizer
    for epoch in range(2):
        sampler.set_epoch(epoch)  # @site:set_epoch
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)  # @site:forward
            loss.backward()
            optimizer.step()
        print(f"[rank{rank}] epoch {epoch} loss {loss.item():.4f}", flush=True)
    cfg = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):  # @site:sd_ctx
        state = model.state_dict()  # @site:state_dict
    if rank == 0:
        print(f"[rank0] checkpoint with {len(state)} tensors", flush=True)
    dist.barrier()  # @site:end_barrier
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
