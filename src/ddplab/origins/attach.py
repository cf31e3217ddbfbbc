"""``ddplab attach PID``: diagnose a running torchrun job that ddplab did not start.

The origin "processes found in the tree", for the one pipeline (``ddplab.engine.diagnose``): find torchrun
and every local rank (PID may be torchrun's or any rank's), hand the loop a supervisor built from
them (``supervise.FoundSupervisor``: the stall rule, with a watch time where ``run`` has a
deadline), and collect and judge as for any origin. The job keeps running unless ``stop=True``.
``save=DIR`` writes what was found on this machine to a folder (``ddplab.origins.nodes``) that
``ddplab explain`` merges with the other nodes' folders.

What can be read from outside a job that was not started by ddplab:
  * stacks: py-spy (needs ptrace rights: root, or ptrace_scope=0 on Linux);
  * the ledger (torch's flight recorder): through a worker server when the ranks run one (ddplab's
    rank hook, or torch's ``control_plane.worker_main`` with ``TORCH_WORKER_SERVER_SOCKET``); a job
    that only set ``TORCH_FR_BUFFER_SIZE`` records it but has no door to read it from outside.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from ddplab.engine import evidence
from ddplab.origins import nodes
from ddplab import runfiles
from ddplab.defaults import DEFAULT_STALL_S, DEFAULT_WATCH_S, GRACE_S, Ending, Status  # noqa: F401  (re-exported)
from ddplab.engine.diagnose import Identity, diagnose
from ddplab.errors import DdplabError
from ddplab.origins.job import new_run_dir, runs_root, seconds
from ddplab.result import RunResult
from ddplab.engine.supervise import FoundSupervisor, _alive


def _is_torchrun(p: psutil.Process) -> bool:
    cmd = _cmdline(p)
    return any(os.path.basename(c) == "torchrun" for c in cmd[:2]) or \
        any(c in ("torch.distributed.run", "ddplab.origins._torchrun", "torch.distributed.launch") for c in cmd[:4])


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _is_warm_parent(p: psutil.Process) -> bool:
    """ddplab.origins.warm's process (its forked agents share its command line; their parent is it)."""
    cmd = _cmdline(p)
    if "--warm" not in cmd[3:5]:
        return False
    try:
        parent = p.parent()
    except psutil.Error:
        return True
    return parent is None or _cmdline(parent) != cmd


def _env(p: psutil.Process) -> dict:
    try:
        return p.environ()
    except psutil.AccessDenied:
        raise DdplabError(f"cannot read the environment of pid {p.pid} (another user's process)",
                          hint="run ddplab attach as that user, or as root") from None
    except psutil.Error:
        return {}


def _is_rank(p: psutil.Process) -> bool:
    env = _env(p)
    return "RANK" in env and "LOCAL_RANK" in env and ("TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env)


def _is_rank_or_say(p: psutil.Process) -> bool:
    try:
        return _is_rank(p)
    except DdplabError:
        if _is_torchrun(p):
            raise
        raise DdplabError(f"pid {p.pid} is {_describe(p)}, not a torchrun job or one of its ranks that ddplab can read "
                          "(its environment is not readable)",
                          hint="pass the pid of torchrun or of a rank that you own") from None


def _describe(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline())[:80] or p.name()
    except psutil.Error:
        cmd = "?"
    return f"{p.name()} ({cmd})"


@dataclass(frozen=True)
class Found:
    agent: psutil.Process | None           # torchrun (None if the ranks' parent is not torchrun)
    ranks: dict[int, psutil.Process]       # global rank -> process (this machine's ranks)
    world_size: int | None


def find_job(pid: int) -> Found:
    """torchrun and its ranks from a pid of either; DdplabError naming what the pid is otherwise."""
    try:
        p = psutil.Process(pid)
        p.status()
    except psutil.NoSuchProcess:
        raise DdplabError(f"no process with pid {pid}", hint="pass the pid of torchrun or of one rank (see `ps -ef | grep torchrun`)") from None
    agent = None
    if _is_torchrun(p):
        agent = p
    elif _is_rank_or_say(p):
        parent = p.parent()
        while parent is not None and not _is_torchrun(parent):
            parent = parent.parent()
        agent = parent
    else:
        raise DdplabError(f"pid {pid} is {_describe(p)}, not a torchrun job or one of its ranks",
                          hint="pass the pid of torchrun or of a rank (a process with RANK and LOCAL_RANK in its environment)")
    if agent is p and _is_warm_parent(p):
        raise DdplabError(f"pid {pid} is ddplab's warm process, which forks each run's torchrun agent; it runs no ranks",
                          hint="pass the pid of one of its children (an agent) or of a rank")
    candidates = agent.children(recursive=False) if agent is not None else [p]
    ranks, world = {}, None
    for c in candidates:
        try:
            env = _env(c)
        except DdplabError:
            raise
        if "RANK" in env and "LOCAL_RANK" in env and _alive(c):
            ranks[int(env["RANK"])] = c
            world = int(env.get("WORLD_SIZE", 0)) or world
    if not ranks:
        raise DdplabError(f"pid {pid} is torchrun, but it has no running ranks (still starting, or already finished)",
                          hint="try again in a few seconds, or check torchrun's output")
    return Found(agent, ranks, world)


def _socket_of(env: dict) -> str | None:
    """The rank's worker-server socket, if it runs one: ddplab's rank hook, or torch's worker_main."""
    if env.get("DDPLAB_SOCKET_DIR") and env.get("RANK") is not None:
        path = os.path.join(env["DDPLAB_SOCKET_DIR"], runfiles.socket_name(env["RANK"]))
        if os.path.exists(path):
            return path
    path = env.get("TORCH_WORKER_SERVER_SOCKET")
    return path if path and os.path.exists(path) else None


def job_run_dir(found: Found) -> Path | None:
    """The run folder of a job ddplab started (its ranks' DDPLAB_RUN_DIR, if they all agree): its
    rank hook's records are read like ``run``'s. None for a job ddplab did not start."""
    dirs = {_env(p).get("DDPLAB_RUN_DIR") for p in found.ranks.values()}
    d = dirs.pop() if len(dirs) == 1 else None
    return Path(d) if d and Path(d, runfiles.RANKS).is_dir() else None


def attach(pid: int, stall_s: float | None = None, watch_s: float = DEFAULT_WATCH_S, stop: bool = False,
           progress=None, save: str | os.PathLike | None = None, force: bool = False,
           node: str | None = None) -> RunResult:
    """Watch the job for up to ``watch_s`` seconds: "hung" once every rank made no progress for
    ``stall_s``; "running" if it kept making progress; "exited" if it ended; evidence read either way.
    ``save``: a folder to write this node's evidence to (refused if it exists, unless ``force``),
    for ``ddplab explain``; ``node`` names this node there (default: the hostname)."""
    stall_s = seconds(DEFAULT_STALL_S if stall_s is None else stall_s, "--stall", "for example --stall 3")
    if save is not None:
        nodes.check_target(Path(save), force)
    source = AttachedJob(find_job(pid), pid, stall_s, watch_s, stop, save, force, node)
    result = diagnose(source, show=progress)
    if result.status == Status.INTERRUPTED:
        raise KeyboardInterrupt
    return result


class AttachedJob:
    """The origin "a running job found in the process tree": the supervisor is built from the
    processes found (pids, worker-server sockets); the evidence is what the loop saw, the live ranks
    and, for a job ddplab started, its ranks' records."""
    limit = Ending.WATCHED

    def __init__(self, found: Found, pid: int, stall_s: float, watch_s: float, stop: bool,
                 save: str | os.PathLike | None, force: bool, node: str | None):
        self.found, self.stall_s, self.stop = found, stall_s, stop
        self.save_to, self.force, self.node = (Path(save) if save is not None else None), force, node
        self.limit_s = max(watch_s, stall_s + 1)
        self.source_dir = job_run_dir(found)     # a job ddplab started: its rank hook's records
        self.sockets = {r: _socket_of(_env(p)) for r, p in found.ranks.items()}
        run_dir = new_run_dir(runs_root(lab=False) / "attach", f"pid{pid}")
        (run_dir / runfiles.RANKS).mkdir(parents=True, exist_ok=True)
        self.identity = Identity(target=f"pid {pid}", run_dir=run_dir, command=_command(found), attached_pid=pid,
                                 records_dir=self.source_dir)

    def handle(self) -> FoundSupervisor:
        root = self.found.agent or next(iter(self.found.ranks.values()))
        ranks = {r: (p, self.sockets[r]) for r, p in self.found.ranks.items()}
        # a job ddplab started: SIGUSR1 dumps go to its own folder; any other job has no such hook
        capture = self.source_dir or Path(tempfile.gettempdir())
        return FoundSupervisor(root, ranks, self.stall_s, time.monotonic(), capture)

    def evidence(self, seen: evidence.Watch | None, live: dict) -> evidence.Evidence:
        return evidence.collect(self._with_notes(seen), live, self.source_dir)

    def _with_notes(self, seen: evidence.Watch) -> evidence.Watch:
        found, notes = self.found, list(seen.notes)
        if not any(self.sockets.values()):
            notes.append("the ranks run no worker server, so their collective ledgers cannot be read from outside "
                         "(start the job with `ddplab run`, or wrap main in torch.distributed.elastic.control_plane."
                         "worker_main() with TORCH_WORKER_SERVER_SOCKET and TORCH_FR_BUFFER_SIZE set)")
        if found.world_size and found.world_size > len(found.ranks):
            notes.append(f"only this machine's {len(found.ranks)} of {found.world_size} ranks were seen")
        notes.append("the job was stopped (--stop)" if self.stop else "the job was left running (pass --stop to end it)")
        return replace(seen, notes=tuple(notes), ranks_here=tuple(sorted(found.ranks)))

    def keep(self, ev: evidence.Evidence, result: RunResult) -> None:
        """--save: this node's evidence in a folder of its own, for ``ddplab explain``."""
        if self.save_to is not None:
            nodes.save(self.save_to, {r: _env(p) for r, p in self.found.ranks.items()}, self.found.world_size, ev,
                       result, self.source_dir, self.force, self.node)


def _command(found: Found) -> tuple[str, ...]:
    try:
        return tuple((found.agent or next(iter(found.ranks.values()))).cmdline())
    except psutil.Error:
        return ()
