"""Two ranks exchange a tensor with blocking point-to-point calls, both sending first: each send waits
for a receive the peer never posts (an ordering deadlock; modelled on forum reports of pipeline code).

    torchrun --nproc-per-node 2 tests/scripts/reasons/p2p_both_send.py [--order recv-first]
"""
import argparse

import torch
import torch.distributed as dist


def exchange(t: torch.Tensor, peer: int, order: str) -> torch.Tensor:
    out = torch.empty_like(t)
    if order == "send-first":
        dist.send(t, dst=peer)             # BROKEN: both ranks send first
        dist.recv(out, src=peer)
    elif order == "recv-first":
        dist.recv(out, src=peer)           # BROKEN: both ranks receive first
        dist.send(t, dst=peer)
    else:                                  # FIX: one side sends first, the other receives first
        if dist.get_rank() == 0:
            dist.send(t, dst=peer)
            dist.recv(out, src=peer)
        else:
            dist.recv(out, src=peer)
            dist.send(t, dst=peer)
    return out


def main(order: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(torch.ones(1))
    got = exchange(torch.full((1 << 20,), float(rank)), (rank + 1) % world, order)
    print(f"rank {rank} got {got[0].item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--order", choices=["send-first", "recv-first", "fixed"], default="send-first")
    main(p.parse_args().order)
