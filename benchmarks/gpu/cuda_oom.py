"""A CUDA out-of-memory error: a tensor larger than the GPU, after NCCL has started.
torchrun --nproc-per-node 1 benchmarks/gpu/cuda_oom.py"""
import os

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
dist.init_process_group("nccl")
free, total = torch.cuda.mem_get_info()
activations = torch.empty(int(total * 2), dtype=torch.uint8, device="cuda")   # twice the card
dist.all_reduce(activations[:8].float())
dist.destroy_process_group()
