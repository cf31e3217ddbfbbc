"""The last rank enters a barrier while the others all-reduce: every rank waits for ever.

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT tests/scripts/hang_last_rank.py

With ``--dump-after S`` every collective times out after S seconds instead, and each rank writes
torch's flight-recorder dump to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (gloo records the ledger with
TORCH_FR_BUFFER_SIZE set, but writes no dump by itself; NCCL does, on its watchdog's timeout).
"""
import argparse
import datetime
import os

import torch
import torch.distributed as dist


def main(dump_after: float | None) -> None:
    kw = {"timeout": datetime.timedelta(seconds=dump_after)} if dump_after else {}
    dist.init_process_group("gloo", **kw)
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(t)
    print(f"rank {rank}: three steps done", flush=True)
    try:
        if rank == world - 1:
            dist.barrier()          # BROKEN: only the last rank takes this branch
        else:
            dist.all_reduce(t)
    except Exception:
        if dump_after:
            from torch._C._distributed_c10d import _dump_fr_trace
            with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as f:
                f.write(_dump_fr_trace())
        raise


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--dump-after", type=float, default=None, help="collective timeout in seconds, then dump")
    main(p.parse_args().dump_after)
