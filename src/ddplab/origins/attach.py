"""``ddplab attach PID``: diagnose a running torchrun job that ddplab did not start.

The same pipeline as ``ddplab.run`` without the start: find torchrun and every local rank through
the process tree (PID may be torchrun's or any rank's), then the same watch loop
(``supervise.watch``: the stall rule, with a watch time where ``run`` has a deadline), the same
``evidence.collect`` and the same ``classify.judge``. The job keeps running unless ``stop=True``.
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
import signal
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from ddplab.engine import classify, evidence, stacks  # noqa: F401  (render: the result's views)
from ddplab.views import render  # noqa: F401  (render: the result's views)
from ddplab import runfiles  # noqa: F401  (render: the result's views)
from ddplab.defaults import DEFAULT_STALL_S, DEFAULT_WATCH_S, GRACE_S  # noqa: F401  (re-exported)
from ddplab.errors import DdplabError
from ddplab.origins.job import new_run_dir, runs_root, seconds
from ddplab.result import RunResult
from ddplab.engine.supervise import RankWatch, Supervisor, _alive, watch


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


class _AttachedSupervisor(Supervisor):
    """The poll loop over processes found, not started: ranks from the tree, stacks from py-spy
    when no worker server answers. The job has ended on its own when every rank has."""
    attached = True
    finished_as = "exited"

    def __init__(self, found: Found, stall_s: float, t0: float, run_dir: Path):
        self.found = found
        root = found.agent or next(iter(found.ranks.values()))
        self.root = root
        # Supervisor reads proc.pid and, in terminate(), proc.poll()/wait(); give it a stand-in.
        super().__init__(_Proc(root), run_dir, len(found.ranks), stall_s, t0)
        self.world = max(found.ranks) + 1
        self.known[root.pid] = root
        for rank, proc in found.ranks.items():
            env = _env(proc)
            self.known[proc.pid] = proc
            self.ranks[rank] = RankWatch(rank, proc.pid, _socket_of(env), proc, t0)

    def finished(self) -> bool:
        return bool(self.ranks) and not self.live()

    def returncode(self) -> int | None:
        return None       # not our child: its exit status is not ours to read

    def _discover(self, now: float) -> None:  # the ranks are known; only their children change
        for p in list(self.known.values()):
            try:
                for c in p.children(recursive=True):
                    self.known.setdefault(c.pid, c)
            except psutil.Error:
                pass

    def _stack(self, w: RankWatch):
        frames = super()._stack(w)
        if frames is None:
            frames, _ = stacks.pyspy_dump(w.pid)
        return frames

    def terminate(self, grace_s: float = GRACE_S) -> tuple[int, ...]:
        """--stop: SIGTERM to torchrun and every rank (each in its own session), then SIGKILL."""
        procs = self.alive_processes()
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=2)
        self._discover(time.monotonic())
        return tuple(p.pid for p in self.alive_processes())


class _Proc:
    """The part of subprocess.Popen the supervisor uses, for a process that is not our child."""

    def __init__(self, p: psutil.Process):
        self.pid, self._p, self.returncode = p.pid, p, None

    def poll(self):
        return None if _alive(self._p) else 0

    def wait(self, timeout=None):
        try:
            self._p.wait(timeout)
        except psutil.Error:
            pass
        return 0


def attach(pid: int, stall_s: float | None = None, watch_s: float = DEFAULT_WATCH_S, stop: bool = False,
           progress=None, save: str | os.PathLike | None = None, force: bool = False,
           node: str | None = None) -> RunResult:
    """Watch the job for up to ``watch_s`` seconds: "hung" once every rank made no progress for
    ``stall_s``; "running" if it kept making progress; "exited" if it ended; evidence read either way.
    ``save``: a folder to write this node's evidence to (refused if it exists, unless ``force``),
    for ``ddplab explain``; ``node`` names this node there (default: the hostname)."""
    stall_s = seconds(DEFAULT_STALL_S if stall_s is None else stall_s, "--stall", "for example --stall 3")
    if save is not None:
        from ddplab.origins import nodes
        nodes.check_target(Path(save), force)
    found = find_job(pid)
    run_dir = new_run_dir(runs_root() / "attach", f"pid{pid}")
    (run_dir / runfiles.RANKS).mkdir(parents=True, exist_ok=True)
    source = job_run_dir(found)
    t0 = time.monotonic()
    sup = _AttachedSupervisor(found, stall_s, t0, run_dir)
    ended_by = None
    try:
        ended_by = watch(sup, limit_s=max(watch_s, stall_s + 1), limit="watched", show=progress)
    finally:
        # a job ddplab started: SIGUSR1 dumps go to its own folder; any other job has no such hook
        seen, live = sup.end(ended_by, stop=stop, capture_dir=source or Path(tempfile.gettempdir()))
        ev = evidence.collect(_with_notes(seen, found, sup, stop), live, source)
        v = classify.judge(ev)
        result = RunResult(target=f"pid {pid}", variant=None, nproc=len(found.ranks), wall_s=seen.wall_s,
                           run_dir=str(run_dir), command=_command(found), stall_s=stall_s, leftover=seen.leftover,
                           notes=ev.watch.notes, attached_pid=pid, **v.fields())
        result.save()
        if save is not None:
            nodes.save(Path(save), {r: _env(p) for r, p in found.ranks.items()}, found.world_size, ev, result, source,
                       force, node)
    if ended_by == "interrupt":
        raise KeyboardInterrupt
    return result


def _with_notes(seen: evidence.Watch, found: Found, sup: _AttachedSupervisor, stop: bool) -> evidence.Watch:
    notes = list(seen.notes)
    if not any(w.sock for w in sup.ranks.values()):
        notes.append("the ranks run no worker server, so their collective ledgers cannot be read from outside "
                     "(start the job with `ddplab run`, or wrap main in torch.distributed.elastic.control_plane."
                     "worker_main() with TORCH_WORKER_SERVER_SOCKET and TORCH_FR_BUFFER_SIZE set)")
    if found.world_size and found.world_size > len(found.ranks):
        notes.append(f"only this machine's {len(found.ranks)} of {found.world_size} ranks were seen")
    notes.append("the job was stopped (--stop)" if stop else "the job was left running (pass --stop to end it)")
    return replace(seen, notes=tuple(notes), ranks_here=tuple(sorted(found.ranks)))


def _command(found: Found) -> tuple[str, ...]:
    try:
        return tuple((found.agent or next(iter(found.ranks.values()))).cmdline())
    except psutil.Error:
        return ()
