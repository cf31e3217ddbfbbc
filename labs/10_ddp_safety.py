"""Lab 10 - model code that is not DDP-safe, each with its measured consequence.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/10_ddp_safety.py --variant unused-params
    ddplab run 10 --variant eval-rank0        # the same, judged by progress, with a diagnosis
Notebook: notebooks/10_ddp_safety.ipynb; its runs and measurements: ddplab.course.lab10.

Article 001 ("How can I resolve PyTorch DistributedDataParallel issues?") says DDP issues show as
"deadlocks, inconsistent model states across processes, slow training speed, or outright runtime
errors"; article 002's Example 3 says a custom layer's hand-made nn.Parameter may not follow
DataParallel to the worker devices. Each variant (LAB["variants"] below, each with the outcome it
must show; `--variant NAME` runs one) is one such piece of model code, run for real.
"""
import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab

LAB = {
    "title": "Model code that is not DDP-safe: unused parameters, BatchNorm buffers, evaluation "
             "on one rank, model.module, rank-dependent init, a custom layer under DataParallel",
    "article": "001_159326f62e29f2b3.txt", "nproc": 2, "min_nproc": 2,
    "variants": {
        "unused-params": {
            "expect": "failed", "signature": "unused-parameters",
            "about": "a head forward() never uses: DDP raises 'Expected to have finished "
                     "reduction' at iteration 2",
        },
        "unused-fixed": {
            "expect": "ok", "signature": None, "measured": "rounds of ms per step, paired",
            "about": "find_unused_parameters=True vs static_graph=True: both train; ms per step "
                     "measured",
        },
        "batchnorm": {
            "expect": "ok", "signature": None,
            "about": "BatchNorm running stats across non-IID ranks: buffer sync on/off, "
                     "averaged, vs the global batch",
        },
        "eval-rank0": {
            "expect": "hung", "signature": "hang-different-collectives",
            "about": "rank 0 evaluates through the DDP wrapper: a buffer broadcast inside "
                     "forward rank 1 never joins",
        },
        "eval-fixed": {
            "expect": "ok", "signature": None,
            "about": "evaluate model.module under no_grad (rank 0 alone, or sharded + all_reduce)",
        },
        "module-forward": {
            "expect": "ok", "signature": None,
            "about": "training forward through model.module: no gradient sync, parameters "
                     "diverge silently",
        },
        "rank-init": {
            "expect": "ok", "signature": None,
            "about": "rank-seeded init: DDP's construction broadcast fixes parameters, not "
                     "attributes or re-init after wrap",
        },
        "dp-custom-layer": {
            "expect": "ok", "signature": None,
            "about": "article 002's custom nn.Parameter layer under DataParallel (real on 2+ "
                     "GPUs, else a CPU emulation)",
        },
    },
    "knobs": {},
    "sizes": {
        "width": 64, "depth": 24, "batch": 32, "steps": 8, "cost_rounds": 12, "cost_steps": 5,
        "bn_features": 8,
        "bn_steps": 20, "rank_shift": 3.0, "momentum": 0.1,
    },
}
S = LAB["sizes"]


def batch(ctx, step, features=None, shift=0.0):
    g = torch.Generator().manual_seed(1000 * ctx.rank + step)    # every rank its own data
    x = torch.randn(S["batch"], features or S["width"], generator=g) + shift * ctx.rank
    return x.to(ctx.device), x[:, :1].sum(1, keepdim=True).to(ctx.device)


class TwoHeads(nn.Module):
    """A deep trunk, a head, and an auxiliary head that this forward() never uses."""

    def __init__(self, use_aux: bool = False):
        super().__init__()
        w = S["width"]
        self.trunk = nn.Sequential(*[m for _ in range(S["depth"]) for m in (nn.Linear(w, w),
                                                                            nn.ReLU())])
        self.head, self.aux, self.use_aux = nn.Linear(w, 1), nn.Linear(w, 1), use_aux

    def forward(self, x):
        h = self.trunk(x)
        # aux: no gradient unless used
        return self.head(h) + self.aux(h) if self.use_aux else self.head(h)


def unused_params(ctx):
    torch.manual_seed(0)
    model = ddp(TwoHeads(), ctx)  # BROKEN: self.aux gets no gradient, DDP waits for it
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, S["steps"] + 1):
        lab.record("step_start", step=step)
        x, y = batch(ctx, step)
        # iteration 2's forward raises: reduction never finished
        F.mse_loss(model(x), y).backward()
        step_all([opt])


def unused_fixed(ctx):
    configs = {
        "all params used (reference)": (dict(use_aux=True), {}),
        # FIX 1: walk the graph each step
        "find_unused_parameters=True": (dict(), dict(find_unused_parameters=True)),  # FIX
        # FIX 2: learn the unused set once
        "static_graph=True": (dict(), dict(static_graph=True)),  # FIX
    }
    unused_cost(configs, lambda mkw, dkw: ddp(TwoHeads(**mkw), ctx, **dkw),
                lambda step: batch(ctx, step), S)


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.BatchNorm1d(S["bn_features"], momentum=S["momentum"]),
                         nn.Linear(S["bn_features"], 16), nn.ReLU(), nn.Linear(16, 1))


def batchnorm(ctx):
    f, shift = S["bn_features"], S["rank_shift"]
    # the default: rank 0's buffers broadcast every forward
    runs = {"sync": ddp(bn_model(), ctx, **lab.buffer_sync(True)),
            # each rank keeps its own running statistics
            "local": ddp(bn_model(), ctx, **lab.buffer_sync(False)),
            # FIX on CPU: all_reduce-average the buffers before use
            "averaged": ddp(bn_model(), ctx, **lab.buffer_sync(False))}  # FIX
    refs = train_bn_runs(runs, lambda step: batch(ctx, step, f, shift), S["bn_steps"], f,
                         S["momentum"])
    bn = runs["averaged"].module[0]
    for buf in (bn.running_mean, bn.running_var):  # FIX: average them
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        buf /= ctx.world_size
    record_bn(ctx, runs, refs, shift, lambda: nn.SyncBatchNorm.convert_sync_batchnorm(bn_model()),
              batch(ctx, 0, f, shift))


def train_bn(ctx):
    model = ddp(bn_model(), ctx)
    loss = train(model, lambda step: batch(ctx, step, S["bn_features"]), S["steps"])
    x = torch.randn(4 * S["batch"], S["bn_features"], generator=torch.Generator().manual_seed(99))
    return model, loss, (x.to(ctx.device), x[:, :1].to(ctx.device))


def eval_rank0(ctx):
    model, loss, (x, y) = train_bn(ctx)
    if ctx.rank == 0:
        model.eval()
        with torch.no_grad():
            lab.record("eval_start", through="DDP wrapper")
            # BROKEN: DDP's forward broadcasts the buffers; rank 1 is not there
            val = F.mse_loss(model(x), y)  # BROKEN
        lab.record("eval", loss=val.item())
    # rank 1 waits here for rank 0, which waits in the broadcast
    dist.all_reduce(loss)
    lab.record("epoch", loss=loss.item())


def eval_fixed(ctx):
    model, loss, (x, y) = train_bn(ctx)
    net = model.module.eval()  # FIX: the plain module, no DDP collectives inside forward
    with torch.no_grad():
        if ctx.rank == 0:
            lab.record("eval", how="rank 0 alone, model.module", loss=F.mse_loss(net(x), y).item())
        # or: every rank its shard (rank 0's BatchNorm statistics)
        sharded = sharded_loss(net, x, y, ctx)
    lab.record("eval", how="sharded on every rank, all_reduce", loss=sharded)
    dist.all_reduce(loss)
    lab.record("epoch", loss=loss.item())


def module_forward(ctx):
    torch.manual_seed(0)
    broken = ddp(nn.Sequential(nn.Linear(S["width"], 32), nn.ReLU(), nn.Linear(32, 1)), ctx)
    torch.manual_seed(0)
    fixed = ddp(nn.Sequential(nn.Linear(S["width"], 32), nn.ReLU(), nn.Linear(32, 1)), ctx)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (broken, fixed)]
    record_replicas(0, broken, fixed)
    for step in range(1, S["steps"] + 1):
        x, y = batch(ctx, step)
        # BROKEN: bypasses DDP: no all-reduce of gradients
        F.mse_loss(broken.module(x), y).backward()  # BROKEN
        F.mse_loss(fixed(x), y).backward()          # FIX: call the wrapper
        step_all(opts)
        record_replicas(step, broken, fixed)


class Projected(nn.Module):
    """A fixed random projection (a plain attribute, or a registered buffer) and a trained head."""

    def __init__(self, as_buffer: bool):
        super().__init__()
        proj = torch.randn(S["width"], 16)
        if as_buffer:
            # FIX: a buffer is broadcast at construction and moved by .to()
            self.register_buffer("proj", proj)  # FIX
        else:
            self.proj = proj                        # BROKEN: a plain attribute, DDP never sees it
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(x @ self.proj.to(x.device))


def rank_init(ctx):
    for case in ("rank-seeded", "reinit-after-wrap", "fixed"):
        # BROKEN: a seed that depends on the rank
        torch.manual_seed(0 if case == "fixed" else ctx.rank)  # BROKEN
        net = Projected(as_buffer=case != "rank-seeded").to(ctx.device)
        # DDP broadcasts rank 0's parameters and buffers here
        model, before, after = wrap_measured(net, ctx)
        if case == "reinit-after-wrap":
            # BROKEN: re-initialised after wrapping, with the rank's seed
            model.module.head.reset_parameters()  # BROKEN
        record_rank_init(ctx, case, model, before, after, lambda step: batch(ctx, step),
                         S["steps"], S["width"])


# ---- article 002's Example 3 under DataParallel (real on 2+ GPUs, else an emulation) ----

def replicate_emulated(network, devices):
    """DataParallel's replicate() (torch/nn/parallel/replicate.py) step for step, with
    Tensor.to(device) in place of the CUDA broadcast: every module copied, every registered
    parameter and buffer moved."""
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


class CustomLayer(nn.Module):                       # article 002, Example 3, as written
    def __init__(self, input_size, hidden_size):
        super(CustomLayer, self).__init__()
        self.weight = nn.Parameter(torch.randn(input_size, hidden_size))

    def forward(self, x):
        # this operation may not have correct device affinity in a distributed environment
        return torch.matmul(x, self.weight)


# the contrast: the same weight as a plain tensor attribute
class PlainTensorLayer(nn.Module):
    def __init__(self, input_size, hidden_size, device):
        super().__init__()
        self.weight = torch.randn(input_size, hidden_size, device=device)

    def forward(self, x):
        return torch.matmul(x, self.weight)


# article 002, Example 3, as written (plus the layer choice)
class ModelWithCustomLayer(nn.Module):
    def __init__(self, input_size, hidden_size, layer=None):
        super(ModelWithCustomLayer, self).__init__()
        self.custom_layer = layer or CustomLayer(input_size, hidden_size)
        self.linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        x = self.custom_layer(x)
        x = self.linear(x)
        return x


def custom_layer(ctx) -> None:
    """Article 002's Example 3 under DataParallel, with the article's layer and with a plain tensor
    attribute: the replicas' input and weight devices, the error if any, and the output against one
    device."""
    # DataParallel is one process: rank 0 runs it, rank 1 waits
    if ctx.rank != 0:
        return
    n = torch.cuda.device_count()
    real = n >= 2
    home = torch.device("cuda", 0) if real else torch.device("cpu")
    if real:
        devices = [torch.device("cuda", i) for i in range(n)]
    else:
        devices = [torch.device("cpu"), torch.device("meta")]
    lab.record("dp_start", dp_mode="real" if real else "emulation",
               devices=[str(d) for d in devices],
               label="real nn.DataParallel" if real else
               "EMULATION of DataParallel's replicate() on CPU (the meta device stands in for "
               "GPU 1)")
    input_size, hidden_size, batch_size = 100, 50, 32            # the article's sizes
    for layer in ("nn.Parameter (article)", "plain tensor attribute"):
        torch.manual_seed(0)
        plain = (None if layer.startswith("nn.")
                 else PlainTensorLayer(input_size, hidden_size, home))
        model = ModelWithCustomLayer(input_size, hidden_size, plain)
        model = model.to(home)
        x = torch.randn(batch_size, input_size).to(home)
        if real:
            with torch.no_grad():
                # one device, no DataParallel (before the hook below)
                ref = model(x)
        seen = []
        model.custom_layer.register_forward_hook(
            lambda mod, inp, out: seen.append({"input": str(inp[0].device),
                                               "weight": str(mod.weight.device)}))
        error = None
        try:
            if real:
                out = nn.DataParallel(model, device_ids=list(range(n)))(x)
                out.pow(2).mean().backward()
                grad = model.custom_layer.weight.grad
                grad_device = str(grad.device) if grad is not None else None
                diff = float((out.detach() - ref).abs().max())
            else:
                replicas = replicate_emulated(model, devices)
                outs = [r(c.to(d)) for r, c, d in zip(replicas, x.chunk(len(devices)), devices)]
                # the meta replica holds no data to compare or back-propagate
                grad_device, diff = None, None
        except RuntimeError as e:
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            grad_device = diff = None
        same = all(s["input"] == s["weight"] for s in seen) and len(seen) == len(devices)
        lab.record("dp_layer", layer=layer, dp_mode="real" if real else "emulation", replicas=seen,
                   same_device=same,
                   error=error, grad_device=grad_device, max_abs_diff_vs_one_device=diff)


# ---- DDP helpers: wrap, compare the ranks' tensors, time configurations, BatchNorm statistics
# ----

def gathered(values) -> torch.Tensor:
    """Every rank's values (float64 all_gather): row r is rank r's."""
    # NCCL: CUDA tensors
    t = torch.as_tensor(values, dtype=torch.float64).detach().flatten().to(lab.ctx().device)
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
    return DDP(model.to(ctx.device),
               device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None, **kw)


def unused_cost(configs: dict, make, batch, sizes: dict) -> None:
    """Build each config's DDP model (name -> (model kwargs, DDP kwargs); ``make(mkw, dkw)``, an
    ``aux`` head), time ``steps`` training steps of each per round, the models interleaved; record
    each one's cost and whether aux trained."""
    rounds, steps = sizes["cost_rounds"], sizes["cost_steps"]
    models = {}
    for name, (mkw, dkw) in configs.items():
        torch.manual_seed(0)
        m = make(mkw, dkw)
        models[name] = (m, torch.optim.SGD(m.parameters(), lr=0.01),
                        m.module.aux.weight.detach().clone())
    times, round_ms, got_grad = {name: [] for name in models}, {name: [] for name in models}, {}
    step = 0
    # rounds interleave the configs (a loaded machine hits all alike)
    for rnd in range(rounds + 1):
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
            # round 0 warms up (static_graph's first step is special)
            if rnd > 0:
                times[name] += this_round
                round_ms[name].append(1e3 * statistics.median(this_round))
    for name, (m, _, aux0) in models.items():
        aux = m.module.aux.weight
        lab.record("unused_cost", config=name, ms_per_step=1e3 * statistics.median(times[name]),
                   round_ms=round_ms[name], steps=len(times[name]),
                   aux_got_grad=got_grad[name], aux_trained=not torch.equal(aux.detach(), aux0),
                   params_spread=spread(m.parameters()))


def train_bn_runs(runs: dict, batch, steps: int, features: int, momentum: float):
    """Train every DDP model of ``runs`` on this rank's batches; beside them, the running
    statistics of the global batch (what SyncBatchNorm computes) and of this rank's data alone.
    Returns those two."""
    # what SyncBatchNorm computes: the global batch
    ref_global = nn.BatchNorm1d(features, momentum=momentum)
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
    """Record each run's BatchNorm statistics and how far the ranks' evaluations (of one batch
    shifted by ``shift / 2``) are apart, the two references, then one SyncBatchNorm step (its real
    error where it needs GPUs)."""
    ref_global, ref_own = refs
    features = ref_global.num_features
    x_eval = torch.randn(64, features, generator=torch.Generator().manual_seed(7)) + shift / 2
    for k, m in runs.items():
        b = m.module[0]
        with torch.no_grad():
            # the same eval batch on every rank
            out = m.module.eval()(x_eval.to(ctx.device))
        lab.record("bn_stats", mode=k, running_mean=b.running_mean.cpu(),
                   running_var=b.running_var.cpu(),
                   eval_spread=spread([out]))
    lab.record("bn_reference", global_mean=ref_global.running_mean,
               global_var=ref_global.running_var,
               own_mean=ref_own.running_mean, own_var=ref_own.running_var,
               sync_kwarg=next(iter(lab.buffer_sync(True))))
    sync = make_sync()
    try:
        m = ddp(sync, ctx)
        F.mse_loss(m(first_batch[0]), first_batch[1]).backward()
        b = m.module[0]
        lab.record("syncbn", ok=True, device=str(ctx.device), running_mean=b.running_mean.cpu())
    # on CPU: PyTorch's own error, recorded
    except (RuntimeError, ValueError) as e:
        lab.record("syncbn", ok=False, device=str(ctx.device), error_type=type(e).__name__,
                   error=str(e)[:300])


def record_replicas(step: int, broken, fixed) -> None:
    """How far the ranks' parameters are apart in each model (and, after step 0, each one's
    checksum)."""
    sums = {} if step == 0 else {"broken_checksum": float(flat(broken.parameters()).sum()),
                                 "fixed_checksum": float(flat(fixed.parameters()).sum())}
    lab.record("replicas", step=step, broken_spread=spread(broken.parameters()),
               fixed_spread=spread(fixed.parameters()),
               **sums)


def sharded_loss(net, x, y, ctx) -> float:
    """Every rank takes rank 0's BatchNorm statistics (``net``'s buffers), evaluates its shard
    (rows r, r + W, ...), and joins one all_reduce of (summed loss, rows)."""
    # rank 1's last training forward updated its own copy after
    for b in net.buffers():
        dist.broadcast(b, src=0)                # DDP's broadcast at that forward's start
    xs, ys = x[ctx.rank::ctx.world_size], y[ctx.rank::ctx.world_size]
    sums = torch.tensor([F.mse_loss(net(xs), ys, reduction="sum").item(), len(ys)],
                        dtype=torch.float64,
                        device=ctx.device)
    dist.all_reduce(sums)
    return (sums[0] / sums[1]).item()


def step_all(opts) -> None:
    for o in opts:
        o.step()
        o.zero_grad()


def wrap_measured(net, ctx):
    """``net`` wrapped in DDP, with how far the ranks' parameters were apart before and after
    construction."""
    before = spread(net.parameters())
    model = ddp(net, ctx)
    return model, before, spread(model.parameters())


def train(model, batch, steps: int, lr: float = 0.01) -> torch.Tensor:
    """``steps`` SGD steps of ``model`` on ``batch(step)``; the summed loss (a tensor on the
    batch's device)."""
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


def record_rank_init(ctx, case: str, model, before: float, after: float, batch, steps: int,
                     width: int) -> None:
    """Train ``model`` (DDP) and record how far the ranks' parameters, projection and outputs are
    apart."""
    x_eval = torch.randn(8, width, generator=torch.Generator().manual_seed(5)).to(ctx.device)
    train(model, batch, steps)
    with torch.no_grad():
        out = model.module(x_eval)
    lab.record("rank_init", case=case, params_before=before, params_after_construction=after,
               params_after_training=spread(model.parameters()),
               proj_after_training=spread([model.module.proj]),
               outputs_after_training=spread([out]))


# the variants differ by procedure: one function each
VARIANTS = {"unused-params": unused_params, "unused-fixed": unused_fixed, "batchnorm": batchnorm,
            "eval-rank0": eval_rank0, "eval-fixed": eval_fixed, "module-forward": module_forward,
            "rank-init": rank_init, "dp-custom-layer": custom_layer}   # article 002's Example 3


def main(variant: str) -> None:  # lab 10 has no knobs: each variant is its code
    ctx = lab.setup()
    torch.set_num_threads(1)
    VARIANTS[variant](ctx)
    lab.record("done")
    lab.teardown()


if __name__ == "__main__":
    from ddplab.rank import lab_args

    variant, knobs = lab_args.parse(LAB, __doc__)
    main(variant, **knobs)
