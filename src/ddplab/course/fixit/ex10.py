"""Fix-it 10 (lab 10, model code that is not DDP-safe): rank 0 validates through the DDP wrapper.

Lab 10's eval-rank0 evaluates once, after training. Here rank 0 logs a validation loss after every
epoch, in the middle of training: its forward through the wrapper broadcasts the BatchNorm buffers, a
collective rank 1 never joins, so from the first validation on the ranks' collectives are out of step
and the job dies when rank 1 finishes while rank 0 still waits.
"""
from __future__ import annotations

from ddplab.course.fixit.exercise import (
    Attempt, Edit, Exercise, Mismatch, WrongFix, every_rank, calls, close, flat, has_keyword, in_try)

EPOCHS = 3
STEPS = 4
BATCH = 16
LR = 0.05
TOL = 1e-5

BROKEN = '''\
# Fix it (lab 10): train on 2 ranks for 3 epochs; after each epoch rank 0 logs the validation loss.
# It fails. Repair it so that it ends, rank 0 logs one validation loss per epoch (the model's, with
# rank 0's BatchNorm statistics), and training is unchanged.
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab

d = lab.setup()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
val_x = torch.randn(64, 6, generator=torch.Generator().manual_seed(7))
val_y = val_x[:, :1] * 2

for epoch in range(3):
    model.train()
    for step in range(4):
        g = torch.Generator().manual_seed(100 * epoch + 10 * step + d.rank)   # each rank its own batch
        x = torch.randn(16, 6, generator=g)
        loss = nn.functional.mse_loss(model(x), x[:, :1] * 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if d.rank == 0:                                       # only rank 0 logs the validation loss
        model.eval()
        with torch.no_grad():
            val = nn.functional.mse_loss(model(val_x), val_y)
        lab.record("val", epoch=epoch, loss=val.item())

lab.record("final", params=[p.detach().flatten().tolist() for p in model.parameters()])
lab.teardown()
'''

_VAL = "            val = nn.functional.mse_loss(model(val_x), val_y)\n"
_BLOCK = '''\
        lab.record("val", epoch=epoch, loss=val.item())
'''

REFERENCE = BROKEN.replace(_VAL, "            val = nn.functional.mse_loss(model.module(val_x), val_y)   "
                                 "# FIX: the plain module, no collective\n")


def baseline(nproc: int) -> tuple[list[float], list[float]]:
    """One process: each step's gradient is the mean of every rank's (BatchNorm on each rank's own batch,
    from rank 0's buffers, which DDP broadcasts at each forward); the buffers after a step are rank 0's;
    the validation uses them, as rank 0's does."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    val_x = torch.randn(64, 6, generator=torch.Generator().manual_seed(7))
    val_y = val_x[:, :1] * 2
    vals = []
    for epoch in range(EPOCHS):
        model.train()
        for step in range(STEPS):
            opt.zero_grad()
            start = [b.clone() for b in model.buffers()]
            after0 = start
            for r in range(nproc):
                with torch.no_grad():
                    for b, s in zip(model.buffers(), start):
                        b.copy_(s)
                x = torch.randn(BATCH, 6, generator=torch.Generator().manual_seed(100 * epoch + 10 * step + r))
                (nn.functional.mse_loss(model(x), x[:, :1] * 2) / nproc).backward()
                if r == 0:
                    after0 = [b.clone() for b in model.buffers()]
            with torch.no_grad():
                for b, a in zip(model.buffers(), after0):
                    b.copy_(a)
            opt.step()
        model.eval()
        with torch.no_grad():
            vals.append(nn.functional.mse_loss(model(val_x), val_y).item())
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()], vals


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    finals = attempt.finals()
    missing = every_rank(finals, nproc)
    if missing is not None:
        return missing
    params, vals = baseline(nproc)
    got = [r.get("loss") for r in attempt.result.records_of("val") if r.get("rank") == 0]
    if len(got) != len(vals) or not close([float(v) for v in got], vals, TOL):
        return Mismatch("validation losses on rank 0", vals, got, TOL)
    for rank in sorted(finals):
        p = flat(finals[rank].get("params", []))
        if not close(p, params, TOL):
            return Mismatch("params", params, p, TOL)
    return None


EXERCISE = Exercise(
    id="10", lab="10", title="Validation on rank 0 through the DDP wrapper",
    task="It ends; rank 0 logs one validation loss per epoch (the model with rank 0's BatchNorm statistics), and "
         "training is that of one process averaging every rank's gradient.",
    broken=BROKEN, reference=REFERENCE,
    hint="A forward through the DDP wrapper is not local: with BatchNorm it starts with a collective. What can rank "
         "0 call instead, that computes the same thing and talks to no one?",
    judge=judge, nproc=2, stall_s=2.0, tolerance=TOL, failure="rank-exited-early",
    wrong_fixes=(
        WrongFix(
            "barrier-after",
            (Edit("from ddplab.rank import lab\n", "import torch.distributed as dist\n\nfrom ddplab.rank import lab\n"),
             Edit(_BLOCK, _BLOCK + "    dist.barrier()                                        # wait for rank 0\n")),
            lambda a: bool(calls(a.tree, "barrier")) and not a.ok,
            "The barrier makes rank 1 wait for rank 0, but rank 0 is not late: it is inside a collective of its "
            "own (the buffer broadcast in DDP's forward) that rank 1 does not call. Rank 1 now waits in the "
            "barrier and rank 0 in the broadcast: the decision 'only rank 0 validates' still runs a collective "
            "on one rank.",
            "https://github.com/pytorch/PiPPy/pull/1139 (barriers added to stop hangs); lab 01's rank-conditional"),
        WrongFix(
            "find-unused-parameters",
            (Edit("model = DDP(nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1)))",
                  "model = DDP(nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1)),\n"
                  "            find_unused_parameters=True)"),),
            lambda a: has_keyword(a.tree, ("DDP", "DistributedDataParallel"), "find_unused_parameters", value=True),
            "find_unused_parameters=True is for parameters that a forward does not use; every parameter here is "
            "used. It adds a traversal of the autograd graph every step (torch warns that it found no unused "
            "parameters) and changes nothing about the collective only rank 0 calls.",
            "https://github.com/speechbrain/speechbrain/pull/713 ('not the right choice', with torch's warning); "
            "https://github.com/pytorch/pytorch/issues/20125"),
        WrongFix(
            "longer-timeout",
            (Edit("d = lab.setup()", "d = lab.setup(timeout_s=3600)"),),
            lambda a: has_keyword(a.tree, ("setup", "init_process_group"), "timeout", "timeout_s") and not a.ok,
            "The ranks are not slow, they are out of step: rank 0 has called one collective more than rank 1. "
            "A longer timeout cannot make rank 1 call it.",
            "https://github.com/ultralytics/ultralytics/pull/3343 (the timeout raised to 3 hours)"),
        WrongFix(
            "try-except",
            (Edit(_VAL, "            try:\n"
                        "                val = nn.functional.mse_loss(model(val_x), val_y)\n"
                        "            except RuntimeError:                          # skip a failed validation\n"
                        "                continue\n"),),
            lambda a: in_try(a.tree, "model") and (not a.ok or a.mismatch is not None),
            "Catching the error hides it on rank 0, but by then the collectives are already out of step: the "
            "broadcast rank 0 called alone was answered by one of rank 1's training collectives. The job may end, "
            "but a validation loss is missing and training is not the one the task asks for.",
            "https://github.com/pytorch/pytorch/issues/44353 (skipping a collective on one process after an "
            "exception leads to the hang)"),
    ),
    sources=("https://github.com/speechbrain/speechbrain/issues/1939",),
)
