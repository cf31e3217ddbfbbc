"""Fix-it 02 (lab 02, out of memory): a whole batch that does not fit the rank's memory.

Lab 02's last rank runs out of memory at one step, on one long padded document. Here every rank's
batch is too big at every step, for an MLP on 4096 rows: under the rank's memory budget (an
RLIMIT_DATA cap that stands for a GPU's memory, the same mechanism as lab 02 on the CPU) the first
step's activations do not fit. The fix keeps the batch: micro-batches, with the gradient accumulated
(and all-reduced once) so that each step is the whole batch's.
"""
from __future__ import annotations

import ast

from ddplab.course.fixit.exercise import Attempt, Edit, Exercise, Mismatch, WrongFix, calls, in_try, params_match

BUDGET_MIB = 16
ROWS = 4096
STEPS = 3
LR = 0.05
TOL = 1e-3          # on each parameter's sum and norm (float64 over up to 65536 float32 values)

BROKEN = '''\
# Fix it (lab 02): each optimizer step trains on a batch of 4096 rows per rank (8192 over 2 ranks). Each
# rank may use 16 MiB beyond what it holds after set-up: memory_budget stands for a GPU's memory (leave
# it as it is). It runs out of memory. Repair it so that it fits and every step still uses the gradient
# of the whole batch: the model one process gets from the 8192 rows of each step at once.
import resource

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddplab.rank import lab


def memory_budget(mib):
    """This rank's memory (a stand-in for a GPU's): mib MiB more than the rank holds now, once torch has set up
    its matrix kernels (as a GPU's memory leaves out the CUDA context and the cuBLAS workspace)."""
    with torch.no_grad():
        torch.zeros(512, 256) @ torch.zeros(256, 256)       # the kernels' own buffers, taken once, up front
    with open("/proc/self/status") as f:
        data = next(int(line.split()[1]) for line in f if line.startswith("VmData:")) * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (data + mib * 2**20, resource.getrlimit(resource.RLIMIT_DATA)[1]))


d = lab.setup()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
memory_budget(16)

for step in range(3):
    g = torch.Generator().manual_seed(10 * step + d.rank)    # this rank's half of the step's batch
    x = torch.randn(4096, 32, generator=g)
    y = x[:, :1] - x[:, 1:2]
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

lab.record("final", params=[[p.double().sum().item(), p.double().norm().item()] for p in model.parameters()])
lab.teardown()
'''

_STEP = '''\
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
'''

REFERENCE = BROKEN.replace("import resource\n", "import contextlib\nimport resource\n").replace(_STEP, '''\
    opt.zero_grad()
    micro = 8                                                # FIX: 8 micro-batches of 512 rows fit
    for i, (xb, yb) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
        last = i == micro - 1                                # all-reduce once, with the last one
        with contextlib.nullcontext() if last else model.no_sync():
            (nn.functional.mse_loss(model(xb), yb) / micro).backward()   # FIX: parts of the batch's mean
    opt.step()
''')


def baseline(nproc: int) -> list[float]:
    """One process, no budget: each step's whole batch (every rank's rows) at once; each parameter's sum and
    norm, as the script records them."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x = torch.cat([torch.randn(ROWS, 32, generator=torch.Generator().manual_seed(10 * step + r))
                       for r in range(nproc)])
        loss = nn.functional.mse_loss(model(x), x[:, :1] - x[:, 1:2])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [v for p in model.parameters() for v in (p.double().sum().item(), p.double().norm().item())]


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    return params_match(attempt, nproc, baseline(nproc), TOL)


def _budgets(tree: ast.AST) -> list[object]:
    """The arguments of the memory_budget calls (their constants)."""
    return [c.args[0].value if c.args and isinstance(c.args[0], ast.Constant) else None
            for c in calls(tree, "memory_budget")]


def _loops(tree: ast.AST) -> int:
    return sum(isinstance(n, (ast.For, ast.While)) for n in ast.walk(tree))


EXERCISE = Exercise(
    id="02", lab="02", title="A batch that does not fit",
    task="Within the 16 MiB budget, every optimizer step uses the gradient of its whole batch (4096 rows on each of "
         "2 ranks): the same model as one process stepping once on the 8192 rows of each step.",
    broken=BROKEN, reference=REFERENCE,
    hint="What takes the memory is what the forward keeps for backward, and that grows with the rows you pass at "
         "once. How can a step use the gradient of 4096 rows without passing them through the model at once, and "
         "what must each part's loss be so that the parts add up to the whole batch's?",
    judge=judge, nproc=2, stall_s=2.0, tolerance=TOL, failure="cpu-oom",
    wrong_fixes=(
        WrongFix(
            "bigger-budget",
            (Edit("memory_budget(16)", "memory_budget(256)"),),
            lambda a: _budgets(a.tree) != [BUDGET_MIB],
            "The budget is the machine's: it stands for the GPU's memory, which a script cannot raise (and removing "
            "the cap only moves the failure to the machine's RAM, or to the kernel's OOM killer). The job must fit "
            "within 16 MiB per rank.",
            "no user report cited: the budget is the exercise's premise (lab 02: a GPU's memory, with an RLIMIT cap "
            "standing for it on the CPU)"),
        WrongFix(
            "skip-on-oom",
            (Edit(_STEP, '''\
    try:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    except RuntimeError as e:                                # out of memory: skip this batch
        if "can't allocate memory" not in str(e):
            raise
        opt.zero_grad()
'''),),
            lambda a: in_try(a.tree, "backward", "model", "mse_loss") and (not a.ok or a.mismatch is not None),
            "Skipping the batch that does not fit skips the training: here every batch is too big, so no step is "
            "taken. Where only one rank runs out, the others are already in backward's all-reduce and wait for it: "
            "lab 02's hang.",
            "https://github.com/pytorch/pytorch/issues/44353 ('ran out of memory, skipping this batch' under DDP: "
            "'the others get blocked'); https://github.com/Lightning-AI/pytorch-lightning/issues/5243"),
        WrongFix(
            "empty-cache",
            (Edit("import resource\n", "import gc\nimport resource\n"),
             Edit("    loss = nn.functional.mse_loss(model(x), y)\n",
                  "    gc.collect()                                             # free what we can first\n"
                  "    torch.cuda.empty_cache()\n"
                  "    loss = nn.functional.mse_loss(model(x), y)\n")),
            lambda a: bool(calls(a.tree, "empty_cache", "collect")) and not a.ok,
            "empty_cache() gives back memory the allocator keeps but no tensor uses (and on the CPU there is no "
            "cache); gc.collect() frees only what nothing refers to. What does not fit here is what the forward "
            "keeps for backward, alive until backward ends: nothing of it can be freed.",
            "https://github.com/pytorch/pytorch/pull/4879 ('a common misconception ... that torch.cuda.empty_cache "
            "will ... solve their OOM issues'); https://github.com/qqlu/Entity/issues/26"),
        WrongFix(
            "smaller-batch",
            (Edit("    x = torch.randn(4096, 32, generator=g)\n",
                  "    x = torch.randn(4096, 32, generator=g)[:512]             # a batch that fits\n"),),
            lambda a: a.ok and a.mismatch is not None and _loops(a.tree) == 1,
            "A smaller batch fits, but it is another training: each step now sees 512 rows of 4096 (the rest of the "
            "data is never used), and its gradient is that of a smaller batch. Keep the batch and pass it in parts "
            "(gradient accumulation), so that the step is the same.",
            "https://github.com/EuroEval/EuroEval/issues/22 ('different batch sizes tend to make the models perform "
            "differently ... we should change the gradient accumulation accordingly')"),
    ),
    limited=False,
    sources=("https://github.com/pytorch/pytorch/issues/44353",
             "https://github.com/Lightning-AI/pytorch-lightning/issues/5243"),
)
