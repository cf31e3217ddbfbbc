"""Fix-it 11 (lab 11, mixed precision): gradients clipped while they are still scaled.

Lab 11 runs GradScaler under DDP with accumulation, and shows what an inf on one rank does. Here the
GradScaler loop is the documented one, with gradient clipping added in the usual place, but without
``scaler.unscale_(opt)`` first: clip_grad_norm_ sees the gradients multiplied by the scale (256), so
every step is clipped to 0.5 / 256 of the intended norm. It ends ok and trains, far too slowly; only
the result shows it.
"""
from __future__ import annotations

import ast

from ddplab.course.fixit.exercise import Attempt, Edit, Exercise, Mismatch, WrongFix, calls, params_match

STEPS = 6
BATCH = 16
LR = 0.1
MAX_NORM = 0.5
SCALE = 256.0
TOL = 1e-4

BROKEN = '''\
# Fix it (lab 11): mixed-precision training on 2 ranks, float16 autocast with a GradScaler (on the CPU here:
# the same code as on the GPUs), with the gradient's norm clipped to 0.5. It ends ok. Repair it so that the
# clipping does what it says: the model one process gets from every rank's batches, with the (true) gradient
# clipped to norm 0.5 at every step.
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab

d = lab.setup()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=256.0)

for step in range(6):
    g = torch.Generator().manual_seed(10 * step + d.rank)     # each rank its own batch
    x = torch.randn(16, 8, generator=g)
    y = 3 * x[:, :1] - x[:, 1:2]
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    opt.zero_grad()
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    scaler.step(opt)
    scaler.update()

lab.record("final", scale=scaler.get_scale(), params=[p.detach().flatten().tolist() for p in model.parameters()])
lab.teardown()
'''

_CLIP = "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)\n"
_STEP = "    scaler.step(opt)\n"

REFERENCE = BROKEN.replace(_CLIP, "    scaler.unscale_(opt)                                      "
                                  "# FIX: the true gradients, before they are clipped\n" + _CLIP)


def baseline(nproc: int) -> tuple[list[float], float]:
    """One process: each rank's scaled float16-autocast gradient computed in turn, averaged as DDP does
    (each divided by the world size, then summed), then the documented GradScaler order: unscale_, clip,
    step, update."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    for step in range(STEPS):
        grads = None
        for r in range(nproc):
            x = torch.randn(BATCH, 8, generator=torch.Generator().manual_seed(10 * step + r))
            y = 3 * x[:, :1] - x[:, 1:2]
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            mine = [p.grad / nproc for p in model.parameters()]
            grads = mine if grads is None else [a + b for a, b in zip(grads, mine)]
        for p, gr in zip(model.parameters(), grads):
            p.grad = gr
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=MAX_NORM)
        scaler.step(opt)
        scaler.update()
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()], scaler.get_scale()


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    params, scale = baseline(nproc)
    found = params_match(attempt, nproc, params, TOL)
    if found is not None:
        return found
    for rec in attempt.finals().values():
        if "scale" in rec and rec["scale"] != scale:
            return Mismatch("scale", scale, rec["scale"])
    return None


def _line(tree: ast.AST, *names: str) -> list[int]:
    return sorted(c.lineno for c in calls(tree, *names))


def _unscale_after_clip(a: Attempt) -> bool:
    clips, unscales = _line(a.tree, "clip_grad_norm_", "clip_grad_value_"), _line(a.tree, "unscale_")
    return a.mismatch is not None and bool(clips) and bool(unscales) and min(unscales) > min(clips)


def _divides_by_scale(tree: ast.AST) -> bool:
    """Something is divided by ``scaler.get_scale()`` (``x /= ...`` or ``x / ...``): an unscale by hand."""
    for node in ast.walk(tree):
        right = node.value if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div) else \
            node.right if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) else None
        if right is not None and calls(right, "get_scale"):
            return True
    return False


def _clip_after_step(a: Attempt) -> bool:
    clips, steps = _line(a.tree, "clip_grad_norm_", "clip_grad_value_"), _line(a.tree, "step")
    return a.mismatch is not None and bool(clips) and bool(steps) and min(clips) > min(steps)


EXERCISE = Exercise(
    id="11", lab="11", title="Gradients clipped while still scaled",
    task="Every rank ends with the model one process gets from every rank's batches in float16 autocast with the "
         "GradScaler, the true (unscaled) gradient clipped to norm 0.5 at every step.",
    broken=BROKEN, reference=REFERENCE,
    hint="What is in p.grad right after scaler.scale(loss).backward(): the gradient, or the gradient times what? "
         "The GradScaler has a call that turns it back into the gradient before you look at it.",
    judge=judge, nproc=2, stall_s=2.0, tolerance=TOL, failure="params",
    wrong_fixes=(
        WrongFix(
            "unscale-after-clip",
            (Edit(_CLIP, _CLIP + "    scaler.unscale_(opt)                                      # unscale too\n"),),
            _unscale_after_clip,
            "unscale_ after the clip is too late: clip_grad_norm_ has already measured the scaled gradient (256 "
            "times too long) and cut it to 0.5, so after unscaling each step is 256 times too small. Unscale "
            "first, then clip.",
            "https://github.com/milesial/Pytorch-UNet/issues/468 ('scaler.unscale_(optimizer) should be added "
            "before gradient clipping'); https://github.com/pytorch/examples/issues/1196"),
        WrongFix(
            "clip-after-step",
            (Edit(_CLIP, ""), Edit("    scaler.update()\n", "    scaler.update()\n" + _CLIP)),
            _clip_after_step,
            "Clipping after scaler.step() clips gradients that have already been used: the step took the "
            "unclipped gradient, and the clipped one is thrown away by the next zero_grad(). The clip must come "
            "between unscale_ and step.",
            "https://github.com/milesial/Pytorch-UNet/issues/468 (a comment: clipping after scaler.step makes "
            "no sense, the step has used the gradients)"),
        WrongFix(
            "manual-unscale",
            (Edit(_CLIP, "    for p in model.parameters():                              # undo the scale by hand\n"
                         "        p.grad /= scaler.get_scale()\n" + _CLIP),),
            lambda a: a.mismatch is not None and _divides_by_scale(a.tree) and not calls(a.tree, "unscale_"),
            "Dividing by the scale yourself does not tell the GradScaler: scaler.step() still unscales, so the "
            "gradient is divided by 256 twice and the step is 256 times too small. scaler.unscale_(opt) unscales "
            "and records that it did, so step() does not do it again.",
            "https://github.com/huggingface/accelerate/issues/113 (the scaler did not know the optimizer was "
            "unscaled: 'the gradient get unscaled again')"),
    ),
    sources=("https://github.com/harubaru/waifu-diffusion/issues/64",
             "https://github.com/pytorch/examples/issues/1196"),
)
