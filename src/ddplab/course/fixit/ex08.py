"""Fix-it 08 (lab 08, the articles' own code): gradient accumulation that accumulates nothing.

Lab 08 runs article 001's Example 3 (zero_grad() at every micro-batch) on its own model. Here a
regression accumulates 4 micro-batches per optimizer step, with zero_grad() in the same wrong place: it
ends ok, and each step uses only the last micro-batch's gradient. Only the result shows it.
"""
from __future__ import annotations

import ast

from ddplab.course.fixit.exercise import Attempt, Edit, Exercise, Mismatch, WrongFix, calls, params_match

K = 4
MICRO = 8
STEPS = 5
LR = 0.05
TOL = 1e-5

BROKEN = '''\
# Fix it (lab 08): each optimizer step should use the gradient of 4 micro-batches of 8 rows per rank
# (a batch of 64 rows over 2 ranks), as if the whole batch had gone through at once. It ends ok.
# Repair it so that the model is the one a single process gets from the whole batch at every step.
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab

d = lab.setup()
torch.manual_seed(0)
model = DDP(nn.Linear(5, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
accum = 4

for step in range(5):
    g = torch.Generator().manual_seed(10 * step + d.rank)       # this rank's share of the step's batch
    x = torch.randn(accum * 8, 5, generator=g)
    y = x.sum(1, keepdim=True)
    for xb, yb in zip(x.chunk(accum), y.chunk(accum)):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
    opt.step()

lab.record("final", params=[p.detach().flatten().tolist() for p in model.parameters()])
lab.teardown()
'''

_INNER = '''\
    for xb, yb in zip(x.chunk(accum), y.chunk(accum)):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
    opt.step()
'''

REFERENCE = BROKEN.replace(_INNER, '''\
    for xb, yb in zip(x.chunk(accum), y.chunk(accum)):
        loss = nn.functional.mse_loss(model(xb), yb) / accum     # FIX: the mean over the micro-batches
        loss.backward()                                         # gradients add up across micro-batches
    opt.step()
    opt.zero_grad()                                             # FIX: cleared once per optimizer step
''')


def baseline(nproc: int) -> list[float]:
    """One process, the whole batch (every rank's rows of the step) at once, one step per batch."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Linear(5, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        xs = [torch.randn(K * MICRO, 5, generator=torch.Generator().manual_seed(10 * step + r)) for r in range(nproc)]
        x = torch.cat(xs)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    return params_match(attempt, nproc, baseline(nproc), TOL)


def _zero_in_if(tree: ast.AST) -> bool:
    """zero_grad() is called only under an ``if`` (on some steps), never unconditionally in a loop."""
    return any(isinstance(n, ast.If) and any(calls(s, "zero_grad") for s in n.body) for n in ast.walk(tree))


def _no_division(a: Attempt) -> bool:
    """Gradients accumulate (zero_grad not inside the micro-batch loop) but the loss is not divided."""
    import ast
    for node in ast.walk(a.tree):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and \
                any(isinstance(n, ast.Attribute) and n.attr == "chunk" for n in ast.walk(node.iter)):
            inner_zero = any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "zero_grad"
                             for stmt in node.body for n in ast.walk(stmt))
            divides = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
                          for stmt in node.body for n in ast.walk(stmt))
            return not inner_zero and not divides and a.mismatch is not None
    return False


EXERCISE = Exercise(
    id="08", lab="08", title="Accumulation that accumulates nothing",
    task="Each optimizer step uses the gradient of the whole batch (4 micro-batches of 8 rows on each of 2 ranks): "
         "the same model as one process stepping once per whole batch.",
    broken=BROKEN, reference=REFERENCE,
    hint="Follow one parameter's .grad through the inner loop: what is in it when opt.step() runs? And if it "
         "held the sum of 4 micro-batches' gradients, what would the whole batch's mean be?",
    judge=judge, nproc=2, stall_s=2.0, tolerance=TOL, failure="params",
    wrong_fixes=(
        WrongFix(
            "no-division",
            (Edit(_INNER, _INNER.replace("        opt.zero_grad()\n", "") + "    opt.zero_grad()\n"),),
            _no_division,
            "Moving zero_grad() out of the loop makes the gradients add up, but they add up to the SUM of 4 "
            "micro-batch means: 4 times the whole batch's gradient, as if the learning rate were 4 times larger. "
            "Divide each micro-batch's loss by the number of micro-batches.",
            "https://github.com/karpathy/nanoGPT/issues/206 (backward without dividing by the accumulation "
            "steps); https://github.com/ApolloResearch/e2e_sae/pull/70 (the division removed, then restored)"),
        WrongFix(
            "no-sync-everywhere",
            (Edit(_INNER, '''\
    with model.no_sync():                                       # no all-reduce while accumulating
        for xb, yb in zip(x.chunk(accum), y.chunk(accum)):
            loss = nn.functional.mse_loss(model(xb), yb) / accum
            loss.backward()
        opt.step()
    opt.zero_grad()
'''),),
            lambda a: "step-in-no-sync" in a.findings() or (a.mismatch is not None and bool(calls(a.tree, "no_sync"))),
            "no_sync() saves the all-reduce of the micro-batches before the last; with every backward inside it "
            "no gradient is ever averaged across ranks, so each rank steps on its own data and the replicas "
            "drift apart. The last micro-batch's backward (and the step) must run outside no_sync().",
            "https://github.com/modelscope/FunASR/pull/3472 (the step's micro-batch inside no_sync left "
            "rank-local gradients); https://github.com/pytorch/pytorch/issues/53443"),
        WrongFix(
            "zero-once",
            (Edit(_INNER, "    if step == 0:\n        opt.zero_grad()                                     # once\n"
                  + _INNER.replace("        opt.zero_grad()\n", "").replace(
                      "model(xb), yb)\n", "model(xb), yb) / accum\n")),),
            lambda a: a.mismatch is not None and _zero_in_if(a.tree),
            "zero_grad() only before the first step lets the gradients of every step pile up: step 2 steps on the "
            "gradients of steps 1 and 2, and so on. Clear them once per optimizer step, after opt.step().",
            "no user report found for this exact form: a variant of article 001's Example 3 (where zero_grad() "
            "goes); https://github.com/karpathy/nanoGPT/issues/605 asks what the accumulated gradient holds"),
    ),
    sources=("article 001's Example 3", "https://github.com/karpathy/nanoGPT/issues/206"),
)
