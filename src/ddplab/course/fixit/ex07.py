"""Fix-it 07 (lab 07, scaling): data parallelism by hand, one all-reduce per parameter tensor.

Lab 07 measures where a DDP step's time goes (the gradient all-reduce against compute) and what a
larger batch, accumulation or compression buys. Here there is no DDP: the script averages gradients
itself, with one ``dist.all_reduce`` per parameter tensor (8 per step; hundreds in a real model), each
paying the collective's fixed cost: the small-message corner that DDP's gradient buckets exist to
avoid. It ends ok and trains right; what is wrong is the number of collectives, counted from every
rank's own collective ledger (torch's flight recorder), never from a clock.
"""
from __future__ import annotations

import ast

from ddplab.course.fixit.exercise import (
    Attempt, Edit, Exercise, Layout, Mismatch, WrongFix, calls, has_keyword, params_match)

STEPS = 5
BATCH = 32
LR = 0.05
TOL = 1e-5

BROKEN = '''\
# Fix it (lab 07): data parallelism written by hand (no DDP): after backward, every rank averages each
# parameter's gradient with the other rank's. It ends ok and trains right, but it scales badly: one
# all-reduce per parameter tensor (8 per step here, hundreds in a real model), each paying the network's
# fixed cost. Repair it so that each step communicates ONCE (one all-reduce that carries every gradient)
# and trains the same model: the one a single process gets from every rank's batches.
import torch
import torch.distributed as dist
import torch.nn as nn

from ddplab.rank import lab

d = lab.setup()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                      nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)

for step in range(5):
    g = torch.Generator().manual_seed(20 * step + d.rank)     # each rank its own batch
    x = torch.randn(32, 16, generator=g)
    loss = nn.functional.mse_loss(model(x), x[:, :1] * x[:, 1:2])
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():                              # average each gradient over the ranks
        dist.all_reduce(p.grad)
        p.grad /= d.world_size
    opt.step()

lab.record("final", params=[p.detach().flatten().tolist() for p in model.parameters()])
lab.teardown()
'''

_SYNC = '''\
    for p in model.parameters():                              # average each gradient over the ranks
        dist.all_reduce(p.grad)
        p.grad /= d.world_size
'''

REFERENCE = BROKEN.replace(_SYNC, '''\
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])   # FIX: every gradient in one bucket
    dist.all_reduce(flat)                                     # FIX: one all-reduce per step
    flat /= d.world_size
    offset = 0
    for p in model.parameters():                              # each gradient back from its part of the bucket
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
''')


def baseline(nproc: int) -> list[float]:
    """One process, each step's batch being every rank's batch of that step (equal sizes: the ranks' mean)."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x = torch.cat([torch.randn(BATCH, 16, generator=torch.Generator().manual_seed(20 * step + r))
                       for r in range(nproc)])
        loss = nn.functional.mse_loss(model(x), x[:, :1] * x[:, 1:2])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def all_reduces(attempt: Attempt) -> dict[int, int]:
    """How many all-reduces each rank issued, from its collective ledger (torch's flight recorder)."""
    return {r.rank: sum(c.op == "all_reduce" for c in r.ledger) for r in attempt.result.ranks}


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    found = params_match(attempt, nproc, baseline(nproc), TOL)
    if found is not None:
        return found
    counts = all_reduces(attempt)
    most = max(counts.values(), default=0)
    if most > STEPS:
        return Mismatch("all-reduces", STEPS, most)
    return None


def _in_if(tree: ast.AST, *names: str) -> bool:
    """A call to one of ``names`` sits in the body of an ``if``: communication only on some steps."""
    return any(isinstance(n, ast.If) and any(calls(s, *names) for s in n.body) for n in ast.walk(tree))


def _no_division(a: Attempt) -> bool:
    m = a.mismatch
    divides = any(isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div) or
                  isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in ast.walk(a.tree))
    return m is not None and m.what == "params" and not divides and max(all_reduces(a).values(), default=0) <= STEPS


EXERCISE = Exercise(
    id="07", lab="07", title="One all-reduce per parameter",
    task="At most one all-reduce per step (5 in all on each rank, counted from its collective ledger), and every "
         "rank ends with the parameters one process gets from every rank's batches.",
    broken=BROKEN, reference=REFERENCE,
    hint="A collective's cost is a fixed part per call plus a part per byte. The bytes cannot shrink without "
         "changing the result; the calls can. What does DDP put its gradients in before it all-reduces them?",
    judge=judge, nproc=2, stall_s=2.0, tolerance=TOL, failure="all-reduces",
    wrong_fixes=(
        WrongFix(
            "async-per-parameter",
            (Edit(_SYNC, '''\
    works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]   # all in flight at once
    for w in works:
        w.wait()
    for p in model.parameters():
        p.grad /= d.world_size
'''),),
            lambda a: has_keyword(a.tree, ("all_reduce",), "async_op", value=True) and a.mismatch is not None
            and a.mismatch.what == "all-reduces",
            "async_op=True lets the all-reduces run while Python goes on, but there are still 8 of them per step, "
            "each with its own fixed cost (and with no backward left to hide them behind, the waits come right "
            "after). Put the gradients in one buffer and all-reduce that once.",
            "https://github.com/meta-pytorch/torchft/pull/111 (an async all_reduce per tensor, then 'Wait for all "
            "allreduce operations to complete', replaced by one flat buffer); "
            "https://github.com/NVIDIA/waveglow/issues/92"),
        WrongFix(
            "every-other-step",
            (Edit(_SYNC, "    if step % 2 == 0:                                         # communicate less often\n"
                  + "".join("    " + line + "\n" for line in _SYNC.splitlines())),),
            lambda a: _in_if(a.tree, "all_reduce") and a.mismatch is not None
            and a.mismatch.what in ("params", "ranks"),
            "Averaging only on some steps lets each rank step on its own gradient in between: the replicas drift "
            "apart and the model is no longer the one the whole batch trains (that is local SGD, another "
            "algorithm). Communicate fewer times per step, not on fewer steps.",
            "https://github.com/meta-pytorch/torchft/pull/111 (LocalSGD: parameters averaged every few steps, "
            "a different training from synchronous data parallelism)"),
        WrongFix(
            "no-average",
            (Edit(_SYNC, '''\
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])   # one bucket
    dist.all_reduce(flat)
    offset = 0
    for p in model.parameters():
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
'''),),
            _no_division,
            "One all-reduce, but it SUMS the ranks' gradients: without dividing by the world size each step is "
            "world_size times too large (as if the learning rate had doubled). DDP divides for you; by hand you "
            "must.",
            "https://github.com/spellml/deeplab-voc-2012/issues/3 (are gradients summed rather than averaged?); "
            "https://github.com/NVIDIA/apex/issues/696"),
    ),
    layouts=(Layout(3),),
    bounded_collectives=True,
    sources=("https://github.com/NVIDIA/waveglow/issues/92", "https://github.com/meta-pytorch/torchft/pull/111"),
)
