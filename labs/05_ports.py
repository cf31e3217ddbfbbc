"""Lab 05 - port conflicts, and two jobs that meet on one port.

Run it by itself (gloo on CPU, NCCL when each rank has a GPU):

    torchrun --nproc-per-node 2 labs/05_ports.py --variant port-taken --master-port 12355
    ddplab run 05 --variant port-taken -- --master-port 12355
                                    # the same, judged by progress, with a diagnosis

Article 003 ("Why is DDP timing out during initialization?") hard-codes MASTER_PORT=12355, says
"choose an available port", and on failure sleeps 60 s before exiting. On a shared machine (a
classroom: everyone copied 12355) the port is often taken, and rank 0, which hosts the rendezvous
store on MASTER_PORT, fails at once with DistNetworkError ... EADDRINUSE. The other ranks connect
to whatever listens there. Two jobs on one port meet in one store.

Variants:
  port-taken       another process listens on the port (if none does, this script starts a labelled
                   STAND-IN listener first): rank 0 fails with PyTorch's real EADDRINUSE error.
  article-retry    the same, with the article's try/except + time.sleep(60) and no init timeout:
                   rank 0 sleeps on its error, rank 1 waits at the rendezvous (30 minutes by
                   default).
  two-jobs         the article's fixed port. Alone it works; the workbook starts two at the same
                   moment.
  fixed-free-port  no fixed port: init from torchrun's rendezvous, whose store the launcher bound
                   on port 0 (`--rdzv-endpoint 127.0.0.1:0`), so two jobs at once both succeed.
  fixed-retry      the port is taken, as in port-taken; rank 0 fails fast (no sleep), binds port 0
                   instead and passes the port on through torchrun's own store: the job succeeds.
"""
import datetime
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from ddplab.rank import lab
from ddplab.rank import ports

LAB = {
    "title": "Port conflicts, and two jobs that meet on one port",
    "article": "003_da49d0a504e50001.txt",
    "nproc": 2, "min_nproc": 2,
    "variants": {
        "port-taken": {
            "expect": "failed", "signature": "port-in-use",
            "about": "MASTER_PORT is held by another process: rank 0 cannot host the store "
                     "(EADDRINUSE)",
        },
        "article-retry": {
            "expect": "hung", "signature": "hang-rendezvous",
            "about": "the article's try/except + time.sleep(60) on the taken port: rank 0 "
                     "sleeps, rank 1 waits at the rendezvous",
        },
        "two-jobs": {
            "expect": "ok", "signature": None,
            "about": "the article's fixed MASTER_PORT; alone it works, two at once race "
                     "(lab05.two_jobs)",
        },
        "fixed-free-port": {
            "expect": "ok", "signature": None,
            "about": "no fixed port: torchrun's rendezvous store on a port the launcher bound "
                     "(port 0)",
        },
        "fixed-retry": {
            "expect": "ok", "signature": None,
            "about": "port taken; rank 0 fails fast, binds port 0 and passes it on via "
                     "torchrun's store",
        },
    },
    "knobs": {
        "port": {
            "type": "int", "default": 12355, "range": [1024, 65535], "flag": "--master-port",
            "help": "the fixed MASTER_PORT (default: the article's); unused by fixed-free-port",
        },
        "pg_timeout_s": {
            "type": "float", "default": None, "range": [1, 3600],
            "help": "init_process_group(timeout=...) in seconds (None: 20 s; article-retry: none "
                    "given, as in the article, so PyTorch's default of 30 minutes)",
        },
        "steps": {
            "type": "int", "default": 40, "range": [1, 1000],
            "help": "training steps after the join, about 0.05 s each: the window in which a "
                    "second job meets this one",
        },
        "sleep_s": {
            "type": "float", "default": 60.0, "range": [0, 600],
            "help": "article-retry: the article's time.sleep after a failed init",
        },
    },
}

ARTICLE_PORT = LAB["knobs"]["port"]["default"]
# init_process_group timeout unless --pg-timeout-s is given (article-retry: PyTorch's default)
PG_TIMEOUT_S = 20.0
STANDIN = ("import os,socket,sys,time\n"
           "s=socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(64)\n"
           "print('listening', flush=True)\n"
           "parent=int(sys.argv[2]); end=time.time()+float(sys.argv[3])\n"
           "while os.getppid()==parent and time.time()<end: time.sleep(0.05)\n")


def take_port_if_free(port: int, hold_s: float = 60.0):
    """STAND-IN for 'a classmate's job already on this port': a separate process listening on
    127.0.0.1:port. It ends with this rank (or after hold_s). Does nothing if the port is taken."""
    if not ports.check_port(port).free:
        return None
    # -I: isolated, so ddplab's rank hook (PYTHONPATH) does not take this process for a rank.
    cmd = [sys.executable, "-I", "-c", STANDIN, str(port), str(os.getpid()), str(hold_s)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    p.stdout.readline()  # "listening"
    lab.record("standin", pid=p.pid, port=port,
               note="stand-in listener started by this lab (emulates another job)")
    return p


def init_article_style(rank: int, world: int, port: int, timeout_s: float | None) -> None:
    """Article 003, Example 1: MASTER_ADDR/MASTER_PORT set in code, rank 0 hosts the store there.
    timeout_s None: PyTorch's default (30 minutes), as the article's call has no timeout."""
    # the article says 'localhost'; loopback only here
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    # BROKEN: a fixed port, the same in every copy of the script
    os.environ["MASTER_PORT"] = str(port)  # BROKEN
    # Under torchrun the ranks would reuse torchrun's store; the article's launcher has none, so
    # rank 0
    # hosts a new store on MASTER_PORT. Drop the flag to behave exactly like the article's script.
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    kw = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    dist.init_process_group("gloo", rank=rank, world_size=world, **kw)


def init_fixed_retry(rank: int, world: int, port: int, timeout_s: float) -> int:
    """FIX: try the preferred port once; on EADDRINUSE bind port 0 and pass the port on.
    torchrun's own store (MASTER_ADDR:MASTER_PORT from torchrun, bound before any rank started) is
    always there, so the ranks can agree on the port without guessing or sleeping."""
    t0 = time.monotonic()
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        try:
            store = dist.TCPStore("127.0.0.1", port, world, is_master=True, timeout=timeout,
                                  wait_for_workers=False)
        except dist.DistNetworkError as e:  # FIX: no sleep; a clear error, at once
            lab.record("port_busy", port=port, seconds=round(time.monotonic() - t0, 3),
                       error=str(e).splitlines()[0][:200], holder=ports.check_port(port).to_dict())
            # FIX: port 0
            store = dist.TCPStore("127.0.0.1", 0, world, True, timeout, wait_for_workers=False)
        agent.set("lab05/store_port", str(store.port))        # FIX: pass it on
    else:
        agent.wait(["lab05/store_port"])
        store = dist.TCPStore("127.0.0.1", int(agent.get("lab05/store_port")), world,
                              is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    return store.port


def job_tag() -> str:
    """Which job this rank belongs to: torchrun's run id and its agent's pid."""
    return f"{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/{os.getppid()}"


def init_failed(port: int, t0: float, e: Exception) -> None:
    """Record the facts the diagnosis needs (who holds the port, now)."""
    lab.record("init_failed", seconds=round(time.monotonic() - t0, 3),
               error=str(e).splitlines()[0][:300], holder=ports.check_port(port).to_dict())


def init_plain(rank, world, port, timeout_s, explicit, sleep_s) -> int:
    """port-taken, two-jobs: the article's Example 1; fails as PyTorch does."""
    t0 = time.monotonic()
    try:
        init_article_style(rank, world, port, timeout_s)
    except RuntimeError as e:
        init_failed(port, t0, e)
        raise
    return port


def init_free_port(rank, world, port, timeout_s, explicit, sleep_s) -> int:
    lab.setup(timeout_s=timeout_s)  # FIX: the launcher's port (port 0)
    return int(os.environ["MASTER_PORT"])


def init_retry(rank, world, port, timeout_s, explicit, sleep_s) -> int:
    return init_fixed_retry(rank, world, port, timeout_s)


# how each variant joins the process group; the rest of the job is the same for all
# (article-retry's is in main: the article's Example 2 as written)
INITS = {"port-taken": init_plain, "two-jobs": init_plain, "fixed-free-port": init_free_port,
         "fixed-retry": init_retry}


def main(variant: str, *, port: int, pg_timeout_s: float | None, steps: int,
         sleep_s: float) -> None:
    if "RANK" not in os.environ:
        sys.exit("start this script with torchrun (or `ddplab run 05`), which sets RANK and "
                 "WORLD_SIZE: torchrun --nproc-per-node 2 " + " ".join(sys.argv))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    explicit_timeout = pg_timeout_s is not None
    pg_timeout_s = pg_timeout_s or PG_TIMEOUT_S
    if variant in ("port-taken", "article-retry",
                   "fixed-retry") and int(os.environ["LOCAL_RANK"]) == 0:
        take_port_if_free(port)
    # the init timeout this rank will wait with (None: PyTorch's default, 30 minutes, as in the
    # article's call)
    init_timeout_s = None if variant == "article-retry" and not explicit_timeout else pg_timeout_s
    lab.record("init_start", variant=variant, port=port, job=job_tag(), timeout_s=init_timeout_s,
               sleep_s=sleep_s)
    t0 = time.monotonic()
    if variant == "article-retry":
        try:                                   # article 003, Example 2
            # The article's call has no timeout: rank 1 waits up to PyTorch's default 30 minutes.
            init_article_style(rank, world, port, pg_timeout_s if explicit_timeout else None)
        except RuntimeError as e:
            init_failed(port, t0, e)
            print(f"Process {rank}: DDP initialization failed: {e}", flush=True)
            # "allow time for other processes to report errors"; nothing is learnt
            time.sleep(sleep_s)  # BROKEN
            sys.exit(1)
        used = port
    else:
        used = INITS[variant](rank, world, port, pg_timeout_s, explicit_timeout, sleep_s)
    init_s = time.monotonic() - t0
    # Who is in my process group? Ranks of another job that met us in the same store show up here.
    peers = [None] * world
    dist.all_gather_object(peers, job_tag())
    lab.record("joined", seconds=round(init_s, 3), port=used, job=job_tag(), peers=peers,
               cross_joined=any(p != job_tag() for p in peers))
    # A small data-parallel loop. Gradients averaged and SGD applied by hand, as DDP + SGD would:
    # both
    # DDP and torch.optim import torch._dynamo on first use (many seconds on a busy 2-core
    # machine).
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    for step in range(steps):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * rank + step))
        loss = model(x).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for prm in model.parameters():
                dist.all_reduce(prm.grad)   # with whoever is in this process group
                prm -= 0.05 * prm.grad / world
        time.sleep(0.05)         # keep the job alive long enough for a second job to meet it
    weight = [None] * world
    dist.all_gather_object(weight, model.weight.detach().sum().item())
    lab.record("done", steps=steps, same_weights=len(set(weight)) == 1, job=job_tag())
    lab.teardown()


if __name__ == "__main__":
    from ddplab.rank import lab_args

    variant, knobs = lab_args.parse(LAB, __doc__)
    main(variant, **knobs)
