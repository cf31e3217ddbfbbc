"""Synthetic evidence of a job of many ranks, built as objects (no processes): every rank but one
waits in all_reduce #21 while the odd one waits in barrier #21, as tests/scripts/hang_n.py does
for real at 8 ranks. Used by tests/test_groups.py and benchmarks/render_many_ranks.py."""
from __future__ import annotations

import torch  # noqa: F401  (only to find torch's own files' paths, as a real stack has them)

from ddplab.engine import classify
from ddplab.engine.evidence import Evidence, LiveRank, RunEvidence, Watch
from ddplab.facts import Collective
from ddplab.result import RunResult
from ddplab.facts import Frame

C10D = str(__import__("pathlib").Path(torch.__file__).parent / "distributed" / "distributed_c10d.py")
SCRIPT = "/work/job/train.py"


def _ledger(last_op: str, n: int = 21) -> tuple[Collective, ...]:
    ms = 50_000_000     # one collective every 50 ms
    done = tuple(Collective(s, "all_reduce", "gloo", ((1000,),), ("Float",), True, "0", s * ms, 600000)
                 for s in range(1, n))
    return done + (Collective(n, last_op, "gloo", ((1000,),) if last_op == "all_reduce" else (),
                              ("Float",) if last_op == "all_reduce" else (), False, "0", n * ms, 600000),)


def hang(nproc: int, odd: int) -> Evidence:
    """The evidence ``classify.judge`` reads for a hung job of ``nproc`` ranks (the loop ended on the
    stall rule after 20 s, 3.1 s without progress)."""
    live = {}
    for r in range(nproc):
        op, line = ("barrier", 16) if r == odd else ("all_reduce", 18)
        frames = [Frame(op, C10D, 4000), Frame("wrapper", C10D.replace("distributed_c10d", "c10d_logger"), 80),
                  Frame("main", SCRIPT, line), Frame("<module>", SCRIPT, 23)]
        live[r] = LiveRank(r, 1000 + r, frames, "worker-server", "futex_wait_queue", _ledger(op))
    ev = RunEvidence(infos={r: {"pid": 1000 + r} for r in range(nproc)}, errors={}, exits={}, torchrun=None,
                     logs={r: f"rank {r}: 20 steps done\n" for r in range(nproc)}, fatal={}, console="")
    watch = Watch(ended_by="stall", returncode=None, world=nproc, stall_s=3.0, wall_s=30.0, idle_s=3.1,
                  since_s=20.0, cpu={r: 1.5 for r in range(nproc)}, pids={r: 1000 + r for r in range(nproc)})
    return Evidence(watch=watch, run=ev, live=live, ledgers={}, records={})


def judged(nproc: int, odd: int) -> RunResult:
    """The synthetic hang judged as ddplab judges a real one (classify.judge), as a RunResult."""
    v = classify.judge(hang(nproc, odd))
    return RunResult(target="train", variant=None, nproc=nproc, wall_s=30.0, run_dir="/tmp/runs/train/1",
                     command=(), **v.fields())
