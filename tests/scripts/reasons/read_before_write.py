"""Rank 0 prepares a file that every rank then reads, with no barrier between the write and the reads:
the other ranks look for it before it exists (modelled on pytorch/tutorials#3066).

    torchrun --nproc-per-node 2 tests/scripts/reasons/read_before_write.py [--variant fixed|nobody-writes]

fixed: a barrier after the write (every rank calls it). nobody-writes: rank 0 only waits, the file is
written by no rank (a plain missing file: the read-before-write reading must not be given).
"""
import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist


def main(variant: str) -> None:
    dist.init_process_group("gloo")
    data_file = os.path.join(tempfile.gettempdir(), f"ddplab_rbw_{os.environ['MASTER_PORT']}.pt")
    if dist.get_rank() == 0:
        if variant == "nobody-writes":
            time.sleep(6)
        else:
            time.sleep(3); torch.save(torch.ones(4), data_file)  # noqa: E702  (the "download")
    if variant == "fixed":
        dist.barrier()
    rows = torch.load(data_file)
    print(f"[rank{dist.get_rank()}] read {rows.numel()} values", flush=True)
    dist.barrier()
    if dist.get_rank() == 0:
        os.remove(data_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--variant", default="broken", choices=["broken", "fixed", "nobody-writes"])
    main(p.parse_args().variant)
