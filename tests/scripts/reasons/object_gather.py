"""Rank 0 gathers a Python object (all_gather_object, e.g. metrics) while rank 1 went on to a barrier:
the ranks wait in different collectives, and rank 0's is the tensor all_gather inside all_gather_object.

    torchrun --nproc-per-node 2 tests/scripts/reasons/object_gather.py
"""
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, {"loss": 0.5})      # BROKEN: only rank 0 gathers
    dist.barrier()


if __name__ == "__main__":
    main()
