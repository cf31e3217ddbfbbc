"""Broken in ways the rank hook's evidence channels must show (issue 41), one per --how:

  guarded       rank 0 alone all-reduces under ``if self.trainer.is_global_zero:`` (a plain class standing in
                for Lightning's trainer), nested in a condition whose string literal says "rank"
  main-process  the same under ``if accelerator.is_main_process:``
  in-flight     rank 1 fails to read its batch and, while handling the error, enters a collective its peer
                never issues
  thread        rank 1 leaves a non-daemon thread running: its main thread ends, the process does not
  os-exit       rank 1 calls os._exit(3): no traceback, no exit handler
  worker        rank 1's DataLoader worker process raises in __getitem__
  folder-race   rank 1 saves into a folder rank 0 makes only after rank 1's error was reported (a flag file)
  folder-missing  rank 1 saves into a folder nobody makes; rank 0 waits at a barrier
  p2p-tags      rank 0 sends with tag 1, rank 1 receives from it with tag 2
  file-poll     rank 0 polls for the file rank 1 writes only after a barrier rank 0 never reaches

    torchrun --nproc-per-node 2 tests/scripts/channels.py --how guarded
"""
import argparse
import os
import sys
import tempfile
import threading

import torch
import torch.distributed as dist


class Trainer:
    """What a Lightning module reads as ``self.trainer``: only the attribute that matters here."""

    def __init__(self, rank):
        self.is_global_zero = rank == 0


class Accelerator:
    def __init__(self, rank):
        self.is_main_process = rank == 0


class Model:
    log_format = "per-step"

    def __init__(self, rank):
        self.trainer = Trainer(rank)

    def on_epoch_end(self, t):
        if "rank" not in self.log_format:      # a string that says "rank": not a condition on the rank
            if self.trainer.is_global_zero:
                dist.all_reduce(t)             # only rank 0 issues it


def read_batch(rank, step):
    if rank == 1 and step == 2:
        raise ValueError(f"batch {step} is corrupt on this rank")
    return torch.ones(4)


def forever():
    threading.Event().wait()                   # nobody sets it


class Items(torch.utils.data.Dataset):
    def __init__(self, rank):
        self.rank = rank

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if self.rank == 1 and i == 3:
            raise KeyError(f"no label for item {i}")
        return torch.ones(2) * i


def main(how):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # a second group for end-of-epoch syncs: a rank waiting there and one waiting in the default group
    # wait for good (gloo matches calls within a group only), so the hangs below are the same every time
    side = dist.new_group(backend="gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if how == "guarded":
        Model(rank).on_epoch_end(t)
        dist.all_reduce(t)                     # rank 0's is its second here: rank 1's first matched its first
        dist.barrier(group=side)
    elif how == "main-process":
        accelerator = Accelerator(rank)
        if accelerator.is_main_process:
            dist.all_reduce(t)
        dist.all_reduce(t)
        dist.barrier(group=side)
    elif how == "in-flight":
        for step in range(4):
            try:
                batch = read_batch(rank, step)
            except ValueError:
                dist.barrier(group=side)       # "stop together": the peer is in the step's all_reduce below
                raise
            dist.all_reduce(batch)
    elif how == "thread":
        if rank == 1:
            threading.Thread(target=forever, name="metrics-uploader").start()
        dist.barrier()
    elif how == "os-exit":
        dist.barrier()
        if rank == 1:
            os._exit(3)
        dist.all_reduce(t)
    elif how in ("folder-race", "folder-missing"):
        folder = os.path.join(tempfile.gettempdir(), f"ddplab_channels_{os.environ['MASTER_PORT']}")
        if rank == 1:
            # the flag is written once the error has been reported (after the excepthook in place before this
            # one: the launcher's, where there is one), so rank 0 makes the folder only after the report
            reported = sys.excepthook

            def flag_after(*exc):
                reported(*exc)
                open(folder + ".failed", "w").close()
                while how == "folder-race" and not os.path.isdir(folder):   # exits once rank 0 has made it
                    threading.Event().wait(0.05)
            sys.excepthook = flag_after
            torch.save(t, os.path.join(folder, "rank1.pt"))
        elif how == "folder-race":
            while not os.path.exists(folder + ".failed"):
                threading.Event().wait(0.05)
            os.makedirs(folder, exist_ok=True)  # rank 0 makes it, after rank 1 needed it
        dist.barrier()
    elif how == "p2p-tags":
        if rank == 0:
            dist.send(t, dst=1, tag=1)
        else:
            dist.recv(t, src=0, tag=2)
    elif how == "file-poll":
        done = os.path.join(tempfile.gettempdir(), f"ddplab_channels_{os.environ['MASTER_PORT']}.done")
        if rank == 0:
            while not os.path.exists(done):
                threading.Event().wait(0.1)
        dist.barrier()
        if rank == 1:
            open(done, "w").close()
    elif how == "worker":
        loader = torch.utils.data.DataLoader(Items(rank), batch_size=2, num_workers=1)
        for batch in loader:
            dist.all_reduce(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--how", required=True)
    main(p.parse_args().how)
