"""Fix-it 06 (lab 06, initialization): a rank number copied from a SLURM script.

Lab 06 makes init_process_group wait for ranks that never come (a world size too big, a late rank,
an unreachable master). Here every rank comes, but each takes its rank from SLURM_PROCID, which
torchrun does not set: every process claims rank 0, no one is rank 1, and init waits for ever.
"""
from __future__ import annotations

from ddplab.course.fixit.exercise import (
    Layout, Attempt, Edit, Exercise, Mismatch, WrongFix, every_rank_joined_and_summed, has_keyword, in_try, sets_env)

BROKEN = '''\
# Fix it (lab 06): this script came from a SLURM cluster; here torchrun starts it on 2 ranks. It never
# gets past init_process_group. Repair it so that each process joins as its own rank and the all_reduce
# adds up every rank's number (1 + 2 = 3 on 2 ranks).
import os

import torch
import torch.distributed as dist

from ddplab.rank import lab

rank = int(os.environ.get("SLURM_PROCID", 0))             # which process am I?
world_size = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world_size)

t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
lab.record("final", rank=dist.get_rank(), world=dist.get_world_size(), total=t.item())
dist.destroy_process_group()
'''

_RANK = 'rank = int(os.environ.get("SLURM_PROCID", 0))             # which process am I?\n'
_INIT = 'dist.init_process_group("gloo", rank=rank, world_size=world_size)\n'

REFERENCE = BROKEN.replace(_RANK, 'rank = int(os.environ["RANK"])                            '
                                  '# FIX: the launcher in use (torchrun) sets RANK\n')


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    return every_rank_joined_and_summed(attempt, nproc)


EXERCISE = Exercise(
    id="06", lab="06", title="A rank number that torchrun never set",
    task="Each process joins as its own rank, and the all_reduce adds every rank's number (3 on 2 ranks).",
    broken=BROKEN, reference=REFERENCE,
    hint="Print the rank each process passes to init_process_group. Which environment variables does "
         "torchrun set for each process it starts?",
    judge=judge, nproc=2, stall_s=2.0, failure="rendezvous-ranks-conflict",
    wrong_fixes=(
        WrongFix(
            "longer-timeout",
            (Edit("import os\n", "import datetime\nimport os\n"),
             Edit(_INIT, 'dist.init_process_group("gloo", rank=rank, world_size=world_size,\n'
                         '                        timeout=datetime.timedelta(hours=2))\n')),
            lambda a: has_keyword(a.tree, ("init_process_group", "setup"), "timeout", "timeout_s") and not a.ok,
            "A longer timeout waits longer for a rank that will never come: every process said it was rank 0, "
            "so no process is rank 1. The wait ends later, with the same error.",
            "https://github.com/tczhangzhi/pytorch-distributed/issues/18 ('Timed out initializing process group "
            "in store based barrier ... worker_count=4'); https://github.com/ultralytics/ultralytics/pull/3343"),
        WrongFix(
            "retry",
            (Edit("import os\n", "import os\nimport time\n"),
             Edit(_INIT, '''\
for attempt in range(3):                                  # retry if init fails
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        break
    except RuntimeError:
        time.sleep(5)
''')),
            lambda a: in_try(a.tree, "init_process_group", "setup") and not a.ok,
            "Retrying repeats the same request: the same rank 0 twice and no rank 1. init_process_group does not "
            "fail fast here, it waits (for 30 minutes by default), so the except clause is reached only after "
            "the timeout, and the retry waits again.",
            "article 003's Example 2 (try/except around init with time.sleep(60)); "
            "https://github.com/pytorch/pytorch/issues/52848 ('usually due to wrongly set world size / ranks')"),
        WrongFix(
            "world-size-one",
            (Edit('world_size = int(os.environ["WORLD_SIZE"])\n',
                  "world_size = 1                                            # each process on its own\n"),),
            lambda a: a.mismatch is not None and a.mismatch.what in ("world", "ranks", "total"),
            "With world_size=1 each process forms a group of its own: init returns at once, but the all_reduce "
            "only adds the process's own number, so nothing is shared. It runs, and it is no longer data-parallel.",
            "https://github.com/pytorch/pytorch/issues/62381 (init with world_size=1 while two processes start)"),
        WrongFix(
            "other-port",
            (Edit(_INIT, 'os.environ["MASTER_PORT"] = "29555"                       # try another port\n' + _INIT),),
            lambda a: sets_env(a.tree, "MASTER_PORT") and not a.ok,
            "The port was never the problem: torchrun already runs the rendezvous store on a free port and tells "
            "every rank where it is. Pointing the ranks at another port sends them to a store nobody serves, "
            "and both ranks still claim rank 0.",
            "https://github.com/helboukkouri/character-bert-pretraining/issues/4 (hang at init_process_group; "
            "setting the address and port 'didn't work as well')"),
    ),
    layouts=(Layout(1, nodes=2),),
    sources=("https://github.com/pytorch/pytorch/issues/49846", "https://github.com/pytorch/pytorch/issues/52848"),
)
