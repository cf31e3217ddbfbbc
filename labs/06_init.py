"""Lab 06 - initialization that never finishes: missing ranks, late ranks, an unreachable master.

Run it by itself (gloo on CPU):

    torchrun --nproc-per-node 2 labs/06_init.py --variant missing-rank
    ddplab run 06 --variant missing-rank        # the same, judged by progress, with each rank's stack

Article 003 ("Why is DDP timing out during initialization?") lists the causes: a firewall or a wrong
MASTER_ADDR, ranks that never join, environments that disagree. Every one of them looks the same
from inside `init_process_group`: a rank waits for others, silently, for the timeout, which is
30 minutes by default. This script makes each cause happen for real and records, on every rank,
how many seconds `init_process_group` took to answer and with which error.

Variants:
  missing-rank        every rank says the world has 3 ranks, only 2 start (a node that never came up).
  late-rank           rank 1 starts --late-s seconds late (slow data staging); timeout shorter than that.
  unreachable-master  ranks other than 0 dial --master-addr, where nothing answers (a firewall).
  env-mismatch        rank 1 has a different MASTER_PORT (--mismatch port) or WORLD_SIZE (world-size).
  wrong-backend       backend "nccl" written in (a GPU cluster's script) while the tensors are on the CPU.
  fixed-backend       the backend chosen from the hardware: nccl with a GPU per rank, else gloo.
  article-sleep       the article's Example 2: default timeout, `except RuntimeError: time.sleep(60)`.
  fixed               an explicit timeout chosen on purpose; torchrun restarts the group if it fires.
  timeout-sweep       late-rank once per --sweep-timeouts x --sweep-delays trial, in one job (ends ok).

On a real cluster the fix is torchrun's own rendezvous, with the join timeout and restarts set:
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $MASTER:29500 \
             --rdzv-conf join_timeout=300 --max-restarts 2 labs/06_init.py --variant fixed
"""
import datetime
import os
import time

import torch
import torch.distributed as dist

from ddplab.rank import lab, lab_store

LAB = {
    "title": "Initialization that never finishes: missing ranks, late ranks, an unreachable master",
    "article": "003_da49d0a504e50001.txt",
    "nproc": 2,
    "min_nproc": 2,
    "variants": {
        "missing-rank": {"expect": "failed", "signature": "rendezvous-timeout",
                         "about": "WORLD_SIZE says 3, only 2 ranks start: the store waits for a client that never comes"},
        "late-rank": {"expect": "failed", "signature": "rendezvous-timeout",
                      "about": "rank 1 starts later than the timeout allows: rank 0 gives up first"},
        "unreachable-master": {"expect": "failed", "signature": "store-unreachable",
                               "about": "rank 1 dials a master address where nothing answers (firewall / wrong address)"},
        "env-mismatch": {"expect": "failed", "signature": "store-unreachable",
                         "about": "rank 1 was given another MASTER_PORT (or, with --mismatch world-size, another WORLD_SIZE)"},
        "wrong-backend": {"expect": "failed", "signature": "nccl-without-gpu",
                          "about": "init_process_group('nccl') with the tensors on the CPU: a CPU build of torch has no NCCL (a CUDA build fails at the first collective instead: no-backend-for-device)"},
        "fixed-backend": {"expect": "ok", "signature": None,
                          "about": "the backend chosen from the hardware (nccl with a GPU per rank, else gloo)"},
        "article-sleep": {"expect": "hung", "signature": "hang-rendezvous",
                          "about": "the article's try/except + sleep(60) with the default 30-minute timeout: no answer for half an hour"},
        "fixed": {"expect": "ok", "signature": None,
                  "about": "a rank 1 s late, a timeout set on purpose that covers it; torchrun restarts if it fires"},
        "timeout-sweep": {"expect": "ok", "signature": None,
                          "about": "late-rank once per (timeout, delay) trial in one job: each trial's outcome is recorded, the job ends ok"},
    },
}

# variant: (init timeout in seconds, rank 1's delay in seconds); short so every failure takes seconds.
# article-sleep: None, PyTorch's default (30 minutes), as the article's call sets none.
DEFAULTS = {"missing-rank": (3.0, 0.0), "late-rank": (2.0, 4.0), "unreachable-master": (3.0, 0.0),
            "env-mismatch": (3.0, 0.0), "article-sleep": (None, 0.0), "fixed": (10.0, 1.0),
            "timeout-sweep": (None, 0.0), "wrong-backend": (10.0, 0.0), "fixed-backend": (10.0, 0.0)}
PORTS = "lab06/ports"   # the store key of two fresh ports: one for this lab's own store, one where nothing listens
LINGER_S = 2.0   # a failed rank stays 2 s so the others' errors reach their logs too (see report())


def init(rank: int, world: int, addr: str, port: int, timeout_s: float | None) -> float:
    """The article's Example 1: MASTER_ADDR/PORT in the environment, then init_process_group."""
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port))
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)   # rank 0 hosts the store itself, as without torchrun
    kw = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    t0 = time.monotonic()
    dist.init_process_group("gloo", rank=rank, world_size=world, **kw)
    return time.monotonic() - t0


def report(rank: int, t0: float, e: BaseException, timeout_s: float | None) -> None:
    lab.record("init_failed", error=type(e).__name__, message=str(e).splitlines()[0][:300],
               seconds=round(time.monotonic() - t0, 3), timeout_s=timeout_s, linger_s=LINGER_S)
    # torchrun ends every rank as soon as one exits; staying LINGER_S lets the other side print its error.
    time.sleep(LINGER_S)


# ---- one function per variant: the broken line and the fix differ visibly ------------------------

def missing_rank(rank: int, world: int, addr: str, a) -> None:
    init(rank, world + 1, addr, lab_store.shared_ports(rank, PORTS)[0], a.timeout_s)        # BROKEN: a rank that never starts


def late_rank(rank: int, world: int, addr: str, a) -> None:
    lab_store.late(rank, a.late_s)
    lab.setup(timeout_s=a.timeout_s)                                    # BROKEN: timeout < rank 1's delay


def unreachable_master(rank: int, world: int, addr: str, a) -> None:
    port, dead = lab_store.shared_ports(rank, PORTS)
    where = a.master_addr
    if rank != 0 and where.startswith("127."):
        port = dead                    # loopback fallback: a port where nothing listens (refused, not dropped)
    timeout_s = a.timeout_s * 3 if rank == 0 else a.timeout_s  # rank 0 waits longer so rank 1's own error shows
    lab.record("dials", master_addr=addr if rank == 0 else where, port=port, timeout_s=timeout_s)
    init(rank, world, addr if rank == 0 else where, port, timeout_s)    # BROKEN: nothing answers there


def env_mismatch(rank: int, world: int, addr: str, a) -> None:
    port, other = lab_store.shared_ports(rank, PORTS)
    if a.mismatch == "port":
        init(rank, world, addr, port if rank == 0 else other,          # BROKEN: rank 1 has another MASTER_PORT
             a.timeout_s * 3 if rank == 0 else a.timeout_s)
    else:
        init(rank, world + (rank != 0), addr, port, a.timeout_s)      # BROKEN: rank 1 has WORLD_SIZE+1
        dist.barrier()


def backend_choice(rank: int, world: int, addr: str, a) -> None:
    if a.variant == "wrong-backend":
        ctx = lab.setup("nccl", a.timeout_s, device="cpu")             # BROKEN: NCCL on CPU tensors
    else:
        ctx = lab.setup(timeout_s=a.timeout_s)                          # FIX: nccl with a GPU per rank, else gloo
    lab.record("backend", backend=ctx.backend, device=str(ctx.device), cuda=torch.cuda.is_available())
    dist.all_reduce(torch.ones(1, device=ctx.device))


def article_sleep(rank: int, world: int, addr: str, a) -> None:
    lab_store.heartbeat(time.monotonic())   # records every 2 s how long init has waited so far (it never answers)
    try:                                                                # BROKEN: the article's Example 2
        init(rank, world + 1, addr, lab_store.shared_ports(rank, PORTS)[0], a.timeout_s)   # None (the article's): 30 minutes
    except RuntimeError as e:
        lab.record("init_failed", error=type(e).__name__, message=str(e)[:300])
        time.sleep(a.sleep_s)  # "allow time for other processes to report errors"
        raise SystemExit(1)


def fixed(rank: int, world: int, addr: str, a) -> None:
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) == 0:
        lab_store.late(rank, a.late_s)   # staging is slow the first time; after a restart it is cached
    lab.setup(timeout_s=a.timeout_s)                                    # FIX: a timeout chosen on purpose
    dist.barrier()


VARIANTS = {"missing-rank": missing_rank, "late-rank": late_rank, "unreachable-master": unreachable_master,
            "env-mismatch": env_mismatch, "article-sleep": article_sleep, "fixed": fixed,
            "wrong-backend": backend_choice, "fixed-backend": backend_choice}


def main(a) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr = os.environ["MASTER_ADDR"]
    lab.record("start", variant=a.variant, world_size=world, torch=torch.__version__, timeout_s=a.timeout_s,
               restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
               max_restarts=int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)))
    if a.variant == "timeout-sweep":
        return lab_store.late_rank_sweep(rank, world, a.sweep_timeouts, a.sweep_delays)
    t0 = time.monotonic()
    try:
        VARIANTS[a.variant](rank, world, addr, a)
    except Exception as e:
        report(rank, t0, e, a.timeout_s)
        raise
    lab.record("init_done", seconds=round(time.monotonic() - t0, 3), world_size=dist.get_world_size())
    lab.teardown()


if __name__ == "__main__":
    import argparse

    from ddplab.rank.lab_args import seconds_list as floats

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=list(LAB["variants"]), default="missing-rank",
                   help="which initialization failure (or the fix) to run")
    p.add_argument("--timeout-s", type=float, default=None,
                   help="init_process_group(timeout=...) in seconds (default per variant; article-sleep: none, so PyTorch's 30 min)")
    p.add_argument("--late-s", type=float, default=None,
                   help="how many seconds late rank 1 starts (late-rank: 4, fixed: 1)")
    p.add_argument("--master-addr", default="127.0.0.1",
                   help="where rank 1 looks for the master in unreachable-master (an address nothing answers on)")
    p.add_argument("--mismatch", choices=["port", "world-size"], default="port",
                   help="what rank 1 disagrees on in env-mismatch")
    p.add_argument("--sleep-s", type=float, default=60.0, help="the article's sleep after a failed init (article-sleep)")
    p.add_argument("--sweep-timeouts", type=floats, default=[0.5, 1.0, 2.0, 4.0],
                   help="timeout-sweep: one trial per timeout x delay, e.g. 0.5,1,2,4")
    p.add_argument("--sweep-delays", type=floats, default=[1.5],
                   help="timeout-sweep: rank 1's delays, e.g. 1,3 (each 0.3 s or more from every timeout)")
    a = p.parse_args()
    a.timeout_s = DEFAULTS[a.variant][0] if a.timeout_s is None else a.timeout_s
    a.late_s = DEFAULTS[a.variant][1] if a.late_s is None else a.late_s
    if a.timeout_s is not None and a.timeout_s <= 0:
        p.error("--timeout-s must be more than 0 seconds")
    if a.master_addr.split(".")[0] not in ("127", "10"):
        p.error("--master-addr must be loopback (127.x) or the lab's own namespace (10.206.x.y)")
    main(a)
