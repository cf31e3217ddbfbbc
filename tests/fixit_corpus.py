"""Attempts at the fix-its that are NOT in the exercises' ``wrong_fixes`` lists: the second set of issue 42.

Each ``Case`` writes one attempt into an exercise's broken script (or its reference fix) with ``Edit``s,
says whether it must be rejected or must pass, and cites the real report (forum, GitHub issue or pull
request) where people wrote or advised it. A rejected case must be rejected with a reason: a named wrong
fix whose evidence holds, or the failed invariant with its measured and expected values. A valid
alternative must pass in every layout of its exercise.

``tests/test_fixit_corpus.py`` grades them (a sample in ``make test``, all of them with
DDPLAB_FIXIT_FULL=1); ``benchmarks/fixit_grading.py`` grades all of them and reports the learner's wait.
"""
from __future__ import annotations

from dataclasses import dataclass

from ddplab.course import fixit
from ddplab.course.fixit import Edit

REJECT, PASS = "reject", "pass"


@dataclass(frozen=True)
class Case:
    exercise: str
    key: str
    edits: tuple[Edit, ...]
    expect: str                      # REJECT or PASS
    source: str                      # the real report it comes from
    on_reference: bool = False       # edits apply to the reference fix (else to the broken script)
    invariant: str | None = None     # where the issue names it: the invariant that must reject it

    def attempt(self) -> str:
        ex = fixit.get(self.exercise)
        text = ex.reference if self.on_reference else ex.broken
        for e in self.edits:
            text = e.apply(text)
        return text

    @property
    def id(self) -> str:
        return f"{self.exercise}-{self.key}"


def _ex(n: str):
    return fixit.get(n)


# --- pieces of the scripts the edits replace (each found exactly once) -----------------------------
_STOP01 = '''\
    if loss.item() < 0.05:                                # stop when the loss is small enough
        break
'''
_REF_STOP01 = '''\
    mean = loss.detach().clone()                          # FIX: decide together, on the whole dataset's loss
    dist.all_reduce(mean)
    if mean.item() / d.world_size < 0.05:
        break
'''
_GATHER03 = '''\
gathered = [torch.empty_like(hard) for _ in range(d.world_size)]
dist.all_gather(gathered, hard)
everything = torch.cat(gathered)
'''
_UNPACK04 = "    out, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True)\n"
_GATHER04 = '''\
gathered = [torch.empty_like(out) for _ in range(d.world_size)]
dist.all_gather(gathered, out)
lab.record("final", shape=list(torch.cat(gathered).shape), outputs=torch.cat(gathered).flatten().tolist())
'''
_INIT05 = 'dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=rank, world_size=world)\n'
_RANK06 = 'rank = int(os.environ.get("SLURM_PROCID", 0))             # which process am I?\n'
_INIT06 = 'dist.init_process_group("gloo", rank=rank, world_size=world_size)\n'
_SYNC07 = '''\
    for p in model.parameters():                              # average each gradient over the ranks
        dist.all_reduce(p.grad)
        p.grad /= d.world_size
'''
_INNER08 = '''\
    for xb, yb in zip(x.chunk(accum), y.chunk(accum)):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
    opt.step()
'''
_VAL10 = '''\
    if d.rank == 0:                                       # only rank 0 logs the validation loss
        model.eval()
        with torch.no_grad():
            val = nn.functional.mse_loss(model(val_x), val_y)
        lab.record("val", epoch=epoch, loss=val.item())
'''
_B10 = fixit.get("10").broken
_LOOP10 = _B10[_B10.index("for epoch in range(3):"):_B10.index('\nlab.record("final"') + 1]
_DDP10 = "model = DDP(nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1)))"
_CLIP11 = "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)\n"
_EPOCH12 = "for epoch in range(3):\n"
_STEP02 = '''\
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
'''

CASES: tuple[Case, ...] = (
    # ---- 01: early stopping that hangs -----------------------------------------------------------
    Case("01", "rank0-decides", (Edit(_STOP01, '''\
    if d.rank == 0 and loss.item() < 0.05:               # only the main process decides
        break
'''),), REJECT, "https://github.com/Lightning-AI/pytorch-lightning/issues/379 (the stop condition met in some "
                "processes but not all: those stop, the others hang)"),
    Case("01", "broadcast-rank0-decision", (Edit(_STOP01, '''\
    stop = torch.tensor([float(loss.item() < 0.05)])       # rank 0's decision, sent to everyone
    dist.broadcast(stop, src=0)
    if stop.item():
        break
'''),), REJECT, "https://github.com/ultralytics/yolov5/pull/8345 (broadcast_object_list of the main process's stop "
                "flag: every rank stops, on rank 0's metric alone)"),
    Case("01", "stop-if-any", (Edit(_STOP01, '''\
    stop = torch.tensor([float(loss.item() < 0.05)])       # stop every process if any wants to
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item():
        break
'''),), REJECT, "https://github.com/Lightning-AI/pytorch-lightning/pull/2467 ('stop every ddp process if any world "
                "process decides to stop': all_reduce of the flag)"),
    Case("01", "barrier-then-local-flag", (Edit(_STOP01, '''\
    should_stop = loss.item() < 0.05
    dist.barrier()                                        # synchronise before deciding
    if should_stop:
        break
'''),), REJECT, "https://github.com/talmolab/sleap-nn/pull/471 (barrier() synchronises execution but does not "
                "propagate should_stop: the ranks diverge after it)"),
    Case("01", "no-early-stop", (Edit(_STOP01, ""),), REJECT,
         "https://github.com/Lightning-AI/pytorch-lightning/issues/555 (early stopping removed to make DDP finish)"),
    Case("01", "divide-by-two", (Edit(_REF_STOP01, _REF_STOP01.replace("/ d.world_size", "/ 2")),), REJECT,
         "https://github.com/pytorch/pytorch/issues/23074 (the world size written for one layout: 'it is always the "
         "total number of processes regardless of ... nodes')", on_reference=True),
    Case("01", "all-gather-losses", (Edit(_REF_STOP01, '''\
    losses = [torch.zeros(1) for _ in range(d.world_size)]   # every rank's loss, then their mean
    dist.all_gather(losses, loss.detach().reshape(1))
    if torch.cat(losses).mean().item() < 0.05:
        break
'''),), PASS, "https://github.com/speechbrain/speechbrain/pull/2051 (synchronise the metric across processes)",
         on_reference=True),
    # ---- 02: a batch that does not fit -----------------------------------------------------------
    Case("02", "micro-batches-no-division", (Edit(_STEP02, '''\
    opt.zero_grad()
    for xb, yb in zip(x.chunk(8), y.chunk(8)):             # 8 micro-batches, gradients add up
        nn.functional.mse_loss(model(xb), yb).backward()
    opt.step()
'''),), REJECT, "https://github.com/karpathy/nanoGPT/issues/206 (accumulated micro-batch losses must be scaled by "
                "the number of micro-batches)"),
    Case("02", "no-grad-forward", (Edit(_STEP02, '''\
    with torch.no_grad():                                  # no activations kept: it fits
        loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.requires_grad_(True)
    loss.backward()
    opt.step()
'''),), REJECT, "https://github.com/pytorch/pytorch/issues/16417 ('used with torch.no_grad(): (train model) ... "
                "and this problem solved')"),
    # ---- 03: a ragged all_gather -----------------------------------------------------------------
    Case("03", "sum-padded", (Edit(_GATHER03, '''\
n = torch.tensor([hard.numel()])
dist.all_reduce(n, op=dist.ReduceOp.MAX)
padded = torch.zeros(int(n))
padded[:hard.numel()] = hard
dist.all_reduce(padded)                                   # one collective instead of a gather
everything = padded[padded > 0]
'''),), REJECT, "https://github.com/pytorch/pytorch/issues/70037 (all_reduce used where the values of every rank "
                "were wanted)"),
    Case("03", "gather-to-rank0", (Edit(_GATHER03, '''\
gathered = [torch.empty(40) for _ in range(d.world_size)] if d.rank == 0 else None
padded = torch.zeros(40)
padded[:hard.numel()] = hard
dist.gather(padded, gathered, dst=0)                      # only rank 0 needs them
everything = torch.cat(gathered)[torch.cat(gathered) > 0] if d.rank == 0 else hard
'''),), REJECT, "https://github.com/pytorch/pytorch/issues/23299 (gather to one rank where every rank needs the "
                "result)"),
    Case("03", "two-slots", (Edit(_GATHER03, '''\
sizes = [torch.zeros(1, dtype=torch.long) for _ in range(2)]   # the two GPUs of the workstation
dist.all_gather(sizes, torch.tensor([hard.numel()]))
longest = int(max(sizes))
padded = torch.zeros(longest)
padded[:hard.numel()] = hard
gathered = [torch.empty(longest) for _ in range(2)]
dist.all_gather(gathered, padded)
everything = torch.cat([t[:int(s)] for t, s in zip(gathered, sizes)])
'''),), REJECT, "https://github.com/pytorch/examples/issues/483 (a script written for the two GPUs it was tried on; "
                "'I can not run on 2 or more machines')"),
    Case("03", "all-gather-object", (Edit(_GATHER03, '''\
gathered = [None] * d.world_size
dist.all_gather_object(gathered, hard.tolist())           # any length, pickled
everything = torch.tensor([v for part in gathered for v in part])
'''),), PASS, "https://github.com/pytorch/pytorch/issues/70985 (all_gather_object for tensors of different sizes)"),
    Case("03", "pad-fixed-drop-zeros", (Edit(_GATHER03, '''\
padded = torch.zeros(40)                                  # at most 40 losses per rank; every hard one is > 0.8
padded[:hard.numel()] = hard
gathered = [torch.empty(40) for _ in range(d.world_size)]
dist.all_gather(gathered, padded)
everything = torch.cat(gathered)
everything = everything[everything > 0]
'''),), PASS, "https://github.com/huggingface/accelerate/pull/19 (pad_across_processes, then drop the padding)"),
    # ---- 04: unpacked GRU outputs ---------------------------------------------------------------
    Case("04", "sum-of-lengths", (Edit(_UNPACK04, '''\
    longest = lengths.max().clone()
    dist.all_reduce(longest)                              # the longest over the ranks
    out, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=int(longest))
'''),), REJECT, "https://github.com/pytorch/pytorch/issues/10537 (total_length set from a number that is not the "
                "longest length)"),
    Case("04", "flatten-first", (Edit(_GATHER04, '''\
flat = out.flatten()                                      # one dimension: the shapes cannot disagree
gathered = [torch.empty_like(flat) for _ in range(d.world_size)]
dist.all_gather(gathered, flat)
lab.record("final", shape=list(torch.cat(gathered).shape), outputs=torch.cat(gathered).flatten().tolist())
'''),), REJECT, "https://github.com/pytorch/pytorch/issues/13214 (all_gather of tensors whose sizes differ by rank)"),
    Case("04", "gather-objects-then-pad", (Edit(_GATHER04, '''\
parts = [None] * d.world_size
dist.all_gather_object(parts, out)                        # each rank's outputs, any length
longest = max(p.shape[1] for p in parts)
full = torch.cat([nn.functional.pad(p, (0, 0, 0, longest - p.shape[1])) for p in parts])
lab.record("final", shape=list(full.shape), outputs=full.flatten().tolist())
'''),), PASS, "https://github.com/pytorch/ignite/issues/1569 (gathering outputs of unequal lengths at evaluation)"),
    # ---- 05: a tcp:// port written into the script ----------------------------------------------
    Case("05", "tutorial-env-port", (Edit(_INIT05, '''\
os.environ["MASTER_ADDR"] = "localhost"                   # as in the DDP tutorial
os.environ["MASTER_PORT"] = "12355"
dist.init_process_group("gloo", rank=rank, world_size=world)
'''),), REJECT, "https://github.com/pytorch/examples/issues/840 (a tutorial's MASTER_PORT written into a script that "
                "a launcher starts)"),
    Case("05", "init-without-arguments", (Edit(_INIT05, 'dist.init_process_group("gloo")\n'),), PASS,
         "https://github.com/hpcaitech/ColossalAI/issues/110 (under torchrun, init from the environment)"),
    # ---- 06: a rank number torchrun never set ---------------------------------------------------
    Case("06", "local-rank-as-rank", (Edit(_RANK06, 'rank = int(os.environ["LOCAL_RANK"])                      '
                                                    '# which process am I?\n'),), REJECT,
         "https://github.com/pytorch/pytorch/issues/23074 ('local_rank for the two nodes are actually 0, 1 and 0, 1, "
         "so it hangs')", invariant="ends-ok"),
    Case("06", "group-rank", (Edit(_RANK06, 'rank = int(os.environ["GROUP_RANK"])                      '
                                            '# which process am I?\n'),), REJECT,
         "https://github.com/Tencent/PatrickStar/pull/42 (the node's rank taken for the process's: local to global "
         "rank for multi-node)"),
    Case("06", "local-world-size", (
        Edit(_RANK06, 'rank = int(os.environ["RANK"])\n'),
        Edit('world_size = int(os.environ["WORLD_SIZE"])\n', 'world_size = int(os.environ["LOCAL_WORLD_SIZE"])\n')),
         REJECT, "https://github.com/NVIDIA/DeepLearningExamples/pull/175 (local and global numbers mixed up: "
                 "'Multi-node training reports error because of this rank issue')"),
    Case("06", "slurm-then-rank", (Edit(_RANK06, 'rank = int(os.environ.get("SLURM_PROCID", os.environ["RANK"]))\n'),),
         PASS, "https://github.com/pytorch/pytorch/issues/49846 (the launcher's own variable where SLURM's is absent)"),
    Case("06", "init-without-arguments", (Edit(_INIT06, 'dist.init_process_group("gloo")\n'),), PASS,
         "https://github.com/pytorch/pytorch/issues/52848 (init from the environment torchrun sets)"),
    # ---- 07: one all-reduce per parameter --------------------------------------------------------
    Case("07", "reduce-then-broadcast", (Edit(_SYNC07, '''\
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])   # one bucket
    dist.reduce(flat, dst=0)                                  # summed on rank 0 ...
    dist.broadcast(flat, src=0)                               # ... and sent back
    flat /= d.world_size
    offset = 0
    for p in model.parameters():
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
'''),), REJECT, "https://github.com/pytorch/examples/issues/483 (gradients combined by hand; reduce to the master "
                "then broadcast, as parameter servers do, is two collectives where all_reduce is one)",
         invariant="collectives"),
    Case("07", "flat-not-copied-back", (Edit(_SYNC07, '''\
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])   # one all-reduce for all
    dist.all_reduce(flat)
    flat /= d.world_size
'''),), REJECT, "https://github.com/dotnet/TorchSharp/issues/250 (the summed gradients must be copied back into "
                "each parameter's .grad: 'copy_() will fix the problem')"),
    Case("07", "divide-by-two", (Edit(_SYNC07, '''\
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat)
    flat /= 2                                                 # two workers
    offset = 0
    for p in model.parameters():
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
'''),), REJECT, "https://github.com/Denys88/rl_games/pull/191 (flat gradient all_reduce written for one world "
                "size)"),
    Case("07", "ddp-buckets", (
        Edit("from ddplab.rank import lab\n", "from torch.nn.parallel import DistributedDataParallel as DDP\n\n"
                                              "from ddplab.rank import lab\n"),
        Edit("opt = torch.optim.SGD(model.parameters(), lr=0.05)\n",
             "model = DDP(model)                                        # gradients in buckets\n"
             "opt = torch.optim.SGD(model.parameters(), lr=0.05)\n"),
        Edit(_SYNC07, "")), PASS,
         "https://github.com/Denys88/rl_games/pull/191 ('why do we need to work with gradients manually?')"),
    # ---- 08: accumulation that accumulates nothing ----------------------------------------------
    Case("08", "divide-keep-zero-inside", (Edit(_INNER08, _INNER08.replace(
        "model(xb), yb)\n", "model(xb), yb) / accum\n")),), REJECT,
         "https://github.com/karpathy/nanoGPT/issues/206 (loss divided by the accumulation steps, zero_grad left "
         "inside the micro-batch loop)"),
    Case("08", "step-every-micro-batch", (Edit(_INNER08, '''\
    for xb, yb in zip(x.chunk(accum), y.chunk(accum)):
        loss = nn.functional.mse_loss(model(xb), yb) / accum
        loss.backward()
        opt.step()                                              # step as each micro-batch arrives
        opt.zero_grad()
'''),), REJECT, "https://github.com/ApolloResearch/e2e_sae/pull/70 (the optimizer step must wait for the "
                "accumulated gradient)"),
    Case("08", "no-sync-then-sync", (
        Edit("import torch\n", "import contextlib\n\nimport torch\n"),
        Edit(_INNER08, '''\
    for i, (xb, yb) in enumerate(zip(x.chunk(accum), y.chunk(accum))):
        with model.no_sync() if i < accum - 1 else contextlib.nullcontext():   # all-reduce once
            (nn.functional.mse_loss(model(xb), yb) / accum).backward()
    opt.step()
    opt.zero_grad()
''')), PASS, "https://github.com/pytorch/pytorch/issues/53443 (no_sync for all but the last micro-batch)"),
    # ---- 09: an interface name from the cluster --------------------------------------------------
    Case("09", "unset-ifname", (Edit(
        'os.environ["GLOO_SOCKET_IFNAME"] = "ib0"                  # from the cluster\'s job script: the fast network\n',
        'os.environ.pop("GLOO_SOCKET_IFNAME", None)               # let gloo choose\n'),), PASS,
         "https://github.com/aws-samples/aws-do-eks/pull/51 (the interface variable removed where it names no "
         "interface of the machine)"),
    # ---- 10: validation on rank 0 through the DDP wrapper ---------------------------------------
    Case("10", "join-advice", (
        Edit("from ddplab.rank import lab\n",
             "from torch.distributed.algorithms.join import Join\n\nfrom ddplab.rank import lab\n"),
        Edit(_LOOP10, "with Join([model]):                                      # the rank that finishes first "
                      "shadows the others\n" + "".join("    " + line + "\n" if line else "\n"
                                                        for line in _LOOP10.splitlines()))), REJECT,
         "issue 42's lab 10 report (the generic rank-exited-early advice, Join, followed); "
         "https://github.com/Lightning-AI/pytorch-lightning/issues/11242 (Join to even out the batches)"),
    Case("10", "no-sync-validation", (Edit(_VAL10, _VAL10.replace(
        "        with torch.no_grad():\n", "        with torch.no_grad(), model.no_sync():         # no sync here\n")),),
         REJECT, "https://github.com/pytorch/pytorch/issues/22095 (no_sync does not stop the buffer broadcast of a "
                 "forward)"),
    Case("10", "barrier-before", (Edit(_VAL10, "    dist.barrier()                                        "
                                               "# wait for every rank first\n" + _VAL10),
                                  Edit("from ddplab.rank import lab\n",
                                       "import torch.distributed as dist\n\nfrom ddplab.rank import lab\n")),
         REJECT, "https://github.com/GestaltCogTeam/BasicTS/issues/250 (rank 0 alone in a step, the others wait at a "
                 "barrier)"),
    Case("10", "validate-on-every-rank", (Edit(_VAL10, '''\
    model.eval()                                          # every rank runs the forward: the same collectives
    with torch.no_grad():
        val = nn.functional.mse_loss(model(val_x), val_y)
    if d.rank == 0:
        lab.record("val", epoch=epoch, loss=val.item())
'''),), PASS, "https://github.com/open-mmlab/mmdetection/pull/4582 (evaluation on every rank, buffers broadcast "
              "from rank 0)"),
    Case("10", "broadcast-buffers-false", (Edit(_DDP10, _DDP10[:-1] + ", broadcast_buffers=False)"),), PASS,
         "https://github.com/facebookresearch/maskrcnn-benchmark/issues/692 (broadcast_buffers=False: no collective "
         "in the forward)"),
    # ---- 11: clipping scaled gradients ----------------------------------------------------------
    Case("11", "no-clipping", (Edit(_CLIP11, ""),), REJECT,
         "https://github.com/milesial/Pytorch-UNet/issues/468 (gradients clipped before unscaling; removing the "
         "clip changes the training the task asks for)"),
    Case("11", "unscale-twice", (Edit(_CLIP11, "    scaler.unscale_(opt)\n" + _CLIP11),
                                 Edit("    scaler.step(opt)\n", "    scaler.unscale_(opt)\n    scaler.step(opt)\n")),
         REJECT, "https://github.com/Lightning-AI/pytorch-lightning/issues/9599 (unscale_ in two places: torch "
                 "raises 'unscale_() has already been called on this optimizer since the last update()')"),
    # ---- 12: three epochs in one order ----------------------------------------------------------
    Case("12", "set-epoch-at-end", (Edit('''\
        opt.step()

lab.record(''', '''\
        opt.step()
    sampler.set_epoch(epoch)                              # ready for the next epoch

lab.record('''),), REJECT,
         "https://github.com/Snowdar/asv-subtools/issues/8 (set_epoch must come at the beginning of each epoch, "
         "before the DataLoader iterator is made)"),
    Case("12", "rank-dependent-epoch", (Edit(_EPOCH12, _EPOCH12 + "    sampler.set_epoch(epoch + d.rank)\n"),), REJECT,
         "https://github.com/yangkky/distributed_tutorial/issues/5 ('very important to set the epoch to the same "
         "value in each worker, otherwise ... some data points will be visited multiple times')"),
    Case("12", "set-epoch-on-rank0", (Edit(_EPOCH12, _EPOCH12 + "    if d.rank == 0:\n"
                                                                "        sampler.set_epoch(epoch)\n"),), REJECT,
         "https://github.com/yangkky/distributed_tutorial/issues/5 (the epoch must be the same on every rank)"),
    Case("12", "new-loader-each-epoch", (Edit(_EPOCH12, _EPOCH12 + "    loader = DataLoader(data, batch_size=4, "
                                                                   "sampler=sampler)   # a fresh loader\n"),), REJECT,
         "https://github.com/Spijkervet/SimCLR/pull/26 (without set_epoch 'the same ordering will be always used')"),
    Case("12", "sampler-per-epoch", (Edit(_EPOCH12, _EPOCH12 + '''\
    sampler = DistributedSampler(data, shuffle=True, seed=epoch)   # a new seed each epoch
    loader = DataLoader(data, batch_size=4, sampler=sampler)
'''),), PASS, "https://github.com/pytorch/pytorch/issues/11324 (the order is seeded by seed + epoch: a new seed "
              "each epoch shuffles as set_epoch does)"),
)

REJECTED = tuple(c for c in CASES if c.expect == REJECT)
VALID = tuple(c for c in CASES if c.expect == PASS)
assert len({c.id for c in CASES}) == len(CASES)
