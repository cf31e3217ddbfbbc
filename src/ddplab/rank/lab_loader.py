"""Input-pipeline helpers for lab scripts: a dataset whose samples are 'read' (a sleep standing in for
storage latency) and decoded on the CPU, a timed loop that separates waiting for data from the step,
a small DDP model, and a DataLoader settings sweep. Imported by lab scripts only (it imports torch)."""
from __future__ import annotations

import time
import warnings
import zlib

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from ddplab.rank import lab


class Encoded(Dataset):
    """Samples stored compressed: __getitem__ 'reads' (read_ms, a sleep standing in for storage
    latency) and 'decodes' (zlib, on the CPU, until decode_ms of CPU time are spent)."""

    def __init__(self, n: int, decode_ms: float, read_ms: float = 0.0):
        self.n, self.decode_s, self.read_s = n, decode_ms / 1000, read_ms / 1000
        self.blob = zlib.compress(bytes(range(256)) * 4096)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.read_s:
            time.sleep(self.read_s)                    # storage latency (an imitation: a sleep)
        t0 = time.thread_time()
        raw = zlib.decompress(self.blob)               # the decode: real CPU work in this process,
        while time.thread_time() - t0 < self.decode_s:  # at least once (the CPU clock can tick coarsely)
            raw = zlib.decompress(self.blob)
        x = torch.frombuffer(bytearray(raw[:256 * 4]), dtype=torch.uint8)[:256].float() / 255 + i % 7
        return x, i % 10


def ddp_mlp(ctx):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(ctx.device),
                device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


SWEEP = [  # (num_workers, prefetch_factor, pin_memory)
    (0, None, False), (1, 2, False), (2, 2, False), (2, 4, False), (2, 2, True)]


def loader_sweep(ctx, S: dict, epoch) -> None:
    """num_workers, prefetch_factor and pin_memory measured on the same dataset, every setting once per
    round; ``epoch(ctx, model, optimizer, loader, steps)`` is the lab's own timed loop."""
    model, optimizer = ddp_mlp(ctx)
    batch, steps = S["sweep_batch"], S["sweep_steps"]
    data = Encoded(batch * steps, S["sweep_decode_ms"], S["sweep_read_ms"])
    for round_ in range(S["sweep_rounds"]):           # every setting once per round: the spread shows the noise
        for workers, prefetch, pin in SWEEP:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loader = DataLoader(data, batch_size=batch, num_workers=workers, prefetch_factor=prefetch,
                                    pin_memory=pin, persistent_workers=False)
                m = epoch(ctx, model, optimizer, loader, steps)
                first = next(iter(DataLoader(data, batch_size=2, pin_memory=pin)))[0]
            lab.record("sweep", round=round_, workers=workers, prefetch=prefetch, pin_memory=pin, batch=batch,
                       samples_per_s=batch * steps / m["wall_s"], pinned=bool(first.is_pinned()),
                       warnings=sorted({str(w.message) for w in caught if "pin" in str(w.message)}), **m)
