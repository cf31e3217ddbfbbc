"""Rank 0 sends a (4, 8) activation, rank 1 receives into a buffer of (8,) (a pipeline stage whose
receive buffer has the wrong shape): gloo sees the sizes differ inside the recv.

    torchrun --nproc-per-node 2 tests/scripts/reasons/recv_shape.py
"""
import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        dist.send(torch.randn(4, 8), dst=1)
    else:
        buf = torch.empty(8)                       # BROKEN: the sender's tensor is (4, 8)
        dist.recv(buf, src=0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
