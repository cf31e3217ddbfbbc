"""Lab 03 - mismatched shapes across ranks: what hangs, what crashes, what silently goes wrong.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/03_shapes.py --variant gather-ragged
    TORCH_DISTRIBUTED_DEBUG=DETAIL TORCH_CPP_LOG_LEVEL=INFO \
        torchrun --nproc-per-node 2 labs/03_shapes.py --variant gather-ragged
    # DETAIL names the collective and the shapes; torch 2.13 crashes with it when DDP is built
    # on gloo
    ddplab run 03 --variant gather-ragged     # the same, judged by progress, with a diagnosis

Article 000 says batches of different sizes (Example 3: 10 vs 20 rows) make DDP's all-reduce "fail
silently" and hang. They do not: DDP all-reduces GRADIENTS, shaped like the parameters; what goes
wrong is silent (each rank's mean weighs the same, so 10 rows count as 20). Collectives on tensors
whose SHAPES or DTYPES differ do break: with gloo the rank whose slot is too small aborts
(SIGABRT), its peer may get a wrong result; equal byte counts (float32 vs int32) give wrong numbers
with no error. NCCL can hang.

Variants:
  article-example   rank 0 has 10 rows, rank 1 20: DDP runs fine; the gradient is mis-weighted
                    (FIX: weight by rows).
  gather-ragged     eval all_gather of per-batch predictions; the last batch is 7 rows on rank 0,
                    6 on rank 1.
  model-mismatch    a layer whose width depends on the rank: DDP refuses it at construction.
  fixed-pad-gather  gather the sizes, pad to the largest, gather, trim: equals the single-process
                    result.
  fixed-guard       a shape check before each gather (one tiny all_gather) that names the ranks
                    and shapes.
  dtype-mismatch    all_reduce of per-shard statistics: float32 on rank 0, float64 on rank 1 (its
                    shard's file).
  dtype-same-width  the same with float64 on rank 0, int64 on rank 1: as many bytes, so no error,
                    wrong sums.
  fixed-dtype       the shard is cast to float32 as it is loaded: equals the single-process
                    statistics.
"""
import copy
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab

LAB = {
    "title": "Mismatched shapes across ranks: what hangs and what does not",
    "article": "000_5eac2459042e419e.txt",
    "nproc": 2, "min_nproc": 2,
    "variants": {
        "article-example": {
            "expect": "ok", "signature": None,
            "about": "the article's Example 3 (10 vs 20 rows): no hang; the averaged gradient is "
                     "mis-weighted, fixed by weighting the loss by rows",
        },
        "gather-ragged": {
            "expect": "failed", "signature": "gloo-size-mismatch",
            "about": "all_gather of predictions whose last batch has 7 rows on rank 0 and 6 on "
                     "rank 1: rank 1 aborts in gloo, rank 0 gets a wrong result",
        },
        "model-mismatch": {
            "expect": "failed", "signature": "ddp-model-mismatch",
            "about": "a layer width that depends on the rank: DDP refuses it at construction",
        },
        "fixed-pad-gather": {
            "expect": "ok", "signature": None,
            "about": "gather sizes, pad to the largest, gather, trim: equals single-process "
                     "predictions",
        },
        "fixed-guard": {
            "expect": "ok", "signature": None,
            "about": "a shape check before each gather names ranks and shapes (then pads, or "
                     "raises with --on-mismatch raise)",
        },
        "dtype-mismatch": {
            "expect": "failed", "signature": "gloo-size-mismatch",
            "about": "all_reduce of shard statistics, float32 on rank 0 and float64 on rank 1: "
                     "gloo aborts",
        },
        "dtype-same-width": {
            "expect": "ok", "signature": None,
            "about": "float64 on rank 0, int64 on rank 1 (8 bytes each): no error, every rank's "
                     "sums wrong",
        },
        "fixed-dtype": {
            "expect": "ok", "signature": None,
            "about": "each shard cast to float32 as it is loaded: the statistics equal the "
                     "single-process ones",
        },
    },
    "knobs": {
        "on_mismatch": {
            "type": "str", "default": "pad", "choices": ["pad", "raise"],
            "help": "fixed-guard: what the guard does when shapes differ (pad and go on, or "
                    "raise a clear error)",
        },
        "steps": {
            "type": "int", "default": 30, "range": [1, 1000],
            "help": "fixed-guard: training steps over which the guard's cost is measured",
        },
    },
}

ARTICLE_ROWS = 10      # rank r has 10 * (r + 1) rows, as in the article (10 vs 20)
# 45 rows split over 2 ranks: 23 and 22, so the last batches are 7 and 6 rows
EVAL_ROWS, BATCH = 45, 8


def article_example(ctx) -> None:
    g = torch.Generator().manual_seed(0)                 # the same data and model on every rank
    rows = [ARTICLE_ROWS * (r + 1) for r in range(ctx.world_size)]
    x_all = torch.randn(sum(rows), 100, generator=g)
    y_all = x_all[:, :5].sum(1, keepdim=True) + torch.randn(sum(rows), 1, generator=g)
    start = sum(rows[:ctx.rank])
    x, y = x_all[start:start + rows[ctx.rank]], y_all[start:start + rows[ctx.rank]]
    torch.manual_seed(0)
    net = nn.Linear(100, 1)
    # the single-process reference: all 30 rows at once
    ref = copy.deepcopy(net)
    nn.functional.mse_loss(ref(x_all), y_all).backward()
    ref_grad = torch.cat([p.grad.flatten() for p in ref.parameters()])
    model = DDP(net.to(ctx.device))
    lab.record("start", rows=x.shape[0], rows_all=rows)

    def grad_error(loss) -> float:
        model.zero_grad()
        # DDP all-reduces (averages) gradients: same shapes, no hang
        loss.backward()
        got = torch.cat([p.grad.flatten().cpu() for p in model.parameters()])
        return ((got - ref_grad).norm() / ref_grad.norm()).item()

    out = model(x.to(ctx.device))
    # BROKEN (silently): the mean over MY rows; DDP then averages ranks equally, so 10 rows
    # weigh like 20.
    naive = grad_error(nn.functional.mse_loss(out, y.to(ctx.device)))
    # FIX: all-reduce the row count and weight the loss by rows: sum / total * world (DDP divides
    # by world).
    total = torch.tensor([x.shape[0]], device=ctx.device)
    dist.all_reduce(total)
    out = model(x.to(ctx.device))
    summed = nn.functional.mse_loss(out, y.to(ctx.device), reduction="sum")
    weighted = grad_error(summed * ctx.world_size / total.item())
    lab.record("grad_check", rel_err_naive=naive, rel_err_weighted=weighted,
               rows_total=int(total.item()))


def eval_shards(ctx):
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(EVAL_ROWS, 16, generator=g)
    torch.manual_seed(0)
    net = nn.Linear(16, 4).eval()
    with torch.no_grad():
        reference = net(x_all)                            # the single-process predictions
    # contiguous, uneven split: 23 / 22 rows
    mine = torch.tensor_split(x_all, ctx.world_size)[ctx.rank]
    return net.to(ctx.device), mine.to(ctx.device), reference


# ---- gathering tensors whose shapes may differ: the guard and the ragged gather ----

MAXDIM = 8   # the largest number of dimensions the guard describes


class ShapeMismatchError(RuntimeError):
    """The guard found different shapes on the ranks before a collective that needs equal ones."""


def shapes_of(t: torch.Tensor, world: int) -> list[tuple[int, ...]]:
    """Every rank's shape of ``t``: one all_gather of MAXDIM+1 integers (the guard)."""
    meta = torch.full((MAXDIM + 1,), -1, dtype=torch.int64, device=t.device)
    meta[0] = t.dim()
    meta[1:1 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    got = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(got, meta)
    return [tuple(m[1:1 + int(m[0])].tolist()) for m in got]


def pad_gather(t: torch.Tensor, shapes, world: int) -> list[torch.Tensor]:
    """Pad dim 0 to the largest rank's size, gather equal shapes, trim each back."""
    n = max(s[0] for s in shapes)
    padded = torch.zeros((n, *t.shape[1:]), dtype=t.dtype, device=t.device)
    padded[:t.shape[0]] = t
    got = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(got, padded)
    return [g[:s[0]] for g, s in zip(got, shapes)]


def mismatch_message(shapes, where: str) -> str:
    return ("tensors must have the same shape on every rank for all_gather: " +
            ", ".join(f"rank {r} has {list(s)}" for r, s in enumerate(shapes)) + f" ({where})")


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
                dist.all_gather(got, pred)  # BROKEN: the last batch has 7 rows here, 6 there
            elif variant == "fixed-pad-gather":
                shapes = shapes_of(pred, ctx.world_size)
                got = pad_gather(pred, shapes, ctx.world_size)  # FIX: sizes, pad, gather, trim
            else:  # fixed-guard
                t0 = time.perf_counter()
                shapes = shapes_of(pred, ctx.world_size)  # FIX: check shapes before the collective
                if len(set(shapes)) > 1:
                    ms = 1e3 * (time.perf_counter() - t0)
                    msg = mismatch_message(shapes, f"batch {b}, found in {ms:.2f} ms")
                    lab.record("guard_caught", batch=b, shapes=[list(s) for s in shapes],
                               message=msg, ms=ms)
                    if on_mismatch == "raise":
                        raise ShapeMismatchError(msg)
                    got = pad_gather(pred, shapes, ctx.world_size)
                else:
                    got = [torch.empty_like(pred) for _ in range(ctx.world_size)]
                    dist.all_gather(got, pred)
            per_batch.append([g.cpu() for g in got])
    # per_batch[b][r] is rank r's batch b; the split was contiguous, so rank-major order is the
    # original one
    preds = torch.cat([torch.cat([pb[r] for pb in per_batch]) for r in range(ctx.world_size)])
    same = preds.shape == reference.shape
    lab.record("compare", rows=preds.shape[0], ref_rows=reference.shape[0],
               max_abs_diff=(preds - reference).abs().max().item() if same else None,
               equal=bool(same and torch.allclose(preds, reference, atol=1e-6)))


def model_mismatch(ctx, *_) -> None:
    net = nn.Linear(8, 4 + ctx.rank)  # BROKEN: the layer width depends on the rank
    lab.record("built", weight_shape=list(net.weight.shape))
    DDP(net.to(ctx.device))           # DDP compares parameter shapes across ranks here


# each shard file's dtype: (rank 0's, the others')
SHARD_DTYPE = {"dtype-mismatch": (torch.float32, torch.float64),
               "dtype-same-width": (torch.float64, torch.int64),
               "fixed-dtype": (torch.float32, torch.float64)}


def shard_stats(ctx, variant: str, *_) -> None:
    """Normalisation statistics over every rank's shard: sum and sum of squares, all-reduced."""
    g = torch.Generator().manual_seed(2)
    shards = torch.randint(0, 10, (ctx.world_size, EVAL_ROWS, 4), generator=g)
    reference = torch.stack([shards.sum((0, 1)), (shards * shards).sum((0, 1))]).double()
    x = shards[ctx.rank].to(SHARD_DTYPE[variant][min(ctx.rank, 1)])
    if variant == "fixed-dtype":
        x = x.to(torch.float32)  # FIX: one dtype on every rank, chosen by the code
    stats = torch.stack([x.sum(0), (x * x).sum(0)]).to(ctx.device)
    lab.record("start", dtype=str(stats.dtype).removeprefix("torch."),
               bytes_per_element=stats.element_size())
    dist.all_reduce(stats)  # BROKEN unless every rank's stats have one dtype
    got = stats.cpu().double()
    lab.record("compare", rows=EVAL_ROWS * ctx.world_size, equal=bool(torch.equal(got, reference)),
               max_abs_diff=(got - reference).abs().max().item(), sums=got[0].tolist())


# the variants that differ by procedure; the gather variants differ by a line (evaluate)
PROCEDURES = {"article-example": lambda ctx, *_: article_example(ctx),
              "model-mismatch": model_mismatch, **dict.fromkeys(SHARD_DTYPE, shard_stats)}


def guard_cost(ctx, steps: int) -> None:
    """Lab 03 fixed-guard, per training step: the guard's time against the step's own time
    (forward, backward, DDP all-reduce)."""
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


def main(variant: str, *, on_mismatch: str, steps: int) -> None:
    ctx = lab.setup()
    builds_ddp = variant in ("article-example", "model-mismatch", "fixed-guard")
    detail = os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL"
    if detail and ctx.backend == "gloo" and builds_ddp:
        lab.log("WARNING: TORCH_DISTRIBUTED_DEBUG=DETAIL crashes (SIGSEGV) when DDP is built on "
                "gloo with torch 2.13; use it around plain collectives (variant gather-ragged)")
    PROCEDURES.get(variant, evaluate)(ctx, variant, on_mismatch)
    if variant == "fixed-guard":
        guard_cost(ctx, steps)
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    from ddplab.rank import lab_args

    variant, knobs = lab_args.parse(LAB, __doc__)
    main(variant, **knobs)
