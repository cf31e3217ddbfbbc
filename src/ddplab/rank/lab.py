"""What a lab script (or your own) imports inside each rank: set-up from torchrun's environment,
``[rank N]`` logging, one JSON record per event, peak memory and a step timer.

Imports torch, so only ranks import it; the launcher and the CLI do not.
"""
from __future__ import annotations

import datetime
import json
import os
import resource
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ddplab import runfiles
from ddplab.origins import turns

# make workbook: a run whose verdicts compare times waits here (torch imported, nothing timed yet)
# until the launcher has the machine alone for it (ddplab.origins.turns); elsewhere this returns at once
turns.wait_for_go()


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_CTX: Dist | None = None


def setup(backend: str | None = None, timeout_s: float | None = None, device: str | None = None) -> Dist:
    """Join the process group from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT), like nanoGPT's train.py.

    NCCL and ``cuda:LOCAL_RANK`` when this node has a GPU for every one of its ranks (or
    DDPLAB_DEVICE=cuda), else gloo on the CPU for all of them: every rank must pick the same backend
    (with one GPU and two ranks, rank 0 on NCCL and rank 1 on gloo waited for each other for ever).
    ``timeout_s`` sets the process group's collective timeout (PyTorch's default is 30 minutes:
    ``torch.distributed.constants.default_pg_timeout``).
    """
    global _CTX
    if "RANK" not in os.environ:
        sys.exit("this script is meant to be started by torchrun (or `ddplab run`), which sets RANK and "
                 "WORLD_SIZE: torchrun --nproc-per-node 2 " + " ".join(sys.argv))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    want = device or os.environ.get("DDPLAB_DEVICE", "auto")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available()
                                  and torch.cuda.device_count() >= local_world)
    if use_cuda:
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    backend = backend or ("nccl" if use_cuda else "gloo")
    kwargs = {}
    if timeout_s is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, rank=rank, world_size=world, **kwargs)
    _CTX = Dist(rank, world, local, dev, backend)
    return _CTX


def ctx() -> Dist | None:
    return _CTX


def _rank() -> int:
    return _CTX.rank if _CTX else int(os.environ.get("RANK", 0))


def log(*parts: object) -> None:
    """Print one line prefixed with ``[rank N]``."""
    print(f"[rank {_rank()}]", *parts, flush=True)


def record(event: str, **fields: object) -> dict:
    """One JSON object per event: appended to this rank's records file in the ddplab run directory
    (read back into RunResult.ranks[n].records) and printed as a ``[rank N]`` line."""
    rec = {"event": event, "rank": _rank(), "t": round(time.time(), 3), **fields}
    line = json.dumps(rec, default=_jsonable)
    run_dir = os.environ.get("DDPLAB_RUN_DIR")
    if run_dir:
        folder = os.path.join(run_dir, runfiles.RANKS)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, runfiles.rank_name(rec["rank"], runfiles.RECORDS)), "a") as f:
            f.write(line + "\n")
    print(f"[rank {rec['rank']}] {line}", flush=True)
    return rec


def _jsonable(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (torch.device, torch.dtype)):
        return str(x)
    return str(x)


def peak_memory_mb(device: torch.device | None = None) -> float:
    """Peak memory of this rank in MiB: the CUDA allocator's peak on a GPU, peak RSS on the CPU."""
    device = device or (_CTX.device if _CTX else torch.device("cpu"))
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


class StepTimer:
    """Wall time of a block, synchronising the GPU when there is one so the time is real."""

    def __init__(self, device: torch.device | None = None):
        self.device = device or (_CTX.device if _CTX else torch.device("cpu"))
        self.seconds = 0.0

    def __enter__(self) -> "StepTimer":
        self._sync()
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self._t

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
