"""Collectives called with arguments that differ (or only seem to) across ranks (issue 41, the arguments channel),
one per --how:

  bcast-root        each rank broadcasts from its own rank (src=rank): gloo hangs, both ranks in broadcast
  bcast-root-equal  src computed from the rank, equal on every rank (rank // world * world): it completes
  group-root-equal  the same root given as group_src=0 on rank 0 and as src=0 on rank 1: it completes
  reduce-op         rank 0 all-reduces with SUM, rank 1 with MAX: gloo completes, rank 1 gets a SUM
  same              every collective with the same arguments on every rank
  gather-shape      all_gather of 4 numbers from rank 0 and 5 from rank 1 (the list holds 4-number tensors)
  group-differs     rank 0 all-reduces in a group of every rank made with new_group, rank 1 in the default group

    torchrun --nproc-per-node 2 tests/scripts/collective_args.py --how bcast-root
"""
import argparse

import torch
import torch.distributed as dist


def main(how):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)))
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)                                   # the same on every rank
    if how == "bcast-root":
        dist.broadcast(t, src=rank)                      # each rank its own root
    elif how == "bcast-root-equal":
        dist.broadcast(t, src=rank // world * world)     # rank-dependent, 0 on every rank
    elif how == "group-root-equal":
        if rank == 0:
            dist.broadcast(t, group_src=0, group=group)
        else:
            dist.broadcast(t, src=0, group=group)
    elif how == "reduce-op":
        dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
    elif how == "same":
        dist.broadcast(t, src=0)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out = [torch.zeros(4) for _ in range(world)]
        dist.all_gather(out, t)
    elif how == "gather-shape":
        mine = torch.ones(4 + rank)
        out = [torch.zeros(4) for _ in range(world)]
        dist.all_gather(out, mine)
    elif how == "group-differs":
        dist.all_reduce(t, group=group if rank == 0 else None)
    print(f"rank {rank}: {t.tolist()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--how", required=True)
    main(p.parse_args().how)
