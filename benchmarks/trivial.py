"""The trivial job the launch-overhead benchmark times: join, one barrier, leave.

    torchrun --nproc-per-node 2 benchmarks/trivial.py
"""
import torch.distributed as dist

if __name__ == "__main__":
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
