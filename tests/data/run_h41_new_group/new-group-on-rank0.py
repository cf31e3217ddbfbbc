"""Base program: a GPT trainer in the shape of karpathy/nanoGPT's train.py (ddp_rank / seed_offset,
get_batch, gradient accumulation with DDP's sync only on the last micro-step, estimate_loss every
eval_interval, master_process logging), a tiny model on synthetic tokens, CPU/gloo, a few seconds.
A memory cap (RLIMIT_DATA above the start-up size, MEM_CAP_MB) stands in for a GPU's memory.
The `# @site:` comments mark where mutation operators apply (removed from the mutants)."""
import math
import os
import resource

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

MEM_CAP_MB = int(os.environ.get("MEM_CAP_MB", "400"))
batch_size = 8
block_size, n_embd, n_head, vocab = 32, 32, 2, 64
max_iters, eval_interval, eval_iters, gradient_accumulation_steps = 12, 4, 2, 4
learning_rate = 1e-2


def cap_memory(mb):
    with open("/proc/self/status") as f:
        vm_data = next(int(line.split()[1]) for line in f if line.startswith("VmData:")) * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (vm_data + mb * 2**20, resource.RLIM_INFINITY))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.attn(self.ln1(x)).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(torch.ones(T, T).tril() == 0, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln_f, self.lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        logits = self.lm_head(self.ln_f(self.blocks(x)))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        return logits, loss


init_process_group(backend="gloo")
ddp_rank = int(os.environ["RANK"])
ddp_local_rank = int(os.environ["LOCAL_RANK"])
ddp_world_size = int(os.environ["WORLD_SIZE"])
master_process = ddp_rank == 0
seed_offset = ddp_rank
gradient_accumulation_steps = max(1, gradient_accumulation_steps // ddp_world_size)
cap_memory(MEM_CAP_MB)
torch.manual_seed(1337 + seed_offset)
if master_process:
    log_group = dist.new_group(ranks=[0])  # the logger's own group (only rank 0 logs)
eval_group = dist.new_group()  # evaluation's all_reduce, every rank

g = torch.Generator().manual_seed(0)
train_data = torch.randint(0, vocab, (20000,), generator=g)
val_data = torch.randint(0, vocab, (4000,), generator=g)


def get_batch(split, bs=None):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (bs or batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


model = GPT()
model = DDP(model)
raw_model = model.module
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)

X, Y = get_batch("train")
for iter_num in range(max_iters):
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        val = torch.tensor([losses["val"]])
        dist.all_reduce(val, group=eval_group)
        if master_process:
            print(f"step {iter_num}: val loss {val.item() / ddp_world_size:.4f}", flush=True)
    for micro_step in range(gradient_accumulation_steps):
        model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

if master_process:
    print(f"done: {max_iters} iterations", flush=True)
destroy_process_group()
