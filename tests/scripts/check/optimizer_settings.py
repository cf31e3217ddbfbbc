"""A DDP job whose optimizers may part across ranks although DDP averages every gradient: a learning-rate
scheduler stepped on one rank, or a resumed optimizer state loaded on one rank.

    torchrun --nproc-per-node 2 tests/scripts/check/optimizer_settings.py --mode scheduler-rank0

--mode same: the scheduler stepped on every rank (right). scheduler-rank0: stepped in rank 0's logging
branch (BROKEN, rwth-i6/returnn#1493). resume-rank0: rank 0 alone loads an earlier run's optimizer state,
whose learning rate its scheduler had decayed (BROKEN, vllm-project/speculators#926). resume-all: every
rank loads it (right). momentum-rank0: rank 0 alone loads a state with the same learning rate but its
momentum buffers (BROKEN: only the state's checksum tells).
"""
import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(mode: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    if mode in ("resume-rank0", "resume-all", "momentum-rank0"):
        path = os.path.join(tempfile.gettempdir(), f"optimizer_settings_{os.environ['MASTER_PORT']}.pt")
        if rank == 0:   # the earlier run's optimizer, after one step
            old = torch.optim.SGD(torch.nn.Linear(8, 1).parameters(), lr=0.1, momentum=0.9)
            torch.optim.lr_scheduler.StepLR(old, step_size=1, gamma=0.5)   # its groups' initial_lr, as ours
            old.zero_grad()
            sum(p.sum() for g in old.param_groups for p in g["params"]).backward()
            old.step()
            state = old.state_dict()
            if mode != "momentum-rank0":
                state["param_groups"][0]["lr"] = 0.01
            torch.save(state, path)
        dist.barrier()
        if rank == 0 or mode == "resume-all":     # BROKEN unless every rank loads it
            opt.load_state_dict(torch.load(path))
        dist.barrier()
        if rank == 0:
            os.remove(path)
    g = torch.Generator().manual_seed(rank)
    for step in range(6):
        x = torch.randn(16, 8, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if step % 2 == 1 and (rank == 0 or mode != "scheduler-rank0"):   # BROKEN for scheduler-rank0
            sched.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="same",
                   choices=["same", "scheduler-rank0", "resume-rank0", "resume-all", "momentum-rank0"])
    main(p.parse_args().mode)
