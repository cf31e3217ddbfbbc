"""Lab 06 - initialization that never finishes: missing ranks, late ranks, an unreachable master.

Run it by itself (gloo on CPU):

    torchrun --nproc-per-node 2 labs/06_init.py --variant missing-rank
    ddplab run 06 --variant missing-rank   # the same, judged by progress, with each rank's stack

Article 003 ("Why is DDP timing out during initialization?") lists the causes: a firewall or a
wrong MASTER_ADDR, ranks that never join, environments that disagree. Every one of them looks the
same from inside `init_process_group`: a rank waits for others, silently, for the timeout, which is
30 minutes by default. This script makes each cause happen for real and records, on every rank, how
many seconds `init_process_group` took to answer and with which error.

Variants:
  missing-rank        every rank says the world has 3 ranks, only 2 start (a node that never
                      came up).
  late-rank           rank 1 starts --late-s seconds late (slow data staging); timeout shorter
                      than that.
  unreachable-master  ranks other than 0 dial --master-addr, where nothing answers (a firewall).
  env-mismatch        rank 1 has a different MASTER_PORT (--mismatch port) or WORLD_SIZE
                      (world-size).
  wrong-backend       backend "nccl" written in (a GPU cluster's script) while the tensors are on
                      the CPU.
  fixed-backend       the backend chosen from the hardware: nccl with a GPU per rank, else gloo.
  article-sleep       the article's Example 2: default timeout, `except RuntimeError:
                      time.sleep(60)`.
  fixed               an explicit timeout chosen on purpose; torchrun restarts the group if it
                      fires.
  timeout-sweep       late-rank once per --sweep-timeouts x --sweep-delays trial, in one job (ends
                      ok).
  duplicate-rank      both processes ask for rank 0 (RANK=0 copied onto every launch line).
  rank-outside-world  ranks counted from 1: the last asks for rank WORLD_SIZE, outside the world.
  rank-from-env       the fix: each process asks for the RANK torchrun gave it.
  fd-limit            the master's file-descriptor limit (ulimit -n) leaves its store no room.
  fd-limit-raised     the fix: the master raises its soft limit to the hard limit first.

On a real cluster the fix is torchrun's own rendezvous, with the join timeout and restarts set:
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $MASTER:29500 \
             --rdzv-conf join_timeout=300 --max-restarts 2 labs/06_init.py --variant fixed
"""
import datetime
import os
import resource
import socket
import threading
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

from ddplab.rank import lab

LAB = {
    "title": "Initialization that never finishes: missing ranks, late ranks, an unreachable "
             "master",
    "article": "003_da49d0a504e50001.txt", "nproc": 2, "min_nproc": 2,
    "variants": {
        "missing-rank": {
            "expect": "failed", "signature": "rendezvous-timeout",
            "about": "WORLD_SIZE says 3, only 2 ranks start: the store waits for a client that "
                     "never comes",
        },
        "late-rank": {
            "expect": "failed", "signature": "rendezvous-timeout",
            "about": "rank 1 starts later than the timeout allows: rank 0 gives up first",
        },
        "unreachable-master": {
            "expect": "failed", "signature": "store-unreachable",
            "about": "rank 1 dials a master address where nothing answers (firewall / wrong "
                     "address)",
        },
        "env-mismatch": {
            "expect": "failed", "signature": "store-unreachable",
            "about": "rank 1 was given another MASTER_PORT (or, with --mismatch world-size, "
                     "another WORLD_SIZE)",
        },
        "wrong-backend": {
            "expect": "failed", "signature": "nccl-without-gpu",
            "about": "init_process_group('nccl') with the tensors on the CPU: a CPU build of "
                     "torch has no NCCL (a CUDA build fails at the first collective instead: "
                     "no-backend-for-device)",
        },
        "fixed-backend": {
            "expect": "ok", "signature": None,
            "about": "the backend chosen from the hardware (nccl with a GPU per rank, else gloo)",
        },
        "article-sleep": {
            "expect": "hung", "signature": "rendezvous-ranks-conflict",
            "about": "the article's try/except + sleep(60) with the default 30-minute timeout: "
                     "no answer for half an hour",
        },
        "fixed": {
            "expect": "ok", "signature": None,
            "about": "a rank 1 s late, a timeout set on purpose that covers it; torchrun "
                     "restarts if it fires",
        },
        "timeout-sweep": {
            "expect": "ok", "signature": None,
            "about": "late-rank once per (timeout, delay) trial in one job: each trial's outcome "
                     "is recorded, the job ends ok",
        },
        "duplicate-rank": {
            "expect": "hung", "signature": "rendezvous-ranks-conflict",
            "about": "both processes ask init_process_group for rank 0: the rendezvous waits "
                     "for a rank 1 that no process will be",
        },
        "rank-outside-world": {
            "expect": "failed", "signature": "rank-outside-world",
            "about": "ranks counted from 1: the last process asks for rank WORLD_SIZE, which is "
                     "not in 0..WORLD_SIZE-1",
        },
        "rank-from-env": {
            "expect": "ok", "signature": None,
            "about": "each process asks for the RANK and WORLD_SIZE torchrun gave it",
        },
        "fd-limit": {
            "expect": "failed", "signature": "fd-limit",
            "about": "the master's soft limit on open files (ulimit -n) leaves its store no "
                     "descriptor to start with",
        },
        "fd-limit-raised": {
            "expect": "ok", "signature": None,
            "about": "the same low limit, raised to the hard limit by the master before "
                     "init_process_group",
        },
    },
    "knobs": {
        "timeout_s": {
            "type": "float", "default": None, "range": [0.1, 7200],
            "help": "init_process_group(timeout=...) in seconds (None: per variant; "
                    "article-sleep: none, so PyTorch's 30 min)",
        },
        "late_s": {
            "type": "float", "default": None, "range": [0, 600],
            "help": "how many seconds late rank 1 starts (None: late-rank 4, fixed 1)",
        },
        "master_addr": {
            "type": "str", "default": "127.0.0.1",
            "help": "where rank 1 looks for the master in unreachable-master (an address nothing "
                    "answers on: loopback 127.x or the lab's own namespace 10.206.x.y)",
        },
        "mismatch": {
            "type": "str", "default": "port", "choices": ["port", "world-size"],
            "help": "what rank 1 disagrees on in env-mismatch",
        },
        "sleep_s": {
            "type": "float", "default": 60.0, "range": [0, 3600],
            "help": "the article's sleep after a failed init (article-sleep)",
        },
        "sweep_timeouts": {
            "type": "floats", "default": [0.5, 1.0, 2.0, 4.0], "range": [0.01, 120],
            "help": "timeout-sweep: one trial per timeout x delay, e.g. 0.5,1,2,4",
        },
        "sweep_delays": {
            "type": "floats", "default": [1.5], "range": [0.01, 120],
            "help": "timeout-sweep: rank 1's delays, e.g. 1,3 (each 0.3 s or more from every "
                    "timeout)",
        },
        "fd_headroom": {
            "type": "int", "default": 8, "range": [0, 100000],
            "help": "fd-limit: descriptors the master may open beyond those open before "
                    "init_process_group (its soft RLIMIT_NOFILE)",
        },
    },
}

# variant: (init timeout in seconds, rank 1's delay in seconds); short so every failure takes
# seconds.
# article-sleep: None, PyTorch's default (30 minutes), as the article's call sets none.
DEFAULTS = {"missing-rank": (3.0, 0.0), "late-rank": (2.0, 4.0), "unreachable-master": (3.0, 0.0),
            "env-mismatch": (3.0, 0.0), "article-sleep": (None, 0.0), "fixed": (10.0, 1.0),
            "timeout-sweep": (None, 0.0), "wrong-backend": (10.0, 0.0),
            "fixed-backend": (10.0, 0.0), "duplicate-rank": (None, 0.0),
            "rank-outside-world": (10.0, 0.0), "rank-from-env": (10.0, 0.0),
            "fd-limit": (3.0, 0.0), "fd-limit-raised": (10.0, 0.0)}
# the store key of two fresh ports: one for this lab's own store, one where nothing listens
PORTS = "lab06/ports"
# a failed rank stays 2 s so the others' errors reach their logs too (see report())
LINGER_S = 2.0


def init(rank: int, world: int, addr: str, port: int, timeout_s: float | None) -> float:
    """The article's Example 1: MASTER_ADDR/PORT in the environment, then init_process_group."""
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port))
    # rank 0 hosts the store itself, as without torchrun
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    kw = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    t0 = time.monotonic()
    dist.init_process_group("gloo", rank=rank, world_size=world, **kw)
    return time.monotonic() - t0


def report(rank: int, t0: float, e: BaseException, timeout_s: float | None) -> None:
    lab.record("init_failed", error=type(e).__name__, message=str(e).splitlines()[0][:300],
               seconds=round(time.monotonic() - t0, 3), timeout_s=timeout_s, linger_s=LINGER_S)
    # torchrun ends every rank as soon as one exits; staying LINGER_S lets the other side print its
    # error.
    time.sleep(LINGER_S)


# ---- one function per variant: the broken line and the fix differ visibly
# ------------------------

def missing_rank(rank: int, world: int, addr: str, a) -> None:
    # BROKEN: a rank that never starts
    init(rank, world + 1, addr, shared_ports(rank, PORTS)[0], a.timeout_s)  # BROKEN


def late_rank(rank: int, world: int, addr: str, a) -> None:
    late(rank, a.late_s)
    lab.setup(timeout_s=a.timeout_s)  # BROKEN: timeout < rank 1's delay


def unreachable_master(rank: int, world: int, addr: str, a) -> None:
    port, dead = shared_ports(rank, PORTS)
    where = a.master_addr
    if rank != 0 and where.startswith("127."):
        # loopback fallback: a port where nothing listens (refused, not dropped)
        port = dead
    # rank 0 waits longer so rank 1's own error shows
    timeout_s = a.timeout_s * 3 if rank == 0 else a.timeout_s
    lab.record("dials", master_addr=addr if rank == 0 else where, port=port, timeout_s=timeout_s)
    # BROKEN: nothing answers there
    init(rank, world, addr if rank == 0 else where, port, timeout_s)  # BROKEN


def env_mismatch(rank: int, world: int, addr: str, a) -> None:
    port, other = shared_ports(rank, PORTS)
    if a.mismatch == "port":
        # BROKEN: rank 1 has another MASTER_PORT
        init(rank, world, addr, port if rank == 0 else other,  # BROKEN
             a.timeout_s * 3 if rank == 0 else a.timeout_s)
    else:
        init(rank, world + (rank != 0), addr, port, a.timeout_s)  # BROKEN: rank 1 has WORLD_SIZE+1
        dist.barrier()


def backend_choice(rank: int, world: int, addr: str, a) -> None:
    if a.variant == "wrong-backend":
        ctx = lab.setup("nccl", a.timeout_s, device="cpu")  # BROKEN: NCCL on CPU tensors
    else:
        ctx = lab.setup(timeout_s=a.timeout_s)  # FIX: nccl with a GPU per rank, else gloo
    lab.record("backend", backend=ctx.backend, device=str(ctx.device),
               cuda=torch.cuda.is_available())
    dist.all_reduce(torch.ones(1, device=ctx.device))


def article_sleep(rank: int, world: int, addr: str, a) -> None:
    # records every 2 s how long init has waited so far (it never answers)
    heartbeat(time.monotonic())
    try:  # BROKEN: the article's Example 2
        # None (the article's): 30 minutes
        init(rank, world + 1, addr, shared_ports(rank, PORTS)[0], a.timeout_s)
    except RuntimeError as e:
        lab.record("init_failed", error=type(e).__name__, message=str(e)[:300])
        time.sleep(a.sleep_s)  # "allow time for other processes to report errors"
        raise SystemExit(1)


def fixed(rank: int, world: int, addr: str, a) -> None:
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) == 0:
        late(rank, a.late_s)   # staging is slow the first time; after a restart it is cached
    lab.setup(timeout_s=a.timeout_s)  # FIX: a timeout chosen on purpose
    dist.barrier()


def wrong_rank(rank: int, world: int, addr: str, a) -> None:
    """torchrun's own store (as every torchrun job uses it); only the rank each process asks for
    differs. duplicate-rank keeps PyTorch's default timeout, as a script that sets none does."""
    if a.variant == "duplicate-rank":
        asked = 0  # BROKEN: RANK=0 copied onto every launch line
    elif a.variant == "rank-outside-world":
        asked = rank + 1  # BROKEN: counted from 1, so the last rank is WORLD_SIZE
    else:
        asked = int(os.environ["RANK"])  # FIX: the RANK torchrun gave this process
    lab.record("asked", asked_rank=asked, world_size=world)
    kw = {"timeout": datetime.timedelta(seconds=a.timeout_s)} if a.timeout_s else {}
    dist.init_process_group("gloo", rank=asked, world_size=world, **kw)
    got = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(got)   # every rank 0..world-1 took part: the sum is 0 + 1 + ... + world-1
    lab.record("ranks_sum", sum=got.item(), expected=world * (world - 1) / 2)


def open_fds() -> int:
    """How many file descriptors this process has open (Linux: /proc/self/fd; macOS: /dev/fd)."""
    return len(os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"))


def fd_limit(rank: int, world: int, addr: str, a) -> None:
    """Rank 0 hosts the store (the master, as in init()); its soft RLIMIT_NOFILE is set to what is
    open now plus --fd-headroom, standing in for a low `ulimit -n` on the master node."""
    port = shared_ports(rank, PORTS)[0]
    if rank == 0:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        before = open_fds()
        resource.setrlimit(resource.RLIMIT_NOFILE, (before + a.fd_headroom, hard))  # BROKEN
        if a.variant == "fd-limit-raised":
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # FIX: soft up to hard
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        lab.record("fd_limit", open_before=before, soft=soft, hard=hard, headroom=a.fd_headroom)
    init(rank, world, addr, port, a.timeout_s)
    dist.all_reduce(torch.ones(1))
    if rank == 0:
        lab.record("fd_used", open_after=open_fds())


VARIANTS = {"missing-rank": missing_rank, "late-rank": late_rank,
            "unreachable-master": unreachable_master,
            "env-mismatch": env_mismatch, "article-sleep": article_sleep, "fixed": fixed,
            "wrong-backend": backend_choice, "fixed-backend": backend_choice,
            "duplicate-rank": wrong_rank, "rank-outside-world": wrong_rank,
            "rank-from-env": wrong_rank, "fd-limit": fd_limit, "fd-limit-raised": fd_limit}


def main(variant: str, *, timeout_s: float | None, late_s: float | None, master_addr: str,
         mismatch: str, sleep_s: float, sweep_timeouts: list[float],
         sweep_delays: list[float], fd_headroom: int) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr = os.environ["MASTER_ADDR"]
    # the knobs, with the variant's own timeout and delay where none was given
    a = SimpleNamespace(variant=variant, master_addr=master_addr, mismatch=mismatch,
                        sleep_s=sleep_s, fd_headroom=fd_headroom,
                        timeout_s=DEFAULTS[variant][0] if timeout_s is None else timeout_s,
                        late_s=DEFAULTS[variant][1] if late_s is None else late_s)
    lab.record("start", variant=variant, world_size=world, torch=torch.__version__,
               timeout_s=a.timeout_s, restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
               max_restarts=int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)))
    if variant == "timeout-sweep":
        return late_rank_sweep(rank, world, sweep_timeouts, sweep_delays)
    t0 = time.monotonic()
    try:
        VARIANTS[variant](rank, world, addr, a)
    except Exception as e:
        report(rank, t0, e, a.timeout_s)
        raise
    lab.record("init_done", seconds=round(time.monotonic() - t0, 3),
               world_size=dist.get_world_size())
    lab.teardown()


# ---- meeting outside a process group: torchrun's own store ----

def agent_store() -> dist.TCPStore:
    """torchrun's own store (always reachable here): used only to share a free port and to pace
    sweeps."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False,
                         timeout=datetime.timedelta(seconds=30))


def shared_ports(rank: int, key: str) -> tuple[int, int]:
    """Two fresh ports: one for a store of the lab's own, one where nothing listens. Rank 0 picks
    them, the others read them from torchrun's store under ``key``."""
    store = agent_store()
    if rank == 0:
        with socket.socket() as s1, socket.socket() as s2:
            s1.bind(("127.0.0.1", 0))
            s2.bind(("127.0.0.1", 0))
            store.set(key, f"{s1.getsockname()[1]},{s2.getsockname()[1]}")
    port, dead = store.get(key).decode().split(",")
    return int(port), int(dead)


def store_barrier(store: dist.TCPStore, key: str, world: int) -> None:
    store.add(key, 1)
    while int(store.add(key, 0)) < world:
        time.sleep(0.01)


def heartbeat(t0: float, every_s: float = 2.0) -> None:
    """Record every ``every_s`` how long the rank has waited since ``t0`` (a daemon thread)."""
    def beat():
        while True:
            time.sleep(every_s)
            lab.record("waiting", seconds=round(time.monotonic() - t0, 3))
    threading.Thread(target=beat, daemon=True).start()


def late_rank_sweep(rank: int, world: int, timeouts, delays) -> None:
    """For many (timeout, delay) pairs in one job: each trial is a real init_process_group on a
    fresh store prefix; rank 1 arrives `delay` seconds after rank 0 starts waiting. Records each
    trial."""
    store = agent_store()
    pairs = [(t, d) for d in delays for t in timeouts]
    for k, (timeout_s, delay) in enumerate(pairs):
        store_barrier(store, f"sweep/{k}/start", world)
        t0 = time.monotonic()
        outcome, err = "ok", None
        if rank != 0:
            while time.monotonic() - t0 < delay and not store.check([f"sweep/{k}/gave_up"]):
                time.sleep(0.02)
            if store.check([f"sweep/{k}/gave_up"]):
                # rank 0 had already given up: nothing to join any more
                outcome = "too_late"
        if outcome == "ok":
            try:
                # Each rank names a new group by a per-process counter; reset it, or a rank that
                # skipped a
                # trial (too late) would look for the other rank's address under another name.
                dist.distributed_c10d._world.group_count = 0
                dist.init_process_group("gloo", store=dist.PrefixStore(f"sweep/{k}", store),
                                        rank=rank,
                                        world_size=world,
                                        timeout=datetime.timedelta(seconds=timeout_s))
            except RuntimeError as e:
                outcome, err = "failed", str(e).splitlines()[0][:200]
                store.set(f"sweep/{k}/gave_up", "1")
        lab.record("trial", timeout_s=timeout_s, delay_s=delay, outcome=outcome,
                   seconds=round(time.monotonic() - t0, 3), error=err)
        store_barrier(store, f"sweep/{k}/end", world)
        # Tear the group down only once every rank has left init_process_group: a rank that closes
        # its sockets while its peer is still finishing the handshake makes the peer's init fail.
        if dist.is_initialized():
            dist.destroy_process_group()


def late(rank: int, late_s: float) -> None:
    """Lab 06: rank 1 starts ``late_s`` seconds late (slow data staging, a busy node, a container
    still pulling)."""
    if rank == 1:
        lab.record("late_start", late_s=late_s)
        time.sleep(late_s)


def _loopback_or_lab(variant: str, knobs: dict) -> str | None:
    if knobs["master_addr"].split(".")[0] not in ("127", "10"):
        return "--master-addr must be loopback (127.x) or the lab's own namespace (10.206.x.y)"
    return None


if __name__ == "__main__":
    from ddplab.rank import lab_args

    variant, knobs = lab_args.parse(LAB, __doc__, check=_loopback_or_lab)
    main(variant, **knobs)
