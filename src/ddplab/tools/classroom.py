"""``ddplab classroom check --learners N``: does this machine hold N learners at once?

One machine, N learners, each with their own JupyterLab (or a JupyterHub), each running the labs'
2-rank jobs. What decides it, checked rather than assumed:

- memory: N learners' peak (a kernel plus a running 2-rank job) against the memory available now;
- cores: ranks running at once per core when every learner presses Run together, against the most
  that ``benchmarks/classroom.py`` measured still giving every verdict right here;
- threads: the OMP/MKL threads each rank gets (ddplab gives a rank cores // nproc unless
  OMP_NUM_THREADS is set), so N jobs do not each assume the whole machine;
- ports: every ddplab run asks the kernel for a free port (port 0), so learners never meet on one;
  a MASTER_PORT fixed in the shared environment would make them (lab 05 shows what that does);
- run folders: each learner's runs in their own folder (DDPLAB_RUNS_DIR or their own clone), so
  nobody reads or deletes another's evidence;
- torch's debug server (lab 01's ``--debug-server-port``): it listens on every interface with no
  authentication; on a shared host it must stay off, and nothing may already listen on its port.

The numbers per learner are measured (``benchmarks/classroom.py`` prints them; the constants below
are its figures on torch 2.13 CPU); ``--json`` gives every fact as data.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# Measured here (torch 2.13.0 CPU, Linux, 2 cores). RUN_MB: the peak resident memory of one learner's
# process tree while it runs labs 01 and 03 (the launching Python with ddplab, torchrun and 2 ranks),
# from benchmarks/classroom.py; KERNEL_MB: what a notebook kernel adds when it imports torch itself
# (259 MB with torch against 80 MB without); JUPYTERLAB_MB: a JupyterLab server (85 MB idle at start,
# allowed to grow). Re-measure with `python benchmarks/classroom.py` after a torch upgrade.
RUN_MB = 870
KERNEL_MB = 180
JUPYTERLAB_MB = 150
# WARM_MB: the warm process that forks each run's torchrun agent (ddplab.origins.warm), resident in every
# learner's kernel between runs: 207 MB of its own (USS; 219 MB RSS) with torch imported. RUN_MB was
# measured with cold agents, whose ~220 MB the forked agent now shares with it.
WARM_MB = 210
# The most ranks per core at which every verdict of the benchmark's K learners stayed right here,
# measured after the engine's runnable-thread rule (2026-11-23, idle machine at the start): K=1, 2,
# 4, 6, 6 again, 8 and 10 learners (up to 20 ranks on 2 cores, load average up to 19) gave every
# verdict right, 176 of 176. K=10 is the most tried, so that is the figure; what grows with K is
# time: the median run's seconds at each number of ranks per core (same rounds) is the other limit.
RANKS_PER_CORE_OK = 10.0
MEDIAN_RUN_S = {1: 5.2, 2: 7.3, 4: 15.9, 6: 23.5, 8: 34.0, 10: 42.0}
NPROC = 2                    # the labs' rank count (catalog default)
DEBUG_SERVER_PORT = 25999    # torch.distributed.debug.start_debug_server's default port
TORCHRUN_PORT = 29500        # torchrun's default MASTER_PORT


@dataclass(frozen=True)
class Item:
    name: str
    ok: bool
    facts: dict
    advice: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "ok": self.ok, "facts": self.facts, "advice": self.advice}


@dataclass(frozen=True)
class Check:
    learners: int
    items: tuple[Item, ...]
    facts: dict = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        return all(i.ok for i in self.items)

    def item(self, name: str) -> Item:
        return next(i for i in self.items if i.name == name)

    def to_dict(self) -> dict:
        return {"learners": self.learners, "holds": self.holds, "facts": self.facts,
                "items": [i.to_dict() for i in self.items]}

    # a view, made from the fields when shown
    def verdict(self) -> str:
        most = self.facts.get("most_learners")
        if self.holds:
            n = f"{self.learners} learner" + ("s" if self.learners != 1 else "")
            return f"this machine holds {n} (at most {most} by memory and cores)"
        bad = ", ".join(i.name for i in self.items if not i.ok)
        return f"this machine does not hold {self.learners} learners: {bad} (at most {most} by memory and cores)"

    def text(self) -> str:
        lines = [self.verdict()]
        for i in self.items:
            facts = ", ".join(f"{k}={v}" for k, v in i.facts.items())
            lines.append(f"  [{'ok' if i.ok else '!!'}] {i.name:<12} {facts}")
            if i.advice and not i.ok:
                lines.append(f"                    {i.advice}")
        return "\n".join(lines)


def _listening(port: int) -> list[str]:
    """Addresses something listens on at ``port`` (any interface), from the kernel's socket table."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return []
    return sorted({f"{c.laddr.ip}" for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port})


def _ephemeral_ports() -> int | None:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return high - low + 1
    except (OSError, ValueError):
        return None


def _non_loopback() -> list[str]:
    out = []
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6) and not (
                    a.address.startswith("127.") or a.address == "::1" or a.address.startswith("fe80")):
                out.append(f"{name}:{a.address.split('%')[0]}")
    return out


def _default_runs_root() -> Path:
    """Where runs go without DDPLAB_RUNS_DIR (ddplab.origins.job.runs_root without the environment)."""
    from ddplab.origins import catalog
    return catalog.REPO_DIR / "runs" if catalog.labs_dir().is_dir() else Path.cwd() / "runs"


def check(learners: int, env: dict | None = None) -> Check:
    """The facts and one item per resource for ``learners`` learners on this machine."""
    from ddplab.errors import DdplabError

    if isinstance(learners, bool) or not isinstance(learners, int) or learners < 1:
        raise DdplabError(f"--learners must be a whole number of at least 1, not {learners!r}",
                          hint="for example --learners 20")
    env = dict(os.environ if env is None else env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    mem = psutil.virtual_memory()
    avail_mb = mem.available // 2**20
    per_learner_mb = JUPYTERLAB_MB + KERNEL_MB + RUN_MB + WARM_MB
    need_mb = learners * per_learner_mb
    by_memory = int(avail_mb // per_learner_mb)
    by_cores = int(RANKS_PER_CORE_OK * cores // NPROC)
    items = []

    items.append(Item("memory", need_mb <= avail_mb,
                      {"available_mb": avail_mb, "total_mb": mem.total // 2**20, "per_learner_mb": per_learner_mb,
                       "needed_mb": need_mb},
                      f"{learners} learners need about {need_mb / 1024:.1f} GiB at once; this machine has "
                      f"{avail_mb / 1024:.1f} GiB available: fewer learners, or pairs sharing a notebook"))

    ranks_per_core = learners * NPROC / cores
    run_s = next((MEDIAN_RUN_S[k] for k in sorted(MEDIAN_RUN_S) if k >= ranks_per_core), None)
    items.append(Item("cores", ranks_per_core <= RANKS_PER_CORE_OK,
                      {"cores": cores, "ranks_at_once": learners * NPROC, "ranks_per_core": round(ranks_per_core, 2),
                       "most_ranks_per_core_measured_ok": RANKS_PER_CORE_OK,
                       "median_run_s_measured": run_s, "median_run_s_alone": MEDIAN_RUN_S[1]},
                      f"{learners} learners pressing Run together put {ranks_per_core:.1f} ranks on each core; "
                      f"verdicts stayed right up to {RANKS_PER_CORE_OK:g} here (benchmarks/classroom.py), with a "
                      f"median run of {MEDIAN_RUN_S[max(MEDIAN_RUN_S)]:g} s there against {MEDIAN_RUN_S[1]:g} s alone: "
                      "pairs sharing a notebook, or a second machine"))

    omp = env.get("OMP_NUM_THREADS")
    per_rank = int(omp) if omp and omp.isdigit() else max(1, cores // NPROC)
    threads = learners * NPROC * per_rank
    items.append(Item("threads", learners == 1 or per_rank == 1,
                      {"OMP_NUM_THREADS": omp, "threads_per_rank": per_rank, "threads_at_once": threads,
                       "cores": cores},
                      "set OMP_NUM_THREADS=1 in every learner's environment (their JupyterLab's), so N jobs "
                      f"do not each take {per_rank} threads per rank ({threads} threads on {cores} cores)"))

    fixed_port = env.get("MASTER_PORT")
    eph = _ephemeral_ports()
    items.append(Item("ports", not fixed_port,
                      {"MASTER_PORT": fixed_port, "ephemeral_ports": eph, "ddplab_port": 0,
                       "torchrun_default_29500_listening": bool(_listening(TORCHRUN_PORT))},
                      "unset MASTER_PORT in the shared environment: ddplab picks a free port per run, a fixed "
                      "one makes two learners' jobs meet (lab 05)"))

    own = bool(env.get("DDPLAB_RUNS_DIR"))
    root = Path(env["DDPLAB_RUNS_DIR"]) if own else _default_runs_root()
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    writable = os.access(existing, os.W_OK)
    items.append(Item("run folders", writable and (own or learners == 1),
                      {"runs_root": str(root), "DDPLAB_RUNS_DIR_set": own, "writable": writable},
                      "give each learner their own clone, or DDPLAB_RUNS_DIR=$HOME/ddplab-runs in their "
                      "environment, so each one's run folders (evidence, result.json) stay theirs"))

    listening = _listening(DEBUG_SERVER_PORT)
    shared = learners > 1
    items.append(Item("debug server", not listening,
                      {"port": DEBUG_SERVER_PORT, "listening_on": listening, "shared_host": shared,
                       "reachable_interfaces": _non_loopback()},
                      f"something listens on {DEBUG_SERVER_PORT} (torch's debug server default, every interface, "
                      "no authentication): stop it; on a shared host leave lab 01's --debug-server-port at 0"))

    facts = {"cores": cores, "available_mb": avail_mb, "per_learner_mb": per_learner_mb,
             "most_learners": max(0, min(by_memory, by_cores)), "most_by_memory": by_memory, "most_by_cores": by_cores,
             "measured": {"run_mb": RUN_MB, "kernel_mb": KERNEL_MB, "jupyterlab_mb": JUPYTERLAB_MB,
                          "ranks_per_core_ok": RANKS_PER_CORE_OK,
                          "median_run_s": MEDIAN_RUN_S}}
    return Check(learners, tuple(items), facts)
