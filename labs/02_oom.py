"""Lab 02 - out of memory on one rank, and the OOM that turns into a hang.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/02_oom.py --variant oom --mem-limit-mb 48
    sudo torchrun --nproc-per-node 2 labs/02_oom.py --variant oom-killer   # needs a writable memory cgroup
    ddplab run 02 --variant skip-batch          # the same, judged by progress, with each rank's stack

Each rank pads its batch of 16 sequences to the longest one in it, and a per-token MLP runs on the
padded tensor, so activation memory grows with batch x longest length. At step 2 the last rank draws
one long document (384 tokens instead of 8-32): its padded batch is ~12x bigger and does not fit under
the memory cap (--mem-limit-mb: model + optimizer + activations, on top of what torch itself uses).
On CPU the cap is a real rlimit on the rank (Memory.cap), on a GPU the CUDA allocator's limit: both make
the allocation FAIL with a Python exception. The kernel's OOM killer does something else: it SIGKILLs the
process, which leaves no Python message at all. `oom-killer` runs that for real: the last rank moves
itself into a child memory cgroup (v2 memory.max + memory.swap.max=0, or v1 memory.limit_in_bytes) and
the kernel kills it at the long step. That needs a cgroup the user may write to (root, usually).
Notebook: notebooks/02_oom.ipynb; workbook module: ddplab.course.lab02.

Variants:
  oom                     the allocation fails on the last rank; torchrun ends the others. Fails fast.
  oom-killer              no rlimit: the last rank runs under a cgroup memory limit; the kernel SIGKILLs it.
  skip-batch              the usual `except OOM: continue` on the failing rank only -> the others wait
                          in DDP's all-reduce for a batch that never comes: a hang.
  fixed-accumulate        the largest micro-batch that fits (measured), gradient accumulation under
                          no_sync(): the same effective batch, checked against the full-batch gradient.
  fixed-coordinated-skip  every rank learns whether any rank failed (all-reduce of a flag), all skip.
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab
from ddplab.rank.lab_memory import Memory, check_gradient, enter_memory_cgroup, is_oom, largest_fitting

LAB = {
    "title": "Out of memory, and the OOM that turns into a hang",
    "article": "000_5eac2459042e419e.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "oom": {"expect": "failed", "signature": "cpu-oom",
                "about": "the last rank's padded batch does not fit; the allocation fails and torchrun ends the others"},
        "oom-killer": {"expect": "failed", "signature": "rank-killed",
                       "about": "a cgroup memory limit on the last rank: the kernel's OOM killer SIGKILLs it, no Python error (needs a writable memory cgroup)"},
        "skip-batch": {"expect": "hung", "signature": "hang-different-collectives",
                       "about": "catch the OOM and skip the batch on that rank only: the others wait in DDP's all-reduce"},
        "fixed-accumulate": {"expect": "ok", "signature": None,
                             "about": "largest micro-batch that fits (measured) + gradient accumulation under no_sync()"},
        "fixed-coordinated-skip": {"expect": "ok", "signature": None,
                                   "about": "all-reduce an 'I failed' flag first, so every rank skips the same batch"},
    },
    # read by ddplab.course.lab02 to reject a cap too small for the model before any rank starts
    "model": {"features": 32, "hidden": 512, "batch": 16, "long_len": 384, "steps": 4, "long_step": 2},
}
M = LAB["model"]


class TokenMLP(nn.Module):
    def __init__(self, features: int = M["features"], hidden: int = M["hidden"]):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x, mask):                    # x (B, T, F), mask (B, T): 1 for real tokens
        per_token = self.net(x).squeeze(-1)        # activations ~ B x T x hidden: this is what runs out
        return (per_token * mask).sum(1) / mask.sum(1)   # masked mean: padding never changes the answer


def batch_for(rank: int, world: int, step: int, size: int = M["batch"]):
    """A padded batch of `size` sequences; the last rank draws one long document at the long step."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    lens = torch.randint(8, 33, (size,), generator=g)
    if rank == world - 1 and step == M["long_step"]:
        lens[0] = M["long_len"]
    x = torch.randn(size, int(lens.max()), M["features"], generator=g)
    mask = (torch.arange(x.shape[1])[None, :] < lens[:, None]).float()
    y = (x[..., 0] * mask).sum(1) / lens
    return x, mask, y


def seq_loss(model, x, mask, y, total: int):
    """Sum of squared errors / full batch size: micro-batch losses add up to the full-batch mean."""
    return ((model(x, mask) - y) ** 2).sum() / total


def find_micro_batch(mem: Memory, limit_mb: float, model_mb: float, device, batch: int) -> int:
    """FIX (1/2): measure the largest micro-batch that fits the worst-case length, like accelerate's
    find_executable_batch_size. Local only (no collectives inside), so catching OOM here is safe."""
    rank, world = dist.get_rank(), dist.get_world_size()
    longest = torch.tensor([max(batch_for(rank, world, s, batch)[0].shape[1] for s in range(M["steps"]))], device=device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)                  # every rank probes the same shape
    probe, T = TokenMLP().to(device), int(longest)

    def step_of(m: int) -> None:                                    # one forward and backward of m sequences
        seq_loss(probe, torch.randn(m, T, M["features"], device=device), torch.ones(m, T, device=device),
                 torch.zeros(m, device=device), m).backward()
    return largest_fitting(mem, limit_mb, model_mb, batch, step_of, probe, length=T)


def main(variant: str, mem_limit_mb: float, batch: int = M["batch"], accum: int = 0,
         pg_timeout_s: float | None = None) -> None:
    ctx = lab.setup(timeout_s=pg_timeout_s, device="cpu" if variant == "oom-killer" else None)  # host memory
    rank, world, device = ctx.rank, ctx.world_size, ctx.device
    torch.manual_seed(0)
    model = DDP(TokenMLP().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) * 3 / 2**20  # params+grads+momentum
    x, mask, y = batch_for(rank, world, 0, 2)   # warm-up step: DDP's lazy buffers exist before the cap
    seq_loss(model, x, mask, y, 2).backward()
    opt.zero_grad(set_to_none=False)
    mem = Memory(device)
    if variant == "oom-killer":
        if rank == world - 1 and mem_limit_mb > 0:
            enter_memory_cgroup(mem_limit_mb - model_mb)   # the kernel, not malloc, enforces this one
    elif mem_limit_mb > 0:
        mem.cap(mem_limit_mb, model_mb)
    micro = batch
    if variant == "fixed-accumulate":
        micro = max(1, batch // accum) if accum else find_micro_batch(mem, mem_limit_mb, model_mb, device, batch)
    lab.record("start", variant=variant, device=str(device), backend=ctx.backend, mem_limit_mb=mem_limit_mb,
               model_mb=round(model_mb, 2), batch=batch, micro=micro, cap="cgroup memory limit" if variant == "oom-killer" else "cuda fraction" if mem.cuda else "RLIMIT_DATA")

    for step in range(M["steps"]):
        x, mask, y = (t.to(device) for t in batch_for(rank, world, step, batch))
        mem.reset_peak()
        failed = torch.zeros(1, device=device)
        # ---- the broken lines and their fixes -----------------------------------------------------
        if variant in ("oom", "oom-killer"):
            seq_loss(model, x, mask, y, len(y)).backward()           # BROKEN: raises (oom) or is SIGKILLed (oom-killer)
        elif variant == "skip-batch":
            try:
                seq_loss(model, x, mask, y, len(y)).backward()
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                lab.record("skipped", step=step, why=str(e).split("\n")[0][-90:])
                opt.zero_grad()
                continue                                            # BROKEN: only this rank skips; the
                # others are already in backward's all-reduce, which now waits for this rank forever
        elif variant == "fixed-accumulate":
            for i in range(0, len(y), micro):                       # FIX (2/2): micro-batches, same effective batch
                sl = slice(i, i + micro)
                last = i + micro >= len(y)
                with (model.no_sync() if not last else contextlib.nullcontext()):  # all-reduce once, on the last micro-batch
                    seq_loss(model, x[sl], mask[sl], y[sl], len(y)).backward()
        else:  # fixed-coordinated-skip
            try:
                out = model(x, mask)                                # forward is where this model runs out
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                failed += 1
                out = None
            dist.all_reduce(failed)                                 # FIX: everyone learns if anyone failed ...
            if failed.item() > 0:
                lab.record("skipped", step=step, ranks_failed=int(failed.item()))
                opt.zero_grad()
                continue                                            # ... and every rank skips together
            (((out - y) ** 2).mean()).backward()
        # --------------------------------------------------------------------------------------------
        peak = mem.peak_above_base()
        if variant == "fixed-accumulate" and step == M["long_step"]:
            ref = TokenMLP().to(x.device)                           # a plain copy: the full batch's gradient
            ref.load_state_dict(model.module.state_dict())
            check_gradient(model, ref, lambda: seq_loss(ref, x, mask, y, len(y)).backward(), mem, mem_limit_mb, model_mb)
        opt.step()
        opt.zero_grad()
        lab.record("step", step=step, tokens=int(x.shape[0] * x.shape[1]), peak_mb=peak)

    lab.record("loop_done")
    dist.barrier()                   # e.g. "wait for everyone before saving the checkpoint"
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="oom",
                   help="which version of the training loop to run")
    p.add_argument("--mem-limit-mb", type=float, default=48,
                   help="per-rank budget for model + optimizer + activations in MiB (0: no cap)")
    p.add_argument("--batch", type=int, default=M["batch"], help="sequences per rank per step")
    p.add_argument("--accum", type=int, default=0, choices=[0, 1, 2, 4, 8, 16],
                   help="fixed-accumulate: micro-batches per step (0: find the largest micro-batch that fits)")
    p.add_argument("--pg-timeout-s", type=float, default=None,
                   help="init_process_group(timeout=...) in seconds (default: PyTorch's 30 minutes)")
    a = p.parse_args()
    model_mb = sum(q.numel() * 4 for q in TokenMLP().parameters()) * 3 / 2**20
    if a.batch < 1:
        p.error(f"--batch must be at least 1 (got {a.batch})")
    if 0 < a.mem_limit_mb <= model_mb or a.mem_limit_mb < 0:
        p.error(f"--mem-limit-mb {a.mem_limit_mb:g} cannot hold the model itself ({model_mb:.1f} MiB); use 0 (no cap) or more")
    main(a.variant, a.mem_limit_mb, a.batch, a.accum, a.pg_timeout_s)
