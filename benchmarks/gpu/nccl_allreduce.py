"""NCCL on this node's GPUs: one all_reduce, each rank on cuda:(LOCAL_RANK % device_count).
torchrun --nproc-per-node 1 benchmarks/gpu/nccl_allreduce.py   (2 ranks on one GPU: NCCL refuses)"""
import os

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local % torch.cuda.device_count())
dist.init_process_group("nccl")
x = torch.ones(1024, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
print(f"rank {dist.get_rank()}: sum {x[0].item():.0f} on {torch.cuda.get_device_name()}", flush=True)
dist.destroy_process_group()
