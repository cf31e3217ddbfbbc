"""A device-agnostic training script (the torch.accelerator style of pytorch/examples) on a CPU laptop:
torch.accelerator.current_accelerator() is None there, and the script reads its .type.

    torchrun --nproc-per-node 2 tests/scripts/reasons/tutorial_accelerator_none.py
"""
import os

import torch
import torch.distributed as dist


def setup():
    local_rank = int(os.environ["LOCAL_RANK"])
    device_type = torch.accelerator.current_accelerator().type     # BROKEN: None on a machine with no accelerator
    device = torch.device(device_type, local_rank)
    dist.init_process_group(backend=dist.get_default_backend_for_device(device))
    return device


if __name__ == "__main__":
    device = setup()
    dist.all_reduce(torch.ones(1, device=device))
    dist.destroy_process_group()
