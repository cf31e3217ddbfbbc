"""Lab 03 - mismatched shapes across ranks: what hangs, what crashes, what silently goes wrong.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/03_shapes.py --variant gather-ragged
    TORCH_DISTRIBUTED_DEBUG=DETAIL TORCH_CPP_LOG_LEVEL=INFO torchrun --nproc-per-node 2 labs/03_shapes.py --variant gather-ragged
    ddplab run 03 --variant gather-ragged     # the same, judged by progress, with a diagnosis

Article 000, Example 3, says ranks whose batches differ in size (10 vs 20 rows) make DDP's
all-reduce "fail silently" and hang. They do not: DDP all-reduces GRADIENTS, which have the
parameters' shapes whatever the batch size. What really goes wrong there is silent: DDP averages the
ranks' mean gradients with equal weights, so 10 rows count as much as 20. Collectives on tensors whose
SHAPES differ (gathering ragged predictions) do break: with gloo the rank whose slot is too small
aborts (SIGABRT), while the other rank's all_gather returns a WRONG result without any error (it may
even finish before torchrun stops it); NCCL can hang or corrupt.

Variants:
  article-example   rank 0 has 10 rows, rank 1 20: DDP runs fine; the gradient is mis-weighted (FIX: weight by rows).
  gather-ragged     eval all_gather of per-batch predictions; the last batch is 7 rows on rank 0, 6 on rank 1.
  model-mismatch    a layer whose width depends on the rank: DDP refuses it at construction.
  fixed-pad-gather  gather the sizes, pad to the largest, gather, trim: equals the single-process result.
  fixed-guard       a shape check before each gather (one tiny all_gather) that names the ranks and shapes.

TORCH_DISTRIBUTED_DEBUG=DETAIL names the mismatched collective and shapes around PLAIN collectives
(gather-ragged), but on torch 2.13 CPU it crashes (SIGSEGV) when DDP is constructed on gloo, so do not
use it with article-example, model-mismatch or fixed-guard.
"""
import copy
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab import lab
from ddplab.lab_gather import ShapeMismatchError, mismatch_message, pad_gather, shapes_of

LAB = {
    "title": "Mismatched shapes across ranks: what hangs and what does not",
    "article": "000_5eac2459042e419e.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "article-example": {"expect": "ok", "signature": None,
                            "about": "the article's Example 3 (10 vs 20 rows): no hang; the averaged gradient is mis-weighted, fixed by weighting the loss by rows"},
        "gather-ragged": {"expect": "failed", "signature": "gloo-size-mismatch",
                          "about": "all_gather of predictions whose last batch has 7 rows on rank 0 and 6 on rank 1: rank 1 aborts in gloo, rank 0 gets a wrong result"},
        "model-mismatch": {"expect": "failed", "signature": "ddp-model-mismatch",
                           "about": "a layer width that depends on the rank: DDP refuses it at construction"},
        "fixed-pad-gather": {"expect": "ok", "signature": None,
                             "about": "gather sizes, pad to the largest, gather, trim: equals single-process predictions"},
        "fixed-guard": {"expect": "ok", "signature": None,
                        "about": "a shape check before each gather names ranks and shapes (then pads, or raises with --on-mismatch raise)"},
    },
}

ARTICLE_ROWS = 10      # rank r has 10 * (r + 1) rows, as in the article (10 vs 20)
EVAL_ROWS, BATCH = 45, 8   # 45 rows split over 2 ranks: 23 and 22, so the last batches are 7 and 6 rows


def article_example(ctx) -> None:
    g = torch.Generator().manual_seed(0)                 # the same data and model on every rank
    rows = [ARTICLE_ROWS * (r + 1) for r in range(ctx.world_size)]
    x_all = torch.randn(sum(rows), 100, generator=g)
    y_all = x_all[:, :5].sum(1, keepdim=True) + torch.randn(sum(rows), 1, generator=g)
    start = sum(rows[:ctx.rank])
    x, y = x_all[start:start + rows[ctx.rank]], y_all[start:start + rows[ctx.rank]]
    torch.manual_seed(0)
    net = nn.Linear(100, 1)
    ref = copy.deepcopy(net)                             # the single-process reference: all 30 rows at once
    nn.functional.mse_loss(ref(x_all), y_all).backward()
    ref_grad = torch.cat([p.grad.flatten() for p in ref.parameters()])
    model = DDP(net.to(ctx.device))
    lab.record("start", rows=x.shape[0], rows_all=rows)

    def grad_error(loss) -> float:
        model.zero_grad()
        loss.backward()                                  # DDP all-reduces (averages) gradients: same shapes, no hang
        got = torch.cat([p.grad.flatten().cpu() for p in model.parameters()])
        return ((got - ref_grad).norm() / ref_grad.norm()).item()

    out = model(x.to(ctx.device))
    # BROKEN (silently): the mean over MY rows; DDP then averages ranks equally, so 10 rows weigh like 20.
    naive = grad_error(nn.functional.mse_loss(out, y.to(ctx.device)))
    # FIX: all-reduce the row count and weight the loss by rows: sum / total * world (DDP divides by world).
    total = torch.tensor([x.shape[0]], device=ctx.device)
    dist.all_reduce(total)
    out = model(x.to(ctx.device))
    weighted = grad_error(nn.functional.mse_loss(out, y.to(ctx.device), reduction="sum") * ctx.world_size / total.item())
    lab.record("grad_check", rel_err_naive=naive, rel_err_weighted=weighted, rows_total=int(total.item()))


def eval_shards(ctx):
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(EVAL_ROWS, 16, generator=g)
    torch.manual_seed(0)
    net = nn.Linear(16, 4).eval()
    with torch.no_grad():
        reference = net(x_all)                            # the single-process predictions
    mine = torch.tensor_split(x_all, ctx.world_size)[ctx.rank]   # contiguous, uneven split: 23 / 22 rows
    return net.to(ctx.device), mine.to(ctx.device), reference


def evaluate(ctx, variant: str, on_mismatch: str) -> None:
    net, x, reference = eval_shards(ctx)
    lab.record("start", rows=x.shape[0], batches=-(-x.shape[0] // BATCH),
               debug=os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF"))
    per_batch = []
    with torch.no_grad():
        for b, xb in enumerate(x.split(BATCH)):
            pred = net(xb)
            lab.record("gather_start", batch=b, shape=list(pred.shape))
            if variant == "gather-ragged":
                got = [torch.empty_like(pred) for _ in range(ctx.world_size)]
                dist.all_gather(got, pred)               # BROKEN: the last batch has 7 rows here, 6 there
            elif variant == "fixed-pad-gather":
                got = pad_gather(pred, shapes_of(pred, ctx.world_size), ctx.world_size)  # FIX: sizes, pad, trim
            else:  # fixed-guard
                t0 = time.perf_counter()
                shapes = shapes_of(pred, ctx.world_size)  # FIX: check shapes before the collective
                if len(set(shapes)) > 1:
                    msg = mismatch_message(shapes, f"batch {b}, found in {1e3 * (time.perf_counter() - t0):.2f} ms")
                    lab.record("guard_caught", batch=b, shapes=[list(s) for s in shapes], message=msg,
                               ms=1e3 * (time.perf_counter() - t0))
                    if on_mismatch == "raise":
                        raise ShapeMismatchError(msg)
                    got = pad_gather(pred, shapes, ctx.world_size)
                else:
                    got = [torch.empty_like(pred) for _ in range(ctx.world_size)]
                    dist.all_gather(got, pred)
            per_batch.append([g.cpu() for g in got])
    # per_batch[b][r] is rank r's batch b; the split was contiguous, so rank-major order is the original
    preds = torch.cat([torch.cat([pb[r] for pb in per_batch]) for r in range(ctx.world_size)])
    lab.record("compare", rows=preds.shape[0], ref_rows=reference.shape[0],
               max_abs_diff=(preds - reference).abs().max().item() if preds.shape == reference.shape else None,
               equal=bool(preds.shape == reference.shape and torch.allclose(preds, reference, atol=1e-6)))


def guard_cost(ctx, steps: int) -> None:
    """Per training step: the guard's time against the step's own time (forward, backward, DDP all-reduce)."""
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(ctx.device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64, device=ctx.device), torch.randint(0, 10, (64,), device=ctx.device)
    step_s, guard_s = [], []
    for i in range(steps + 3):                           # 3 warm-up steps
        with lab.StepTimer() as tg:
            shapes_of(x, ctx.world_size)                 # the guard on this step's batch
        with lab.StepTimer() as ts:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        if i >= 3:
            guard_s.append(tg.seconds)
            step_s.append(ts.seconds)
    g, s = statistics.median(guard_s) * 1e3, statistics.median(step_s) * 1e3
    lab.record("guard_cost", steps=steps, guard_ms=g, step_ms=s, overhead_pct=100 * g / s)


def model_mismatch(ctx, *_) -> None:
    net = nn.Linear(8, 4 + ctx.rank)                 # BROKEN: the layer width depends on the rank
    lab.record("built", weight_shape=list(net.weight.shape))
    DDP(net.to(ctx.device))                          # DDP compares parameter shapes across ranks here


# the variants that differ by procedure; the gather variants differ by a line (evaluate)
PROCEDURES = {"article-example": lambda ctx, *_: article_example(ctx), "model-mismatch": model_mismatch}


def main(variant: str, on_mismatch: str = "pad", steps: int = 30) -> None:
    ctx = lab.setup()
    builds_ddp = variant in ("article-example", "model-mismatch", "fixed-guard")
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL" and ctx.backend == "gloo" and builds_ddp:
        lab.log("WARNING: TORCH_DISTRIBUTED_DEBUG=DETAIL crashes (SIGSEGV) when DDP is constructed on gloo with "
                "torch 2.13; use it around plain collectives (variant gather-ragged)")
    PROCEDURES.get(variant, evaluate)(ctx, variant, on_mismatch)
    if variant == "fixed-guard":
        guard_cost(ctx, steps)
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="article-example",
                   help="which version of the code to run")
    p.add_argument("--on-mismatch", choices=["pad", "raise"], default="pad",
                   help="fixed-guard: what the guard does when shapes differ (pad and go on, or raise a clear error)")
    p.add_argument("--steps", type=int, choices=range(1, 1001), metavar="1..1000", default=30,
                   help="fixed-guard: training steps over which the guard's cost is measured")
    a = p.parse_args()
    main(a.variant, a.on_mismatch, a.steps)
