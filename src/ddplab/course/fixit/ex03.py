"""Fix-it 03 (lab 03, shapes): all_gather of a rank-dependent number of hard examples.

Lab 03 gathers an evaluation's per-batch predictions whose last batch is ragged. Here each rank keeps
the per-sample losses above a threshold (how many depends on its data) and gathers them to pick the
hardest examples overall: the tensors differ in length, and gloo aborts the rank whose slot is too small.
"""
from __future__ import annotations

from ddplab.course.fixit.exercise import (
    Layout, Attempt, Edit, Exercise, Mismatch, WrongFix, every_rank, calls, close, in_try, reduces_with)

SEED = 3
SAMPLES = 40
CUT = 0.8
TOL = 1e-6

BROKEN = '''\
# Fix it (lab 03): every rank keeps its own "hard" examples (loss above 0.8) and all ranks gather them,
# to pick the hardest ones overall. Run with 2 ranks. It crashes: repair it so that every rank ends with
# every rank's hard losses, each exactly once, and nothing else.
import torch
import torch.distributed as dist

from ddplab.rank import lab

d = lab.setup()
g = torch.Generator().manual_seed(3 + d.rank)
losses = torch.rand(40, generator=g)                      # this rank's per-sample evaluation losses
hard = losses[losses > 0.8]                               # how many depends on this rank's data

gathered = [torch.empty_like(hard) for _ in range(d.world_size)]
dist.all_gather(gathered, hard)
everything = torch.cat(gathered)

lab.record("final", hard=sorted(everything.tolist()))
lab.teardown()
'''

_GATHER = '''\
gathered = [torch.empty_like(hard) for _ in range(d.world_size)]
dist.all_gather(gathered, hard)
everything = torch.cat(gathered)
'''

REFERENCE = BROKEN.replace(_GATHER, '''\
n = torch.tensor([hard.numel()])                          # FIX: share the lengths first,
sizes = [torch.zeros_like(n) for _ in range(d.world_size)]
dist.all_gather(sizes, n)
longest = max(int(s) for s in sizes)
padded = torch.zeros(longest)                             # pad to the longest,
padded[:hard.numel()] = hard
gathered = [torch.empty(longest) for _ in range(d.world_size)]
dist.all_gather(gathered, padded)
everything = torch.cat([t[:int(s)] for t, s in zip(gathered, sizes)])   # and cut each back to its length
''')


def baseline(nproc: int) -> list[float]:
    """Every rank's hard losses, computed in one process."""
    import torch
    out = []
    for rank in range(nproc):
        losses = torch.rand(SAMPLES, generator=torch.Generator().manual_seed(SEED + rank))
        out.extend(losses[losses > CUT].tolist())
    return sorted(out)


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    finals = attempt.finals()
    missing = every_rank(finals, nproc)
    if missing is not None:
        return missing
    want = baseline(nproc)
    for rank in sorted(finals):
        got = [float(v) for v in finals[rank].get("hard", [])]
        if not close(got, want, TOL):
            return Mismatch("hard losses", want, got, TOL)
    return None


def _cut_to_shortest(a: Attempt) -> bool:
    """Every rank kept fewer than it should, the same on every rank, and the code asks for the minimum
    of the ranks' counts (a gather to one rank, also short on the others, is not this)."""
    m = a.mismatch
    same = len({tuple(r.get("hard", [])) for r in a.finals().values()}) == 1
    return m is not None and isinstance(m.got, list) and len(m.got) < len(m.expected) and same \
        and reduces_with(a.tree, "MIN")


def _padded_not_cut(a: Attempt) -> bool:
    m = a.mismatch
    return m is not None and isinstance(m.got, list) and len(m.got) > len(m.expected) and 0.0 in m.got


EXERCISE = Exercise(
    id="03", lab="03", title="Gathering a different number of hard examples per rank",
    task="Every rank ends with every rank's hard losses (above 0.8), each exactly once, and nothing else.",
    broken=BROKEN, reference=REFERENCE,
    hint="all_gather needs the same shape on every rank. What does each rank need to know before it gathers, "
         "and what must it remove afterwards?",
    judge=judge, nproc=2, stall_s=2.0, tolerance=TOL, failure="gloo-size-mismatch",
    wrong_fixes=(
        WrongFix(
            "cut-to-shortest",
            (Edit(_GATHER, '''\
n = torch.tensor([hard.numel()])                          # every rank keeps as many as the shortest
dist.all_reduce(n, op=dist.ReduceOp.MIN)
hard = hard[:int(n)]
''' + _GATHER),),
            _cut_to_shortest,
            "Cutting every rank to the shortest length (or drop_last, which does the same to batches) makes the "
            "shapes agree by throwing data away: the hard examples past the shortest rank's count are never "
            "gathered, so the result misses some of them.",
            "https://github.com/pytorch/ignite/issues/1569 (unequal lengths at evaluation; padding the data "
            "to an even split changes the metric); https://github.com/pytorch/pytorch/issues/70985"),
        WrongFix(
            "pad-without-cut",
            (Edit(_GATHER, '''\
n = torch.tensor([hard.numel()])                          # pad every rank to the longest
dist.all_reduce(n, op=dist.ReduceOp.MAX)
padded = torch.zeros(int(n))
padded[:hard.numel()] = hard
gathered = [torch.empty(int(n)) for _ in range(d.world_size)]
dist.all_gather(gathered, padded)
everything = torch.cat(gathered)
'''),),
            _padded_not_cut,
            "Padding makes the shapes agree, but the padding is gathered too: without each rank's true length the "
            "zeros you added stay in the result as if they were losses. Gather the lengths and cut each piece "
            "back to its own length.",
            "https://github.com/Lightning-AI/pytorch-lightning/issues/7773 (pad with values that can be "
            "extracted later); https://github.com/huggingface/accelerate/pull/19 (pad_across_processes)"),
        WrongFix(
            "try-except",
            (Edit("dist.all_gather(gathered, hard)\n", '''\
try:
    dist.all_gather(gathered, hard)
except RuntimeError:                                      # skip the gather if the shapes disagree
    pass
'''),),
            lambda a: in_try(a.tree, "all_gather", "all_gather_into_tensor") and not a.ok,
            "gloo does not raise a Python error here: the rank whose slot is too small aborts (SIGABRT) inside "
            "the collective, which no except clause can catch, and its peer may already hold wrong bytes.",
            "https://github.com/pytorch/pytorch/issues/44353 (catching the error in one process only)"),
        WrongFix(
            "barrier-first",
            (Edit("gathered = [torch.empty_like(hard) for _ in range(d.world_size)]\n",
                  "dist.barrier()                                            # make the ranks meet first\n"
                  "gathered = [torch.empty_like(hard) for _ in range(d.world_size)]\n"),),
            lambda a: len(calls(a.tree, "barrier")) > 0 and not a.ok,
            "The ranks already meet in the gather; a barrier before it changes when they arrive, not what they "
            "bring. The lengths still differ, so the gather still breaks.",
            "https://github.com/Lightning-AI/pytorch-lightning/issues/7773 (different sizes freeze all_gather)"),
    ),
    layouts=(Layout(3),),
    sources=("https://github.com/pytorch/pytorch/issues/70037", "https://github.com/pytorch/pytorch/issues/23299"),
)
