"""The same collective with different sizes on the two ranks (a ragged last batch).

--sizes 1,3: gloo finishes rank 0's all_reduce of 1 element (silently wrong) and rank 0 goes on to
the barrier; rank 1 waits in its all_reduce of 3 for ever.  --sizes 7,5: gloo aborts rank 1
(SIGABRT, "Received data size doesn't match expected size") and rank 0 loses its peer.

    torchrun --nproc-per-node 2 tests/scripts/size_mismatch.py --sizes 1,3
"""
import argparse

import torch
import torch.distributed as dist


def main(sizes: list[int]) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    last_batch = torch.ones(sizes[rank])
    dist.all_reduce(last_batch)
    dist.barrier()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1,3")
    main([int(x) for x in p.parse_args().sizes.split(",")])
