"""Fix-it 05 (lab 05, ports): a port written into the script, run under torchrun.

Lab 05 sets MASTER_PORT in code (article 003) and lets rank 0 host a new store there, which fails at
once when the port is taken. Here the script comes from an ``mp.spawn`` tutorial: it passes
``init_method="tcp://127.0.0.1:29500"``, and torchrun starts it on a machine where another job already
listens on 29500. Under torchrun no rank hosts that store (torchrun's agent already runs one and tells
every rank to be its client), so every rank dials 29500 and waits at the rendezvous: a hang, not
EADDRINUSE.
"""
from __future__ import annotations

import ast

from ddplab.course.fixit.exercise import (
    Layout, Attempt, Edit, Exercise, Mismatch, WrongFix, calls, every_rank_joined_and_summed, has_keyword, in_try)

PORT = 29500

BROKEN = '''\
# Fix it (lab 05): this script came from a tutorial that spawned its own ranks; here torchrun starts it on 2 ranks, on a
# shared machine where another job already listens on port 29500 (the first two lines after the
# imports stand in for it: leave them). It never gets past init_process_group. Repair it so that every
# rank joins and the all_reduce adds up every rank's number (1 + 2 = 3 on 2 ranks).
import contextlib
import os
import socket

import torch
import torch.distributed as dist

from ddplab.rank import lab

if os.environ["RANK"] == "0":                             # the other job on this machine: it holds 29500
    with contextlib.suppress(OSError):                    # (or something else holds it already)
        other_job = socket.create_server(("127.0.0.1", 29500))

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=rank, world_size=world)

t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
lab.record("final", rank=dist.get_rank(), world=dist.get_world_size(), total=t.item())
dist.destroy_process_group()
'''

_INIT = 'dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=rank, world_size=world)\n'
_OTHER = '''\
if os.environ["RANK"] == "0":                             # the other job on this machine: it holds 29500
    with contextlib.suppress(OSError):                    # (or something else holds it already)
        other_job = socket.create_server(("127.0.0.1", 29500))
'''

REFERENCE = BROKEN.replace(_INIT, """\
# FIX: join the store torchrun runs for this job, at the address and free port it gave every rank
# (MASTER_ADDR, MASTER_PORT)
dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
""")


def judge(attempt: Attempt, nproc: int) -> Mismatch | None:
    return every_rank_joined_and_summed(attempt, nproc)


def _tcp_ports(tree: ast.AST) -> list[str]:
    """The ports of the ``tcp://host:port`` init methods written into the code."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("tcp://"):
            out.append(node.value.rsplit(":", 1)[-1])
    return out


def _other_port(a: Attempt) -> bool:
    return not a.ok and any(p != str(PORT) for p in _tcp_ports(a.tree))


def _other_job_stopped(a: Attempt) -> bool:
    """The stand-in for the other job is gone (no server on the port) and the run still does not end ok."""
    return not a.ok and not calls(a.tree, "create_server", "bind") and str(PORT) in _tcp_ports(a.tree)


EXERCISE = Exercise(
    id="05", lab="05", title="A tcp:// port written into the script",
    task="Every rank joins the process group (with the other job still holding 29500), and the all_reduce adds "
         "every rank's number (3 on 2 ranks).",
    broken=BROKEN, reference=REFERENCE,
    hint="Under torchrun, who hosts the rendezvous store, and on which port? Look at the address the ranks wait "
         "for in ddplab's explanation and at the one torchrun gave them (MASTER_ADDR, MASTER_PORT).",
    judge=judge, nproc=2, stall_s=2.0, failure="hang-rendezvous",
    wrong_fixes=(
        WrongFix(
            "other-port",
            (Edit(_INIT, _INIT.replace(":29500", ":29501")), ),
            _other_port,
            "Another port written into the script is the same mistake: under torchrun every rank is a client of "
            "the store at the address you give, and nobody serves 29501 either (torchrun's own store is on the "
            "port it chose and put in MASTER_PORT). Where the script hosts its own store, a fixed port works "
            "only until a second copy of the script starts on the same machine.",
            "https://github.com/thu-coai/CDial-GPT/issues/103 ('specify a port ... any port number'); "
            "https://github.com/facebookresearch/XLM/issues/53 ('--master_port 32000. Any free port is ok.')"),
        WrongFix(
            "stop-other-job",
            (Edit(_OTHER, ""), ),
            _other_job_stopped,
            "Ending the job that holds the port is not yours to do on a shared machine, and it does not help: "
            "with nothing on 29500 every rank still dials 29500, now to find no store at all, and waits. The "
            "store torchrun runs for this job is elsewhere.",
            "https://github.com/yangkky/distributed_tutorial/issues/13 ('try to kill all the process related "
            "to it'); https://github.com/huggingface/accelerate/issues/74 ('You may also have hanging processes')"),
        WrongFix(
            "retry",
            (Edit("import os\n", "import os\nimport time\n"),
             Edit(_INIT, '''\
for attempt in range(3):                                  # the port may be free again in a minute
    try:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=rank, world_size=world)
        break
    except RuntimeError:
        time.sleep(60)
''')),
            lambda a: in_try(a.tree, "init_process_group") and not a.ok,
            "Nothing fails to retry: the ranks do not get an error, they wait at the rendezvous for a store on "
            "29500 that will never answer them (for 30 minutes by default). The except clause is reached only "
            "after that, and the retry dials the same port again.",
            "article 003's Example 2 (try/except around init with time.sleep(60), lab 05's article-retry)"),
        WrongFix(
            "longer-timeout",
            (Edit("import os\n", "import datetime\nimport os\n"),
             Edit(_INIT, _INIT.replace("world_size=world)", "world_size=world,\n"
                                       "                        timeout=datetime.timedelta(hours=1))"))),
            lambda a: has_keyword(a.tree, ("init_process_group", "setup"), "timeout", "timeout_s") and not a.ok,
            "A longer timeout is a longer wait at the same wrong address: the store the ranks dial is not this "
            "job's, so no amount of waiting lets them meet.",
            "https://github.com/ultralytics/ultralytics/pull/3343 (timeout raised from 1 to 3 hours)"),
    ),
    layouts=(Layout(1, nodes=2),),
    sources=("https://github.com/pytorch/examples/issues/840", "https://github.com/hpcaitech/ColossalAI/issues/110"),
)
