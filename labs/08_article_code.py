"""Lab 08 - run the articles' own code: what their samples really do, measured.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/08_article_code.py --variant accumulate-article
    ddplab run 08 --variant no-master-env       # the same, judged by progress, with the diagnosis

The samples are copied from the seed articles with only what is needed to run them (a model, data);
each broken line is marked `# BROKEN:` next to its `# FIX:`.

Variants:
  accumulate-article    article 001, Example 3: optimizer.zero_grad() at every micro-batch, so nothing
                        accumulates. The gradient at optimizer.step() is measured against the last
                        micro-batch's and the full batch's, for k = 1, 2, 4, 8 micro-batches. Runs: silently wrong.
  accumulate-fixed      zero_grad() only after the step, loss / k, model.no_sync() on all but the last
                        micro-batch: equals the full-batch gradient, with k - 1 fewer all-reduces per step.
  sampler-no-set-epoch  article 001, Example 2: DistributedSampler(shuffle=True), never set_epoch():
                        every epoch visits the data in the same order.
  sampler-set-epoch     sampler.set_epoch(epoch) before each epoch: a new order each epoch.
  no-master-env         article 000, Example 2: init_process_group("gloo", rank, world_size) with no
                        MASTER_ADDR / MASTER_PORT (torchrun sets them, so the script removes them).

apex.amp (article 001) is deprecated and not installed; torch.autocast(dtype=torch.bfloat16) replaces it.
bfloat16 has float32's exponent range, so no loss scaling (apex's amp.scale_loss, torch's GradScaler) is needed.
"""
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddplab.rank import lab

LAB = {
    "title": "Run the articles' own code: silent accumulation, frozen shuffles, missing env",
    "article": "001_159326f62e29f2b3.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "accumulate-article": {"expect": "ok", "signature": None,
                               "about": "article 001's accumulation: zero_grad() every micro-batch, the step uses only the last micro-batch's gradient"},
        "accumulate-fixed": {"expect": "ok", "signature": None,
                             "about": "zero_grad() after the step, loss / k, no_sync() on all but the last micro-batch: the full-batch gradient"},
        "sampler-no-set-epoch": {"expect": "ok", "signature": None,
                                 "about": "DistributedSampler(shuffle=True) without set_epoch(): the same order every epoch"},
        "sampler-set-epoch": {"expect": "ok", "signature": None,
                              "about": "sampler.set_epoch(epoch) each epoch: a new order every epoch"},
        "no-master-env": {"expect": "failed", "signature": "missing-master-env",
                          "about": "article 000's init_process_group without MASTER_ADDR/MASTER_PORT: PyTorch's real error"},
    },
    "sizes": {"features": 8, "micro": 4, "ks": [1, 2, 4, 8], "dataset": 16, "batch": 2, "epochs": 4},
}
S = LAB["sizes"]


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(S["features"], 16), nn.Tanh(), nn.Linear(16, 1))


def micro_batch(rank: int, i: int, device):
    g = torch.Generator().manual_seed(100 * rank + i)
    x = torch.randn(S["micro"], S["features"], generator=g)
    return x.to(device), x.sum(1, keepdim=True).sin().to(device)


def flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().flatten().float() for p in model.parameters()])


def reference_grad(plain: nn.Module, batches, amp: bool, device) -> torch.Tensor:
    """The gradient of the mean loss over `batches` (one rank's), averaged over ranks by hand: what
    DDP's all-reduce of one full batch gives. A plain copy, no DDP hooks."""
    plain.zero_grad(set_to_none=True)
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        loss = nn.functional.mse_loss(plain(x).float(), y)
    loss.backward()
    g = flat_grad(plain)
    dist.all_reduce(g)
    return g / dist.get_world_size()


def accumulate(variant: str, device, max_k: int) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = make_model().to(device)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    calls = [0]

    def counting_hook(state, bucket):            # one call per bucket all-reduced (this model: 1 bucket)
        calls[0] += 1
        return default_hooks.allreduce_hook(None, bucket)

    ddp_model.register_comm_hook(None, counting_hook)
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()
    for amp in (False, True):                    # float32, then bfloat16 autocast (the article's mixed precision)
        for k in [k for k in S["ks"] if k <= max_k]:
            batches = [micro_batch(rank, 10 * k + i, device) for i in range(k)]
            plain = copy.deepcopy(model)         # the weights the step will use, for the references
            full = reference_grad(plain, batches, amp, device)
            last = reference_grad(plain, batches[-1:], amp, device)
            calls[0] = 0
            used = None
            if variant == "accumulate-article":
                for i, (batch, target) in enumerate(batches):
                    optimizer.zero_grad()                       # BROKEN: clears the previous micro-batches' gradients
                    # apex.amp.initialize / amp.scale_loss in the article; torch.autocast here (apex is deprecated)
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                        output = ddp_model(batch)
                        loss = loss_fn(output.float(), target)  # BROKEN (too): not divided by k
                    loss.backward()                             # all-reduces every micro-batch
                    if (i + 1) % k == 0:
                        used = flat_grad(model)                 # what optimizer.step() is about to apply
                        optimizer.step()
            else:
                optimizer.zero_grad()
                for i, (batch, target) in enumerate(batches):
                    last_micro = (i + 1) % k == 0
                    # FIX: skip DDP's all-reduce on all but the last micro-batch; grads add up locally
                    with (ddp_model.no_sync() if not last_micro else _nothing()):
                        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                            loss = loss_fn(ddp_model(batch).float(), target) / k   # FIX: mean over k micro-batches
                        loss.backward()
                    if last_micro:
                        used = flat_grad(model)
                        optimizer.step()
                        optimizer.zero_grad()                   # FIX: zero only after the step
            scale = float(full.abs().max())
            lab.record("accum", k=k, amp="bf16" if amp else "fp32",
                       diff_full=float((used - full).abs().max()), diff_last=float((used - last).abs().max()),
                       rel_err_full=float((used - full).norm() / full.norm()), grad_scale=scale,
                       allreduces=calls[0], allreduces_saved=k - calls[0])
            lab.log(f"k={k} {'bf16' if amp else 'fp32'}: |used - full| {float((used - full).abs().max()):.2e}, "
                    f"|used - last micro-batch| {float((used - last).abs().max()):.2e}, all-reduces {calls[0]}")


def sampler_orders(variant: str, epochs: int) -> None:
    dataset = TensorDataset(torch.arange(S["dataset"]))
    sampler = DistributedSampler(dataset, shuffle=True)          # article 001, Example 2
    dataloader = DataLoader(dataset, batch_size=S["batch"], sampler=sampler)
    for epoch in range(epochs):
        if variant == "sampler-set-epoch":
            sampler.set_epoch(epoch)                             # FIX: reseed the shuffle with the epoch
        # BROKEN (sampler-no-set-epoch): no set_epoch(), the shuffle's seed stays seed + 0 every epoch
        order = [int(i) for (b,) in dataloader for i in b]
        lab.record("epoch", epoch=epoch, order=order)
        lab.log(f"epoch {epoch}: {order}")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(variant: str, max_k: int, epochs: int) -> None:
    if variant == "no-master-env":
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        # torchrun exports MASTER_ADDR/MASTER_PORT; the article's mp.spawn script never sets them.
        os.environ.pop("MASTER_ADDR", None)
        os.environ.pop("MASTER_PORT", None)
        lab.record("start", variant=variant, master_addr=os.environ.get("MASTER_ADDR"))
        dist.init_process_group("gloo", rank=rank, world_size=world_size)   # BROKEN: article 000's call
        # FIX: set MASTER_ADDR and MASTER_PORT before this line (or start with torchrun and leave them)
        lab.record("joined")
        return
    ctx = lab.setup()
    lab.record("start", variant=variant, device=str(ctx.device), backend=ctx.backend)
    if variant.startswith("accumulate"):
        accumulate(variant, ctx.device, max_k)
    else:
        sampler_orders(variant, epochs)
    dist.barrier()
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="accumulate-article",
                   help="which article sample to run")
    p.add_argument("--max-k", type=int, choices=S["ks"], default=max(S["ks"]),
                   help="accumulate-*: the largest number of micro-batches per optimizer step")
    p.add_argument("--epochs", type=int, choices=range(2, 9), default=S["epochs"],
                   help="sampler-*: epochs to draw the index order for")
    a = p.parse_args()
    main(a.variant, a.max_k, a.epochs)
