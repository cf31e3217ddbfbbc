"""Drivers of lab 04 (padded variable-length sequences): the article's Example 1 loop, the packed-LSTM
training loop and the pinned-device layer under DataParallel (real or the CPU emulation of
ddplab.rank.lab_dataparallel), the masked loss, and the random vs length-bucketed batching measurement under
DDP. The models, the data and the BROKEN/FIX lines stay in labs/04_padding.py and come in as arguments.
Imported by lab scripts only (it imports torch)."""
from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils.rnn import pad_sequence

from ddplab.rank import lab
from ddplab.rank.lab_dataparallel import data_parallel, label

ARTICLE_SEQ_LENGTHS = [10, 20, 30, 40, 5, 15, 25, 35]   # the article's dummy data set


def run_article_example1(mode, n, SimpleModel):
    """Example 1 as the article writes it: CustomDataset of randn(seq_len, 10), a DataLoader whose
    collate_fn is pad_sequence(batch_first=True), batch 4, SimpleModel(10, 20) (the lab's class), MSELoss,
    Adam. Only the DataParallel call is ddplab's: real nn.DataParallel on n GPUs, or the emulation of its steps."""
    from torch.utils.data import DataLoader
    torch.manual_seed(0)
    dataset = [torch.randn(n_, 10) for n_ in ARTICLE_SEQ_LENGTHS]
    dataloader = DataLoader(dataset, batch_size=4, shuffle=False,
                            collate_fn=lambda batch: torch.nn.utils.rnn.pad_sequence(batch, batch_first=True))
    model = SimpleModel(10, 20)
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters())
    lab.record("dp_start", dp_mode=mode, label=label(mode),
               replicas=n, params=sum(p.numel() for p in model.parameters()), model="article Example 1: nn.Linear(10, 20)")
    dp = nn.DataParallel(model.cuda(), device_ids=list(range(n))) if mode == "real" else None
    for step, inputs in enumerate(dataloader):
        optimizer.zero_grad()
        lab.record("dp_batch", step=step, dp_mode=mode, padded_len=inputs.size(1), rows_per_replica=[len(c) for c in inputs.chunk(n)],
                   chunk_max_lengths=[inputs.size(1)] * len(inputs.chunk(n)))
        if mode == "real":
            output = dp(inputs.cuda())
        else:
            outs = [model(c) for c in inputs.chunk(n, 0)]           # scatter along dim 0, a replica per chunk
            lab.record("replica_outputs", dp_mode=mode, shapes=[list(o.shape) for o in outs])
            output = torch.cat(outs, dim=0)                         # gather along dim 0
        with torch.no_grad():
            diff = float((output - model(inputs.to(output.device))).abs().max())   # the same model, one process
        target = torch.randn(output.shape, device=output.device)
        loss = criterion(output, target)
        loss.backward()
        optimizer.step()
        lab.record("dp_step", step=step, dp_mode=mode, out_shape=list(output.shape), loss=round(loss.item(), 6),
                   max_abs_diff_vs_single=diff)


def mask_of(lengths, t):
    return (torch.arange(t).view(1, -1) < lengths.view(-1, 1)).unsqueeze(-1).float()


def masked_sse(out, y, lengths):
    return (((out - y) ** 2) * mask_of(lengths, out.size(1))).sum()


def run_dp(variant, mode, n, PackedRNN, make_batch, apply, dp_lengths):
    """The packed LSTM (the lab's PackedRNN) trained on ``dp_lengths`` batches under DataParallel, whose forward is
    the lab's ``apply``; each step's output against the same model in one process."""
    torch.manual_seed(0)
    dev = torch.device("cuda", 0) if mode == "real" else torch.device("cpu")
    model = PackedRNN(fix=variant == "dp-fixed").to(dev)
    lab.record("dp_start", dp_mode=mode, label=label(mode),
               replicas=n, params=sum(p.numel() for p in model.parameters()))
    for step, lengths in enumerate(dp_lengths):
        x, lens, y = make_batch(lengths, seed=step)
        lab.record("dp_batch", step=step, dp_mode=mode, padded_len=x.size(1), rows_per_replica=[len(c) for c in lens.chunk(n)],
                   chunk_max_lengths=[int(c.max()) for c in lens.chunk(n)])
        out = data_parallel(model, x, lens, n, mode, apply)  # dp-broken raises here when the chunks' maxima differ
        with torch.no_grad():
            ref = model(x.to(dev), lens)                   # the same model in one process, no DataParallel
        loss = masked_sse(out.cpu(), y, lens) / lens.sum()
        loss.backward()                                    # gradients of all replicas land in the one model
        with torch.no_grad():                              # plain SGD by hand (torch.optim's first use imports
            for p in model.parameters():                   # torch._dynamo: seconds of start-up for nothing here)
                p -= 0.1 * p.grad
                p.grad = None
        lab.record("dp_step", step=step, dp_mode=mode, out_shape=list(out.shape), loss=round(loss.item(), 6),
                   max_abs_diff_vs_single=float((out.detach().cpu() - ref.cpu()).abs().max()),
                   checksum=round(float(out.detach().double().sum()), 6))


def run_pinned(mode, n, CustomLayer):
    """The lab's CustomLayer (article, following the input, pinned) in a model under DataParallel."""
    torch.manual_seed(0)
    home = torch.device("cuda", 0) if mode == "real" else torch.device("cpu")
    devices = [torch.device("cuda", i) for i in range(n)] if mode == "real" else [torch.device("cpu")] + [torch.device("meta")] * (n - 1)
    lab.record("pinned_start", dp_mode=mode, devices=[str(d) for d in devices],
               label="real nn.DataParallel" if mode == "real" else "emulation: the meta device stands in for GPU 1 (shapes and device checks, no data)")
    x = torch.randn(8, 10)
    for how in ("article", "follow", "pinned"):  # the last one fails
        model = nn.Sequential(CustomLayer(10, 6, home, how), nn.Linear(6, 6)).to(home)
        if mode == "real":
            out = nn.DataParallel(model, device_ids=list(range(n)))(x.to(home))
            outs = [out]
        else:  # replicate (a copy per device), scatter the rows, run each replica on its own device
            reps = [model] + [copy.deepcopy(model).to(d) for d in devices[1:]]
            outs = [r(c.to(d)) for r, c, d in zip(reps, x.chunk(n, 0), devices)]
        lab.record("pinned_layer", how=how, dp_mode=mode, ok=True, out_devices=[str(o.device) for o in outs])


def batches_for(mode, lengths, batch, W, r, seed):
    N = len(lengths)
    g = torch.Generator().manual_seed(seed)            # the same seed on every rank: the same plan
    order = torch.randperm(N, generator=g)
    if mode == "random":                               # what DistributedSampler(shuffle=True) + DataLoader does
        mine = order[r::W]
        return [mine[i:i + batch].tolist() for i in range(0, len(mine) - len(mine) % batch, batch)]
    glob, pool = batch * W, batch * W * 8              # sort by length inside pools of 8 global batches
    out = []
    for s in range(0, N, pool):
        chunk = order[s:s + pool]
        chunk = chunk[lengths[chunk].argsort(descending=True)]
        out += [chunk[b:b + glob] for b in range(0, len(chunk) - len(chunk) % glob, glob)]
    perm = torch.randperm(len(out), generator=g)       # shuffle the batch order, the same way on every rank
    return [out[i][r * batch:(r + 1) * batch].tolist() for i in perm]  # every rank: the same number of batches


def run_bucketing(ctx, n_seqs, reps, PackedRNN, feats, batch=16):
    """Random vs length-bucketed batches (the same count on every rank) of long-tailed sequences, training
    the lab's PackedRNN under DDP: padding, tokens/s (timed epochs alternating) and the masked loss."""
    W, r = ctx.world_size, ctx.rank
    g = torch.Generator().manual_seed(1)
    lengths = (3.0 + 0.7 * torch.randn(n_seqs, generator=g)).exp().clamp(4, 160).long()  # long-tailed lengths
    seqs = [torch.randn(int(n), feats, generator=g) for n in lengths]
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
                s += torch.tensor([float(masked_sse(model.module(x, lens), y, lens)), float(lens.sum())], dtype=torch.float64)
        dist.all_reduce(s)
        return float(s[0] / s[1])

    for rep in range(-1, reps):                        # rep -1: an untimed warm-up epoch (first-call costs)
        for mode in ("random", "bucketed"):            # alternate, so machine noise hits both alike
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
                loss.backward()                        # DDP all-reduce: every rank runs len(plan) steps
                opt.step()
            t = torch.tensor([time.perf_counter() - t0, real, padded], dtype=torch.float64)
            tmax = t.clone()
            dist.all_reduce(t)
            dist.all_reduce(tmax, op=dist.ReduceOp.MAX)
            if rep < 0:
                continue
            lab.record("batching", mode=mode, rep=rep, batches=len(plan), epoch_s=round(float(tmax[0]), 4),
                       real_tokens=int(t[1]), padded_slots=int(t[2]), padding_fraction=round(1 - float(t[1] / t[2]), 4),
                       tokens_per_s=round(float(t[1] / tmax[0]), 1), masked_loss_init=loss0,
                       masked_loss_after=masked_loss(plan))


