"""Lab 12 - ok but wrong: jobs that end with status ok and train the wrong model.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/12_silent.py --variant no-set-epoch
    ddplab run 12 --variant no-set-epoch --check     # the same, and what each rank's records show

Article 001 ("How can I resolve PyTorch DistributedDataParallel issues?") warns that "uneven data
distribution among workers can cause discrepancies in model updates", that "the sampler should be
reset before each epoch", and that gradient accumulation handled wrongly "can result in unexpected
gradient updates". None of these hangs or crashes: every variant ends ok. Each broken variant has a
fixed twin that differs only in the lines marked # BROKEN / # FIX; both train the same model from
the same seed on the same data, and every rank records its own replica's validation loss and accuracy.

Variants (each also as NAME-fixed):
  module-update     rank 0 also trains on an extra batch through model.module: its replica drifts
                    (fix: the extra batch goes through the DDP wrapper, on every rank).
  no-set-epoch      DistributedSampler(shuffle=True) without set_epoch: the same order every epoch.
  step-in-no-sync   gradient accumulation with optimizer.step() inside no_sync(): gradients never
                    averaged (fix: the last micro-batch and the step outside no_sync()).
  rank-split        each rank takes a random half of the data, split with a seed of its rank: samples
                    seen twice and never (fix: DistributedSampler).
  bn-unsynced       DDP's buffer sync off, ranks reading different sources: BatchNorm running stats
                    differ between replicas (fix: buffer sync on).
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from ddplab.rank import lab
from ddplab.rank.lab_ddp import buffer_sync   # DDP's buffer-sync switch, named as this torch names it

LAB = {
    "title": "Ok but wrong: replicas that drift, samples seen twice, gradients never averaged, buffers that differ",
    "article": "001_159326f62e29f2b3.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "module-update": {"expect": "ok", "about": "rank 0 also trains on an extra batch through model.module: replicas drift"},
        "module-update-fixed": {"expect": "ok", "about": "the extra batch through the DDP wrapper on every rank"},
        "no-set-epoch": {"expect": "ok", "about": "DistributedSampler(shuffle=True) without set_epoch: the same order every epoch"},
        "no-set-epoch-fixed": {"expect": "ok", "about": "sampler.set_epoch(epoch) before each epoch"},
        "step-in-no-sync": {"expect": "ok", "about": "optimizer.step() inside no_sync(): gradients never averaged"},
        "step-in-no-sync-fixed": {"expect": "ok", "about": "the last micro-batch and the step outside no_sync()"},
        "rank-split": {"expect": "ok", "about": "a random half per rank (seeded by rank), no sampler: overlap and samples never seen"},
        "rank-split-fixed": {"expect": "ok", "about": "DistributedSampler: every sample once per epoch"},
        "bn-unsynced": {"expect": "ok", "about": "buffer sync off, each rank one source: BatchNorm running stats differ"},
        "bn-unsynced-fixed": {"expect": "ok", "about": "DDP's buffer sync on: rank 0's statistics copied to every rank at each forward"},
    },
    # the finding `ddplab run --check` must report for each broken variant (its -fixed twin: none)
    "findings": {"module-update": "replicas-differ", "no-set-epoch": "same-order",
                 "step-in-no-sync": "step-in-no-sync", "rank-split": "samples-overlap", "bn-unsynced": "buffers-differ"},
    "sizes": {"train": 512, "val": 512, "features": 16, "hidden": 64, "classes": 4, "batch": 16, "epochs": 4,
              "lr": 0.05, "eval_every": 4, "seed": 0},
}
S = LAB["sizes"]


def make_data(seed: int):
    """Two sources of the same task (labels from one fixed teacher): even rows source A, odd rows
    source B (shifted and scaled). The same on every rank (the same seed)."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(S["features"], S["classes"], generator=g)
    n = S["train"] + S["val"]
    z = torch.randn(n, S["features"], generator=g)
    y = (z @ teacher).argmax(1)
    source_b = torch.arange(n) % 2 == 1
    x = torch.where(source_b[:, None], 1.5 * z + 2.0, z)
    return TensorDataset(x[:S["train"]], y[:S["train"]]), (x[S["train"]:], y[S["train"]:])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(S["features"], S["hidden"]), nn.BatchNorm1d(S["hidden"]), nn.ReLU())
        self.head = nn.Linear(S["hidden"], S["classes"])

    def forward(self, x):
        return self.head(self.body(x))


def loader_for(variant: str, train, ctx, seed: int):
    if variant == "rank-split":
        perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed + ctx.rank))  # BROKEN: rank seed
        part = Subset(train, perm[:len(train) // ctx.world_size].tolist())
        return DataLoader(part, batch_size=S["batch"], shuffle=True), None
    # bn-unsynced: no shuffle, so rank r reads rows r, r+2, ...: rank 0 source A, rank 1 source B
    sampler = DistributedSampler(train, shuffle=not variant.startswith("bn-unsynced"), seed=seed)   # FIX (rank-split)
    return DataLoader(train, batch_size=S["batch"], sampler=sampler), sampler


def evaluate(model, val, step):
    """This rank's own replica on the whole validation set (no DataLoader, no collective)."""
    net = model.module
    net.eval()
    with torch.no_grad():
        out = net(val[0])
        loss, acc = F.cross_entropy(out, val[1]).item(), (out.argmax(1) == val[1]).float().mean().item()
    net.train()
    lab.record("eval", step=step, val_loss=loss, val_acc=acc)


def train_step(net, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()


def main(variant: str, *, epochs: int = S["epochs"], seed: int = S["seed"], eval_every: int = S["eval_every"]):
    ctx = lab.setup()
    torch.manual_seed(seed)                      # the same seed for every variant and rank
    train, val = make_data(seed)
    val = (val[0].to(ctx.device), val[1].to(ctx.device))
    model = DDP(Net().to(ctx.device), device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                **buffer_sync(variant != "bn-unsynced"))     # BROKEN (bn-unsynced): buffers never synced
    opt = torch.optim.SGD(model.parameters(), lr=S["lr"], momentum=0.9)
    loader, sampler = loader_for(variant, train, ctx, seed)
    extra = torch.Generator().manual_seed(seed + 100 + ctx.rank)
    step = 0
    evaluate(model, val, step)
    for epoch in range(epochs):
        if sampler is not None and variant != "no-set-epoch":  # BROKEN (no-set-epoch): never reset
            sampler.set_epoch(epoch)                            # FIX: a new order every epoch
        for x, y in loader:
            x, y = x.to(ctx.device), y.to(ctx.device)
            if variant == "step-in-no-sync":
                with model.no_sync():
                    for xm, ym in zip(x.chunk(2), y.chunk(2)):
                        (F.cross_entropy(model(xm), ym) / 2).backward()
                    opt.step()                   # BROKEN: inside no_sync(), gradients never averaged
                opt.zero_grad()
            elif variant == "step-in-no-sync-fixed":
                h = len(x) // 2
                with model.no_sync():
                    (F.cross_entropy(model(x[:h]), y[:h]) / 2).backward()
                (F.cross_entropy(model(x[h:]), y[h:]) / 2).backward()   # FIX: the last micro-batch syncs
                opt.step()                                               # FIX: outside no_sync()
                opt.zero_grad()
            else:
                train_step(model, opt, x, y)
            step += 1
            if variant.startswith("module-update") and step % eval_every == 0:
                idx = torch.randint(len(train), (S["batch"],), generator=extra)
                xb, yb = train[idx]
                if variant == "module-update":
                    if ctx.rank == 0:
                        train_step(model.module, opt, xb.to(ctx.device), yb.to(ctx.device))  # BROKEN: rank 0, bypassing DDP
                else:
                    train_step(model, opt, xb.to(ctx.device), yb.to(ctx.device))   # FIX: every rank, through DDP
            if step % eval_every == 0:
                evaluate(model, val, step)
    sha = lambda ts: hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in ts)).hexdigest()
    # this replica, bit for bit: parameters and buffers, and parameters alone (the buffers of the last
    # forward are rank-local even with buffer sync on: DDP broadcasts them at the start of the next one)
    lab.record("done", steps=step, epochs=epochs, sha256=sha(model.module.state_dict().values()),
               params_sha256=sha(model.module.parameters()))
    lab.teardown()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="module-update")
    p.add_argument("--epochs", type=int, default=S["epochs"], help="passes over the training data")
    p.add_argument("--seed", type=int, default=S["seed"], help="data, init and sampler seed (the same on every rank)")
    a = p.parse_args()
    if a.epochs < 1:
        p.error("--epochs must be at least 1")
    main(a.variant, epochs=a.epochs, seed=a.seed)
