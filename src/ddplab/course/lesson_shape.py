"""A lesson's shape for every notebook, The Carpentries' lesson template as the model:

    python -m ddplab.course.lesson_shape notebooks/ [--solutions solutions/]

At the top of each notebook (its first markdown cell): the learner's minutes beside the machine's
("Teaching: N min, Exercises: M min"; the build still stamps "Measured time: N s") and one objectives
list. At the end: "Key points" and "Recap questions", two cells marked ``metadata.ddplab.lesson``;
the recap answers go to the instructor's ``solutions/NN_*.md`` under "## Recap answers", never into a
notebook. In every markdown cell, the first use of a glossary term links to ``docs/glossary.md``. And
the test marker leaves the learner's code: a code cell's ``# NBVAL_CHECK_OUTPUT`` line becomes nbval's
cell tag ``nbval-check-output`` (what ``ddplab.course.build`` selects checked cells by).

Why a script and not hand edits: several people edit other cells of the same notebooks at once, so the
lesson's parts are data here (``LESSONS``), applied with nbformat to those parts only, and running it
again replaces what it wrote (the header between its two comment lines, the cells by their metadata,
a term already linked is left alone): run it after every merge. Outputs are never touched.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

# --- the data: one place for every notebook's lesson parts --------------------------------------

FIXIT_MIN = 15          # the fix-it exercise: read the broken script, repair, run (2 ranks), grade, retry
GLOSSARY = "../docs/glossary.md"     # from notebooks/
SOLUTIONS_HEADING = "## Recap answers"
HEADER_START = "<!-- ddplab:lesson-header: written by python -m ddplab.course.lesson_shape, edit its data -->"
HEADER_END = "<!-- /ddplab:lesson-header -->"
TAG = "nbval-check-output"            # ddplab.course.build.CHECK_TAG (not imported: build imports torch's world)
COMMENT = "# NBVAL_CHECK_OUTPUT"


@dataclass(frozen=True)
class Lesson:
    """One notebook's lesson parts. Minutes are an estimate for a newcomer: teaching is reading the
    markdown (about 150 words a minute), the code and outputs (about 300) and waiting for the runs;
    exercises are the predictions and checkers (about 5 minutes each, a checker that runs a job
    included); the fix-it's FIXIT_MIN is added where the notebook has one (a ``%%ddplab`` cell)."""
    teaching: int
    exercises: int
    objectives: tuple[str, ...]
    keypoints: tuple[str, ...]              # typed: sentences that hold whatever a run measures
    recap: tuple[tuple[str, str], ...]      # (question, the instructor's answer)
    opening: str = "After this lab you can:"
    # key points that quote the runs (issue 42): a code cell that makes them from the notebook's own runs
    # (its lab's ``keypoints(runs)``, every number and comparative word computed), instead of typed text
    keypoints_code: str = ""


LESSONS: dict[str, Lesson] = {
    "00": Lesson(
        teaching=10, exercises=5, opening="After this notebook you can:",
        objectives=(
            "say what every lab does: reproduce an article's failure with a real multi-process run, diagnose it "
            "from evidence, fix it and plot the measured difference, and check the article's claims;",
            "check that this machine is ready (`ddplab doctor`) and run a first two-rank DDP job with `ddplab.run`;",
            "read a `RunResult`: its status, each rank's exit code and steps, and the run folder it leaves;",
            "say what ddplab means by a hung job (no rank made progress for the stall window) and what a claim's "
            "verdict can be.",
        ),
        keypoints=(
            "Every run is a real `torchrun` job (gloo on this CPU); `ddplab.run` returns a `RunResult` of facts "
            "(status, signature, each rank's exit code, where it waited) and leaves a run folder with each rank's "
            "log, its records and `result.json`.",
            "The first run, lab 01's `fixed-sampler`, ended `ok` with exit codes `[0, 0]`: two ranks, 5 steps each.",
            "A job is hung when no rank has made progress for the stall window (3 s by default), not when a clock "
            "runs out: a slow rank is not a stuck one.",
            "Each lab checks article sentences against its runs; a sentence gets one verdict (holds, partly, "
            "wrong, not established, not tested here), and a stand-in for the real thing decides none of them.",
        ),
        recap=(
            ("What does `ddplab.run` give back, and where does the evidence behind it live?",
             "A `RunResult` of facts: status, signature, each rank's exit code, where it waited and its error, the "
             "first failing rank, the wall time and `run_dir`. The run folder holds each rank's log, its records "
             "(one JSON object per event) and `result.json`; `r.explain()` puts the facts in sentences."),
            ("Why does ddplab judge a hang by progress over a stall window instead of by a timeout?",
             "A rank blocked in a collective uses no CPU and its ledger stands still however loaded the machine "
             "is, while a slow rank keeps moving. A timeout is either long (PyTorch's default: 30 minutes) or, "
             "short, calls a slow correct job hung on a loaded machine; the stall window answers a few seconds "
             "after a hang begins."),
            ("What does a claim verdict of \"not tested here\" tell you, and when does a lab give it?",
             "That this machine could run only a stand-in for what the sentence is about (the CPU emulation of "
             "`nn.DataParallel` without 2 GPUs, a cap on host memory for GPU memory, loopback for a network), so "
             "no run decided it. It is neither holds nor wrong."),
            ("What would you run first on a new machine before the labs, and what does it check?",
             "`ddplab doctor`: torch, the gloo and NCCL backends, GPUs, whether py-spy may read another process's "
             "stack, the number of cores, and whether torchrun's default port is free."),
        )),
    "01": Lesson(
        teaching=15, exercises=10,
        objectives=(
            "make a real two-rank DDP job hang, and read from each rank's stack and ledger where each rank waits;",
            "explain why ranks with different numbers of batches deadlock under DDP, and why a collective under "
            "`if rank == 0:` does too;",
            "fix it two ways: `DistributedSampler` (the same number of steps on every rank) and "
            "`torch.distributed.algorithms.Join`;",
            "measure how long each way of finding out takes: PyTorch's default timeout, "
            "`init_process_group(timeout=...)`, ddplab's verdict and torch's debug server.",
        ),
        keypoints=(),
        keypoints_code=("# Key points: made from this notebook's runs above\n"
                        'lab01.keypoints({"broken": broken, "rank-conditional": conditional, '
                        '**{r.variant: r for r in fixed},\n                 "time-to-answer": tta})'),
        recap=(
            ("Why does the rank with fewer batches not simply finish while the other trains on?",
             "Under DDP every `backward()` issues a gradient all-reduce that needs every rank. After its last batch "
             "rank 0 enters `barrier()`; rank 1's next `backward()` enters `all_reduce`. Each collective waits for "
             "the other rank, which is in a different one, so neither ever completes."),
            ("Why does `init_process_group(timeout=10)` not end the job 10 s after launch?",
             "The timeout bounds each collective's wait from the moment it starts waiting. The job first starts "
             "(torchrun, imports, rendezvous) and runs its first steps; only then do the ranks wait, and the 10 s "
             "count from there (about 13 s after launch in the stored run)."),
            ("How do `DistributedSampler` and `Join` fix the hang differently, and what does each do to the data?",
             "`DistributedSampler` makes the shards equal (it pads by repeating samples), so every rank runs the "
             "same number of steps. `Join` keeps the uneven shards: a rank that runs out joins the others' "
             "all-reduces with zeros until every rank is done, so no sample is repeated."),
            ("What does each way of finding the hang cost you, and what does it give?",
             "PyTorch's timeout: nothing to install, but 30 minutes by default and a message that names no "
             "collective. A shorter timeout: a code change, and a job that fails on a slow step. The debug server: "
             "a code change, three packages, open ports on every interface, stacks you still have to read. "
             "ddplab: no code change, a verdict a few seconds after the hang that names each rank's collective."),
            ("On NCCL, where would py-spy show the rank that waits in the gradient all-reduce, and why?",
             "At its next synchronisation (`loss.item()`, `torch.cuda.synchronize()`, a `.cpu()`), not in "
             "`all_reduce`: NCCL collectives are enqueued on a CUDA stream and `backward()` returns. The flight "
             "recorder, not the stack, says which collective it waits in."),
        )),
    "02": Lesson(
        teaching=15, exercises=10,
        objectives=(
            "make one rank of a real 2-rank DDP job run out of memory, and read what really happens;",
            "see what the kernel's OOM killer does instead (SIGKILL, no Python error), for real, under a cgroup "
            "memory limit;",
            "explain what `except OOM: continue` on one rank does to the other ranks;",
            "fix it two ways: gradient accumulation under `no_sync()` with the largest micro-batch that fits "
            "(found by measurement), or a skip that every rank agrees on first;",
            "measure peak memory against batch size, and check the accumulated gradient equals the full-batch one.",
        ),
        keypoints=(
            "A refused allocation is a clear, fast failure: `oom` ended `failed [cpu-oom]` within seconds, with "
            "`DefaultCPUAllocator: can't allocate memory` from the rank that ran out (on a GPU "
            "`torch.OutOfMemoryError`).",
            "The kernel's OOM killer leaves no Python error: where a memory cgroup could be made, the killed rank "
            "ended on SIGKILL (`rank-killed`) and the only message in the logs was its peer's \"Connection closed "
            "by peer\", which does not mention memory.",
            "Catching the OOM on one rank turned the crash into a hang (`skip-batch`: `hung "
            "[hang-different-collectives]`), and before it stopped, the all-reduces paired up by order, not by "
            "step: gradients of different steps were averaged.",
            "Accumulation under `no_sync()` with the largest micro-batch that fits gave the full-batch gradient "
            "(max difference under 1e-5) at a lower peak; a skip all ranks agree on first (an all-reduced flag) "
            "skipped the same step on every rank.",
            "Every memory limit here is host memory, a stand-in for GPU memory: it judges no claim about GPUs.",
        ),
        recap=(
            ("Why does skipping a batch on the one rank that ran out of memory hang the job, and what happened to "
             "the gradients before it hung?",
             "The skipping rank makes one all-reduce fewer than the others. DDP's all-reduces pair up by order, so "
             "from the skipped step on, one rank's step-n gradients were averaged with the other's step n+1; at the "
             "end one rank waits in a gradient all-reduce that never comes while the other waits in the final "
             "barrier."),
            ("What evidence is left when the kernel's OOM killer ends a rank, and where would you look on a cluster?",
             "No traceback and no \"out of memory\": only SIGKILL in torchrun's summary and the peer's \"Connection "
             "closed by peer\" (with gloo; with NCCL the peer waits until the watchdog's timeout). The reason is in "
             "the kernel's log on that node (`dmesg`: \"Memory cgroup out of memory: Killed process ...\")."),
            ("Why is catching OOM safe in the accumulation's probe but not in the training step?",
             "The probe runs forward and backward locally with no collective inside, so a rank that catches and "
             "retries changes nothing for the others; the ranks then agree on the micro-batch with one "
             "`all_reduce(MIN)`. In the training step, catching and skipping changes the number of collectives one "
             "rank issues."),
            ("Why does accumulation under `no_sync()` give the full batch's gradient, and what does it cost?",
             "Gradients add up in `.grad` across the micro-batches (each loss divided by their number), and the one "
             "all-reduce on the last micro-batch averages the sum: the same as one backward over the whole batch. "
             "It costs more, smaller forward and backward passes per step (time), not memory."),
            ("Why can this CPU machine not decide whether running out of GPU memory \"hangs without a clear "
             "message\"?",
             "There is no GPU memory here: the runs cap host memory (an rlimit, a cgroup), a stand-in that shows "
             "what host code does but not what the CUDA allocator and NCCL's watchdog do. The claim rows say so "
             "(\"not tested here\")."),
        )),
    "03": Lesson(
        teaching=15, exercises=15,
        objectives=(
            "say which shape differences between ranks break a data-parallel job and which do not;",
            "read what gloo, `TORCH_DISTRIBUTED_DEBUG=DETAIL` and DDP say when shapes differ;",
            "gather ragged tensors correctly (sizes, pad, gather, trim) and guard a collective with a cheap shape "
            "check;",
            "find the silent error that unequal batch sizes can cause in an averaged gradient.",
        ),
        keypoints=(
            "Batches of 10 and 20 rows under DDP neither hung nor failed: DDP all-reduces gradients, whose shapes "
            "are the parameters'. The harm is silent: the averaged gradient was off the 30-row gradient (the run above prints by how "
            "much), and weighting each rank's loss by its rows removed the error.",
            "An `all_gather` of 7 rows against 6 failed on gloo (`gloo-size-mismatch`): the rank whose slot was too "
            "small aborted, the other went on with wrong predictions until torchrun stopped it. "
            "`TORCH_DISTRIBUTED_DEBUG=DETAIL` named the collective and each rank's shape.",
            "DDP refused a model whose parameter shapes differ across ranks when it was constructed "
            "(`ddp-model-mismatch`).",
            "gloo compares bytes, not types: float64 against int64 ended `ok` with wrong sums on every rank; one "
            "cast where the data enters fixes it.",
            "A guard (a tiny `all_gather` of shapes before the gather) names the ranks and their shapes, or pads; "
            "its cost is one small collective's latency per gather.",
        ),
        recap=(
            ("Why does DDP not hang when ranks have different batch sizes, and what does go wrong?",
             "DDP all-reduces gradients, and a gradient has its parameter's shape whatever the batch, so every "
             "all-reduce matches. But each rank's loss is the mean over its own rows and DDP averages ranks with "
             "equal weight: 10 rows weigh as much as 20 (35 % error here). Weight each loss by its rows "
             "(`loss_sum * world_size / total_rows`) or give the ranks equal shards."),
            ("In a ragged `all_gather` on gloo, why do the two ranks fail differently?",
             "The rank with fewer rows receives more bytes than its slot holds: gloo's size check throws and it "
             "aborts. The rank with more rows receives fewer bytes into a larger slot: no check fails, one row stays "
             "unwritten, and it carries on with wrong results until torchrun stops it."),
            ("What does `TORCH_DISTRIBUTED_DEBUG=DETAIL` do before each collective, and why not leave it on?",
             "It first exchanges a fingerprint of the collective (operation, shapes, dtypes) across ranks and "
             "raises on a mismatch, naming both. That costs an extra exchange per collective (on NCCL a gloo-based "
             "one), and on torch 2.13's CPU build it crashes when DDP is constructed on gloo: use it to find a bug."),
            ("How can two ranks with different dtypes end `ok`, and what would catch it?",
             "With two 8-byte types (float64, int64) the byte counts match, so gloo adds the other rank's bits as if "
             "they were its own type. Nothing raises; a guard that gathers the dtype with the shape, or one cast at "
             "load on every rank, catches or prevents it."),
            ("What could a ragged gather do on NCCL, where there is no size check like gloo's?",
             "Hang until the watchdog's timeout, or complete with garbage (not measured here: no GPUs), so on GPUs "
             "a shape guard, or `DETAIL` while debugging, is worth more than on gloo."),
        )),
    "04": Lesson(
        teaching=20, exercises=15,
        objectives=(
            "run the article's own Example 1 and see when padding does and does not break DataParallel;",
            "explain why a model that unpacks a padded batch with `pad_packed_sequence` breaks `nn.DataParallel`, "
            "and fix it with `total_length=`;",
            "spot a tensor created on a fixed device inside `forward()` and fix it with `x.device` or "
            "`register_buffer`;",
            "gather padded outputs across DDP ranks correctly (agree on the global maximum length, pad, gather, "
            "trim);",
            "measure what padding costs and what length-bucketed batching (still distributed-safe) gives back.",
        ),
        keypoints=(
            "The article's Example 1 trained: the batch is padded before DataParallel splits it, so every "
            "replica's output has the same length.",
            "An LSTM unpacked with `pad_packed_sequence` returns each replica's own longest length; the gather "
            "failed at step 1 (`tensor-size-mismatch`), and `total_length=x.size(1)` made every step equal to one "
            "process. Without 2 GPUs these DataParallel runs are an emulation, and say so.",
            "A tensor created on a fixed device inside `forward()` failed on the other replica "
            "(`device-mismatch`); `device=x.device` or a registered buffer follows each replica.",
            "Under DDP, outputs padded to each rank's own longest sequence could not be gathered "
            "(`gloo-size-mismatch`); agreeing on the global maximum first (one `all_reduce` with `MAX`) and "
            "trimming back gave the one-process result.",
            "Length-bucketed batches at least halved the padding, with the same number of batches per rank and the "
            "same masked loss at the same weights; tokens per second is a timing on a shared machine: read the "
            "ratio.",
        ),
        recap=(
            ("Why did the article's Example 1 train under DataParallel while the LSTM extension failed?",
             "Example 1 pads the whole batch before DataParallel splits it and its `Linear` keeps the length, so "
             "every replica returns the same shape. The LSTM packs and unpacks: `pad_packed_sequence` pads back to "
             "the longest sequence in each replica's own chunk, and gather cannot concatenate different lengths."),
            ("Why did step 0 of the LSTM run work, and what does `total_length=` change?",
             "In step 0 both halves of the batch happened to hold a sequence of the same longest length (9). "
             "`total_length=x.size(1)` pads every replica's output back to the length of the input it received, "
             "which scatter keeps equal across chunks."),
            ("Why must every DDP rank pad to the same length before `all_gather`, and how do the ranks learn it?",
             "`all_gather` needs the same shape on every rank, and no rank may cut a sequence, so all pad to the "
             "global maximum; one `all_reduce` of each rank's own maximum with `MAX` gives it, and each row is "
             "trimmed back to its own length after the gather."),
            ("What does length bucketing change, and why does it keep DDP's all-reduces matched?",
             "It sorts sequences by length inside pools before cutting batches, so a batch's sequences have similar "
             "lengths and little padding. Every rank still gets the same number of batches (global batches cut "
             "first, their order shuffled with one seed), so every rank runs the same number of steps."),
            ("What can the CPU emulation of DataParallel show, and what can it not?",
             "It does DataParallel's steps by hand (scatter along dim 0, one replica per chunk, gather by "
             "concatenation), so it shows what that sequence does to these tensors. It is not `nn.DataParallel`: "
             "it judges no claim about what `nn.DataParallel` itself does."),
        )),
    "05": Lesson(
        teaching=10, exercises=10,
        objectives=(
            "recognise PyTorch's error when `MASTER_PORT` is taken, say which rank raises it and why, and name the "
            "process that holds the port;",
            "say what really happens when two jobs start at once with the same `MASTER_PORT` (measured, it is a "
            "race);",
            "check a port the way that works (bind it / psutil), and say why the article's `netstat` snippet does "
            "not;",
            "never pick a port by hand again: port 0 (`torchrun --rdzv-endpoint 127.0.0.1:0`, `--standalone`), or "
            "bind port 0 and pass it on.",
        ),
        keypoints=(
            "With `MASTER_PORT` taken, the job failed within seconds (`failed [port-in-use]`), not after a "
            "timeout: the rank that hosts the store could not bind, and ddplab named the process holding the port.",
            "Two jobs started at once on one fixed port did not both succeed in this execution's pair: which job "
            "fails, or whether ranks of one job join the other, is a race; one pair is an anecdote "
            "(`benchmarks/lab05_two_jobs.py` counts many).",
            "The article's `except RuntimeError: time.sleep(60)` hid the error: the job was `hung "
            "[hang-rendezvous]`, one rank sleeping, the other waiting at the rendezvous, until ddplab's stall rule "
            "ended it.",
            "Port 0 removes the race: with `--rdzv-endpoint 127.0.0.1:0` every pair of jobs ended both `ok`, and "
            "`fixed-retry` binds port 0 on `EADDRINUSE` and passes it on.",
            "The article's `netstat` snippet passes `| grep` as an argument, so it reported success on a taken port; "
            "binding the port or asking psutil (`ddplab doctor --port N`) sees it.",
        ),
        recap=(
            ("Why does only one rank fail at once when `MASTER_PORT` is taken, and what is the other rank doing?",
             "Rank 0 hosts the store and must bind the port: the bind fails at once (`EADDRINUSE`). The other ranks "
             "only connect, and a connect to a port someone listens on succeeds: they wait, connected to whatever "
             "listens there, until torchrun ends them after rank 0 exits."),
            ("What can happen when two jobs start with the same `MASTER_PORT`, and why does one pair not say how "
             "often?",
             "One job's store binds and the other's rank 0 fails; or a rank of one job connects to the other job's "
             "store and the jobs cross-join (hangs, wrong groups). Which happens depends on timing: a race, so it "
             "needs many repetitions to count."),
            ("What does the article's `time.sleep(60)` cost you, and what would you write instead?",
             "The failing rank knows within milliseconds but stays alive, so torchrun learns nothing for 60 s, and "
             "the other rank waits at the rendezvous (30 minutes with the default timeout). Fail fast (no sleep) "
             "and use a port nobody chose by hand."),
            ("Why does the article's netstat snippet report success on a taken port?",
             "Without a shell no pipe runs: `'| grep 12355'` is passed to `netstat` as arguments, netstat prints "
             "its table and exits 0, and the snippet reads exit 0 as \"port free\". Bind the port (or ask psutil who "
             "listens) instead."),
            ("Why is port 0 free of races while \"pick a free port, then pass it to torchrun\" is not?",
             "With port 0 the OS chooses the port while binding it, so nobody can take it in between. A port found "
             "free and bound later can be taken by another job in the gap."),
        )),
    "06": Lesson(
        teaching=15, exercises=10,
        objectives=(
            "recognise PyTorch's own messages for a missing rank on both sides of the store;",
            "predict, from the configured timeout and a rank's delay, whether and when `init_process_group` fails "
            "(measured sweep);",
            "tell \"nothing answers\" from \"a rank is missing\" by PyTorch's exception and ddplab's signature;",
            "choose timeouts on purpose and check the ground before a multi-node run (`ddplab doctor`'s "
            "pre-flight).",
        ),
        keypoints=(
            "A missing rank: both sides timed out on their own clock (`rendezvous-timeout`), rank 0 with \"2/3 "
            "clients joined\" and rank 1 with a store wait timeout; neither names the missing host, only a count.",
            "With rank 1 1.5 s late, the timeouts of 0.5 and 1 s failed after about the timeout and those of 2 and "
            "4 s succeeded as soon as it arrived; the default would wait 30 minutes for a rank that never comes.",
            "A master nothing answers ended `store-unreachable` (`DistNetworkError` after the timeout), a missing "
            "rank `DistStoreError`: which layer gave up says where to look.",
            "`init_process_group(\"nccl\")` on a machine without GPUs failed at once with the cause named "
            "(`nccl-without-gpu`); choosing the backend from the hardware ran.",
            "The article's `except RuntimeError: time.sleep(60)` with the default timeout told no one anything; "
            "ddplab called it hung after its stall window, while a timeout set on purpose failed in seconds.",
        ),
        recap=(
            ("Why does neither rank's error name the rank that is missing, and what clue is there?",
             "Each side only knows what it waited for: rank 0's store counts clients (\"2/3 clients joined\"), rank "
             "1 waits for a key rank 0 never publishes. Nobody knows the missing rank's host; the count says one is "
             "missing."),
            ("How would you choose `init_process_group`'s timeout for a job whose nodes can start a minute apart?",
             "Longer than the largest delay you expect (a timeout shorter than the delay fails; a longer one "
             "returns as soon as the late rank arrives, so a generous one costs nothing when all come), but far "
             "below 30 minutes; on a cluster bound the wait for nodes with torchrun's `join_timeout` and let "
             "`--max-restarts` retry."),
            ("What does `DistNetworkError` tell you that `DistStoreError` does not?",
             "That no store answered at all: the network layer gave up connecting (a wrong address or port, a "
             "route, a firewall that drops). `DistStoreError` means the store answered and the wait inside it ran "
             "out: a rank that never came."),
            ("Why did the script written with `\"nccl\"` fail at once instead of hanging?",
             "A CPU build of torch has no NCCL, so `init_process_group(\"nccl\")` raises immediately; on a CUDA "
             "build it initialises, and the first collective on a CPU tensor raises instead. Either way the wrong "
             "backend is an error, not a wait."),
            ("What does the pre-flight check before a multi-node job, and why before `init_process_group`?",
             "That the master is reachable, its port usable, and that all ranks agree on torch and `WORLD_SIZE` "
             "(a tiny job, every rank reporting). Inside `init_process_group` the same faults show only as a silent "
             "wait until the timeout."),
        )),
    "07": Lesson(
        teaching=15, exercises=10,
        objectives=(
            "split a DDP step into compute, communication hidden under backward, and *exposed* communication, per "
            "rank, with PyTorch's own instruments (a DDP communication hook, DDP's logging data, "
            "`torch.profiler`);",
            "show from real runs where the \"large model, small batch\" corner is, and measure what each fix buys "
            "in samples per second;",
            "read an all-reduce bus-bandwidth curve against the machine's copy bandwidth;",
            "say what a CPU laptop can and cannot tell you about scaling on a GPU cluster.",
        ),
        keypoints=(),
        keypoints_code=("# Key points: made from this notebook's runs above\n"
                        'L.keypoints({"grid": grid, "scaling": scaling, "fix-rows": frows, "dataparallel": dp})'),
        recap=(
            ("Why does a larger per-rank batch reduce the share of the step spent waiting for communication?",
             "The all-reduce moves the same bytes (the parameter count x 4) whatever the batch, while compute grows "
             "linearly with it; the communication is also overlapped with more backward work. So the exposed part "
             "shrinks relative to the step."),
            ("Why can the smallest model at the smallest batch show the largest communication share?",
             "Its all-reduce is latency-bound: a small message still costs a fixed few hundred microseconds to "
             "milliseconds on loopback, and its compute is almost nothing, so the fixed cost dominates."),
            ("What is exposed communication, and why is it the part that matters?",
             "The part of the all-reduce the step waits for after backward has finished, as opposed to the part "
             "hidden under backward's remaining compute. Only the exposed part adds to the step time."),
            ("Why did compression not pay on loopback, and when would it?",
             "On loopback the link is fast and partly latency-bound, so halving the bytes saves little, while the "
             "casts cost CPU time. It pays on a slow link where the bytes dominate the step (lab 09's capped link)."),
            ("What can a CPU run tell you about scaling on a GPU cluster, and what not?",
             "The mechanism and the ratios: how the communication share moves with model size and batch, which "
             "fixes attack it. Not the numbers: GPUs compute about 100x faster and NVLink or InfiniBand move bytes "
             "at tens to hundreds of GB/s, so measure the ratio on the real hardware."),
        )),
    "08": Lesson(
        teaching=15, exercises=10,
        objectives=(
            "run a code sample from an article for real (2 gloo ranks, `torchrun` via `ddplab.run`) instead of "
            "trusting it;",
            "measure which gradient article 001's gradient-accumulation loop hands to `optimizer.step()`, fix the "
            "loop, and count the all-reduces the fix changes;",
            "record the order in which `DistributedSampler(shuffle=True)` visits the data, epoch after epoch, with "
            "and without `set_epoch()`;",
            "read PyTorch's real error when article 000's `init_process_group` runs without "
            "`MASTER_ADDR`/`MASTER_PORT`.",
        ),
        keypoints=(
            "Article 001's accumulation loop ran with no error and was silently wrong: `zero_grad()` at the top of "
            "every iteration left `optimizer.step()` the last micro-batch's gradient alone (identical to it, for "
            "every k), and it all-reduced k times per step.",
            "The fixed loop (zero after the step, the loss divided by k, `no_sync()` for the first k - 1 backward "
            "passes) equalled the full-batch gradient to float32 rounding and all-reduced once per step.",
            "Without `set_epoch`, `DistributedSampler(shuffle=True)` visited the data in the same order every "
            "epoch; the shards still covered the dataset once per epoch.",
            "Article 000's `init_process_group` without `MASTER_ADDR` did not hang: every rank raised `ValueError` "
            "at once (`missing-master-env`).",
            "Read as text, each sample looked correct; running it found the mistakes.",
        ),
        recap=(
            ("Which gradient does article 001's loop apply, and why does nothing warn you?",
             "Only the last micro-batch's: `zero_grad()` at the top of every iteration wipes the ones before. "
             "Every call is legal and every rank does the same, so DDP stays consistent and nothing raises: the "
             "model just trains on a quarter of the data per step (k = 4)."),
            ("Why does `no_sync()` save all-reduces without changing the gradient?",
             "Inside `no_sync()` DDP's reducer only accumulates gradients locally in `.grad`; the backward outside "
             "it all-reduces once, the sum of all micro-batches, which averaged over ranks is what k all-reduces "
             "would have produced. k - 1 all-reduces are saved per step."),
            ("Why is the loss divided by k in the fixed loop?",
             "Gradients of k micro-batches add up in `.grad`; dividing each loss by k makes the sum the mean over "
             "the whole batch, the gradient one backward over all of it would give."),
            ("What goes wrong without `set_epoch`, and why do the shards stay balanced anyway?",
             "The sampler shuffles with `seed + epoch`, and the epoch stays 0, so every epoch replays the same "
             "batches in the same order: the shuffle happens once. The split into shards does not depend on the "
             "epoch, so each epoch still covers the dataset once across ranks."),
            ("How would you check another article's code sample before trusting it?",
             "Run it as written on 2 ranks (`ddplab run sample.py --nproc 2`, with `--check`) and measure what it "
             "claims against a reference computed in one process: the gradient applied, the order of the data, the "
             "number of collectives; read the error it raises rather than the article's description of it."),
        )),
    "09": Lesson(
        teaching=20, exercises=15,
        objectives=(
            "run a real multi-node job: one torchrun agent per node, c10d rendezvous at node 0's address;",
            "see a slow link turn DDP's all-reduce into the step, and measure what fp16 compression and PowerSGD "
            "buy there;",
            "meet a firewall and a hostname that resolves to 127.0.1.1 the way a cluster shows them, and read the "
            "diagnosis;",
            "launch two nodes that disagree on WORLD_SIZE, and catch it with a rank-side pre-flight before any job;",
            "check the articles' network sentences against the measurements.",
        ),
        keypoints=(
            "A firewall that opened only the rendezvous port hung the job (`hang-data-port-blocked`): torchrun's "
            "store for the workers and gloo listen on random ports, and dropped packets give no error. ddplab named "
            "the unanswered address from each rank's sockets; trusting the cluster's subnet fixed it.",
            "A hostname that resolves to 127.0.1.1 made gloo tell its peer to dial its own loopback: the job failed "
            "(`gloo-loopback-address`), and `GLOO_SOCKET_IFNAME` fixed it. The network pre-flight found both faults "
            "before any job.",
            "Nodes launched with different `--nproc-per-node` under `TORCH_ELASTIC_WORKER_IDENTICAL=1` disagreed "
            "on WORLD_SIZE and hung at the rendezvous, one rank number belonging to no process; the ranks' "
            "pre-flight named the disagreement before the job.",
            "On a link capped at 100 Mbit/s the all-reduce became most of the step, and fp16 compression and "
            "PowerSGD bought time back there (fp16 about halved the step); uncapped, both made the step slower.",
            "A link dropping 5 % of packets gave a few much slower steps (TCP retransmits) but no hang: the job "
            "ended `ok`.",
        ),
        recap=(
            ("Why is opening the rendezvous port in a firewall not enough for a torchrun job?",
             "The agents meet on that port, but torchrun 2.13 then starts a second store for the workers on a "
             "random port (`MASTER_PORT`), and gloo's data connections use random ports too. Trust the nodes' "
             "subnet (or fix and open every port torchrun and gloo use)."),
            ("Why does a firewall that drops packets give a hang where a closed port gives an error?",
             "A closed port answers with a reset (connection refused) at once. A dropping firewall answers nothing: "
             "the connection stays in SYN_SENT while TCP retries, and the rank waits in `init_process_group` until "
             "its timeout, 30 minutes by default."),
            ("What does gloo do with the hostname, and what does `GLOO_SOCKET_IFNAME` change?",
             "Without it gloo resolves the hostname to find the address it listens on and tells its peers; a hosts "
             "file line `127.0.1.1 node1` makes that loopback, which on the peer's node is the peer itself. "
             "`GLOO_SOCKET_IFNAME` names the interface the nodes share instead."),
            ("Why does a pre-flight find these faults faster than the job would?",
             "It checks each fault directly (what the hostname resolves to, a connection to the rendezvous port "
             "and to a random port, what every rank was given) with bounded waits and no `init_process_group`, so "
             "a fault is named in about a second instead of surfacing as a silent wait."),
            ("When does gradient compression pay, and how would you find out on your cluster?",
             "When the link, not compute or latency, sets the step: a slow or shared inter-node network. Measure "
             "the step with and without the hook on the real link (and the all-reduce bus bandwidth with "
             "nccl-tests); on a fast link the casts can cost more than the bytes saved."),
        )),
    "10": Lesson(
        teaching=20, exercises=15,
        objectives=(
            "see what DDP does with a parameter that gets no gradient, and choose between "
            "`find_unused_parameters=True`, `static_graph=True` and removing the parameter, with their measured "
            "cost;",
            "say whose statistics a BatchNorm's running buffers hold under DDP, with buffer sync on, off or averaged "
            "by hand;",
            "explain what happens when one rank evaluates through the DDP wrapper, and evaluate safely instead;",
            "show what training through `model.module` does to the replicas;",
            "tell which rank-dependent state DDP's constructor makes equal across ranks and which it does not.",
        ),
        keypoints=(
            "A parameter that gets no gradient made DDP raise in the next iteration (`unused-parameters`), not in "
            "the backward that skipped it; `find_unused_parameters=True` and `static_graph=True` both trained with "
            "the ranks equal, and their cost was measured, not assumed.",
            "BatchNorm's running statistics are buffers, never all-reduced: with buffer sync on, rank 0's "
            "checkpoint held rank 0's data only; off, the same batch gave different outputs on the two ranks; "
            "averaged by hand, the running mean was the global one. `SyncBatchNorm` refused CPU modules.",
            "Evaluating through the DDP wrapper on rank 0 alone hung (`hang-different-collectives`): the wrapper's "
            "forward broadcasts buffers, a collective rank 1 never joins. Evaluating `model.module` under "
            "`no_grad` ended `ok`.",
            "Training through `model.module` skips DDP's hooks: the ranks' parameters differed from step 1 on, with "
            "no error and no warning.",
            "DDP's constructor broadcasts rank 0's parameters and buffers; it does not equalise plain tensor "
            "attributes or weights re-initialised after wrapping.",
        ),
        recap=(
            ("Why does DDP raise about the unused parameter one iteration late?",
             "The backward that skips it returns normally: the reducer just never finishes the bucket that holds "
             "the parameter. The next forward checks that the previous reduction finished, and raises there."),
            ("What do the three ways of handling BatchNorm buffers (sync on, off, averaged) leave on the ranks, and "
             "which would you checkpoint?",
             "Sync on: every rank starts each forward with rank 0's statistics, so the checkpoint holds rank 0's "
             "data only. Off: each rank keeps its own, and evaluation differs by rank. Averaged (all_reduce then "
             "divide before evaluating or saving): the ranks agree and the mean is the global one (the variance "
             "is not exactly). Average before saving, or use `SyncBatchNorm` on GPUs."),
            ("Why do `torch.no_grad()` and `model.eval()` not prevent the evaluation hang?",
             "They switch off gradients and dropout, not DDP: the wrapper's `forward` still broadcasts the buffers "
             "first, a collective that needs every rank. Evaluate `model.module`, whose forward has no collective."),
            ("Why does training through `model.module` raise no error, and how would you notice it?",
             "`model.module` is the plain model: its backward computes local gradients and no DDP hook all-reduces "
             "them, which is legal. Compare parameter checksums across ranks (`ddplab run --check` does) or watch "
             "the ranks' losses part."),
            ("Which state does DDP's constructor make equal across ranks, and which not?",
             "It broadcasts rank 0's registered parameters and buffers once, at construction. Plain tensor "
             "attributes, anything re-initialised after wrapping, and optimizer or random state stay per rank: "
             "seed everything the same, or create such state before wrapping."),
        )),
    "11": Lesson(
        teaching=15, exercises=15,
        objectives=(
            "port an `apex.amp` training loop to `torch.amp` (autocast, and `GradScaler` where fp16 needs it), with "
            "gradient accumulation under `no_sync()`, and measure the loss, step time and memory against float32;",
            "explain how `GradScaler` decides under DDP when only **one** rank's gradient is non-finite, and build "
            "the case where the ranks disagree;",
            "tell a slow input pipeline from a hang: where each rank waits, and what `num_workers`, "
            "`prefetch_factor` and `pin_memory` change.",
        ),
        keypoints=(
            "`apex.amp` ports to `torch.amp`: bf16 autocast on this CPU kept the loss within 1 % of float32 at "
            "every step and about halved the activations saved for backward; its step time says nothing about a "
            "GPU.",
            "Under DDP a non-finite gradient on one rank is non-finite on every rank after the all-reduce, so every "
            "rank's scaler skipped the same step and halved its scale, and the weights stayed equal.",
            "Kept inside `no_sync()` (no all-reduce), each rank's scaler decided alone: only the rank with the inf "
            "skipped, the scales and the weights parted, and the job still ended `ok`.",
            "A slow input pipeline on one rank looks like a hang: the other rank waits in a collective. Stopped, "
            "ddplab said `interrupted [rank-waits-for-data]`; left alone, the job ended `ok`, because the loader's "
            "decoding counts as progress.",
            "Two DataLoader workers raised samples per second when loading waits on storage; `pin_memory=True` "
            "pinned nothing without an accelerator (PyTorch warns).",
        ),
        recap=(
            ("Why do the ranks' GradScalers agree under DDP without communicating, and what breaks that?",
             "The gradient all-reduce adds the ranks' gradients, so an inf or NaN on one rank is on every rank "
             "afterwards, and each scaler sees the same gradient and decides the same. Any step on gradients that "
             "were never all-reduced (a loop kept inside `no_sync()`, a rank-local skip) breaks it."),
            ("Why is bf16 autocast run without a GradScaler, and fp16 not?",
             "bfloat16 has float32's exponent range, so small gradients do not underflow. float16 cannot represent "
             "values below about 6e-8: without scaling the loss up first, small gradients become zero."),
            ("How can you tell a slow input pipeline from a hang, with ddplab and without it?",
             "A slow loader keeps a rank busy (its workers use CPU or wait on I/O) while the others wait in a "
             "collective for it; a hang has no rank making progress. ddplab names where each rank waits "
             "(`dataloader` against `collective`); by hand, time `next(loader)` per rank and look at py-spy on "
             "every rank, not just the one that looks stuck."),
            ("Why did more DataLoader workers help here although the machine has 2 cores?",
             "Most of a sample's time was a wait on storage (a sleep), which uses no core, so two workers wait for "
             "two batches at once. Had the time been decoding (CPU work), workers beyond the free cores would add "
             "nothing."),
            ("What kind of loader wait would ddplab's stall rule mistake for a hang, and what would you do?",
             "One that uses no CPU and is not in the kernel's uninterruptible disk wait: a `time.sleep` or a socket "
             "read from an object store, filling the whole stall window in every process of a rank. Give such a job "
             "a longer `stall_s`."),
        )),
    "12": Lesson(
        teaching=10, exercises=10,
        objectives=(
            "name five ways a data-parallel job ends with status ok and a wrong model;",
            "run any script with `ddplab run --check` and read its \"ok, but ...\" section;",
            "say which fix removes each finding, and what `--check` cannot see.",
        ),
        keypoints=(
            "All ten jobs ended `ok`; `--check` reported a finding for each of the five broken variants and nothing "
            "for their fixed twins.",
            "Training through `model.module` and `optimizer.step()` inside `no_sync()` left the ranks with different "
            "models at the end; the data variants (no `set_epoch`, rank-seeded splits) left the replicas identical, "
            "so comparing the replicas does not reveal them, nor, on this task, the loss curve: `--check` did.",
            "With buffer sync on, every forward starts from rank 0's BatchNorm buffers and then updates them from "
            "each rank's own batch: the ranks' losses still differed a little. Only `SyncBatchNorm` gives the whole "
            "batch's statistics.",
            "`--check` adds no collective: each rank keeps its own records and the launcher compares them after the "
            "run; where it cannot see (no DDP model, FSDP) it says \"not checked\".",
        ),
        recap=(
            ("Why can a job that trains two different models end `ok` with no error?",
             "Every collective still matches (the same calls in the same order with the same shapes), so nothing "
             "hangs or raises; the mistake is in what goes into them (a step without DDP's all-reduce, a step on "
             "unsynchronised gradients), which no collective checks."),
            ("Two of the broken variants leave the replicas identical. Why is that still a bug?",
             "The replicas agree but train on the wrong data: without `set_epoch` every epoch repeats one order, "
             "and rank-seeded splits drop some samples and repeat others. DDP averages every gradient, so the "
             "ranks stay equal while the model sees less, or the wrong mix, of the data."),
            ("What does `--check` record on each rank, and why does it need no collective?",
             "Checksums of the DDP model's parameters and buffers every few forwards, the indices each DataLoader "
             "hands out per epoch, and every optimizer step (inside `no_sync()` or not). Each rank writes its own "
             "records; the launcher compares them after the run, so the training's collectives are unchanged."),
            ("Why do `TORCH_DISTRIBUTED_DEBUG=DETAIL` and the flight recorder not find these problems?",
             "They check that collectives match across ranks (operation, shapes, order). Every collective here "
             "matched; what differed was the data and the state, which only a comparison of the ranks' own records "
             "shows."),
            ("Which rank's model would you save from `module-update`, and what does the question tell you?",
             "Neither is the model the script meant to train: the rank that also stepped through `model.module` "
             "drifted, and the other is missing those updates. That the saved model depends on which rank saves "
             "it is the symptom; fix the training, not the choice of rank."),
        )),
}

# Glossary terms: anchor in docs/glossary.md -> what counts as a use in prose (a plain word, or a code span).
TERMS: dict[str, str] = {
    "stall-window": r"stall window",
    "signature": r"signatures?",
    "ledger": r"ledgers?",
    "flight-recorder": r"flight[ -]recorder",
    "stand-in": r"stand-ins?",
    "rank": r"ranks?",
    "world-size": r"world size|`WORLD_SIZE`",
    "rendezvous": r"rendezvous",
    "collective": r"collectives?",
    "verdict": r"verdicts?",
    "--check": r"`--check`",
    "fix-it": r"fix-it",
}


# --- the header ---------------------------------------------------------------------------------

def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else source


def has_fixit(nb) -> bool:
    """The notebook has a fix-it exercise (a ``%%ddplab`` cell)."""
    return any(c.cell_type == "code" and _text(c.source).lstrip().startswith("%%ddplab") for c in nb.cells)


def learner_minutes(lesson: Lesson, fixit: bool) -> tuple[int, int]:
    """(teaching, exercises) minutes; the fix-it's are counted only where the notebook has one."""
    return lesson.teaching, lesson.exercises + (FIXIT_MIN if fixit else 0)


def header_block(lesson: Lesson, fixit: bool) -> str:
    teaching, exercises = learner_minutes(lesson, fixit)
    parts = [f"predictions and checkers {lesson.exercises} min"] + ([f"the fix-it {FIXIT_MIN} min"] if fixit else [])
    lines = [HEADER_START,
             f"**Learner time:** Teaching: {teaching} min, Exercises: {exercises} min ({', '.join(parts)}), "
             "an estimate for a newcomer who reads, predicts and answers; the measured time above is the machine's.",
             "",
             f"**Objectives.** {lesson.opening}"]
    lines += [f"- {o}" for o in lesson.objectives]
    return "\n".join(lines + [HEADER_END])


_OLD_OBJECTIVES = re.compile(r"^\*\*(Objectives\b|You will:\*\*)")


def _paragraphs(text: str) -> list[str]:
    return [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text.strip("\n"))]


def shape_header(text: str, lesson: Lesson, fixit: bool) -> str:
    """The first markdown cell with this script's block (learner time, objectives) after the paragraph
    that holds "Measured time" (after the title where there is none), an earlier block replaced, and
    the notebook's own objectives paragraph ("**Objectives...", "**You will:**") removed: the block holds
    them now."""
    text = re.sub(re.escape(HEADER_START) + r".*?" + re.escape(HEADER_END), "", text, flags=re.S)
    paras = [p for p in _paragraphs(text) if p.strip() and not _OLD_OBJECTIVES.match(p.strip())]
    at = next((i + 1 for i, p in enumerate(paras) if "Measured time" in p), 1)
    paras.insert(at, header_block(lesson, fixit))
    return "\n\n".join(paras)


# --- the cells at the end -----------------------------------------------------------------------

def keypoints_text(lesson: Lesson) -> str:
    return "## Key points\n\n" + "\n".join(f"- {k}" for k in lesson.keypoints)


def recap_text(lesson: Lesson, solutions_name: str) -> str:
    questions = "\n".join(f"{i}. {q}" for i, (q, _) in enumerate(lesson.recap, 1))
    return ("## Recap questions\n\nAnswer them in your own words, from what the runs above showed; the instructor's "
            f"answers are in `solutions/{solutions_name}` (outside `notebooks/`).\n\n" + questions)


def _lesson_kind(cell) -> str | None:
    return ((cell.get("metadata") or {}).get("ddplab") or {}).get("lesson")


def shape_end(nb, lesson: Lesson, solutions_name: str) -> None:
    """Key points and recap questions as the notebook's last two cells (metadata.ddplab.lesson). A cell
    an earlier run wrote is moved to the end, wherever it now stands, with its new text and the metadata
    an execution gave it (papermill's), so a stored, executed notebook shapes to itself."""
    import nbformat

    earlier = {_lesson_kind(c): c for c in nb.cells if _lesson_kind(c) in ("keypoints", "recap")}
    nb.cells = [c for c in nb.cells if _lesson_kind(c) not in ("keypoints", "recap")]
    code = {"keypoints": bool(lesson.keypoints_code), "recap": False}
    for kind, text in (("keypoints", lesson.keypoints_code or keypoints_text(lesson)),
                       ("recap", recap_text(lesson, solutions_name))):
        cell = earlier.get(kind)
        if cell is None or (cell.cell_type == "code") != code[kind]:
            new = nbformat.v4.new_code_cell if code[kind] else nbformat.v4.new_markdown_cell
            cell = new(text, metadata={"ddplab": {"lesson": kind}})
            cell["id"] = f"ddplab-lesson-{kind}"       # fixed: a second run writes the same file
        cell.source = text
        nb.cells.append(cell)


# --- glossary links -----------------------------------------------------------------------------

# Spans of a markdown line that are not prose: code, links (text and target), HTML, quotations.
_SKIP = re.compile(r"`[^`\n]*`|!?\[[^\]\n]*\]\([^)\n]*\)|<[^>\n]*>|“[^”\n]*”|\"[^\"\n]*\"")


def _link_first(text: str, anchor: str, pattern: str) -> tuple[str, bool]:
    """``text`` with the first prose use of the term linked to the glossary: not in a heading, a
    quotation (block or inline), code, a link or HTML; a word joined by a hyphen is not a use."""
    word = re.compile(rf"(?<![\w-])(?:{pattern})(?![\w-])", re.I)
    fence = False
    lines = text.split("\n")
    for n, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence or line.lstrip().startswith(("#", ">", "<!--")):
            continue
        spans = [m.span() for m in _SKIP.finditer(line)]
        for m in word.finditer(line):
            inside = [s for s in spans if s[0] <= m.start() < s[1]]
            if inside and not (inside[0] == m.span() and m.group(0).startswith("`")):
                continue               # a code-span term (`--check`) is linked whole; nothing else inside spans
            lines[n] = f"{line[:m.start()]}[{m.group(0)}]({GLOSSARY}#{anchor}){line[m.end():]}"
            return "\n".join(lines), True
    return text, False


def link_terms(nb) -> None:
    """In the notebook's markdown, in order, the first use of each glossary term linked (a term the
    notebook already links is left as it is)."""
    md = [c for c in nb.cells if c.cell_type == "markdown"]
    for anchor, pattern in TERMS.items():
        target = f"({GLOSSARY}#{anchor})"
        if any(target in _text(c.source) for c in md):
            continue
        for c in md:
            c.source, done = _link_first(_text(c.source), anchor, pattern)
            if done:
                break


# --- test markers -------------------------------------------------------------------------------

def tag_checked(nb) -> None:
    """A code cell's ``# NBVAL_CHECK_OUTPUT`` line removed and the cell tagged ``nbval-check-output``
    (nbval reads either; the tag is metadata, out of the learner's view). Outputs are kept."""
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        lines = _text(c.source).split("\n")
        if not any(l.strip() == COMMENT for l in lines):
            continue
        c.source = "\n".join(l for l in lines if l.strip() != COMMENT)
        tags = c.metadata.setdefault("tags", [])
        if TAG not in tags:
            tags.append(TAG)


# --- the instructor's answers -------------------------------------------------------------------

def answers_text(lesson: Lesson) -> str:
    body = "\n\n".join(f"{i}. **{q}**\n\n   {a}" for i, (q, a) in enumerate(lesson.recap, 1))
    return (f"{SOLUTIONS_HEADING}\n\nThe recap questions at the end of the notebook; answers from this lab's runs "
            f"(the notebook's key points say what they measured).\n\n{body}\n")


def shape_solutions(path: Path, lesson: Lesson, title: str) -> bool:
    """The solutions file's "## Recap answers" section written (replaced in place, or appended); the
    file made with ``title`` where there is none (00). True when the file changed."""
    old = path.read_text() if path.exists() else f"# {title}\n"
    section = answers_text(lesson)
    m = re.search(rf"^{re.escape(SOLUTIONS_HEADING)}\n.*?(?=^## |\Z)", old, flags=re.M | re.S)
    if m:
        new = old[:m.start()] + section + ("\n" if old[m.end():] else "") + old[m.end():]
    else:
        new = old.rstrip("\n") + "\n\n" + section
    if new != old:
        path.write_text(new)
    return new != old


# --- one notebook, all of them ------------------------------------------------------------------

def apply(path: Path, solutions_dir: Path) -> list[str]:
    """Shape one notebook (and its solutions file); what changed."""
    import nbformat

    number = path.name[:2]
    lesson = LESSONS.get(number)
    nb = nbformat.read(str(path), as_version=4)
    before = nbformat.writes(nb)
    tag_checked(nb)
    if lesson is not None:
        first = next(c for c in nb.cells if c.cell_type == "markdown")
        first.source = shape_header(_text(first.source), lesson, has_fixit(nb))
        shape_end(nb, lesson, f"{path.stem}.md")
    link_terms(nb)
    changed = []
    if nbformat.writes(nb) != before:
        nbformat.write(nb, str(path))
        changed.append(path.name)
    if lesson is not None:
        sol = next(iter(sorted(solutions_dir.glob(f"{number}_*.md"))), solutions_dir / f"{path.stem}.md")
        if shape_solutions(sol, lesson, f"{path.stem}: instructor notes"):
            changed.append(sol.name)
    return changed


# --- the instructor's route (docs/instructor.md) -------------------------------------------------

BREAK_MIN = 10          # a route row named "break"
_ROUTE = re.compile(r"^\| (\d+):(\d\d) \| ([^|]*?) \|", re.M)
_ROUTE_HEADING = re.compile(r"^## A route of .*$", re.M)


def notebook_minutes(path: Path) -> int:
    """A notebook's learner minutes as its header gives them (teaching + exercises, the fix-it included
    where the notebook has one)."""
    import nbformat
    nb = nbformat.read(path, as_version=4)
    return sum(learner_minutes(LESSONS[path.name[:2]], has_fixit(nb)))


def _row_minutes(name: str, minutes: dict[str, int]) -> int | None:
    """A route row's minutes: a break's, a notebook's, or the longest of "A or B"; None for any other row."""
    if name.strip() == "break":
        return BREAK_MIN
    names = [n.strip() for n in name.split(" or ")]
    return max(minutes[n] for n in names) if all(n in minutes for n in names) else None


def route_times(text: str, minutes: dict[str, int]) -> str:
    """The route with each row's start time the sum of the learner minutes of the rows above it (issue 42:
    a route of 160 minutes for notebooks whose own headers add up to 255), and its heading with the total."""
    rows = list(_ROUTE.finditer(text))
    if not rows:
        return text
    start = int(rows[0].group(1)) * 60 + int(rows[0].group(2))
    out, at = [], 0
    for m in rows:
        out.append(text[at:m.start()])
        out.append(f"| {start // 60}:{start % 60:02d} | {m.group(3)} |")
        at = m.end()
        start += _row_minutes(m.group(3), minutes) or 0
    text = "".join(out) + text[at:]
    total = start - (int(rows[0].group(1)) * 60 + int(rows[0].group(2)))
    return _ROUTE_HEADING.sub(f"## A route of {total // 60} h {total % 60:02d} min (the notebooks' learner minutes)",
                              text, count=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddplab.course.lesson_shape", description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", type=Path, help="the folder of NN_*.ipynb (notebooks/)")
    ap.add_argument("--solutions", type=Path, default=None, help="the instructor's answers (default: ../solutions)")
    a = ap.parse_args(argv)
    solutions = a.solutions or a.notebooks.resolve().parent / "solutions"
    paths = sorted(a.notebooks.glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        print(f"no NN_*.ipynb in {a.notebooks}", file=sys.stderr)
        return 1
    missing = [p.name for p in paths if p.name[:2] not in LESSONS]
    for p in paths:
        changed = apply(p, solutions)
        print(f"{p.name}: " + (", ".join(changed) + " written" if changed else "unchanged"))
    if missing:
        print(f"no lesson data for {', '.join(missing)}: add it to LESSONS", file=sys.stderr)
        return 1
    route = a.notebooks.resolve().parent / "docs" / "instructor.md"
    if route.is_file():
        text = route.read_text()
        new = route_times(text, {p.stem: notebook_minutes(p) for p in paths})
        if new != text:
            route.write_text(new)
        print(f"{route.name}: route times {'written' if new != text else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
