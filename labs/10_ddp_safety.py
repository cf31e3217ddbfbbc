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
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ddplab.rank import lab, lab_dataparallel
from ddplab.rank.lab_ddp import (buffer_sync, ddp, record_bn, record_rank_init, record_replicas, sharded_loss, step_all,
                            train, train_bn_runs, unused_cost, wrap_measured)

LAB = {
    "title": "Model code that is not DDP-safe: unused parameters, BatchNorm buffers, evaluation on one rank, model.module, rank-dependent init, a custom layer under DataParallel",
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
    "sizes": {"width": 64, "depth": 24, "batch": 32, "steps": 8, "cost_rounds": 12, "cost_steps": 5, "bn_features": 8, "bn_steps": 20, "rank_shift": 3.0, "momentum": 0.1},
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
        step_all([opt])


def unused_fixed(ctx):
    configs = {"all params used (reference)": (dict(use_aux=True), {}),
               "find_unused_parameters=True": (dict(), dict(find_unused_parameters=True)),   # FIX 1: walk the graph each step
               "static_graph=True": (dict(), dict(static_graph=True))}                       # FIX 2: learn the unused set once
    unused_cost(configs, lambda mkw, dkw: ddp(TwoHeads(**mkw), ctx, **dkw), lambda step: batch(ctx, step), S)


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.BatchNorm1d(S["bn_features"], momentum=S["momentum"]), nn.Linear(S["bn_features"], 16),
                         nn.ReLU(), nn.Linear(16, 1))


def batchnorm(ctx):
    f, shift = S["bn_features"], S["rank_shift"]
    runs = {"sync": ddp(bn_model(), ctx, **buffer_sync(True)),     # the default: rank 0's buffers broadcast every forward
            "local": ddp(bn_model(), ctx, **buffer_sync(False)),   # each rank keeps its own running statistics
            "averaged": ddp(bn_model(), ctx, **buffer_sync(False))}  # FIX on CPU: all_reduce-average the buffers before use
    refs = train_bn_runs(runs, lambda step: batch(ctx, step, f, shift), S["bn_steps"], f, S["momentum"])
    for buf in (runs["averaged"].module[0].running_mean, runs["averaged"].module[0].running_var):  # FIX: average them
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        buf /= ctx.world_size
    record_bn(ctx, runs, refs, shift, lambda: nn.SyncBatchNorm.convert_sync_batchnorm(bn_model()), batch(ctx, 0, f, shift))


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
            val = F.mse_loss(model(x), y)           # BROKEN: DDP's forward broadcasts the buffers; rank 1 is not there
        lab.record("eval", loss=val.item())
    dist.all_reduce(loss)                           # rank 1 waits here for rank 0, which waits in the broadcast
    lab.record("epoch", loss=loss.item())


def eval_fixed(ctx):
    model, loss, (x, y) = train_bn(ctx)
    net = model.module.eval()                       # FIX: the plain module, no DDP collectives inside forward
    with torch.no_grad():
        if ctx.rank == 0:
            lab.record("eval", how="rank 0 alone, model.module", loss=F.mse_loss(net(x), y).item())
        sharded = sharded_loss(net, x, y, ctx)      # or: every rank its shard (rank 0's BatchNorm statistics)
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
        F.mse_loss(broken.module(x), y).backward()  # BROKEN: bypasses DDP: no all-reduce of gradients
        F.mse_loss(fixed(x), y).backward()          # FIX: call the wrapper
        step_all(opts)
        record_replicas(step, broken, fixed)


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
    for case in ("rank-seeded", "reinit-after-wrap", "fixed"):
        torch.manual_seed(0 if case == "fixed" else ctx.rank)     # BROKEN: a seed that depends on the rank
        net = Projected(as_buffer=case != "rank-seeded").to(ctx.device)
        model, before, after = wrap_measured(net, ctx)   # DDP broadcasts rank 0's parameters and buffers here
        if case == "reinit-after-wrap":
            model.module.head.reset_parameters()    # BROKEN: re-initialised after wrapping, with the rank's seed
        record_rank_init(ctx, case, model, before, after, lambda step: batch(ctx, step), S["steps"], S["width"])


VARIANTS = {"unused-params": unused_params, "unused-fixed": unused_fixed, "batchnorm": batchnorm,
            "eval-rank0": eval_rank0, "eval-fixed": eval_fixed, "module-forward": module_forward,
            "rank-init": rank_init, "dp-custom-layer": lab_dataparallel.custom_layer}   # article 002's Example 3


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
