"""Lab 04 - padded variable-length sequences under DataParallel and DDP.

Run it by itself (gloo on CPU; real nn.DataParallel when 2+ GPUs exist):

    torchrun --nproc-per-node 2 labs/04_padding.py --variant dp-broken
    ddplab run 04 --variant ddp-broken      # the same, judged by progress, with a diagnosis

Article 002 ("Why is training not starting with nn.DataParallel?") pads each batch in its collate_fn
and says DataParallel "expects a completely consistent tensor". `article-example1` runs its Example 1
as written (nn.Linear(10, 20) on pad_sequence batches, Adam): a batch padded BEFORE the split gives
every replica the same length, so it trains. The extension (not the article's code) is a model that packs
the padded batch and unpacks it with pad_packed_sequence() pads its output back only to the longest
sequence *it* saw. DataParallel splits the batch along dim 0, each replica sees another chunk, so the
replicas return different lengths and gather() cannot concatenate them. `total_length=` fixes it.
DDP has the same trap at evaluation time: each rank's outputs are as long as its own longest sequence,
and all_gather needs equal shapes. And padding costs throughput: length-bucketed batches waste less.

Without 2 GPUs the DataParallel variants run an EMULATION of DataParallel's own steps on CPU (scatter:
Tensor.chunk along dim 0; a replica per chunk; gather: torch.cat along dim 0), with the same model and
the same broken/fixed line. DataParallel is one process: only rank 0 runs the dp-* variants.

Notebook: notebooks/04_padding.ipynb; workbook module: ddplab.course.lab04.

Variants: LAB["variants"] below, each with the outcome it must show; `--variant NAME` runs one.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

from ddplab.rank import lab
from ddplab.rank.lab_padding import run_article_example1, run_bucketing, run_dp, run_pinned

LAB = {
    "title": "Padded variable-length sequences under DataParallel and DDP",
    "article": "002_3b7eff0f44992b59.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "article-example1": {"expect": "ok", "signature": None,
                             "about": "the article's Example 1 as written (nn.Linear on pad_sequence batches) under DataParallel (emulation on CPU without 2 GPUs)"},
        "dp-broken": {"expect": "failed", "signature": "tensor-size-mismatch",
                      "about": "extension, not the article's code: an LSTM under DataParallel (emulation on CPU): each replica unpads to its own chunk's longest sequence; gather fails"},
        "dp-fixed": {"expect": "ok", "signature": None,
                     "about": "pad_packed_sequence(..., total_length=x.size(1)): equal lengths, equal to one process"},
        "pinned-layer": {"expect": "failed", "signature": "device-mismatch",
                         "about": "a layer creates a tensor on a fixed device in forward(); the replica on device 1 fails"},
        "ddp-broken": {"expect": "failed", "signature": "gloo-size-mismatch",
                       "about": "all_gather of outputs padded to each rank's own longest sequence"},
        "ddp-fixed": {"expect": "ok", "signature": None,
                      "about": "all_reduce(MAX) the lengths, pad to the global maximum, all_gather, trim"},
        "bucketing": {"expect": "ok", "signature": None,
                      "about": "random vs length-bucketed batches (equal batch count per rank): padding, tokens/s, loss"},
    },
}

FEATS, HIDDEN = 4, 32
DP_LENGTHS = [[9, 4, 6, 3, 9, 5, 2, 7], [12, 3, 5, 8, 6, 4, 7, 2], [8, 8, 3, 5, 4, 2, 6, 3]]  # one batch per row
EVAL_LENGTHS = [6, 11, 9, 17, 4, 8, 12, 5, 7, 14, 3, 9, 10, 6, 8, 13]  # rank 0 gets the even rows (max 12), rank 1 the odd (max 17)


class PackedRNN(nn.Module):
    """Per-timestep regression: pack the padded batch, run an LSTM, unpack, a linear head."""

    def __init__(self, fix: bool):
        super().__init__()
        self.rnn, self.head, self.fix = nn.LSTM(FEATS, HIDDEN, batch_first=True), nn.Linear(HIDDEN, 1), fix

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        if self.fix:
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))  # FIX: back to the length this replica got
        else:
            out, _ = pad_packed_sequence(out, batch_first=True)  # BROKEN: pads only to the longest sequence of THIS replica's chunk
        return self.head(out)


class SimpleModel(nn.Module):
    """The article's Example 1 model, as written."""

    def __init__(self, input_size, hidden_size):
        super(SimpleModel, self).__init__()
        self.linear = nn.Linear(input_size, hidden_size)

    def forward(self, x):
        return self.linear(x)


class CustomLayer(nn.Module):
    """The article's Example 3 layer (a weight as nn.Parameter: replicated fine), plus one line that
    creates a tensor inside forward() -- on a fixed device, or on the input's device."""

    def __init__(self, n_in, n_out, home, how):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) / n_in ** 0.5)
        self.home, self.how = home, how   # a plain attribute: replicas keep the device the model was built on

    def forward(self, x):
        if self.how == "article":
            return torch.matmul(x, self.weight)
        if self.how == "pinned":
            scale = torch.ones(self.weight.size(1), device=self.home)   # BROKEN: always the device the model was built on
        else:
            scale = torch.ones(self.weight.size(1), device=x.device)    # FIX: follow the input (or register_buffer it)
        return torch.matmul(x, self.weight) * scale


def make_batch(lengths, seed):
    """The article's collate_fn: pad_sequence pads each batch to ITS longest sequence."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randn(n, FEATS, generator=g) for n in lengths]
    x = pad_sequence(seqs, batch_first=True)
    y = x[..., :1].cumsum(1) / torch.arange(1, x.size(1) + 1).view(1, -1, 1)  # running mean of feature 0
    return x, torch.tensor(lengths), y


def _data_parallel(model, x, lengths, n, mode):
    if mode == "real":
        return nn.DataParallel(model, device_ids=list(range(n)))(x.cuda(0), lengths)
    xs, ls = x.chunk(n, 0), lengths.chunk(n, 0)     # scatter: DataParallel splits with Tensor.chunk along dim 0
    # replicate: on one CPU every replica is the model itself (same parameters; gradients sum as DP's do)
    outs = [model(xi, li) for xi, li in zip(xs, ls)]  # parallel_apply (threads in DP; one after another here)
    lab.record("replica_outputs", dp_mode=mode, shapes=[list(o.shape) for o in outs])
    return torch.cat(outs, dim=0)                   # gather: concatenate along dim 0 on the output device


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
    idx = list(range(r, len(EVAL_LENGTHS), W))         # DistributedSampler(shuffle=False) gives rank r rows r, r+W, ...
    out = padded_eval_outputs(model, EVAL_LENGTHS, idx)  # [rows, own longest, 1]
    lab.record("ddp_eval_start", own_max_len=out.size(1), rows=len(idx))
    if variant == "ddp-broken":
        gathered = [torch.empty_like(out) for _ in range(W)]   # BROKEN: assumes every rank's output has this rank's shape
        dist.all_gather(gathered, out)
    else:
        t = torch.tensor([out.size(1)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)               # FIX: agree on the global longest first,
        out = F.pad(out, (0, 0, 0, int(t) - out.size(1)))       # pad to it,
        gathered = [torch.empty_like(out) for _ in range(W)]
        dist.all_gather(gathered, out)                          # gather equal shapes,
        rows = {}
        for rr, g in enumerate(gathered):                       # and trim each row to its own length
            for j, i in enumerate(range(rr, len(EVAL_LENGTHS), W)):
                rows[i] = g[j, :EVAL_LENGTHS[i]]
        ref = padded_eval_outputs(model, EVAL_LENGTHS, list(range(len(EVAL_LENGTHS))))  # one process, one batch
        diff = max(float((rows[i] - ref[i, :n]).abs().max()) for i, n in enumerate(EVAL_LENGTHS))
        lab.record("ddp_eval", global_max_len=int(t), gathered_rows=len(rows), max_abs_diff_vs_single=diff)


def main(variant, *, dp="auto", replicas=2, n_seqs=512, reps=2):
    ctx = lab.setup()
    mode = dp if dp != "auto" else ("real" if torch.cuda.device_count() >= replicas else "emulation")
    if variant in ("article-example1", "dp-broken", "dp-fixed", "pinned-layer"):
        if mode == "real" and torch.cuda.device_count() < replicas:
            raise SystemExit(f"--dp real needs {replicas} GPUs, this machine has {torch.cuda.device_count()}")
        if ctx.rank == 0:                              # DataParallel is one process driving every GPU
            lab.log(f"DataParallel path: {'real nn.DataParallel' if mode == 'real' else 'EMULATION on CPU (no 2 GPUs)'}")
            if variant == "pinned-layer":
                run_pinned(mode, replicas, CustomLayer)
            elif variant == "article-example1":
                run_article_example1(mode, replicas, SimpleModel)
            else:
                run_dp(variant, mode, replicas, PackedRNN, make_batch, _data_parallel, DP_LENGTHS)
    elif variant in ("ddp-broken", "ddp-fixed"):
        run_ddp_eval(variant, ctx)
    else:
        run_bucketing(ctx, n_seqs, reps, PackedRNN, FEATS)
    dist.barrier()
    lab.record("done", variant=variant)
    lab.teardown()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="dp-broken", help="which failure or fix to run")
    p.add_argument("--dp", choices=["auto", "emulation", "real"], default="auto",
                   help="DataParallel variants: real nn.DataParallel (needs --replicas GPUs) or the CPU emulation; auto picks")
    p.add_argument("--replicas", type=int, choices=[2, 3, 4], default=2, help="DataParallel replicas (GPUs)")
    p.add_argument("--n-seqs", type=int, choices=[256, 512, 1024, 2048], default=512, help="bucketing: sequences in the data set")
    p.add_argument("--reps", type=int, choices=[1, 2, 3, 4, 5], default=2, help="bucketing: timed epochs per batching")
    a = p.parse_args()
    main(a.variant, dp=a.dp, replicas=a.replicas, n_seqs=a.n_seqs, reps=a.reps)
