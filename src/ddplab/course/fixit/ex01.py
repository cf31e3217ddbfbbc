"""Fix-it 01 (lab 01, a hang): early stopping decided by each rank alone.

Lab 01's script hangs because its ranks get different numbers of batches. Here the data is even and
the hang comes from a rank-local decision: each rank stops when *its own* loss is small enough, so one
rank leaves the loop for the checkpoint barrier while the other waits in backward's all-reduce.
"""
from __future__ import annotations

from ddplab.course.fixit.exercise import (
    Layout, Attempt, Edit, Exercise, Mismatch, WrongFix, every_rank, close, flat, has_keyword, imports_or_calls,
    in_loop, in_try)

THRESHOLD = 0.05
LR = 0.05
MAX_STEPS = 500
ROWS = 32
TOL = 1e-4

BROKEN = '''\
# Fix it (lab 01): train until the loss over the WHOLE dataset (every rank's shard) is below 0.05,
# then save a checkpoint. Run with 2 ranks. It hangs: repair it so that it ends, trains the same
# model as one process would on all the data, and takes the same number of steps.
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab

d = lab.setup()
torch.manual_seed(0)
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(100 + d.rank)          # each rank reads its own shard
x = torch.randn(32, 4, generator=g)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(32, 1, generator=g)

steps = 0
for step in range(500):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
    if loss.item() < 0.05:                                # stop when the loss is small enough
        break

lab.record("final", steps=steps, params=[p.detach().flatten().tolist() for p in model.parameters()])
dist.barrier()                                            # every rank done before rank 0 saves
if d.rank == 0:
    torch.save(model.module.state_dict(), "/dev/null")
lab.teardown()
'''

REFERENCE = BROKEN.replace('''\
    if loss.item() < 0.05:                                # stop when the loss is small enough
        break
''', '''\
    mean = loss.detach().clone()                          # FIX: decide together, on the whole dataset's loss
    dist.all_reduce(mean)
    if mean.item() / d.world_size < 0.05:
        break
''')

_STOP = '''\
    if loss.item() < 0.05:                                # stop when the loss is small enough
        break
'''
_LOOP = BROKEN[BROKEN.index("for step in range(500):"):BROKEN.index("\nlab.record(") + 1]


def baseline(nproc: int) -> tuple[int, list[float]]:
    """One process, every rank's shard at once, the same rule on the whole dataset's loss."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    xs, ys = [], []
    for rank in range(nproc):
        g = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(ROWS, 4, generator=g)
        xs.append(x)
        ys.append(x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(ROWS, 1, generator=g))
    x, y = torch.cat(xs), torch.cat(ys)
    steps = 0
    for _ in range(MAX_STEPS):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        if loss.item() < THRESHOLD:
            break
    return steps, [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    finals = attempt.finals()
    missing = every_rank(finals, nproc)
    if missing is not None:
        return missing
    steps, params = baseline(nproc)
    for rank in sorted(finals):
        rec = finals[rank]
        if rec.get("steps") != steps:
            return Mismatch("steps", steps, rec.get("steps"))
        if not close(flat(rec.get("params", [])), params, TOL):
            return Mismatch("params", params, flat(rec.get("params", [])), TOL)
    return None


def _not_ok(a: Attempt) -> bool:
    return not a.ok


EXERCISE = Exercise(
    id="01", lab="01", title="Early stopping that hangs",
    task="Train until the loss over the whole dataset (every rank's shard) is below 0.05, then save a "
         "checkpoint; the same steps and the same final parameters as one process training on all the data.",
    broken=BROKEN, reference=REFERENCE,
    hint="Every rank must make the same decision to stop, at the same step, from the same number. Which number "
         "does each rank look at now, and how could every rank see the whole dataset's loss?",
    judge=judge, nproc=2, stall_s=2.0, tolerance=TOL, failure="hang-different-collectives",
    wrong_fixes=(
        WrongFix(
            "longer-timeout",
            (Edit("d = lab.setup()", "d = lab.setup(timeout_s=3600)"),),
            lambda a: has_keyword(a.tree, ("setup", "init_process_group"), "timeout", "timeout_s") and not a.ok,
            "A longer timeout changes when the wait ends, not whether the ranks meet: one rank is in the barrier "
            "after the loop, the other in the next step's all-reduce, and neither can ever finish. The timeout "
            "only decides how long the job sits there before it dies.",
            "https://github.com/ultralytics/ultralytics/pull/3343 (timeout raised from 1 to 3 hours); "
            "https://github.com/speechbrain/speechbrain/issues/1939 (early stop on one GPU -> watchdog timeout)"),
        WrongFix(
            "barrier-in-loop",
            (Edit(_STOP, "    dist.barrier()                                        # wait for each other\n" + _STOP),),
            lambda a: in_loop(a.tree, "barrier") and not a.ok,
            "The barrier makes the ranks wait for each other at that point, but each one still decides alone "
            "whether to break right after it: the rank whose loss is small leaves for the final barrier while the "
            "other goes on to the next all-reduce. A barrier synchronises time, not decisions.",
            "https://github.com/speechbrain/speechbrain/pull/2051 (stop decided on the main process only; "
            "the fix synchronises the metric, not the time)"),
        WrongFix(
            "try-except",
            (Edit('''\
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
''', '''\
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    try:
        loss.backward()
    except RuntimeError:                                  # skip a step that fails
        continue
    opt.step()
'''),),
            lambda a: in_try(a.tree, "backward", "all_reduce", "barrier") and not a.ok,
            "A hang raises nothing to catch: the collective just waits. When the timeout finally raises, the "
            "ranks are already out of step (different collective numbers), so skipping and going on cannot bring "
            "them back together.",
            "https://github.com/pytorch/pytorch/issues/44353 (catching the exception in one process blocks the "
            "others: 'skip comm or redo comm ... leads to the hang')"),
        WrongFix(
            "join",
            (Edit("from ddplab.rank import lab\n",
                  "from torch.distributed.algorithms.join import Join\n\nfrom ddplab.rank import lab\n"),
             Edit(_LOOP, "with Join([model]):                                      # the rank that stops waits\n"
                  + "".join("    " + line + "\n" if line else "\n" for line in _LOOP.splitlines()))),
            lambda a: imports_or_calls(a.tree, "Join") and (not a.ok or a.mismatch is not None),
            "Join is for uneven *data*: the rank that has finished shadows the others' all-reduces with zero "
            "gradients. Here the stop is a decision, not a lack of data: with Join the rank that stopped first "
            "adds zeros while the other keeps training on half a gradient, so the ranks take different numbers "
            "of steps and the model is not the one-process model.",
            "https://docs.pytorch.org/tutorials/advanced/generic_join.html (Join for uneven inputs); "
            "https://github.com/pytorch/pytorch/issues/38174 (uneven inputs in DDP)"),
    ),
    layouts=(Layout(3),),
    sources=("https://github.com/speechbrain/speechbrain/issues/1939",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/555"),
)
