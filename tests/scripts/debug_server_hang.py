"""torch's debug server writes periodic dumps while rank 1 skips a collective and every rank waits.

    TORCH_FR_BUFFER_SIZE=200 torchrun --nproc-per-node 3 tests/scripts/debug_server_hang.py \
        --port PORT --dump-dir DIR --dump-interval 1

A job that never ran under ddplab: torch's own debug server (torch >= 2.13, with jinja2, tabulate
and requests) writes every rank's stacks into DIR every ``--dump-interval`` seconds (its flight
recorder dump fails for gloo on torch 2.13 and is not written). Every rank but rank 1 all-reduces
a fourth time; rank 1 skips it and goes on to the barrier, so the others wait in all_reduce and
rank 1 in barrier, for ever (until killed). With 3 ranks or more, rank 1 is the one whose stack
differs.
"""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.debug import start_debug_server


def main(port: int, dump_dir: str, interval: float, fetch_timeout: float) -> None:
    dist.init_process_group("gloo")
    start_debug_server(port=port, dump_dir=dump_dir, dump_interval=interval, fetch_timeout=fetch_timeout)
    rank = dist.get_rank()
    t = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(t)
    print(f"rank {rank}: three steps done", flush=True)
    if rank != 1:
        dist.all_reduce(t)          # BROKEN: rank 1 skips this collective
    dist.barrier()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True, help="the debug server's port (rank 0)")
    p.add_argument("--dump-dir", required=True)
    p.add_argument("--dump-interval", type=float, default=1.0)
    p.add_argument("--fetch-timeout", type=float, default=60.0,
                   help="how long the debug server waits for a rank's answer")
    a = p.parse_args()
    main(a.port, a.dump_dir, a.dump_interval, a.fetch_timeout)
