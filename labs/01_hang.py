"""Lab 01 - anatomy of a hang: ranks that run different numbers of batches.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/01_hang.py --variant broken
    ddplab run 01 --variant broken          # the same, judged by progress, with each rank's stack
    torchrun --nproc-per-node 2 labs/01_hang.py --variant broken --debug-server-port 25999
                                            # then open http://localhost:25999/stacks (torch's own
                                            # debug server: the route from inside the job)

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
        "broken": {"expect": "hung", "signature": "hang-different-collectives",
                   "about": "uneven hand-made shards: rank 0 leaves the loop and waits in a barrier, rank 1 in backward's all-reduce"},
        "rank-conditional": {"expect": "hung", "signature": "hang-different-collectives",
                             "about": "a barrier inside `if rank == 0:` (checkpointing), the other rank goes on to its next all-reduce"},
        "fixed-sampler": {"expect": "ok", "signature": None,
                          "about": "DistributedSampler: the same number of batches on every rank"},
        "fixed-join": {"expect": "ok", "signature": None,
                       "about": "uneven inputs kept; Join shadows the finished rank's all-reduces"},
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


def main(variant: str, steps_log: bool = True, pg_timeout_s: float | None = None,
         debug_server_port: int = 0) -> None:
    ctx = lab.setup(timeout_s=pg_timeout_s)
    if debug_server_port:
        start_debug_server(debug_server_port)
    rank, device = ctx.rank, ctx.device
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = make_data()

    # ---- the broken lines and their fixes ------------------------------------------------------
    if variant in ("broken", "fixed-join"):
        loader = DataLoader(uneven_shard(data, rank), batch_size=BATCH)          # BROKEN: 4 vs 6 batches
    else:
        sampler = DistributedSampler(data, shuffle=True, seed=0)                  # FIX: equal shards
        sampler.set_epoch(0)  # reshuffles each epoch; forgetting it repeats the same order every epoch
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    joined = Join([model]) if variant == "fixed-join" else _nothing()          # FIX: Join for uneven inputs
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
            if steps_log:
                lab.record("step", step=step, loss=round(loss.item(), 5))
            if variant == "rank-conditional" and rank == 0 and step == 1:
                torch.save(model.module.state_dict(), os.devnull)  # "only rank 0 saves"
                dist.barrier()       # BROKEN: a collective only rank 0 calls; move it out of the `if`

    lab.record("loop_done", steps=steps)
    dist.barrier()                   # e.g. "wait for everyone before saving the checkpoint"
    lab.record("done", steps=steps)
    lab.teardown()


def start_debug_server(port: int) -> None:
    """torch's experimental in-job debug server (torch >= 2.13): rank 0 serves every rank's Python
    stacks at http://<host>:<port>/stacks while the job runs. It is the route from inside the job:
    one line in the training script, extra packages, and ports opened on every interface (only on a
    trusted network). ddplab's own diagnosis reads the same stacks from outside, with no code change."""
    try:
        from torch.distributed.debug import start_debug_server as start
    except ImportError as e:  # older torch, or jinja2 / tabulate / requests missing
        raise SystemExit(f"[rank {lab.ctx().rank}] torch's debug server is not available here ({e}): it needs "
                         f"torch>=2.13 and `pip install jinja2 tabulate requests`") from None
    start(port=port)
    lab.record("debug_server", port=port)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="broken",
                   help="which version of the training loop to run")
    p.add_argument("--pg-timeout-s", type=float, default=None,
                   help="init_process_group(timeout=...) in seconds (default: PyTorch's 30 minutes)")
    p.add_argument("--quiet", action="store_true", help="do not record every step")
    p.add_argument("--debug-server-port", type=int, default=0, metavar="PORT",
                   help="start torch's debug server on rank 0 at this port (0: off); it listens on every interface")
    a = p.parse_args()
    if not 0 <= a.debug_server_port <= 65535:
        p.error(f"--debug-server-port {a.debug_server_port}: a port is 1-65535 (0 turns the server off)")
    main(a.variant, steps_log=not a.quiet, pg_timeout_s=a.pg_timeout_s, debug_server_port=a.debug_server_port)
