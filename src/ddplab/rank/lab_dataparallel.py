"""nn.DataParallel for lab scripts on any machine: real on 2+ GPUs, else an EMULATION of its own steps on
CPU (scatter: Tensor.chunk along dim 0; a replica per chunk; gather: torch.cat along dim 0; replicate()
with the meta device standing in for GPU 1); and article 002's Example 3 under it (lab 10). Labs 04 and
10 import it; it imports torch, so the launcher never does."""
from __future__ import annotations

import torch
import torch.nn as nn

from ddplab.rank import lab


def label(mode: str) -> str:
    return "real nn.DataParallel" if mode == "real" else "emulation of DataParallel on CPU"


def data_parallel(model, x, lengths, n, mode, apply):
    """One DataParallel forward, ``apply(model, x, lengths, n, mode)`` (the lab's own scatter/gather). A forward
    hook (copied to DataParallel's replicas with the module) records what each replica held and got."""
    seen = []
    hook = model.register_forward_hook(lambda m, i, o: seen.append(
        {"device": str(next(m.parameters()).device), "params": sum(q.numel() for q in m.parameters()),
         "rows": int(i[0].shape[0]), "out_len": int(o.shape[1])}))
    try:
        return apply(model, x, lengths, n, mode)
    finally:
        hook.remove()
        lab.record("replicas", dp_mode=mode, seen=sorted(seen, key=lambda d: d["device"]))


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


def custom_layer(ctx) -> None:
    """Article 002's Example 3 under DataParallel, with the article's layer and with a plain tensor attribute:
    the replicas' input and weight devices, the error if any, and the output against one device."""
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
