"""FSDP (FullyShardedDataParallel, FSDP1) on CPU with gloo, built on each rank before it is wrapped,
trained for 2 epochs from a DataLoader with a DistributedSampler.

    torchrun --nproc-per-node 2 tests/scripts/check/fsdp_init.py --mode seed-per-rank

--mode same-seed: every rank builds the model from seed 0 (right). seed-per-rank: each from its own
rank (BROKEN: FSDP shards weights of different initialisations). loaded: per rank, then the same
checkpoint loaded into the wrapped model before training (what the ranks train from is equal).
no-set-epoch: same seed, but the sampler is never told the epoch (BROKEN: the same order each epoch).
"""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def main(mode: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build(rank if mode in ("seed-per-rank", "loaded") else 0)   # BROKEN for seed-per-rank
    model = FSDP(model, device_id=torch.device("cpu"))
    if mode == "loaded":   # FIX: the same weights on every rank, loaded before training
        cfg = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
            model.load_state_dict(build(0).state_dict())
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    sampler = DistributedSampler(TensorDataset(x), shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(x), batch_size=8, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        if mode != "no-set-epoch":
            sampler.set_epoch(epoch)
        for (xb,) in loader:
            opt.zero_grad()
            model(xb).pow(2).mean().backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["same-seed", "seed-per-rank", "loaded", "no-set-epoch"], required=True)
    main(p.parse_args().mode)
