"""Lab 01 - anatomy of a hang: ranks that run different numbers of batches.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/01_hang.py --variant broken
    ddplab run 01 --variant broken          # the same, judged by progress, with each rank's stack
    torchrun --nproc-per-node 2 labs/01_hang.py --variant broken --debug-server-port 25999
                                            # then open http://localhost:25999/stacks (torch's
                                            # own debug server: the route from inside the job)

Article 000 ("Why do DataParallel and DDP hang indefinitely?") blames hangs mostly on networks and
data transfer. The most common hang in real code is simpler: DDP runs one all-reduce per backward,
so every rank must run the same number of backward passes. If one rank's data runs out first,
it leaves the loop and waits somewhere else (here a barrier before saving a checkpoint) while the
other waits in backward's all-reduce. Neither collective can finish: the job hangs, for the
process group's timeout (30 minutes by default), with no error.

Variants:
  broken            rank 0 gets 16 rows, rank 1 gets 24 (hand-made shards): 4 vs 6 batches.
  rank-conditional  equal shards, but `dist.barrier()` sits inside `if rank == 0:`.
  fixed-sampler     DistributedSampler splits the data evenly: every rank runs the same steps.
  fixed-join        the uneven shards kept, wrapped in torch.distributed.algorithms.Join.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from ddplab.rank import lab

LAB = {
    "title": "Anatomy of a hang: ranks with different numbers of batches",
    "article": "000_5eac2459042e419e.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "broken": {
            "expect": "hung", "signature": "hang-different-collectives",
            "about": "uneven hand-made shards: rank 0 leaves the loop and waits in a barrier, "
                     "rank 1 in backward's all-reduce"},
        "rank-conditional": {
            "expect": "hung", "signature": "hang-different-collectives",
            "about": "a barrier inside `if rank == 0:` (checkpointing), the other rank goes on "
                     "to its next all-reduce"},
        "fixed-sampler": {
            "expect": "ok", "signature": None,
            "about": "DistributedSampler: the same number of batches on every rank"},
        "fixed-join": {
            "expect": "ok", "signature": None,
            "about": "uneven inputs kept; Join shadows the finished rank's all-reduces"},
    },
    "knobs": {
        "pg_timeout_s": {
            "type": "float", "default": None, "range": [0.1, None],
            "help": "init_process_group(timeout=...) in seconds (None: PyTorch's 30 minutes)"},
        "quiet": {"type": "bool", "default": False, "help": "do not record every step"},
        "debug_server_port": {
            "type": "int", "default": 0, "range": [0, 65535],
            "help": "start torch's debug server on rank 0 at this port (0: off); "
                    "it listens on every interface"},
    },
}

ROWS_PER_RANK_BROKEN = (16, 24)   # rank 0, rank 1 (further ranks: 24)
BATCH = 4


def make_data(n: int = 40, features: int = 8) -> TensorDataset:
    g = torch.Generator().manual_seed(0)  # the same data on every rank
    x = torch.randn(n, features, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def uneven_shard(data: TensorDataset, rank: int) -> Subset:
    """A hand-made split by 'files' of different sizes, as real pipelines often do."""
    sizes = [ROWS_PER_RANK_BROKEN[min(r, 1)] for r in range(rank + 1)]
    start = sum(sizes[:-1]) % len(data)
    return Subset(data, [(start + i) % len(data) for i in range(sizes[-1])])


def main(variant: str, *, pg_timeout_s: float | None, quiet: bool, debug_server_port: int) -> None:
    ctx = lab.setup(timeout_s=pg_timeout_s)
    if debug_server_port:
        start_debug_server(debug_server_port)
    rank, device = ctx.rank, ctx.device
    torch.manual_seed(0)
    ids = [device.index] if device.type == "cuda" else None
    model = DDP(nn.Linear(8, 1).to(device), device_ids=ids)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = make_data()

    # ---- the broken lines and their fixes ------------------------------------------------------
    if variant in ("broken", "fixed-join"):
        loader = DataLoader(uneven_shard(data, rank), batch_size=BATCH)  # BROKEN: 4 vs 6 batches
    else:
        sampler = DistributedSampler(data, shuffle=True, seed=0)  # FIX: equal shards
        sampler.set_epoch(0)  # reshuffles each epoch; forget it and every epoch repeats one order
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    joined = Join([model]) if variant == "fixed-join" else _nothing()  # FIX: Join, uneven inputs
    # ---------------------------------------------------------------------------------------------

    lab.record("start", variant=variant, batches=len(loader), world_size=ctx.world_size,
               backend=ctx.backend, pg_timeout_s=pg_timeout_s)
    steps = 0
    with joined:
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()          # DDP all-reduces the gradients here: every rank must arrive
            opt.step()
            steps += 1
            if not quiet:
                lab.record("step", step=step, loss=round(loss.item(), 5))
            if variant == "rank-conditional" and rank == 0 and step == 1:
                torch.save(model.module.state_dict(), os.devnull)  # "only rank 0 saves"
                dist.barrier()  # BROKEN: a collective only rank 0 calls; move it out of the `if`

    lab.record("loop_done", steps=steps)
    dist.barrier()                   # e.g. "wait for everyone before saving the checkpoint"
    lab.record("done", steps=steps)
    lab.teardown()


def start_debug_server(port: int) -> None:
    """torch's experimental in-job debug server (torch >= 2.13): rank 0 serves every rank's Python
    stacks at http://<host>:<port>/stacks while the job runs. It is the route from inside the job:
    one line in the training script, extra packages, and ports opened on every interface (only on a
    trusted network). ddplab's own diagnosis reads the same stacks from outside, with no code
    change."""
    try:
        from torch.distributed.debug import start_debug_server as start
    except ImportError as e:  # older torch, or jinja2 / tabulate / requests missing
        raise SystemExit(f"[rank {lab.ctx().rank}] torch's debug server is not available here "
                         f"({e}): it needs torch>=2.13 and `pip install jinja2 tabulate requests`"
                         ) from None
    start(port=port)
    lab.record("debug_server", port=port)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    from ddplab.rank import lab_args

    variant, knobs = lab_args.parse(LAB, __doc__)
    main(variant, **knobs)
