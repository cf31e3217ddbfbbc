"""Lab 10 - model code that is not DDP-safe, each with its measured consequence.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/10_ddp_safety.py --variant unused-params
    ddplab run 10 --variant eval-rank0        # the same, judged by progress, with a diagnosis

Notebook: notebooks/10_ddp_safety.ipynb; its runs and measurements: ddplab.workbook.lab10.

Article 001 ("How can I resolve PyTorch DistributedDataParallel issues?") says DDP issues show as
"deadlocks, inconsistent model states across processes, slow training speed, or outright runtime
errors"; article 002's Example 3 says a custom layer's hand-made nn.Parameter may not follow
DataParallel to the worker devices. Each variant is one such piece of model code, run for real:

Variants:
  unused-params    a head that forward() never uses: DDP's reducer raises at the next iteration.
  unused-fixed     the same model with find_unused_parameters=True and with static_graph=True:
                   both train; ms per step measured against a model that uses every parameter.
  batchnorm        BatchNorm on non-IID ranks: running statistics with and without DDP's buffer
                   sync, averaged by hand, against the global batch's (what SyncBatchNorm gives;
                   SyncBatchNorm itself on GPUs, its real error recorded on CPU).
  eval-rank0       `if rank == 0: evaluate(model)` through the DDP wrapper: DDP broadcasts the
                   BatchNorm buffers inside forward, rank 1 is elsewhere -> hung.
  eval-fixed       evaluate model.module under no_grad: on rank 0 alone, or sharded on all ranks.
  module-forward   training forward through model.module: no gradient sync; replicas diverge
                   (max |parameter difference| across ranks per step), next to the same loop through the wrapper.
  rank-init        torch.manual_seed(rank) before building the model: what DDP's broadcast at
                   construction fixes (parameters, buffers) and what it does not (a plain tensor
                   attribute, parameters re-initialised after wrapping).
  dp-custom-layer  article 002's Example 3 layer under nn.DataParallel: real on >= 2 GPUs, else an
                   EMULATION of DataParallel's replicate() on CPU (the meta device stands in for GPU 1).
"""
import inspect
import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab import lab

LAB = {
    "title": "Model code that is not DDP-safe: unused parameters, BatchNorm buffers, evaluation on one rank, "
             "model.module, rank-dependent init, a custom layer under DataParallel",
    "article": "001_159326f62e29f2b3.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "unused-params": {"expect": "failed", "signature": "unused-parameters",
                          "about": "a head forward() never uses: DDP raises 'Expected to have finished reduction' at iteration 2"},
        "unused-fixed": {"expect": "ok", "signature": None, "measured": "rounds of ms per step, paired",
                         "about": "find_unused_parameters=True vs static_graph=True: both train; ms per step measured"},
        "batchnorm": {"expect": "ok", "signature": None,
                      "about": "BatchNorm running stats across non-IID ranks: buffer sync on/off, averaged, vs the global batch"},
        "eval-rank0": {"expect": "hung", "signature": "hang-different-collectives",
                       "about": "rank 0 evaluates through the DDP wrapper: a buffer broadcast inside forward rank 1 never joins"},
        "eval-fixed": {"expect": "ok", "signature": None,
                       "about": "evaluate model.module under no_grad (rank 0 alone, or sharded + all_reduce)"},
        "module-forward": {"expect": "ok", "signature": None,
                           "about": "training forward through model.module: no gradient sync, parameters diverge silently"},
        "rank-init": {"expect": "ok", "signature": None,
                      "about": "rank-seeded init: DDP's construction broadcast fixes parameters, not attributes or re-init after wrap"},
        "dp-custom-layer": {"expect": "ok", "signature": None,
                            "about": "article 002's custom nn.Parameter layer under DataParallel (real on 2+ GPUs, else a CPU emulation)"},
    },
    "sizes": {"width": 64, "depth": 24, "batch": 32, "steps": 8, "cost_rounds": 12, "cost_steps": 5,
              "bn_features": 8, "bn_steps": 20, "rank_shift": 3.0, "momentum": 0.1},
}
S = LAB["sizes"]


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


def batch(ctx, step, features=None, shift=0.0):
    g = torch.Generator().manual_seed(1000 * ctx.rank + step)    # every rank its own data
    x = torch.randn(S["batch"], features or S["width"], generator=g) + shift * ctx.rank
    return x.to(ctx.device), x[:, :1].sum(1, keepdim=True).to(ctx.device)


def ddp(model, ctx, **kw):
    return DDP(model.to(ctx.device), device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None, **kw)


def buffer_sync(on: bool) -> dict:
    """DDP's buffer-sync switch: torch >= 2.13 names it forward_sync_buffers (broadcast_buffers is deprecated)."""
    name = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters else "broadcast_buffers"
    return {name: on}


# --- unused parameters -----------------------------------------------------------------------------

class TwoHeads(nn.Module):
    """A deep trunk, a head, and an auxiliary head that this forward() never uses."""

    def __init__(self, use_aux: bool = False):
        super().__init__()
        w = S["width"]
        self.trunk = nn.Sequential(*[m for _ in range(S["depth"]) for m in (nn.Linear(w, w), nn.ReLU())])
        self.head, self.aux, self.use_aux = nn.Linear(w, 1), nn.Linear(w, 1), use_aux

    def forward(self, x):
        h = self.trunk(x)
        return self.head(h) + self.aux(h) if self.use_aux else self.head(h)   # aux: no gradient unless used


def unused_params(ctx):
    torch.manual_seed(0)
    model = ddp(TwoHeads(), ctx)                    # BROKEN: self.aux gets no gradient, DDP waits for it
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, S["steps"] + 1):
        lab.record("step_start", step=step)
        x, y = batch(ctx, step)
        F.mse_loss(model(x), y).backward()          # iteration 2's forward raises: reduction never finished
        opt.step()
        opt.zero_grad()


def unused_fixed(ctx):
    configs = {"all params used (reference)": (dict(use_aux=True), {}),
               "find_unused_parameters=True": (dict(), dict(find_unused_parameters=True)),   # FIX 1: walk the graph each step
               "static_graph=True": (dict(), dict(static_graph=True))}                       # FIX 2: learn the unused set once
    models = {}
    for name, (mkw, dkw) in configs.items():
        torch.manual_seed(0)
        m = ddp(TwoHeads(**mkw), ctx, **dkw)
        models[name] = (m, torch.optim.SGD(m.parameters(), lr=0.01), m.module.aux.weight.detach().clone())
    times, rounds, got_grad = {name: [] for name in configs}, {name: [] for name in configs}, {}
    step = 0
    for rnd in range(S["cost_rounds"] + 1):         # rounds interleave the configs (a loaded machine hits all alike)
        for name, (m, opt, _) in models.items():
            this_round = []
            for _ in range(S["cost_steps"]):
                step += 1
                x, y = batch(ctx, step)
                with lab.StepTimer() as t:
                    F.mse_loss(m(x), y).backward()
                    got_grad[name] = m.module.aux.weight.grad is not None
                    opt.step()
                    opt.zero_grad()
                this_round.append(t.seconds)
            if rnd > 0:                              # round 0 warms up (static_graph's first step is special)
                times[name] += this_round
                rounds[name].append(1e3 * statistics.median(this_round))
    for name, (m, _, aux0) in models.items():
        aux = m.module.aux.weight
        lab.record("unused_cost", config=name, ms_per_step=1e3 * statistics.median(times[name]),
                   round_ms=rounds[name], steps=len(times[name]),
                   aux_got_grad=got_grad[name], aux_trained=not torch.equal(aux.detach(), aux0),
                   params_spread=spread(m.parameters()))


# --- BatchNorm running statistics ------------------------------------------------------------------

def bn_model():
    torch.manual_seed(0)
    f = S["bn_features"]
    return nn.Sequential(nn.BatchNorm1d(f, momentum=S["momentum"]), nn.Linear(f, 16), nn.ReLU(), nn.Linear(16, 1))


def batchnorm(ctx):
    f, shift = S["bn_features"], S["rank_shift"]
    runs = {"sync": ddp(bn_model(), ctx, **buffer_sync(True)),     # the default: rank 0's buffers broadcast every forward
            "local": ddp(bn_model(), ctx, **buffer_sync(False)),   # each rank keeps its own running statistics
            "averaged": ddp(bn_model(), ctx, **buffer_sync(False))}  # FIX on CPU: all_reduce-average the buffers before use
    ref_global = nn.BatchNorm1d(f, momentum=S["momentum"])          # what SyncBatchNorm computes: the global batch
    ref_own = nn.BatchNorm1d(f, momentum=S["momentum"])             # this rank's data alone
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in runs.items()}
    for step in range(S["bn_steps"]):
        x, y = batch(ctx, step, f, shift)
        for k, m in runs.items():
            F.mse_loss(m(x), y).backward()
            opts[k].step()
            opts[k].zero_grad()
        every = gathered(x).view(-1, f).float()
        ref_global(every)
        ref_own(x.cpu())
    bn = runs["averaged"].module[0]
    for buf in (bn.running_mean, bn.running_var):                   # FIX: average what each rank saw
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        buf /= ctx.world_size
    x_eval = torch.randn(64, f, generator=torch.Generator().manual_seed(7)) + shift / 2
    for k, m in runs.items():
        b = m.module[0]
        with torch.no_grad():
            out = m.module.eval()(x_eval.to(ctx.device))             # the same eval batch on every rank
        lab.record("bn_stats", mode=k, running_mean=b.running_mean.cpu(), running_var=b.running_var.cpu(),
                   eval_spread=spread([out]))
    lab.record("bn_reference", global_mean=ref_global.running_mean, global_var=ref_global.running_var,
               own_mean=ref_own.running_mean, own_var=ref_own.running_var, sync_kwarg=next(iter(buffer_sync(True))))
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(bn_model())
    try:
        m = ddp(sync, ctx)
        F.mse_loss(m(batch(ctx, 0, f, shift)[0]), batch(ctx, 0, f, shift)[1]).backward()
        b = m.module[0]
        lab.record("syncbn", ok=True, device=str(ctx.device), running_mean=b.running_mean.cpu())
    except (RuntimeError, ValueError) as e:                          # on CPU: PyTorch's own error, recorded
        lab.record("syncbn", ok=False, device=str(ctx.device), error_type=type(e).__name__, error=str(e)[:300])


# --- evaluation on one rank ------------------------------------------------------------------------

def train_bn(ctx):
    model = ddp(bn_model(), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = torch.zeros(1, device=ctx.device)
    for step in range(S["steps"]):
        x, y = batch(ctx, step, S["bn_features"])
        l = F.mse_loss(model(x), y)
        l.backward()
        opt.step()
        opt.zero_grad()
        loss += l.detach()
    return model, loss


def val_set(ctx):
    g = torch.Generator().manual_seed(99)
    x = torch.randn(4 * S["batch"], S["bn_features"], generator=g)
    return x.to(ctx.device), x[:, :1].to(ctx.device)


def eval_rank0(ctx):
    model, loss = train_bn(ctx)
    if ctx.rank == 0:
        x, y = val_set(ctx)
        model.eval()
        with torch.no_grad():
            lab.record("eval_start", through="DDP wrapper")
            val = F.mse_loss(model(x), y)           # BROKEN: DDP's forward broadcasts the buffers; rank 1 is not there
        lab.record("eval", loss=val.item())
    dist.all_reduce(loss)                           # rank 1 waits here for rank 0, which waits in the broadcast
    lab.record("epoch", loss=loss.item())


def eval_fixed(ctx):
    model, loss = train_bn(ctx)
    x, y = val_set(ctx)
    net = model.module.eval()                       # FIX: the plain module, no DDP collectives inside forward
    with torch.no_grad():
        if ctx.rank == 0:
            lab.record("eval", how="rank 0 alone, model.module", loss=F.mse_loss(net(x), y).item())
        for b in net.buffers():                     # every rank takes rank 0's BatchNorm statistics: rank 1's last
            dist.broadcast(b, src=0)                # training forward updated its own copy after DDP's broadcast
        xs, ys = x[ctx.rank::ctx.world_size], y[ctx.rank::ctx.world_size]   # or: every rank its shard
        sums = torch.tensor([F.mse_loss(net(xs), ys, reduction="sum").item(), len(ys)], dtype=torch.float64,
                            device=ctx.device)
        dist.all_reduce(sums)                       # every rank joins this one
    lab.record("eval", how="sharded on every rank, all_reduce", loss=(sums[0] / sums[1]).item())
    dist.all_reduce(loss)
    lab.record("epoch", loss=loss.item())


# --- training through model.module ----------------------------------------------------------------

def module_forward(ctx):
    torch.manual_seed(0)
    broken = ddp(nn.Sequential(nn.Linear(S["width"], 32), nn.ReLU(), nn.Linear(32, 1)), ctx)
    torch.manual_seed(0)
    fixed = ddp(nn.Sequential(nn.Linear(S["width"], 32), nn.ReLU(), nn.Linear(32, 1)), ctx)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (broken, fixed)]
    lab.record("replicas", step=0, broken_spread=spread(broken.parameters()), fixed_spread=spread(fixed.parameters()))
    for step in range(1, S["steps"] + 1):
        x, y = batch(ctx, step)
        F.mse_loss(broken.module(x), y).backward()  # BROKEN: bypasses DDP: no all-reduce of gradients
        F.mse_loss(fixed(x), y).backward()          # FIX: call the wrapper
        for o in opts:
            o.step()
            o.zero_grad()
        lab.record("replicas", step=step, broken_spread=spread(broken.parameters()), fixed_spread=spread(fixed.parameters()),
                   broken_checksum=float(flat(broken.parameters()).sum()), fixed_checksum=float(flat(fixed.parameters()).sum()))


# --- rank-dependent initialisation -----------------------------------------------------------------

class Projected(nn.Module):
    """A fixed random projection (a plain attribute, or a registered buffer) and a trained head."""

    def __init__(self, as_buffer: bool):
        super().__init__()
        proj = torch.randn(S["width"], 16)
        if as_buffer:
            self.register_buffer("proj", proj)      # FIX: a buffer is broadcast at construction and moved by .to()
        else:
            self.proj = proj                        # BROKEN: a plain attribute, DDP never sees it
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(x @ self.proj.to(x.device))


def rank_init(ctx):
    x_eval = torch.randn(8, S["width"], generator=torch.Generator().manual_seed(5)).to(ctx.device)
    for case in ("rank-seeded", "reinit-after-wrap", "fixed"):
        torch.manual_seed(0 if case == "fixed" else ctx.rank)     # BROKEN: a seed that depends on the rank
        net = Projected(as_buffer=case != "rank-seeded").to(ctx.device)
        before = spread(net.parameters())
        model = ddp(net, ctx)                       # DDP broadcasts rank 0's parameters and buffers here
        after = spread(model.parameters())
        if case == "reinit-after-wrap":
            model.module.head.reset_parameters()    # BROKEN: re-initialised after wrapping, with the rank's seed
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(S["steps"]):
            x, y = batch(ctx, step)
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            out = model.module(x_eval)
        lab.record("rank_init", case=case, params_before=before, params_after_construction=after,
                   params_after_training=spread(model.parameters()), proj_after_training=spread([model.module.proj]),
                   outputs_after_training=spread([out]))


# --- article 002, Example 3: a custom layer under DataParallel --------------------------------------

class CustomLayer(nn.Module):                       # article 002, Example 3, as written
    def __init__(self, input_size, hidden_size):
        super(CustomLayer, self).__init__()
        self.weight = nn.Parameter(torch.randn(input_size, hidden_size))

    def forward(self, x):
        # this operation may not have correct device affinity in a distributed environment
        return torch.matmul(x, self.weight)


class PlainTensorLayer(nn.Module):                  # the contrast: the same weight as a plain tensor attribute
    def __init__(self, input_size, hidden_size, device):
        super().__init__()
        self.weight = torch.randn(input_size, hidden_size, device=device)

    def forward(self, x):
        return torch.matmul(x, self.weight)


class ModelWithCustomLayer(nn.Module):              # article 002, Example 3, as written (plus the layer choice)
    def __init__(self, input_size, hidden_size, layer=None):
        super(ModelWithCustomLayer, self).__init__()
        self.custom_layer = layer or CustomLayer(input_size, hidden_size)
        self.linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        x = self.custom_layer(x)
        x = self.linear(x)
        return x


def replicate_emulated(network, devices):
    """DataParallel's replicate() (torch/nn/parallel/replicate.py) step for step, with Tensor.to(device)
    in place of the CUDA broadcast: every module copied, every registered parameter and buffer moved."""
    modules = list(network.modules())
    copies = [[m._replicate_for_data_parallel() for m in modules] for _ in devices]
    index = {m: i for i, m in enumerate(modules)}
    for i, m in enumerate(modules):
        for j, d in enumerate(devices):
            r = copies[j][i]
            for key, child in m._modules.items():
                setattr(r, key, copies[j][index[child]])
            for key, p in m._parameters.items():
                setattr(r, key, p.to(d))            # a registered nn.Parameter follows the replica
            for key, b in m._buffers.items():
                setattr(r, key, b.to(d))
    return [c[0] for c in copies]


def dp_custom_layer(ctx):
    if ctx.rank != 0:                               # DataParallel is one process: rank 0 runs it, rank 1 waits
        return
    n = torch.cuda.device_count()
    real = n >= 2
    home = torch.device("cuda", 0) if real else torch.device("cpu")
    devices = [torch.device("cuda", i) for i in range(n)] if real else [torch.device("cpu"), torch.device("meta")]
    lab.record("dp_start", dp_mode="real" if real else "emulation", devices=[str(d) for d in devices],
               label="real nn.DataParallel" if real else
               "EMULATION of DataParallel's replicate() on CPU (the meta device stands in for GPU 1)")
    input_size, hidden_size, batch_size = 100, 50, 32            # the article's sizes
    for layer in ("nn.Parameter (article)", "plain tensor attribute"):
        torch.manual_seed(0)
        model = ModelWithCustomLayer(input_size, hidden_size,
                                     None if layer.startswith("nn.") else PlainTensorLayer(input_size, hidden_size, home))
        model = model.to(home)
        x = torch.randn(batch_size, input_size).to(home)
        if real:
            with torch.no_grad():
                ref = model(x)                      # one device, no DataParallel (before the hook below)
        seen = []
        model.custom_layer.register_forward_hook(
            lambda mod, inp, out: seen.append({"input": str(inp[0].device), "weight": str(mod.weight.device)}))
        error = None
        try:
            if real:
                out = nn.DataParallel(model, device_ids=list(range(n)))(x)
                out.pow(2).mean().backward()
                grad_device = str(model.custom_layer.weight.grad.device) if model.custom_layer.weight.grad is not None else None
                diff = float((out.detach() - ref).abs().max())
            else:
                replicas = replicate_emulated(model, devices)
                outs = [r(c.to(d)) for r, c, d in zip(replicas, x.chunk(len(devices)), devices)]
                grad_device, diff = None, None      # the meta replica holds no data to compare or back-propagate
        except RuntimeError as e:
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            grad_device = diff = None
        lab.record("dp_layer", layer=layer, dp_mode="real" if real else "emulation", replicas=seen,
                   same_device=all(s["input"] == s["weight"] for s in seen) and len(seen) == len(devices),
                   error=error, grad_device=grad_device, max_abs_diff_vs_one_device=diff)


VARIANTS = {"unused-params": unused_params, "unused-fixed": unused_fixed, "batchnorm": batchnorm,
            "eval-rank0": eval_rank0, "eval-fixed": eval_fixed, "module-forward": module_forward,
            "rank-init": rank_init, "dp-custom-layer": dp_custom_layer}


def main(variant: str) -> None:
    ctx = lab.setup()
    torch.set_num_threads(1)
    VARIANTS[variant](ctx)
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="unused-params",
                   help="which piece of not-DDP-safe code (or its fix) to run")
    main(p.parse_args().variant)
