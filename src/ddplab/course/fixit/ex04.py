"""Fix-it 04 (lab 04, padding): a GRU tagger's unpacked outputs gathered across ranks.

Lab 04 unpacks an LSTM's outputs under DataParallel and at DDP evaluation. Here a GRU tags each
rank's own sequences at evaluation; pad_packed_sequence pads to the longest sequence *this rank* saw,
so the ranks' outputs differ in length and the all_gather breaks (gloo aborts the rank whose slot is
too small).
"""
from __future__ import annotations

from ddplab.course.fixit.exercise import (
    Layout, Attempt, Edit, Exercise, Mismatch, WrongFix, constant_keyword, every_rank, close, has_keyword, in_try,
    reduces_with)

SEED = 26
N = 5
TOL = 1e-6

BROKEN = '''\
# Fix it (lab 04): each rank tags its own 5 sequences with a GRU, then every rank gathers every rank's
# per-token outputs (padded with zeros to the longest sequence of ALL ranks). Run with 2 ranks. It
# crashes: repair it so that every rank ends with every rank's outputs, padded to the overall longest.
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

from ddplab.rank import lab

d = lab.setup()
torch.manual_seed(0)
rnn = nn.GRU(3, 4, batch_first=True)
g = torch.Generator().manual_seed(26 + d.rank)
lengths = torch.randint(2, 9, (5,), generator=g)          # this rank's sequence lengths
seqs = [torch.randn(int(n), 3, generator=g) for n in lengths]
with torch.no_grad():
    packed = pack_padded_sequence(pad_sequence(seqs, batch_first=True), lengths, batch_first=True,
                                  enforce_sorted=False)
    out, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True)

gathered = [torch.empty_like(out) for _ in range(d.world_size)]
dist.all_gather(gathered, out)
lab.record("final", shape=list(torch.cat(gathered).shape), outputs=torch.cat(gathered).flatten().tolist())
lab.teardown()
'''

_UNPACK = "    out, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True)\n"

REFERENCE = BROKEN.replace(_UNPACK, '''\
longest = lengths.max().clone()                           # FIX: the longest sequence of every rank
dist.all_reduce(longest, op=dist.ReduceOp.MAX)
with torch.no_grad():
    out, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=int(longest))
''')


def baseline(nproc: int) -> tuple[list[int], list[float]]:
    """Every rank's outputs, computed in one process and padded to the longest sequence of all."""
    import torch
    import torch.nn as nn
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence
    torch.manual_seed(0)
    rnn = nn.GRU(3, 4, batch_first=True)
    data = []
    for rank in range(nproc):
        g = torch.Generator().manual_seed(SEED + rank)
        lengths = torch.randint(2, 9, (N,), generator=g)
        data.append((lengths, [torch.randn(int(n), 3, generator=g) for n in lengths]))
    longest = max(int(lengths.max()) for lengths, _ in data)
    outs = []
    with torch.no_grad():
        for lengths, seqs in data:
            packed = pack_padded_sequence(pad_sequence(seqs, batch_first=True), lengths, batch_first=True,
                                          enforce_sorted=False)
            outs.append(pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=longest)[0])
    both = torch.cat(outs)
    return list(both.shape), both.flatten().tolist()


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    finals = attempt.finals()
    missing = every_rank(finals, nproc)
    if missing is not None:
        return missing
    shape, values = baseline(nproc)
    for rank in sorted(finals):
        rec = finals[rank]
        if rec.get("shape") != shape:
            return Mismatch("shape", shape, rec.get("shape"))
        if not close([float(v) for v in rec.get("outputs", [])], values, TOL):
            return Mismatch("outputs", values, rec.get("outputs"), TOL)
    return None


def _shape(a: Attempt, longer: bool) -> bool:
    m = a.mismatch
    if m is None or m.what != "shape" or not isinstance(m.got, list) or len(m.got) != 3:
        return False
    return m.got[1] > m.expected[1] if longer else m.got[1] < m.expected[1]


EXERCISE = Exercise(
    id="04", lab="04", title="Unpacked GRU outputs gathered across ranks",
    task="Every rank ends with every rank's per-token outputs, padded with zeros to the longest sequence of all "
         "ranks (and no longer).",
    broken=BROKEN, reference=REFERENCE,
    hint="pad_packed_sequence can pad beyond the longest sequence it sees (look at its arguments). Where does "
         "the longest length of ALL ranks come from?",
    judge=judge, nproc=2, stall_s=2.0, tolerance=TOL, failure="gloo-size-mismatch",
    wrong_fixes=(
        WrongFix(
            "local-total-length",
            (Edit(_UNPACK, "    out, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True,\n"
                           "                                 total_length=int(lengths.max()))\n"),),
            lambda a: not a.ok and has_keyword(a.tree, ("pad_packed_sequence",), "total_length"),
            "total_length pads to the number you give it; this rank's own longest length is what it padded to "
            "already. The ranks still bring outputs of different lengths to the gather. The number must be the "
            "same on every rank: the longest of all ranks.",
            "https://github.com/pytorch/pytorch/issues/10537 (total_length set to the batch's own max length, "
            "'it doesn't work'); https://github.com/pytorch/pytorch/issues/6299"),
        WrongFix(
            "fixed-max-length",
            (Edit(_UNPACK, "    out, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=16)\n"),),
            lambda a: _shape(a, longer=True) and constant_keyword(a.tree, ("pad_packed_sequence",), "total_length"),
            "A constant total_length makes the shapes agree by guessing: too small and pad_packed_sequence raises, "
            "too large (as here) and every consumer gets padding beyond the longest sequence. Take the longest "
            "length of all ranks instead (one small all_reduce).",
            "https://github.com/pytorch/pytorch/issues/10537 (total_length set to the dataset's max length)"),
        WrongFix(
            "cut-to-shortest",
            (Edit("gathered = [torch.empty_like(out) for _ in range(d.world_size)]\n", '''\
n = torch.tensor(out.shape[1])                            # keep only as many steps as the shortest rank
dist.all_reduce(n, op=dist.ReduceOp.MIN)
out = out[:, :int(n)].contiguous()
gathered = [torch.empty_like(out) for _ in range(d.world_size)]
'''),),
            lambda a: _shape(a, longer=False) and reduces_with(a.tree, "MIN"),
            "Cutting every rank's outputs to the shortest rank's length makes the gather work by dropping the last "
            "tokens of the longer sequences: their tags are lost.",
            "https://github.com/pytorch/ignite/issues/1569 (unequal lengths at evaluation)"),
        WrongFix(
            "try-except",
            (Edit("dist.all_gather(gathered, out)\n", '''\
try:
    dist.all_gather(gathered, out)
except RuntimeError:                                      # skip the gather if the shapes disagree
    pass
'''),),
            lambda a: in_try(a.tree, "all_gather") and not a.ok,
            "gloo aborts the rank whose slot is too small (SIGABRT) inside the collective: no Python exception "
            "reaches the except clause.",
            "https://github.com/pytorch/pytorch/issues/44353 (catching a collective's error on one process)"),
    ),
    layouts=(Layout(3),),
    sources=("https://github.com/pytorch/pytorch/issues/6299", "https://github.com/pytorch/pytorch/issues/13214"),
)
