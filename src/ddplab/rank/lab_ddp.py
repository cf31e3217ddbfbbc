"""DDP helpers lab scripts share (lab 10): wrapping a model for this rank's device, DDP's buffer-sync
switch, how far the ranks' tensors are apart, paired step timing of several DDP configurations, and
BatchNorm's running statistics against the global batch's. Imported by lab scripts only (it imports torch)."""
from __future__ import annotations

import inspect
import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab


def gathered(values) -> torch.Tensor:
    """Every rank's values (float64 all_gather): row r is rank r's."""
    t = torch.as_tensor(values, dtype=torch.float64).detach().flatten().to(lab.ctx().device)  # NCCL: CUDA tensors
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out).cpu()


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().double().cpu().flatten() for t in tensors])


def spread(tensors) -> float:
    """max |rank i - rank j| over every element of ``tensors`` (parameters, buffers, outputs)."""
    rows = gathered(flat(tensors))
    return float((rows.max(0).values - rows.min(0).values).max())


def ddp(model, ctx, **kw):
    return DDP(model.to(ctx.device), device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None, **kw)


def buffer_sync(on: bool) -> dict:
    """DDP's buffer-sync switch: torch >= 2.13 names it forward_sync_buffers (broadcast_buffers is deprecated)."""
    name = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else "broadcast_buffers"
    return {name: on}


def unused_cost(configs: dict, make, batch, sizes: dict) -> None:
    """Build each config's DDP model (name -> (model kwargs, DDP kwargs); ``make(mkw, dkw)``, an ``aux`` head),
    time ``steps`` training steps of each per round, the models interleaved; record each one's cost and
    whether aux trained."""
    rounds, steps = sizes["cost_rounds"], sizes["cost_steps"]
    models = {}
    for name, (mkw, dkw) in configs.items():
        torch.manual_seed(0)
        m = make(mkw, dkw)
        models[name] = (m, torch.optim.SGD(m.parameters(), lr=0.01), m.module.aux.weight.detach().clone())
    times, round_ms, got_grad = {name: [] for name in models}, {name: [] for name in models}, {}
    step = 0
    for rnd in range(rounds + 1):                   # rounds interleave the configs (a loaded machine hits all alike)
        for name, (m, opt, _) in models.items():
            this_round = []
            for _ in range(steps):
                step += 1
                x, y = batch(step)
                with lab.StepTimer() as t:
                    F.mse_loss(m(x), y).backward()
                    got_grad[name] = m.module.aux.weight.grad is not None
                    opt.step()
                    opt.zero_grad()
                this_round.append(t.seconds)
            if rnd > 0:                              # round 0 warms up (static_graph's first step is special)
                times[name] += this_round
                round_ms[name].append(1e3 * statistics.median(this_round))
    for name, (m, _, aux0) in models.items():
        aux = m.module.aux.weight
        lab.record("unused_cost", config=name, ms_per_step=1e3 * statistics.median(times[name]),
                   round_ms=round_ms[name], steps=len(times[name]),
                   aux_got_grad=got_grad[name], aux_trained=not torch.equal(aux.detach(), aux0),
                   params_spread=spread(m.parameters()))


def train_bn_runs(runs: dict, batch, steps: int, features: int, momentum: float):
    """Train every DDP model of ``runs`` on this rank's batches; beside them, the running statistics of
    the global batch (what SyncBatchNorm computes) and of this rank's data alone. Returns those two."""
    ref_global = nn.BatchNorm1d(features, momentum=momentum)        # what SyncBatchNorm computes: the global batch
    ref_own = nn.BatchNorm1d(features, momentum=momentum)           # this rank's data alone
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in runs.items()}
    for step in range(steps):
        x, y = batch(step)
        for k, m in runs.items():
            F.mse_loss(m(x), y).backward()
            opts[k].step()
            opts[k].zero_grad()
        every = gathered(x).view(-1, features).float()
        ref_global(every)
        ref_own(x.cpu())
    return ref_global, ref_own


def record_bn(ctx, runs: dict, refs, shift: float, make_sync, first_batch) -> None:
    """Record each run's BatchNorm statistics and how far the ranks' evaluations (of one batch shifted by
    ``shift / 2``) are apart, the two references, then one SyncBatchNorm step (its real error where it needs GPUs)."""
    ref_global, ref_own = refs
    features = ref_global.num_features
    x_eval = torch.randn(64, features, generator=torch.Generator().manual_seed(7)) + shift / 2
    for k, m in runs.items():
        b = m.module[0]
        with torch.no_grad():
            out = m.module.eval()(x_eval.to(ctx.device))             # the same eval batch on every rank
        lab.record("bn_stats", mode=k, running_mean=b.running_mean.cpu(), running_var=b.running_var.cpu(),
                   eval_spread=spread([out]))
    lab.record("bn_reference", global_mean=ref_global.running_mean, global_var=ref_global.running_var,
               own_mean=ref_own.running_mean, own_var=ref_own.running_var, sync_kwarg=next(iter(buffer_sync(True))))
    sync = make_sync()
    try:
        m = ddp(sync, ctx)
        F.mse_loss(m(first_batch[0]), first_batch[1]).backward()
        b = m.module[0]
        lab.record("syncbn", ok=True, device=str(ctx.device), running_mean=b.running_mean.cpu())
    except (RuntimeError, ValueError) as e:                          # on CPU: PyTorch's own error, recorded
        lab.record("syncbn", ok=False, device=str(ctx.device), error_type=type(e).__name__, error=str(e)[:300])


def record_replicas(step: int, broken, fixed) -> None:
    """How far the ranks' parameters are apart in each model (and, after step 0, each one's checksum)."""
    sums = {} if step == 0 else {"broken_checksum": float(flat(broken.parameters()).sum()),
                                 "fixed_checksum": float(flat(fixed.parameters()).sum())}
    lab.record("replicas", step=step, broken_spread=spread(broken.parameters()), fixed_spread=spread(fixed.parameters()),
               **sums)


def sharded_loss(net, x, y, ctx) -> float:
    """Every rank takes rank 0's BatchNorm statistics (``net``'s buffers), evaluates its shard (rows r, r + W,
    ...), and joins one all_reduce of (summed loss, rows)."""
    for b in net.buffers():                     # rank 1's last training forward updated its own copy after
        dist.broadcast(b, src=0)                # DDP's broadcast at that forward's start
    xs, ys = x[ctx.rank::ctx.world_size], y[ctx.rank::ctx.world_size]
    sums = torch.tensor([F.mse_loss(net(xs), ys, reduction="sum").item(), len(ys)], dtype=torch.float64,
                        device=ctx.device)
    dist.all_reduce(sums)
    return (sums[0] / sums[1]).item()


def step_all(opts) -> None:
    for o in opts:
        o.step()
        o.zero_grad()


def wrap_measured(net, ctx):
    """``net`` wrapped in DDP, with how far the ranks' parameters were apart before and after construction."""
    before = spread(net.parameters())
    model = ddp(net, ctx)
    return model, before, spread(model.parameters())


def train(model, batch, steps: int, lr: float = 0.01) -> torch.Tensor:
    """``steps`` SGD steps of ``model`` on ``batch(step)``; the summed loss (a tensor on the batch's device)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss = torch.zeros(1, device=next(model.parameters()).device)
    for step in range(steps):
        x, y = batch(step)
        l = F.mse_loss(model(x), y)
        l.backward()
        opt.step()
        opt.zero_grad()
        loss += l.detach()
    return loss


def record_rank_init(ctx, case: str, model, before: float, after: float, batch, steps: int, width: int) -> None:
    """Train ``model`` (DDP) and record how far the ranks' parameters, projection and outputs are apart."""
    x_eval = torch.randn(8, width, generator=torch.Generator().manual_seed(5)).to(ctx.device)
    train(model, batch, steps)
    with torch.no_grad():
        out = model.module(x_eval)
    lab.record("rank_init", case=case, params_before=before, params_after_construction=after,
               params_after_training=spread(model.parameters()), proj_after_training=spread([model.module.proj]),
               outputs_after_training=spread([out]))
