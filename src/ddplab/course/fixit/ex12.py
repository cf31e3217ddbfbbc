"""Fix-it 12 (lab 12, silent): a fine-tuning loop whose DistributedSampler never gets set_epoch.

Lab 12's no-set-epoch trains a classifier; here a small regression is fine-tuned for three epochs.
It ends ok and trains: only ``--check`` (every epoch visits the data in the same order) and the final
parameters (not those of the shuffled one-process baseline) show that it is wrong.
"""
from __future__ import annotations

from ddplab.course.fixit.exercise import (
    Layout, Attempt, Edit, Exercise, Mismatch, WrongFix, calls, has_keyword, in_loop, params_match)

SAMPLES = 32
BATCH = 4
EPOCHS = 3
LR = 0.1
SEED = 0
TOL = 1e-5

BROKEN = '''\
# Fix it (lab 12): fine-tune for 3 epochs on 2 ranks, each epoch in a new random order shared out by a
# DistributedSampler. It ends ok. Run it with --check, then repair it so that --check is clean and the
# model is the one a single process gets from the same shuffled batches.
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddplab.rank import lab

d = lab.setup()
g = torch.Generator().manual_seed(1)
x = torch.randn(32, 3, generator=g)
y = x @ torch.tensor([[2.0], [-1.0], [0.5]])
data = TensorDataset(x, y)

torch.manual_seed(0)
model = DDP(nn.Linear(3, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=4, sampler=sampler)

for epoch in range(3):
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()

lab.record("final", params=[p.detach().flatten().tolist() for p in model.parameters()])
lab.teardown()
'''

_EPOCH = "for epoch in range(3):\n"

REFERENCE = BROKEN.replace(_EPOCH, _EPOCH + "    sampler.set_epoch(epoch)                              "
                                            "# FIX: a new order every epoch, the same on every rank\n")


def baseline(nproc: int) -> list[float]:
    """One process, the same batches: each step's batch is every rank's batch of that step, in
    DistributedSampler's order for that epoch (a permutation seeded with seed + epoch, rank r taking
    every nproc-th index from r). DDP's averaged gradient of equal-sized batches is the gradient of their union."""
    import torch
    import torch.nn as nn
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 3, generator=g)
    y = x @ torch.tensor([[2.0], [-1.0], [0.5]])
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        perm = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()
        shards = [perm[r::nproc] for r in range(nproc)]
        for i in range(0, len(shards[0]), BATCH):
            idx = [j for s in shards for j in s[i:i + BATCH]]
            loss = nn.functional.mse_loss(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    return params_match(attempt, nproc, baseline(nproc), TOL)


def _set_epoch_outside_loop(a: Attempt) -> bool:
    """set_epoch is called, but not inside the epoch loop: the order is still the same every epoch."""
    import ast
    inside = set()
    for node in ast.walk(a.tree):
        if isinstance(node, (ast.For, ast.While)):
            inside.update(id(c) for stmt in node.body for c in calls(stmt, "set_epoch"))
    found = calls(a.tree, "set_epoch")
    return bool(found) and not any(id(c) in inside for c in found) and "same-order" in a.findings()


EXERCISE = Exercise(
    id="12", lab="12", title="Three epochs in one order",
    task="Each epoch in a new random order shared out by the DistributedSampler (--check clean), and the final "
         "parameters of one process trained on the same shuffled batches.",
    broken=BROKEN, reference=REFERENCE,
    hint="DistributedSampler shuffles with a seed it computes from its own seed and an epoch number. Who tells "
         "it which epoch it is?",
    judge=judge, nproc=2, stall_s=3.0, tolerance=TOL, silent=True, failure="same-order",
    wrong_fixes=(
        WrongFix(
            "set-epoch-once",
            (Edit(_EPOCH, "sampler.set_epoch(1)                                      # a new seed\n" + _EPOCH),),
            _set_epoch_outside_loop,
            "set_epoch once (before the loop, or with the same number every time) changes the order once: every "
            "epoch still visits the data in that one order. Call sampler.set_epoch(epoch) at the start of each "
            "epoch, with the epoch's number, on every rank.",
            "https://github.com/pytorch/pytorch/issues/31771 (DistributedSampler can't shuffle the dataset); "
            "https://github.com/pytorch/examples/issues/501"),
        WrongFix(
            "manual-seed",
            (Edit(_EPOCH, _EPOCH + "    torch.manual_seed(epoch)                              # reshuffle\n"),),
            lambda a: in_loop(a.tree, "manual_seed") and "same-order" in a.findings(),
            "torch.manual_seed does not reach DistributedSampler: it shuffles with its own generator, seeded with "
            "seed + epoch, and the epoch only changes through set_epoch.",
            "https://github.com/pytorch/pytorch/issues/11324 (why DistributedSampler does not use the default RNG)"),
        WrongFix(
            "loader-shuffle",
            (Edit("loader = DataLoader(data, batch_size=4, sampler=sampler)",
                  "loader = DataLoader(data, batch_size=4, sampler=sampler, shuffle=True)"),),
            lambda a: has_keyword(a.tree, ("DataLoader",), "shuffle", value=True)
            and bool(calls(a.tree, "DistributedSampler")) and not a.ok,
            "A DataLoader takes either a sampler or shuffle=True, not both (ValueError: sampler option is mutually "
            "exclusive with shuffle). The DistributedSampler already shuffles; it needs the epoch, not a second "
            "shuffle.",
            "https://github.com/ultralytics/yolov3/issues/231; https://github.com/NVIDIA/tacotron2/issues/168"),
        WrongFix(
            "drop-sampler",
            (Edit("loader = DataLoader(data, batch_size=4, sampler=sampler)",
                  "loader = DataLoader(data, batch_size=4, shuffle=True)   # shuffle every epoch"),),
            # no loader is given a sampler, and the run shows what that does to the samples
            lambda a: not has_keyword(a.tree, ("DataLoader",), "sampler")
            and bool({"samples-overlap", "samples-dropped"} & a.findings()),
            "shuffle=True without the DistributedSampler gives every rank the whole dataset in its own random "
            "order: each epoch sees every sample twice (once per rank) and the ranks no longer share the data out.",
            "https://github.com/yangkky/distributed_tutorial/issues/5 (the epoch must be the same on every rank, "
            "else samples are visited several times and others not at all)"),
    ),
    layouts=(Layout(4),),
    sources=("https://github.com/lucidrains/DALLE-pytorch/pull/230", "https://github.com/pytorch/pytorch/issues/31771"),
)
