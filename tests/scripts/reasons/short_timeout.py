"""A process-group timeout shorter than one rank's own work: rank 0 writes a "checkpoint" (a sleep) for
longer than the 3 s timeout while the others already wait in the barrier after it, so they time out
although nothing is stuck (modelled on mosaicml/llm-foundry#733).

    torchrun --nproc-per-node 2 tests/scripts/reasons/short_timeout.py [--peer blocked]

--peer blocked: rank 0 waits in a receive from rank 1 instead of working (a real deadlock with a short
timeout: the short timeout is then not the cause, and must not be named).
"""
import argparse
import datetime
import time

import torch
import torch.distributed as dist


def main(peer: str) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    if dist.get_rank() == 0:
        if peer == "blocked":
            dist.recv(torch.empty(2), src=1)
        else:
            time.sleep(8)  # the checkpoint write
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--peer", default="working", choices=["working", "blocked"])
    main(p.parse_args().peer)
