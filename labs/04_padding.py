"""Lab 04 - padded variable-length sequences under DataParallel and DDP.

Run it by itself (gloo on CPU; real nn.DataParallel when 2+ GPUs exist):

    torchrun --nproc-per-node 2 labs/04_padding.py --variant dp-broken
    ddplab run 04 --variant ddp-broken      # the same, judged by progress, with a diagnosis

Article 002 ("Why is training not starting with nn.DataParallel?") pads each batch in its
collate_fn and says DataParallel "expects a completely consistent tensor". `article-example1` runs
its Example 1 as written (nn.Linear(10, 20) on pad_sequence batches, Adam): a batch padded BEFORE
the split gives every replica the same length, so it trains. The extension (not the article's code)
is a model that packs the padded batch and unpacks it with pad_packed_sequence() pads its output
back only to the longest sequence *it* saw. DataParallel splits the batch along dim 0, each replica
sees another chunk, so the replicas return different lengths and gather() cannot concatenate them.
`total_length=` fixes it. DDP has the same trap at evaluation time: each rank's outputs are as long
as its own longest sequence, and all_gather needs equal shapes. And padding costs throughput:
length-bucketed batches waste less.

Without 2 GPUs the DataParallel variants run an EMULATION of DataParallel's own steps on CPU
(scatter: Tensor.chunk along dim 0; a replica per chunk; gather: torch.cat along dim 0), with the
same model and the same broken/fixed line. DataParallel is one process: only rank 0 runs the dp-*
variants.

Notebook: notebooks/04_padding.ipynb; workbook module: ddplab.course.lab04.

Variants: LAB["variants"] below, each with the outcome it must show; `--variant NAME` runs one.
"""
import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

from ddplab.rank import lab

LAB = {
    "title": "Padded variable-length sequences under DataParallel and DDP",
    "article": "002_3b7eff0f44992b59.txt",
    "nproc": 2, "min_nproc": 2,
    "variants": {
        "article-example1": {
            "expect": "ok", "signature": None,
            "about": "the article's Example 1 as written (nn.Linear on pad_sequence batches) "
                     "under DataParallel (emulation on CPU without 2 GPUs)",
        },
        "dp-broken": {
            "expect": "failed", "signature": "tensor-size-mismatch",
            "about": "extension, not the article's code: an LSTM under DataParallel (emulation "
                     "on CPU): each replica unpads to its own chunk's longest sequence; gather "
                     "fails",
        },
        "dp-fixed": {
            "expect": "ok", "signature": None,
            "about": "pad_packed_sequence(..., total_length=x.size(1)): equal lengths, equal to "
                     "one process",
        },
        "pinned-layer": {
            "expect": "failed", "signature": "device-mismatch",
            "about": "a layer creates a tensor on a fixed device in forward(); the replica on "
                     "device 1 fails",
        },
        "ddp-broken": {
            "expect": "failed", "signature": "gloo-size-mismatch",
            "about": "all_gather of outputs padded to each rank's own longest sequence",
        },
        "ddp-fixed": {
            "expect": "ok", "signature": None,
            "about": "all_reduce(MAX) the lengths, pad to the global maximum, all_gather, trim",
        },
        "bucketing": {
            "expect": "ok", "signature": None,
            "about": "random vs length-bucketed batches (equal batch count per rank): padding, "
                     "tokens/s, loss",
        },
    },
    "knobs": {
        "dp": {
            "type": "str", "default": "auto", "choices": ["auto", "emulation", "real"],
            "help": "DataParallel variants: real nn.DataParallel (needs --replicas GPUs) or the "
                    "CPU emulation; auto picks",
        },
        "replicas": {
            "type": "int", "default": 2, "choices": [2, 3, 4],
            "help": "DataParallel replicas (GPUs)",
        },
        "n_seqs": {
            "type": "int", "default": 512, "choices": [256, 512, 1024, 2048],
            "help": "bucketing: sequences in the data set",
        },
        "reps": {
            "type": "int", "default": 2, "range": [1, 5],
            "help": "bucketing: timed epochs per batching",
        },
    },
}

FEATS, HIDDEN = 4, 32
# one batch per row
DP_LENGTHS = [[9, 4, 6, 3, 9, 5, 2, 7], [12, 3, 5, 8, 6, 4, 7, 2], [8, 8, 3, 5, 4, 2, 6, 3]]
# rank 0 gets the even rows (max 12), rank 1 the odd (max 17)
EVAL_LENGTHS = [6, 11, 9, 17, 4, 8, 12, 5, 7, 14, 3, 9, 10, 6, 8, 13]


class PackedRNN(nn.Module):
    """Per-timestep regression: pack the padded batch, run an LSTM, unpack, a linear head."""

    def __init__(self, fix: bool):
        super().__init__()
        self.rnn = nn.LSTM(FEATS, HIDDEN, batch_first=True)
        self.head, self.fix = nn.Linear(HIDDEN, 1), fix

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        if self.fix:
            # FIX: back to the length this replica got
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))  # FIX
        else:
            # BROKEN: pads only to the longest sequence of THIS replica's chunk
            out, _ = pad_packed_sequence(out, batch_first=True)  # BROKEN
        return self.head(out)


class SimpleModel(nn.Module):
    """The article's Example 1 model, as written."""

    def __init__(self, input_size, hidden_size):
        super(SimpleModel, self).__init__()
        self.linear = nn.Linear(input_size, hidden_size)

    def forward(self, x):
        return self.linear(x)


class CustomLayer(nn.Module):
    """The article's Example 3 layer (a weight as nn.Parameter: replicated fine), plus one line
    that creates a tensor inside forward() -- on a fixed device, or on the input's device."""

    def __init__(self, n_in, n_out, home, how):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) / n_in ** 0.5)
        # a plain attribute: replicas keep the device the model was built on
        self.home, self.how = home, how

    def forward(self, x):
        if self.how == "article":
            return torch.matmul(x, self.weight)
        if self.how == "pinned":
            # BROKEN: always the device the model was built on
            scale = torch.ones(self.weight.size(1), device=self.home)  # BROKEN
        else:
            # FIX: follow the input (or register_buffer it)
            scale = torch.ones(self.weight.size(1), device=x.device)  # FIX
        return torch.matmul(x, self.weight) * scale


def make_batch(lengths, seed):
    """The article's collate_fn: pad_sequence pads each batch to ITS longest sequence."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randn(n, FEATS, generator=g) for n in lengths]
    x = pad_sequence(seqs, batch_first=True)
    # running mean of feature 0
    y = x[..., :1].cumsum(1) / torch.arange(1, x.size(1) + 1).view(1, -1, 1)
    return x, torch.tensor(lengths), y


def _data_parallel(model, x, lengths, n, mode):
    if mode == "real":
        return nn.DataParallel(model, device_ids=list(range(n)))(x.cuda(0), lengths)
    # scatter: DataParallel splits with Tensor.chunk along dim 0
    xs, ls = x.chunk(n, 0), lengths.chunk(n, 0)
    # replicate: on one CPU every replica is the model itself (same parameters; gradients sum as
    # DP's do)
    # parallel_apply (threads in DP; one after another here)
    outs = [model(xi, li) for xi, li in zip(xs, ls)]
    lab.record("replica_outputs", dp_mode=mode, shapes=[list(o.shape) for o in outs])
    # gather: concatenate along dim 0 on the output device
    return torch.cat(outs, dim=0)


def padded_eval_outputs(model, lengths, idx, seed=7):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randn(n, FEATS, generator=g) for n in lengths]
    x = pad_sequence([seqs[i] for i in idx], batch_first=True)
    with torch.no_grad():
        return model(x, torch.tensor([lengths[i] for i in idx]))


def run_ddp_eval(variant, ctx):
    torch.manual_seed(0)
    model = PackedRNN(fix=True)                        # the same weights on every rank (seeded)
    W, r = ctx.world_size, ctx.rank
    # DistributedSampler(shuffle=False) gives rank r rows r, r+W, ...
    idx = list(range(r, len(EVAL_LENGTHS), W))
    out = padded_eval_outputs(model, EVAL_LENGTHS, idx)  # [rows, own longest, 1]
    lab.record("ddp_eval_start", own_max_len=out.size(1), rows=len(idx))
    if variant == "ddp-broken":
        # BROKEN: assumes every rank's output has this rank's shape
        gathered = [torch.empty_like(out) for _ in range(W)]  # BROKEN
        dist.all_gather(gathered, out)
    else:
        t = torch.tensor([out.size(1)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # FIX: agree on the global longest first,
        out = F.pad(out, (0, 0, 0, int(t) - out.size(1)))       # pad to it,
        gathered = [torch.empty_like(out) for _ in range(W)]
        dist.all_gather(gathered, out)                          # gather equal shapes,
        rows = {}
        # and trim each row to its own length
        for rr, g in enumerate(gathered):
            for j, i in enumerate(range(rr, len(EVAL_LENGTHS), W)):
                rows[i] = g[j, :EVAL_LENGTHS[i]]
        # one process, one batch
        ref = padded_eval_outputs(model, EVAL_LENGTHS, list(range(len(EVAL_LENGTHS))))
        diff = max(float((rows[i] - ref[i, :n]).abs().max()) for i, n in enumerate(EVAL_LENGTHS))
        lab.record("ddp_eval", global_max_len=int(t), gathered_rows=len(rows),
                   max_abs_diff_vs_single=diff)


def dataparallel(ctx, variant, mode, replicas, n_seqs, reps):
    """The dp-* variants: DataParallel is one process driving every GPU, so rank 0 alone runs
    it."""
    if mode == "real" and torch.cuda.device_count() < replicas:
        raise SystemExit(f"--dp real needs {replicas} GPUs, this machine has "
                         f"{torch.cuda.device_count()}")
    if ctx.rank != 0:
        return
    path = label(mode) if mode == "real" else "EMULATION on CPU (no 2 GPUs)"
    lab.log(f"DataParallel path: {path}")
    if variant == "pinned-layer":
        run_pinned(mode, replicas)
    elif variant == "article-example1":
        run_article_example1(mode, replicas)
    else:
        run_dp(variant, mode, replicas)


PROCEDURES = {
    **dict.fromkeys(("article-example1", "dp-broken", "dp-fixed", "pinned-layer"), dataparallel),
    "ddp-broken": lambda ctx, variant, *_: run_ddp_eval(variant, ctx),
    "ddp-fixed": lambda ctx, variant, *_: run_ddp_eval(variant, ctx),
    "bucketing": lambda ctx, variant, mode, replicas, n_seqs, reps:
        run_bucketing(ctx, n_seqs, reps),
}


def main(variant: str, *, dp: str, replicas: int, n_seqs: int, reps: int) -> None:
    ctx = lab.setup()
    gpus = torch.cuda.device_count()
    mode = dp if dp != "auto" else ("real" if gpus >= replicas else "emulation")
    PROCEDURES[variant](ctx, variant, mode, replicas, n_seqs, reps)
    dist.barrier()
    lab.record("done", variant=variant)
    lab.teardown()


# ---- DataParallel, real or emulated, and the padding measurement ----

def label(mode: str) -> str:
    return "real nn.DataParallel" if mode == "real" else "emulation of DataParallel on CPU"


def data_parallel(model, x, lengths, n, mode, apply):
    """One DataParallel forward, ``apply(model, x, lengths, n, mode)`` (the lab's own
    scatter/gather). A forward hook (copied to DataParallel's replicas with the module) records
    what each replica held and got."""
    seen = []
    hook = model.register_forward_hook(lambda m, i, o: seen.append(
        {"device": str(next(m.parameters()).device),
         "params": sum(q.numel() for q in m.parameters()),
         "rows": int(i[0].shape[0]), "out_len": int(o.shape[1])}))
    try:
        return apply(model, x, lengths, n, mode)
    finally:
        hook.remove()
        lab.record("replicas", dp_mode=mode, seen=sorted(seen, key=lambda d: d["device"]))


ARTICLE_SEQ_LENGTHS = [10, 20, 30, 40, 5, 15, 25, 35]   # the article's dummy data set


def run_article_example1(mode, n):
    """Example 1 as the article writes it: CustomDataset of randn(seq_len, 10), a DataLoader whose
    collate_fn is pad_sequence(batch_first=True), batch 4, SimpleModel(10, 20) (the lab's class),
    MSELoss, Adam. Only the DataParallel call is ddplab's: real nn.DataParallel on n GPUs, or the
    emulation of its steps."""
    from torch.utils.data import DataLoader
    torch.manual_seed(0)
    dataset = [torch.randn(n_, 10) for n_ in ARTICLE_SEQ_LENGTHS]
    dataloader = DataLoader(
        dataset, batch_size=4, shuffle=False,
        collate_fn=lambda batch: torch.nn.utils.rnn.pad_sequence(batch, batch_first=True))
    model = SimpleModel(10, 20)
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters())
    lab.record("dp_start", dp_mode=mode, label=label(mode),
               replicas=n, params=sum(p.numel() for p in model.parameters()),
               model="article Example 1: nn.Linear(10, 20)")
    dp = nn.DataParallel(model.cuda(), device_ids=list(range(n))) if mode == "real" else None
    for step, inputs in enumerate(dataloader):
        optimizer.zero_grad()
        lab.record("dp_batch", step=step, dp_mode=mode, padded_len=inputs.size(1),
                   rows_per_replica=[len(c) for c in inputs.chunk(n)],
                   chunk_max_lengths=[inputs.size(1)] * len(inputs.chunk(n)))
        if mode == "real":
            output = dp(inputs.cuda())
        else:
            # scatter along dim 0, a replica per chunk
            outs = [model(c) for c in inputs.chunk(n, 0)]
            lab.record("replica_outputs", dp_mode=mode, shapes=[list(o.shape) for o in outs])
            output = torch.cat(outs, dim=0)                         # gather along dim 0
        with torch.no_grad():
            # the same model, one process
            diff = float((output - model(inputs.to(output.device))).abs().max())
        target = torch.randn(output.shape, device=output.device)
        loss = criterion(output, target)
        loss.backward()
        optimizer.step()
        lab.record("dp_step", step=step, dp_mode=mode, out_shape=list(output.shape),
                   loss=round(loss.item(), 6),
                   max_abs_diff_vs_single=diff)


def mask_of(lengths, t):
    return (torch.arange(t).view(1, -1) < lengths.view(-1, 1)).unsqueeze(-1).float()


def masked_sse(out, y, lengths):
    return (((out - y) ** 2) * mask_of(lengths, out.size(1))).sum()


def run_dp(variant, mode, n):
    """The packed LSTM (the lab's PackedRNN) trained on ``dp_lengths`` batches under DataParallel,
    whose forward is the lab's ``apply``; each step's output against the same model in one
    process."""
    torch.manual_seed(0)
    dev = torch.device("cuda", 0) if mode == "real" else torch.device("cpu")
    model = PackedRNN(fix=variant == "dp-fixed").to(dev)
    lab.record("dp_start", dp_mode=mode, label=label(mode),
               replicas=n, params=sum(p.numel() for p in model.parameters()))
    for step, lengths in enumerate(DP_LENGTHS):
        x, lens, y = make_batch(lengths, seed=step)
        lab.record("dp_batch", step=step, dp_mode=mode, padded_len=x.size(1),
                   rows_per_replica=[len(c) for c in lens.chunk(n)],
                   chunk_max_lengths=[int(c.max()) for c in lens.chunk(n)])
        # dp-broken raises here when the chunks' maxima differ
        out = data_parallel(model, x, lens, n, mode, _data_parallel)
        with torch.no_grad():
            # the same model in one process, no DataParallel
            ref = model(x.to(dev), lens)
        loss = masked_sse(out.cpu(), y, lens) / lens.sum()
        # gradients of all replicas land in the one model
        loss.backward()
        # plain SGD by hand (torch.optim's first use imports
        with torch.no_grad():
            # torch._dynamo: seconds of start-up for nothing here)
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad = None
        lab.record("dp_step", step=step, dp_mode=mode, out_shape=list(out.shape),
                   loss=round(loss.item(), 6),
                   max_abs_diff_vs_single=float((out.detach().cpu() - ref.cpu()).abs().max()),
                   checksum=round(float(out.detach().double().sum()), 6))


def run_pinned(mode, n):
    """The lab's CustomLayer (article, following the input, pinned) in a model under
    DataParallel."""
    torch.manual_seed(0)
    home = torch.device("cuda", 0) if mode == "real" else torch.device("cpu")
    if mode == "real":
        devices = [torch.device("cuda", i) for i in range(n)]
        what = "real nn.DataParallel"
    else:
        devices = [torch.device("cpu")] + [torch.device("meta")] * (n - 1)
        what = ("emulation: the meta device stands in for GPU 1 (shapes and device checks, "
                "no data)")
    lab.record("pinned_start", dp_mode=mode, devices=[str(d) for d in devices], label=what)
    x = torch.randn(8, 10)
    for how in ("article", "follow", "pinned"):  # the last one fails
        model = nn.Sequential(CustomLayer(10, 6, home, how), nn.Linear(6, 6)).to(home)
        if mode == "real":
            out = nn.DataParallel(model, device_ids=list(range(n)))(x.to(home))
            outs = [out]
        # replicate (a copy per device), scatter the rows, run each replica on its own device
        else:
            reps = [model] + [copy.deepcopy(model).to(d) for d in devices[1:]]
            outs = [r(c.to(d)) for r, c, d in zip(reps, x.chunk(n, 0), devices)]
        lab.record("pinned_layer", how=how, dp_mode=mode, ok=True,
                   out_devices=[str(o.device) for o in outs])


def batches_for(mode, lengths, batch, W, r, seed):
    N = len(lengths)
    g = torch.Generator().manual_seed(seed)            # the same seed on every rank: the same plan
    order = torch.randperm(N, generator=g)
    # what DistributedSampler(shuffle=True) + DataLoader does
    if mode == "random":
        mine = order[r::W]
        return [mine[i:i + batch].tolist() for i in range(0, len(mine) - len(mine) % batch, batch)]
    # sort by length inside pools of 8 global batches
    glob, pool = batch * W, batch * W * 8
    out = []
    for s in range(0, N, pool):
        chunk = order[s:s + pool]
        chunk = chunk[lengths[chunk].argsort(descending=True)]
        out += [chunk[b:b + glob] for b in range(0, len(chunk) - len(chunk) % glob, glob)]
    # shuffle the batch order, the same way on every rank
    perm = torch.randperm(len(out), generator=g)
    # every rank: the same number of batches
    return [out[i][r * batch:(r + 1) * batch].tolist() for i in perm]


def run_bucketing(ctx, n_seqs, reps, batch=16):
    """Random vs length-bucketed batches (the same count on every rank) of long-tailed sequences,
    training the lab's PackedRNN under DDP: padding, tokens/s (timed epochs alternating) and the
    masked loss."""
    W, r = ctx.world_size, ctx.rank
    g = torch.Generator().manual_seed(1)
    # long-tailed lengths
    lengths = (3.0 + 0.7 * torch.randn(n_seqs, generator=g)).exp().clamp(4, 160).long()
    seqs = [torch.randn(int(n), FEATS, generator=g) for n in lengths]
    torch.manual_seed(0)
    model = DDP(PackedRNN(fix=True))
    init = copy.deepcopy(model.module.state_dict())

    def collate(ix):
        x = pad_sequence([seqs[i] for i in ix], batch_first=True)
        y = x[..., :1].cumsum(1) / torch.arange(1, x.size(1) + 1).view(1, -1, 1)
        return x, lengths[ix], y

    def masked_loss(plan):  # the mean over every real token of the data set, all ranks together
        s = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            for ix in plan:
                x, lens, y = collate(ix)
                sse = float(masked_sse(model.module(x, lens), y, lens))
                s += torch.tensor([sse, float(lens.sum())], dtype=torch.float64)
        dist.all_reduce(s)
        return float(s[0] / s[1])

    # rep -1: an untimed warm-up epoch (first-call costs)
    for rep in range(-1, reps):
        # alternate, so machine noise hits both alike
        for mode in ("random", "bucketed"):
            plan = batches_for(mode, lengths, batch, W, r, seed=100 + rep)
            model.module.load_state_dict(init)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            loss0 = masked_loss(plan)
            real = sum(int(lengths[ix].sum()) for ix in plan)
            padded = sum(len(ix) * int(lengths[ix].max()) for ix in plan)
            dist.barrier()
            t0 = time.perf_counter()
            for ix in plan:
                x, lens, y = collate(ix)
                loss = masked_sse(model(x, lens), y, lens) / lens.sum()
                opt.zero_grad()
                # DDP all-reduce: every rank runs len(plan) steps
                loss.backward()
                opt.step()
            t = torch.tensor([time.perf_counter() - t0, real, padded], dtype=torch.float64)
            tmax = t.clone()
            dist.all_reduce(t)
            dist.all_reduce(tmax, op=dist.ReduceOp.MAX)
            if rep < 0:
                continue
            lab.record("batching", mode=mode, rep=rep, batches=len(plan),
                       epoch_s=round(float(tmax[0]), 4),
                       real_tokens=int(t[1]), padded_slots=int(t[2]),
                       padding_fraction=round(1 - float(t[1] / t[2]), 4),
                       tokens_per_s=round(float(t[1] / tmax[0]), 1), masked_loss_init=loss0,
                       masked_loss_after=masked_loss(plan))




if __name__ == "__main__":
    from ddplab.rank import lab_args

    variant, knobs = lab_args.parse(LAB, __doc__)
    main(variant, **knobs)
